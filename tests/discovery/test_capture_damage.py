"""Damaged, foreign and random input: a CaptureError naming file and line, or a valid topology."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayaccel.discovery.capture import import_captures, looks_like_capture, parse_capture
from rayaccel.errors import CaptureError

CAPTURES = Path(__file__).parent.parent / "data" / "captures"
FILES = sorted(CAPTURES.glob("*.txt"))
TEXTS = {f.name: f.read_text() for f in FILES}


def text(prefix: str) -> str:
    return next(v for k, v in TEXTS.items() if k.startswith(prefix + "_"))


@pytest.mark.parametrize("bad,why", [
    ("", "empty capture"),
    ("   \n\t\n", "empty capture"),
    ("\x00\x01\x02binary\xff" * 20, "not a text capture"),
    ("hello world\nthis is not a capture\n", "not a recognised capture"),
    ('{"schema": "rayaccel.topology/1", "devices": []}', "not a recognised capture"),
], ids=["empty", "blank", "binary", "prose", "json"])
def test_foreign_input(bad, why):
    with pytest.raises(CaptureError, match=why) as e:
        parse_capture(bad, "bad.txt")
    assert str(e.value).startswith("bad.txt")
    assert not looks_like_capture(bad)


def test_binary_file(tmp_path):
    p = tmp_path / "junk.bin"
    p.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(CaptureError, match="junk.bin.*not a text capture"):
        import_captures([p])


def test_utf16_file_from_powershell(tmp_path):
    p = tmp_path / "topo.txt"
    p.write_bytes(text("05").encode("utf-16"))
    assert len(import_captures([p]).topology.links) == 6


def test_merged_cells_name_the_line():
    bad = text("01").replace("NV12\tNV12\tNV12\tNV12\tNV12\tNV12\tPXB", "NV12NV12\tNV12\tNV12\tNV12\tNV12\tPXB", 1)
    with pytest.raises(CaptureError) as e:
        parse_capture(bad, "dgx.txt")
    assert e.value.line == 2 and "row GPU0" in str(e.value) and "NV12NV12" in str(e.value)


def test_shifted_cells_are_caught_by_the_self_column():
    bad = text("74").replace("GPU3    NV18    NV18    NV18     X ", "GPU3    NV18    NV18     X      NV18", 1)
    with pytest.raises(CaptureError, match="expected X|unexpected X") as e:
        parse_capture(bad, "h100.txt")
    assert e.value.line == 5


def test_unknown_link_class():
    bad = text("05").replace("GPU1\tNV4\t X \tNV4", "GPU1\tNV4\t X \tFOO", 1)
    with pytest.raises(CaptureError, match="'FOO' under GPU2 is not a link class") as e:
        parse_capture(bad, "x.txt")
    assert e.value.line == 4


def test_row_cut_mid_cells_at_the_end_is_skipped_with_a_warning():
    lines = text("74").splitlines()[:9]   # header + GPU0..GPU7
    lines[-1] = lines[-1][:30]           # GPU7 cut after a few cells
    r = parse_capture("\n".join(lines), "cut.txt")
    assert len(r.topology) == 8 and len(r.topology.links) == 28  # symmetric: GPU7's pairs come from other rows
    assert any("GPU7 is cut" in w for w in r.warnings)


def test_row_cut_in_the_middle_is_an_error():
    lines = text("74").splitlines()
    lines[3] = lines[3][:30]
    with pytest.raises(CaptureError, match="row GPU2.*link cells") as e:
        parse_capture("\n".join(lines), "cut.txt")
    assert e.value.line == 4


def test_rocm_merged_cells():
    bad = text("59").replace("GPU3   15           15           15", "GPU3   1515           15", 1)
    with pytest.raises(CaptureError, match="row GPU3 has 7 cells, expected 8") as e:
        parse_capture(bad, "rocm.txt")
    assert e.value.line is not None


def test_neuron_bad_neighbour_list():
    bad = text("67").replace("| 11, 1     |", "| 11; 1     |", 1)
    with pytest.raises(CaptureError, match="CONNECTED DEVICES") as e:
        parse_capture(bad, "n.txt")
    assert e.value.line == 6


def test_lgip_bad_row():
    bad = text("51").replace("14     4/4        5.81", "14     4-4        5.81", 1)
    with pytest.raises(CaptureError, match="cannot read this profile row") as e:
        parse_capture(bad, "m.txt")
    assert e.value.line == 7


def test_L_bad_gpu_line():
    bad = text("44").replace("(UUID: GPU-2927", "(UUID GPU-2927", 1)
    with pytest.raises(CaptureError, match="cannot read this GPU line") as e:
        parse_capture(bad, "l.txt")
    assert e.value.line == 1


# ----------------------------------------------------------------- fuzzing
def _check(t: str) -> None:
    try:
        r = parse_capture(t, "fuzz.txt")
    except CaptureError as e:
        assert str(e).startswith("fuzz.txt")
        assert "internal error" not in str(e), str(e)
        return
    r.topology.validate()


_EDITS = st.sampled_from(["delete", "duplicate", "truncate", "merge", "swap", "junk", "cut_text"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(TEXTS)), edits=st.lists(st.tuples(_EDITS, st.integers(0, 10_000),
                                                                      st.integers(0, 200)), min_size=1, max_size=4))
def test_mutated_corpus_never_crashes(name, edits):
    lines = TEXTS[name].splitlines()
    for op, i, j in edits:
        if not lines:
            break
        k = i % len(lines)
        if op == "delete":
            del lines[k]
        elif op == "duplicate":
            lines.insert(k, lines[k])
        elif op == "truncate":
            lines[k] = lines[k][: j % (len(lines[k]) + 1)]
        elif op == "merge":
            lines[k] = lines[k].replace("\t", "", 1).replace("  ", "", 1)
        elif op == "swap":
            m = j % len(lines)
            lines[k], lines[m] = lines[m], lines[k]
        elif op == "junk":
            lines[k] = lines[k][: j % (len(lines[k]) + 1)] + "#|:\t X NV GPU9 ," + lines[k][j % (len(lines[k]) + 1):]
        elif op == "cut_text":
            lines = lines[: k + 1]
    _check("\n".join(lines))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("GPU0123 X\tNV18|:-,\nSYSPIXMIG{}/.abc[]=#")), max_size=400))
def test_random_text_never_crashes(t):
    _check(t)
