"""The backend registry: entry points, validation of plugins, duplicates, discover()."""

from __future__ import annotations

import importlib.metadata

import pytest

from rayaccel.discovery import Backend, BackendInfo, backends, discover, get_backend, register_backend, registry
from rayaccel.testing.fakenvml import FakeNVML
from rayaccel.discovery.nvidia import NvidiaBackend
from rayaccel.errors import BackendError, BackendUnavailable, PluginError
from rayaccel.topology import Device, NodeTopology, make_link


@pytest.fixture(autouse=True)
def fresh_registry():
    registry._reset()
    yield
    registry._reset()


def _ep(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=registry.ENTRY_POINT_GROUP)


@pytest.fixture
def plugins(monkeypatch):
    """Replace the installed entry points with the real built-ins plus the given ones."""
    real = list(importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP))

    def install(*extra: tuple[str, str]):
        monkeypatch.setattr(registry, "_entry_points", lambda: real + [_ep(n, v) for n, v in extra])
        registry._reset()

    return install


# ---------------------------------------------------------------- plugin classes used through entry points
class GoodPlugin:
    name = "good"

    def available(self) -> BackendInfo:
        return BackendInfo(self.name, True)

    def discover(self) -> NodeTopology:
        return NodeTopology(devices=(Device(0, vendor="acme"),))


class NoDiscover:
    name = "nodiscover"

    def available(self) -> BackendInfo:
        return BackendInfo(self.name, True)


class WrongName(GoodPlugin):
    name = "something-else"


class NotCallable:
    name = "notcallable"
    available = True
    discover = None


class RaisingFactory:
    name = "raising"

    def __init__(self):
        raise RuntimeError("boom in __init__")


class CrashingAvailable(GoodPlugin):
    name = "crashy"

    def available(self):
        raise ZeroDivisionError("oops")


def _unavailable(name: str, reason: str):
    class Unavailable:
        def __init__(self):
            self.name = name

        def available(self):
            return BackendInfo(name, False, reason, f"install {name}-lib")

        def discover(self):
            raise BackendUnavailable(name, reason)

    return Unavailable


# ---------------------------------------------------------------- built-ins
@pytest.mark.parametrize("name", [*registry.HARDWARE_ORDER, "simulated"])
def test_builtins_come_through_entry_points_and_conform(name):
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert name in eps, "run `pip install -e .` so the entry points are installed"
    b = get_backend(name)
    assert isinstance(b, Backend) and b.name == name
    info = b.available()
    assert isinstance(info, BackendInfo) and info.name == name
    assert info.available or (info.reason and info.hint)


def test_backends_order_builtins_first(plugins):
    plugins(("good", f"{__name__}:GoodPlugin"), ("aaa", f"{__name__}:GoodPlugin"))
    n = len(registry.HARDWARE_ORDER) + 1
    assert list(backends())[:n] == [*registry.HARDWARE_ORDER, "simulated"]
    assert list(backends())[n:] == ["aaa", "good"]


def test_get_backend_caches_instances():
    assert get_backend("simulated") is get_backend("simulated")


def test_unknown_backend_lists_registered():
    with pytest.raises(BackendError, match=r"unknown backend .nope.*nvidia, amd, neuron, tpu, gaudi, ascend, simulated"):
        get_backend("nope")


# ---------------------------------------------------------------- plugin validation
def test_good_plugin_loads(plugins):
    plugins(("good", f"{__name__}:GoodPlugin"))
    assert get_backend("good").discover().devices[0].vendor == "acme"


@pytest.mark.parametrize("name, value, problem", [
    ("nodiscover", f"{__name__}:NoDiscover", "missing method discover()"),
    ("wrongname", f"{__name__}:WrongName", "'name' is 'something-else' but it is registered as 'wrongname'"),
    ("notcallable", f"{__name__}:NotCallable", "available is not callable; discover is not callable"),
    ("raising", f"{__name__}:RaisingFactory", "raised RuntimeError: boom in __init__"),
    ("missingmod", "rayaccel_no_such_module:X", "cannot import 'rayaccel_no_such_module:X'"),
    ("missingattr", f"{__name__}:NoSuchClass", "AttributeError"),
    ("notafactory", f"{__name__}:__doc__", "is not callable"),
], ids=lambda x: x if isinstance(x, str) and ":" not in x and " " not in x else "")
def test_non_conforming_plugin_rejected_with_its_name(plugins, name, value, problem):
    plugins((name, value))
    with pytest.raises(PluginError) as err:
        get_backend(name)
    assert f"backend {name!r}" in str(err.value) and problem in str(err.value)
    assert err.value.backend == name


def test_broken_plugin_does_not_break_listing(plugins):
    plugins(("nodiscover", f"{__name__}:NoDiscover"), ("good", f"{__name__}:GoodPlugin"))
    all_ = backends()
    assert set(all_) == {*registry.HARDWARE_ORDER, "simulated", "nodiscover", "good"}
    info = all_["nodiscover"].available()
    assert not info.available and "missing method discover()" in info.reason
    with pytest.raises(PluginError):
        all_["nodiscover"].discover()
    infos = {i.name: i for i in registry.backend_infos()}
    assert infos["good"].available and not infos["nodiscover"].available


def test_plugin_whose_available_crashes_is_reported(plugins):
    plugins(("crashy", f"{__name__}:CrashingAvailable"))
    info = {i.name: i for i in registry.backend_infos()}["crashy"]
    assert not info.available and "ZeroDivisionError: oops" in info.reason


# ---------------------------------------------------------------- register_backend
def test_duplicate_name_raises_unless_clobber():
    with pytest.raises(PluginError, match="already registered.*clobber=True"):
        register_backend("nvidia", GoodPlugin)
    register_backend("good", GoodPlugin)
    with pytest.raises(PluginError, match="'good' is already registered"):
        register_backend("good", GoodPlugin)
    register_backend("nvidia", _unavailable("nvidia", "replaced"), clobber=True)
    assert get_backend("nvidia").available().reason == "replaced"


def test_register_accepts_module_attr_string():
    register_backend("good", f"{__name__}:GoodPlugin")
    assert get_backend("good").name == "good"


@pytest.mark.parametrize("name, factory", [("", GoodPlugin), ("has space", GoodPlugin), ("ok", 42), ("ok", "no-colon")])
def test_register_rejects_bad_arguments(name, factory):
    with pytest.raises(PluginError):
        register_backend(name, factory)


def test_registered_factory_is_validated():
    register_backend("wrongname", WrongName)
    with pytest.raises(PluginError, match="registered as 'wrongname'"):
        get_backend("wrongname")


# ---------------------------------------------------------------- discover()
def _fake_machine() -> NodeTopology:
    devs = tuple(Device(i, model="NVIDIA L40S", memory_bytes=48 << 30, numa_node=0) for i in range(4))
    links = tuple(make_link(a, b, "pcie", None, "PIX" if a // 2 == b // 2 else "NODE") for a in range(4) for b in range(a + 1, 4))
    return NodeTopology(devices=devs, links=links).validate()


def test_discover_uses_first_available_hardware_backend():
    register_backend("nvidia", lambda: NvidiaBackend(nvml=FakeNVML(_fake_machine())), clobber=True)
    register_backend("amd", _unavailable("amd", "no amdsmi"), clobber=True)
    t = discover()
    assert len(t.devices) == 4 and t.sources == ("nvml",) and t.link(0, 1).pcie == "PIX"


def test_discover_falls_through_to_plugins(plugins):
    plugins(("good", f"{__name__}:GoodPlugin"))
    register_backend("nvidia", _unavailable("nvidia", "no driver"), clobber=True)
    register_backend("amd", _unavailable("amd", "no amdsmi"), clobber=True)
    assert discover().devices[0].vendor == "acme"


def test_discover_nothing_available_lists_reasons_and_hint(plugins):
    plugins(("nodiscover", f"{__name__}:NoDiscover"))
    register_backend("nvidia", _unavailable("nvidia", "no NVIDIA driver"), clobber=True)
    register_backend("amd", _unavailable("amd", "amdsmi is not importable"), clobber=True)
    with pytest.raises(BackendUnavailable) as err:
        discover()
    msg = str(err.value)
    assert "nvidia: no NVIDIA driver" in msg and "amd: amdsmi is not importable" in msg
    assert "nodiscover:" in msg and "missing method discover()" in msg
    assert "RAYACCEL_TOPOLOGY=" in err.value.hint


def test_discover_with_rayaccel_topology_simulates(monkeypatch):
    monkeypatch.setenv("RAYACCEL_TOPOLOGY", "dgx1-v100")
    register_backend("nvidia", lambda: NvidiaBackend(nvml=FakeNVML(_fake_machine())), clobber=True)
    t = discover()
    assert len(t.devices) == 8  # the simulated DGX-1, not the fake 4-GPU box


def test_discover_named_backend():
    register_backend("nvidia", lambda: NvidiaBackend(nvml=FakeNVML(_fake_machine())), clobber=True)
    assert len(discover("nvidia").devices) == 4
    with pytest.raises(BackendError, match="unknown backend"):
        discover("nope")
