import pytest

from rayaccel.errors import RequestError
from rayaccel.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text, expected",
    [("20GiB", 20 << 30), ("512MiB", 512 << 20), ("1.5GB", 1_500_000_000), ("4096", 4096), (" 2 gib ", 2 << 30), (7, 7)],
)
def test_parse(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["20 parsecs", "-1GiB", "", "GiB", True, -5, "1e9"])
def test_parse_rejects_with_field(bad):
    with pytest.raises(RequestError, match="gpu_memory"):
        parse_bytes(bad, "gpu_memory")


def test_format():
    assert format_bytes(None) == "-"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(80 << 30) == "80.0 GiB"
