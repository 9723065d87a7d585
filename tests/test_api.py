"""The public surface: one sorted __all__, every name resolves, and `import rayaccel` stays light."""

from __future__ import annotations

import subprocess
import sys

import rayaccel


def test_all_is_sorted_and_resolves():
    assert rayaccel.__all__ == sorted(rayaccel.__all__)
    for name in rayaccel.__all__:
        assert getattr(rayaccel, name) is not None, name


def test_expected_names():
    assert {"plan", "Request", "Allocation", "Rejection", "load_topology", "discover", "init", "remote",
            "gang", "get_devices", "shutdown", "store", "NodeTopology"} <= set(rayaccel.__all__)


def test_unknown_attribute_is_an_attribute_error():
    try:
        rayaccel.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_import_is_light():
    code = (
        "import sys, rayaccel; rayaccel.load_topology('dgx1-v100'); rayaccel.plan\n"
        "heavy = [m for m in ('ray', 'pynvml', 'amdsmi', 'torch', 'matplotlib') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"import rayaccel pulled in heavy modules: {out}"
