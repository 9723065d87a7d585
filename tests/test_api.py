"""The public surface: ``__all__`` is the documented list, every name resolves, ``dir()`` agrees, and
``import rayaccel`` imports nothing else."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys

import pytest

import rayaccel
from rayaccel import errors


def _documented() -> list[str]:
    """The ``names`` of the "Public surface" list in rayaccel's docstring."""
    lines = rayaccel.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Public surface")) + 2  # the list
    end = lines.index("", start)
    return re.findall(r"``(\w+)``", "\n".join(lines[start:end]))


def test_all_is_the_documented_public_surface():
    names = _documented()
    assert len(names) == len(set(names)), "a name is listed twice in rayaccel's docstring"
    assert sorted(names) == sorted(rayaccel.__all__)
    assert len(rayaccel.__all__) == len(set(rayaccel.__all__))


@pytest.mark.parametrize("name", [n for n in rayaccel.__all__ if n != "__version__"])
def test_every_name_resolves_to_the_object_its_module_defines(name):
    obj = getattr(rayaccel, name)
    assert obj.__name__ == name  # the object itself, not a wrapper or a module
    home = sys.modules[obj.__module__]
    assert getattr(home, name) is obj
    assert obj.__module__.startswith("rayaccel.")


def test_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", rayaccel.__version__)


def test_dir_agrees_before_and_after_every_name_is_fetched():
    code = (
        "import inspect, json, rayaccel\n"
        "public = lambda: sorted(n for n in dir(rayaccel) if not n.startswith('_')"
        " and not inspect.ismodule(getattr(rayaccel, n)))\n"
        "before = public()\n"
        "[getattr(rayaccel, n) for n in rayaccel.__all__]\n"
        "print(json.dumps([before, public(), '__version__' in dir(rayaccel)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, after, version = json.loads(out)
    expected = sorted(n for n in rayaccel.__all__ if not n.startswith("_"))
    assert before == expected and after == expected and version


def _tree() -> list[tuple[str, str | None]]:
    """(class, parent) for every class drawn in the tree of rayaccel.errors' docstring."""
    out: list[tuple[str, str | None]] = []
    parents: dict[int, str] = {}
    root_col = None
    for line in errors.__doc__.splitlines():
        if line.strip() == "RayaccelError":
            root_col = len(line) - len(line.lstrip())
            out.append(("RayaccelError", None))
            parents[0] = "RayaccelError"
        elif root_col is not None and "── " in line:
            depth = (line.index("── ") - 1 - root_col) // 4 + 1
            name = line.split("── ", 1)[1].split()[0]
            out.append((name, parents[depth - 1]))
            parents[depth] = name
    return out


def test_every_error_of_the_tree_is_exported_at_the_top_level():
    tree = _tree()
    drawn = {name for name, _ in tree}
    defined = {n for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, errors.RayaccelError)}
    assert drawn == defined, "the tree in rayaccel/errors.py's docstring and the classes there differ"
    for name, parent in tree:
        cls = getattr(errors, name)
        assert getattr(rayaccel, name) is cls, name
        assert name in rayaccel.__all__, name
        if parent is not None:
            assert getattr(errors, parent) in cls.__bases__, f"{name} is drawn under {parent}"


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        rayaccel.no_such_thing  # noqa: B018


def test_import_rayaccel_imports_nothing_else():
    """Nothing but the package and the tensor transport's registration (which uses the standard library only;
    ``_ray_private`` names the modules where each Ray release checks a transport's name, and imports no ray)."""
    code = ("import sys; before = set(sys.modules); import rayaccel\n"
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ("['rayaccel', 'rayaccel._version', 'rayaccel.ray', 'rayaccel.ray._ray_private', 'rayaccel.ray.rdt', "
                   "'rayaccel.ray.rdt.name']")


def test_from_rayaccel_import_a_type_works_in_a_fresh_interpreter():
    code = "from rayaccel import Device, NodeTopology, TopologyError; print(Device.__module__, TopologyError.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["rayaccel.topology.model", "rayaccel.errors"]


def test_import_is_light():
    code = (
        "import sys, rayaccel; rayaccel.load_topology('dgx1-v100'); rayaccel.plan\n"
        "heavy = [m for m in ('ray', 'pynvml', 'amdsmi', 'torch', 'matplotlib') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"import rayaccel pulled in heavy modules: {out}"
