"""Every real capture in tests/data/captures imports (maybe with warnings) or is rejected clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayaccel.discovery.capture import import_captures, looks_like_capture, parse_capture
from rayaccel.errors import CaptureError
from rayaccel.topology import NodeTopology

CAPTURES = Path(__file__).parent.parent / "data" / "captures"
FILES = sorted(CAPTURES.glob("*.txt"))

# file number -> (devices, links, nics, warnings expected?) or the rejection text
EXPECTED: dict[str, tuple[int, int, int, bool] | str] = {
    "01": (8, 28, 10, False), "02": (8, 28, 12, True), "03": (4, 6, 1, False), "04": (1, 0, 4, False),
    "05": (4, 6, 1, False), "06": (4, 6, 4, False), "07": (2, 1, 0, False), "08": (4, 6, 0, False),
    "09": (2, 1, 0, False), "10": (2, 1, 0, False), "13": (8, 28, 4, False), "14": (4, 6, 1, False),
    "15": (8, 28, 12, True), "18": (6, 15, 0, False), "20": (1, 0, 6, False), "21": (8, 28, 0, False),
    "22": (4, 6, 0, False), "23": (4, 6, 0, False), "25": (8, 28, 4, False), "26": (8, 28, 12, False),
    "27": (8, 28, 6, False), "28": (8, 28, 8, False), "30": (4, 6, 0, False), "32": (2, 1, 0, False),
    "34": (4, 6, 6, False), "36": (8, 28, 4, False), "37": (2, 1, 0, False), "38": (8, 28, 12, True),
    "40": (5, 10, 0, False), "41": (4, 6, 0, False), "42": (4, 6, 1, False), "44": (2, 0, 0, False),
    "45": (1, 0, 0, False), "46": (2, 0, 0, False), "47": (1, 0, 0, False), "49": (5, 0, 0, True),
    "51": (1, 0, 0, True), "52": (1, 0, 0, False), "53": "compute-instance table", "54": (1, 0, 0, False),
    "55": (1, 0, 0, True), "57": (2, 0, 0, True), "59": (8, 28, 0, False), "60": (4, 6, 0, False),
    "61": (4, 6, 0, False), "63": (8, 28, 0, False), "64": (8, 28, 0, True), "66": (8, 0, 0, True),
    "67": (12, 12, 0, False), "68": (16, 32, 0, False), "69": (4, 3, 0, False), "72": (16, 65, 10, True),
    "73": (8, 28, 0, False), "74": (8, 28, 0, False), "76": (4, 6, 2, True), "77": (4, 6, 0, False),
    "78": (2, 1, 2, False), "79": (2, 1, 0, False), "80": "nvidia-smi topo -p2p", "82": (8, 28, 8, False),
    "83": (4, 6, 0, False), "84": (8, 0, 0, True), "85": (1, 0, 0, False), "86": (1, 0, 0, True),
    "87": (1, 0, 0, False),
    "88": (16, 32, 0, False), "89": (16, 32, 0, False), "90": (16, 32, 0, False), "91": (16, 32, 0, False),
    "92": (4, 3, 0, False), "93": (1, 0, 0, False), "94": (1, 0, 0, True), "95": (8, 28, 0, False),
    "96": (8, 28, 0, False), "97": (4, 4, 0, True), "98": (4, 4, 0, True), "99": (4, 4, 0, False),
    "110": (8, 0, 0, False), "111": (2, 0, 0, False), "112": (1, 0, 0, True),
    "113": (1, 0, 0, True), "114": (4, 6, 8, False),
}


def _number(path: Path) -> str:
    """The capture's number: the file name up to its first ``_`` (two or three digits)."""
    return path.name.split("_", 1)[0]


def test_corpus_is_complete():
    assert len(FILES) == 82
    assert sorted(_number(f) for f in FILES) == sorted(EXPECTED)


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_corpus_file(path: Path):
    want = EXPECTED[_number(path)]
    assert looks_like_capture(path.read_text())
    if isinstance(want, str):
        with pytest.raises(CaptureError) as e:
            import_captures([path])
        msg = str(e.value)
        assert want in msg and path.name in msg and e.value.line is not None
        return
    res = import_captures([path])
    topo = res.topology.validate()
    ndev, nlinks, nnics, warned = want
    assert (len(topo.devices), len(topo.links), len(topo.nics)) == (ndev, nlinks, nnics)
    assert bool(res.warnings) == warned, res.warnings
    assert all(path.name in w or w.startswith("GPU ") for w in res.warnings)
    assert topo.sources == (f"capture:{path.name}",)
    assert topo.name == path.stem
    # one link per unordered pair, a < b, every kind legal
    assert len({(l.a, l.b) for l in topo.links}) == len(topo.links)
    # JSON round trip, and the contract's fields are there
    again = NodeTopology.from_json(topo.to_json())
    assert again == topo
    d = topo.to_dict()
    for dev in d["devices"]:
        assert {"index", "numa_node", "cpus", "partitions", "mig_profiles"} <= set(dev)
        assert dev["numa_node"] is None or isinstance(dev["numa_node"], int)
        assert dev["cpus"] is None or all(isinstance(c, int) for c in dev["cpus"])
    for link in d["links"]:
        assert {"a", "b", "kind", "count", "pcie"} <= set(link)


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_parse_capture_matches_import(path: Path):
    text = path.read_text()
    try:
        one = parse_capture(text, str(path))
    except CaptureError as e:
        assert str(path) in str(e)
        return
    assert one.topology == import_captures([path]).topology
