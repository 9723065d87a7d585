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


# ---- hostile sizes (issue 10): never an OverflowError, never a float infinity, always the field's name
NINES = "9" * 400


@pytest.mark.parametrize("bad", [NINES, NINES + "GiB", f"{NINES}.5 TB", 10**400, float("inf"), float("nan"),
                                 "8EiB", (1 << 63), "x" * 5000, "1" * 2000 + "GiB"],
                         ids=["400-nines", "400-nines-GiB", "400-nines-TB", "10**400", "inf", "nan", "8EiB",
                              "2**63", "5000-chars", "2000-digits"])
def test_hostile_sizes_are_request_errors(bad):
    with pytest.raises(RequestError, match="^gpu_memory: ") as e:
        parse_bytes(bad, "gpu_memory")
    assert len(str(e.value)) < 250  # the value is shortened in the message, not echoed whole


def test_largest_size_is_int64():
    from rayaccel.units import MAX_BYTES

    assert parse_bytes(MAX_BYTES) == MAX_BYTES == (1 << 63) - 1
    assert parse_bytes("7EiB") == 7 << 60 and parse_bytes("1.5 PiB") == 3 << 49
    assert parse_bytes("0.5KiB") == 512


def test_format_any_int():
    assert format_bytes(10**400).endswith(" EiB")
    assert format_bytes(1 << 50) == "1.0 PiB"
