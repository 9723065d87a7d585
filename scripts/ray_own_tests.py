#!/usr/bin/env python3
"""Ray's own test files, run unchanged twice: on plain Ray nodes, then with every node they start a rayaccel node.

Ray's tests are not in its wheels: put the files (byte-identical, from a snapshot of Ray's
repository, with Ray's ``python/ray/tests/conftest.py`` or a conftest of the fixtures they use) in a
directory of their own -- never in this project -- and run::

    python scripts/ray_own_tests.py DIR [TEST ...] [--out table.md]

``TEST`` are pytest node ids relative to ``DIR`` (``test_advanced_2.py::test_gpu_ids``); none: every
``test_*.py`` there. The first run is plain pytest. The second loads this file as a pytest plugin
(``-p ray_own_tests``), which makes every node the tests start a rayaccel node, simulating the GPUs
that node was asked for:

* ``ray.init()`` that starts a local cluster -> :func:`rayaccel.init` (``num_gpus=n``: the first ``n``
  GPUs of a simulated DGX-2 (16 V100s; NVL72 beyond that), none without ``num_gpus``; a
  ``CUDA_VISIBLE_DEVICES`` preset names those devices -- UUIDs become the simulated devices' UUIDs);
  ``ray.shutdown()`` -> :func:`rayaccel.shutdown`; a connection to a running cluster stays Ray's;
* ``ray.cluster_utils.Cluster.add_node(**args)`` (the head included) -> the same call with
  :func:`rayaccel.ray.driver.cluster.managed_node_args` (resources, labels, the hook's raylet
  environment, the node's directory); once a driver connects to the cluster, each node's record goes
  to the GCS KV and its agent starts, as in :class:`rayaccel.SimulatedCluster`; ``remove_node`` and
  ``shutdown`` stop them and remove the directories.

Tests that start nodes with the ``ray start`` command line are run too but stay plain Ray nodes (the
table cannot tell them apart: select tests that start their nodes in Python).

It prints one row per test (plain / rayaccel / verdict: ``pass both``, ``fail both``, ``differ``,
``skip``), the counts, and for each difference the first line of the failure. It exits 0 when both
runs completed (whatever the verdicts), 2 when a run did not (no report from pytest).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: Outcomes as junit XML reports them, in the order a verdict reads them.
PASSED, FAILED, SKIPPED, MISSING = "passed", "failed", "skipped", "missing"


# ---------------------------------------------------------------------------------------------- report
def parse_junit(text: str) -> dict[str, tuple[str, str]]:
    """``{node id: (outcome, first line of the message)}`` from a pytest junit XML report.

    The node id is ``file.py::name`` (``file.py::Class::name`` for a test in a class), from the
    ``classname`` pytest writes (``test_file`` or ``test_file.Class``). A test whose setup or body failed
    (``failure`` / ``error``) is ``failed``; ``skipped`` is skipped (an xfail too); else ``passed``. A
    teardown error after a pass makes it ``failed`` too (pytest reports it as a second entry).

    Raises:
        ValueError: not a junit report.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ValueError(f"not a junit XML report ({e})") from None
    out: dict[str, tuple[str, str]] = {}
    for case in root.iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        parts = cls.split(".")
        # classname is the module's dotted path (a package dir adds its name), then classes (capitalised)
        k = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
        nid = "::".join(["/".join(parts[:k]) + ".py", *parts[k:], name])
        outcome, msg = PASSED, ""
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                outcome = FAILED
                msg = _first_line(el.get("message") or el.text or tag)
                break
        else:
            el = case.find("skipped")
            if el is not None:
                outcome, msg = SKIPPED, _first_line(el.get("message") or "")
        if nid in out and out[nid][0] == FAILED:
            continue  # a pass followed by a teardown error: keep the failure
        out[nid] = (outcome, msg)
    return out


#: Terminal colours in a message, raw or as junit XML escapes them (``#x1B[36m``).
_COLOUR = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")


def _first_line(text: str) -> str:
    line = next((ln.strip() for ln in _COLOUR.sub("", text).splitlines() if ln.strip()), "")
    return line[:160]


def verdict(plain: str, accel: str) -> str:
    """``pass both`` / ``fail both`` / ``differ`` / ``skip`` (skipped or missing in either run)."""
    if SKIPPED in (plain, accel) or MISSING in (plain, accel):
        return "skip"
    if plain == accel:
        return "pass both" if plain == PASSED else "fail both"
    return "differ"


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One test of both runs."""

    test: str
    plain: str
    accel: str
    plain_msg: str = ""
    accel_msg: str = ""

    @property
    def verdict(self) -> str:
        return verdict(self.plain, self.accel)


def rows(plain: dict[str, tuple[str, str]], accel: dict[str, tuple[str, str]]) -> list[Row]:
    """One :class:`Row` per test of either run, in test order (file, then as pytest ran them)."""
    order = list(dict.fromkeys([*plain, *accel]))
    return [Row(t, plain.get(t, (MISSING, ""))[0], accel.get(t, (MISSING, ""))[0], plain.get(t, ("", ""))[1],
                accel.get(t, ("", ""))[1]) for t in order]


def counts(table: list[Row]) -> dict[str, int]:
    """How many tests got each verdict (every verdict named, zeros included)."""
    out = dict.fromkeys(("pass both", "fail both", "differ", "skip"), 0)
    for r in table:
        out[r.verdict] += 1
    return out


def render(table: list[Row]) -> str:
    """The markdown table, the counts and each difference with the failing run's first message line."""
    lines = ["| test | plain Ray | rayaccel nodes | verdict |", "|---|---|---|---|"]
    lines += [f"| `{r.test}` | {r.plain} | {r.accel} | {r.verdict} |" for r in table]
    c = counts(table)
    lines += ["", ", ".join(f"{n} {v}" for v, n in c.items())]
    diff = [r for r in table if r.verdict in ("differ", "fail both")]
    if diff:
        lines += [""]
        for r in diff:
            lines.append(f"* `{r.test}` ({r.verdict}): plain: {r.plain_msg or r.plain}; "
                         f"rayaccel: {r.accel_msg or r.accel}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- runs
def run_pytest(directory: Path, tests: list[str], *, rayaccel: bool, report: Path, timeout_s: float,
               extra: list[str]) -> dict[str, tuple[str, str]]:
    """Run pytest in ``directory`` (with this file as a plugin when ``rayaccel``); the parsed report.

    Raises:
        RuntimeError: pytest wrote no report (it did not start, or ran past ``timeout_s``).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
           "-o", "junit_family=xunit1", *(["-p", "ray_own_tests"] if rayaccel else []), *extra]
    label = "rayaccel nodes" if rayaccel else "plain Ray"
    print(f"== {label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(cmd, cwd=directory, env=env, timeout=timeout_s, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        tail = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
        print(f"   {tail[0] if tail else '(no output)'}", file=sys.stderr, flush=True)
    except subprocess.TimeoutExpired:
        pass
    if not report.is_file():
        raise RuntimeError(f"{label}: pytest wrote no report (ran past {timeout_s:.0f} s or did not start)")
    return parse_junit(report.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", type=Path, help="Ray's test files (unchanged) with a conftest of their fixtures")
    ap.add_argument("tests", nargs="*", help="pytest node ids relative to DIRECTORY (default: every test_*.py)")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds per run (default 1500)")
    ap.add_argument("--pytest-arg", action="append", default=[], help="one more pytest argument (repeatable)")
    a = ap.parse_args(argv)
    d = a.directory.resolve()
    if not d.is_dir():
        print(f"error: {a.directory}: not a directory (expected the one holding Ray's test files)", file=sys.stderr)
        return 2
    if d == HERE.parent or HERE.parent in d.parents:
        print(f"error: {a.directory}: inside this project; keep Ray's test files in a scratch directory",
              file=sys.stderr)
        return 2
    tests = a.tests or sorted(p.name for p in d.glob("test_*.py"))
    if not tests:
        print(f"error: {a.directory}: no test_*.py files and no tests named", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ray-own-tests-") as tmp:
        try:
            plain = run_pytest(d, tests, rayaccel=False, report=Path(tmp, "plain.xml"), timeout_s=a.timeout,
                               extra=a.pytest_arg)
            accel = run_pytest(d, tests, rayaccel=True, report=Path(tmp, "rayaccel.xml"), timeout_s=a.timeout,
                               extra=a.pytest_arg)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    text = render(rows(plain, accel))
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0


# ------------------------------------------------------------------------- the plugin (rayaccel run only)
#: A simulated machine with at least that many GPUs (``num_gpus`` or a preset's highest index takes its first ones).
MACHINES = ((16, "dgx2-v100"), (72, "nvl72"))


def sim_topology(num_gpus: Any, visible: str | None) -> tuple[Any, Any]:
    """The simulated topology a node asked for ``num_gpus`` (with ``visible``, its ``CUDA_VISIBLE_DEVICES``)
    gets, and the ``num_gpus`` to give rayaccel (the count plain Ray would advertise on this CPU machine).

    ``visible`` naming UUIDs (not indices, not ``MIG-``) gives the machine's first devices those UUIDs;
    without ``num_gpus`` or ``visible`` the node gets no GPU (plain Ray detects none here).
    """
    from rayaccel.discovery import load_topology

    items = [v.strip() for v in (visible or "").split(",") if v.strip()]
    indices = [int(v) for v in items if v.isdigit()]
    need = max([int(float(num_gpus)) if num_gpus is not None else 0, len(items), *[i + 1 for i in indices]])
    name = next((n for cap, n in MACHINES if cap >= need), MACHINES[-1][1])
    topo = load_topology(name)
    uuids = [v for v in items if not v.isdigit() and not v.startswith("MIG-")]
    if uuids:
        devs = list(topo.devices)
        for i, u in enumerate(uuids[:len(devs)]):
            devs[i] = dataclasses.replace(devs[i], uuid=u)
        topo = dataclasses.replace(topo, devices=tuple(devs))
    if num_gpus is None and visible is None:
        num_gpus = 0
    return topo, num_gpus


class _Patches:
    """Ray's entry points routed through rayaccel while the plugin is loaded (see module docstring)."""

    def __init__(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.ray, self.Cluster = ray, Cluster
        self.orig = {"init": ray.init, "shutdown": ray.shutdown, "add_node": Cluster.add_node,
                     "remove_node": Cluster.remove_node, "cluster_shutdown": Cluster.shutdown}
        self.inside = 0  # > 0 while rayaccel itself calls ray.init / ray.shutdown
        self.nodes: dict[int, list[dict]] = {}  # id(cluster) -> its rayaccel nodes

    def install(self) -> None:
        # wraps: inspect.signature(ray.init) stays Ray's (rayaccel.init checks keywords against it)
        p = self

        @functools.wraps(self.orig["init"])
        def init(*args, **kwargs):
            return p.init(*args, **kwargs)

        @functools.wraps(self.orig["shutdown"])
        def shutdown_ray(*args, **kwargs):
            return p.shutdown(*args, **kwargs)

        self.ray.init, self.ray.shutdown = init, shutdown_ray

        def add_node(cluster, wait=True, **node_args):
            return p.add_node(cluster, wait, **node_args)

        def remove_node(cluster, node, allow_graceful=True):
            return p.remove_node(cluster, node, allow_graceful)

        def shutdown(cluster):
            return p.cluster_shutdown(cluster)

        self.Cluster.add_node, self.Cluster.remove_node, self.Cluster.shutdown = add_node, remove_node, shutdown

    def uninstall(self) -> None:
        self.ray.init, self.ray.shutdown = self.orig["init"], self.orig["shutdown"]
        self.Cluster.add_node, self.Cluster.remove_node = self.orig["add_node"], self.orig["remove_node"]
        self.Cluster.shutdown = self.orig["cluster_shutdown"]

    # -- ray.init / ray.shutdown
    def _starts_local(self, address: Any, kwargs: dict) -> bool:
        from ray._private import services

        if address is not None and not isinstance(address, str) or (address or "").startswith("ray://"):
            return False
        try:
            return services.canonicalize_bootstrap_address(address, kwargs.get("_temp_dir")) is None
        except Exception:  # noqa: BLE001 - Ray's own call reports it
            return False

    def init(self, *args: Any, **kwargs: Any) -> Any:
        address = args[0] if args else kwargs.get("address")
        if self.inside or not self._starts_local(address, kwargs):
            ctx = self.orig["init"](*args, **kwargs)
            if not self.inside:
                self._connected()
            return ctx
        import rayaccel

        kwargs.pop("address", None)
        topo, num_gpus = sim_topology(kwargs.pop("num_gpus", None), os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.inside += 1
        try:
            return rayaccel.init(None, topo, num_gpus=num_gpus, **kwargs)
        finally:
            self.inside -= 1

    def shutdown(self, *args: Any, **kwargs: Any) -> Any:
        if self.inside:
            return self.orig["shutdown"](*args, **kwargs)
        import rayaccel

        self.inside += 1
        try:
            return rayaccel.shutdown()
        finally:
            self.inside -= 1

    # -- Cluster
    def add_node(self, cluster: Any, wait: bool = True, **node_args: Any) -> Any:
        from rayaccel.ray.driver.cluster import managed_node_args

        env = node_args.get("env_vars") or {}
        visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
        topo, num_gpus = sim_topology(node_args.pop("num_gpus", None), visible)
        args, record, d = managed_node_args(topo, {**node_args, "num_gpus": num_gpus})
        handle = self.orig["add_node"](cluster, wait, **args)
        node = {"handle": handle, "record": record, "dir": d, "agent": None}
        self.nodes.setdefault(id(cluster), []).append(node)
        if self.ray.is_initialized() and cluster.address in (self.ray.get_runtime_context().gcs_address, None):
            self._start_agents([node])
        return handle

    def _connected(self) -> None:
        """A driver connected: publish and start the agents of the rayaccel nodes of its cluster."""
        gcs = self.ray.get_runtime_context().gcs_address
        for nodes in self.nodes.values():
            pending = [n for n in nodes if n["agent"] is None and _gcs_of(n["handle"]) == gcs]
            self._start_agents(pending)

    def _start_agents(self, nodes: list[dict]) -> None:
        from rayaccel.ray import _ray_private as rp, kv
        from rayaccel.ray.node import agent

        for n in nodes:
            kv.publish(n["record"])
            n["agent"] = agent.start(n["record"].node_key, n["handle"].node_id, n["dir"],
                                     raylet_pid=rp.raylet_pid(n["handle"]), wait=False)
        agent.wait_started([n["record"].node_key for n in nodes], [n["agent"] for n in nodes])

    def remove_node(self, cluster: Any, node: Any, allow_graceful: bool = True) -> Any:
        out = self.orig["remove_node"](cluster, node, allow_graceful)
        for n in [n for n in self.nodes.get(id(cluster), []) if n["handle"] is node]:
            self._forget(cluster, n)
        return out

    def cluster_shutdown(self, cluster: Any) -> Any:
        out = self.orig["cluster_shutdown"](cluster)
        for n in list(self.nodes.get(id(cluster), [])):
            self._forget(cluster, n)
        return out

    def _forget(self, cluster: Any, n: dict) -> None:
        from rayaccel.ray.node import agent, nodedir

        agent.stop(n["agent"])
        nodedir.remove(n["dir"])
        self.nodes[id(cluster)].remove(n)


def _gcs_of(handle: Any) -> str | None:
    return getattr(handle, "gcs_address", None)


_PATCHES: list[_Patches] = []


def pytest_configure(config: Any) -> None:  # noqa: ARG001 - pytest's hook signature
    """Loaded as a plugin (``-p ray_own_tests``): route Ray's node starts through rayaccel."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    p = _Patches()
    p.install()
    _PATCHES.append(p)


def pytest_unconfigure(config: Any) -> None:  # noqa: ARG001
    while _PATCHES:
        _PATCHES.pop().uninstall()


if __name__ == "__main__":
    sys.exit(main())
