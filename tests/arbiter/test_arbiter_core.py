"""The arbiter's core: the pure decision, the node table, the typed formats, the lock.

These hold what issue "A lean hook and a plain arbiter" asks: the decision is a pure
function tests call directly; the table's precomputed plans answer exactly as the
placer would; nothing remote happens under the node lock (the decision names the
groups to ask about instead); a stuck lock holder is named; the shared formats have
one typed definition with their validation; device states are classified once.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest

from rayaccel import catalog, contract
from rayaccel.arbiter import statefile
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.choose import TableChooser
from rayaccel.arbiter.decide import GrantRequest, decide, forget_groups, memberless_groups
from rayaccel.arbiter.placer import PlacerChooser
from rayaccel.arbiter.state import (STATES, Drain, Snapshot, SnapshotHolder, decode_snapshot, decode_state,
                                    device_state, encode_snapshot, encode_state, fresh_state, snapshot_of)
from rayaccel.arbiter.statefile import Arbiter, LockTimeout
from rayaccel.arbiter.table import PLAN_MAX, decode_table, encode_table
from rayaccel.errors import StateError
from rayaccel.placement.pools import gpu_pool
from rayaccel.topology import NodeTopology

KEY = "0123456789ab"
SMALL = ["dgx1-v100", "hgx-h100", "pcie-8gpu-2socket", "l40s-4x-pcie", "a100-pcie-2x-nvbridge", "mi300x-8x",
         "gb200-nvl4"]


def _gpu(*slots):
    return {"GPU": tuple((s, 1.0) for s in slots)}


# ------------------------------------------------------------------ the pure decision
def test_decide_is_a_pure_function_of_state_request_and_table():
    topo = catalog.load("dgx1-v100")
    table = build_table(topo, KEY, True)
    st = fresh_state(table.pools())
    chooser = TableChooser(table, lambda: topo)
    req = GrantRequest(pid=7, key="task:a", slots=_gpu(0, 1))
    new1, g1 = decide(st, req, table, chooser=chooser, alive=lambda p: True, now=1.0)
    new2, g2 = decide(st, req, table, chooser=chooser, alive=lambda p: True, now=1.0)
    assert st == fresh_state(table.pools())  # the input is untouched
    assert (new1, g1) == (new2, g2)
    assert 7 in new1.holders and new1.holders[7].slots == {"GPU": ((0, 1.0), (1, 1.0))}
    assert sorted(g1.devices) in ([0, 3], [1, 2], [4, 7], [5, 6])  # an NV2 pair, not Ray's 0,1


def test_a_reservation_in_the_way_is_named_not_resolved_under_the_lock():
    topo = catalog.load("dgx1-v100")
    table = build_table(topo, KEY, True)
    chooser = TableChooser(table, lambda: topo)
    st = fresh_state(table.pools())
    st, _ = decide(st, GrantRequest(pid=1, key="a", slots=_gpu(0), pg="ab", bundle=0,
                                    pg_bundles={b: 1.0 for b in range(8)}), table, chooser=chooser,
                   alive=lambda p: True, now=1.0)
    st, _ = decide(st, GrantRequest(pid=1, key="b"), table, chooser=chooser, alive=lambda p: True, now=2.0)
    assert memberless_groups(st) == {"ab"}
    _, g = decide(st, GrantRequest(pid=2, key="c", slots=_gpu(1)), table, chooser=chooser, alive=lambda p: True,
                  now=3.0)
    assert g.waiting and g.blocked_by == {"ab"}
    st2, dropped = forget_groups(st, {"ab"})
    assert dropped == ["ab"] and not st2.pgs


def test_the_arbiter_asks_nobody_while_it_holds_the_lock(tmp_path, monkeypatch):
    """The hook asks Ray about blocking groups between grants, never inside one (a slow GCS stalls no grant)."""
    from rayaccel.ray import _ray_private as rp
    from rayaccel.ray.worker import hook
    topo = catalog.load("dgx1-v100")
    table = build_table(topo, KEY, True)
    arb = Arbiter(tmp_path, table, topology=topo, alive=lambda p: p in (1, 2))
    probe = Arbiter(tmp_path, table, topology=topo)
    arb.grant(GrantRequest(pid=1, key="a", slots=_gpu(0), pg="cd", bundle=0, pg_bundles={b: 1.0 for b in range(8)}))
    arb.grant(GrantRequest(pid=1, key="b"))
    asked = []

    def gcs(pg, node, resource="GPU"):
        probe.read(timeout_s=0)  # raises LockTimeout if anyone holds the node lock now
        asked.append(pg)
        return None  # the group is gone

    monkeypatch.setattr(rp, "pg_bundles_on_node", gcs)

    class _NS:
        arbiter = arb

    g = hook._grant_waiting(_NS(), GrantRequest(pid=2, key="c", slots=_gpu(1)))
    assert asked == ["cd"] and g.waiting is None and not arb.read().pgs


# ------------------------------------------------------------------ the node table
@pytest.mark.parametrize("machine", SMALL + ["gaudi2-hls2-8x", "atlas-800-910a-8x"])
def test_the_tables_plans_answer_exactly_as_the_placer(machine):
    """Every plain question a grant can ask of an 8-device pool: the table answers as the placer does
    (GPUs by allocate; Gaudi modules and Ascend NPUs, device units, by choose_units)."""
    from rayaccel.ray.record import node_spec

    topo = catalog.load(machine)
    spec = node_spec(topo)
    table = build_table(topo, KEY, True, spec)
    res = spec.resource
    pool = table.resources[res].units
    assert len(pool) <= PLAN_MAX and table.resources[res].plans is not None
    fast = TableChooser(table, lambda: topo)
    slow = PlacerChooser(topo, {res: spec} if res != "GPU" else None)
    for m in range(1, 1 << len(pool)):
        avail = frozenset(pool[i] for i in range(len(pool)) if m >> i & 1)
        for k in range(1, len(avail) + 1):
            assert fast.choose(res, avail, k, None) == slow.choose(res, avail, k, None), (m, k)
            if k > 1:
                sizes = {b: 1 for b in range(k)}
                assert fast.gang(res, avail, sizes) == slow.gang(res, avail, sizes), (m, k)
    assert fast.placed == 0


def test_table_round_trips_and_names_its_units():
    topo = catalog.load("a100-mig")
    t = build_table(topo, KEY, False)
    back = decode_table(encode_table(t))
    assert back == t
    mig = [r for r in t.resources if r.startswith("mig_")]
    assert mig and all(t.resources[r].kind == "mig" for r in mig)
    unit = t.resources[mig[0]].units[0]
    assert t.resources[mig[0]].uuid_of[unit].startswith("MIG-")
    with pytest.raises(StateError):
        decode_table(b'{"schema": "rayaccel.table/1", "resources": {"GPU": {"units": [0], "devices": []}}}')


def test_the_pool_is_defined_once_partitions_without_mig_mode_are_not_in_it():
    """Regression: placement checked only mig_mode, the arbiter partitions too; a node then offered device 0."""
    d = catalog.load("a100-mig").to_dict()
    for dev in d["devices"]:
        dev["mig_mode"] = None
    topo = NodeTopology.from_dict(d)
    assert gpu_pool(topo) == ()
    assert build_table(topo, KEY, True).resources["GPU"].units == ()


# ------------------------------------------------------------------ the lock
def _hold_lock(node_dir, seconds):
    code = textwrap.dedent(f"""
        import sys, time
        from rayaccel import catalog
        from rayaccel.arbiter.build import build_table
        from rayaccel.arbiter.statefile import Arbiter
        a = Arbiter({str(node_dir)!r}, build_table(catalog.load("dgx1-v100"), "0123456789ab", True))
        with a._locked():
            print("held", flush=True)
            time.sleep({seconds})
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_stuck_lock_holder_is_named_and_grants_wait_then_proceed(tmp_path, monkeypatch, caplog):
    topo = catalog.load("dgx1-v100")
    arb = Arbiter(tmp_path, build_table(topo, KEY, True), topology=topo)
    holder = _hold_lock(tmp_path, 1.5)
    try:
        time.sleep(0.2)
        info = arb.lock_info(held_over_s=0.1)
        assert info is not None and info.pid == holder.pid and "python" in info.what
        with pytest.raises(LockTimeout) as e:
            arb.read(timeout_s=0.2)
        assert str(holder.pid) in str(e.value) and e.value.holder.pid == holder.pid
        monkeypatch.setattr(statefile, "LOCK_WARN_S", 0.3)
        with caplog.at_level(logging.WARNING, logger="rayaccel.arbiter.statefile"):
            g = arb.grant(GrantRequest(pid=os.getpid(), key="task:x", slots=_gpu(0)))
        assert g.waiting is None and g.devices
        warned = [r.getMessage() for r in caplog.records if "node lock" in r.getMessage()]
        assert len(warned) == 1 and f"pid {holder.pid}" in warned[0]
    finally:
        holder.wait(10)
    assert arb.lock_info(held_over_s=0.0) is None


# ------------------------------------------------------------------ the formats
@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "empty"])
def test_a_damaged_state_file_is_refused_with_why(tmp_path, damage):
    topo = catalog.load("dgx1-v100")
    table = build_table(topo, KEY, True)
    arb = Arbiter(tmp_path, table, topology=topo, alive=lambda p: True)
    arb.grant(GrantRequest(pid=3, key="t", slots=_gpu(0, 1)))
    raw = (tmp_path / "arbiter.state").read_bytes()
    bad = {"truncate": raw[:-3], "flip": raw[:20] + bytes([raw[20] ^ 0xFF]) + raw[21:], "magic": b"XXXX" + raw[4:],
           "empty": b""}[damage]
    with pytest.raises(StateError):
        decode_state(bad, table.pools())
    (tmp_path / "arbiter.state").write_bytes(bad)
    st = arb.read()
    assert st.resets == 1 and not st.holders and "arbiter.state" in st.reset_reason


def test_state_round_trips_exactly():
    topo = catalog.load("dgx1-v100")
    table = build_table(topo, KEY, True)
    chooser = TableChooser(table, lambda: topo)
    st = fresh_state(table.pools())
    for pid, slots in ((1, _gpu(0)), (2, {"GPU": ((1, 0.25),)}), (3, _gpu(2, 3))):
        st, _ = decide(st, GrantRequest(pid=pid, key=f"task:{pid}", slots=slots, info={"name": "f", "kind": "task"}),
                       table, chooser=chooser, alive=lambda p: True, now=1000.0 + pid)
    st = st._replace(drained={5: Drain("Xid 79", 12.5, "health")})
    assert decode_state(encode_state(st), table.pools()) == st


def test_snapshot_round_trips_and_bad_fields_are_named():
    s = Snapshot(at=5.0, node_key=KEY, free=(1, 2), holders=(SnapshotHolder(9, "f", "task", "01", "ab", 1.0, (0,), (),
                                                                               False, None, None, None, None),),
                 drained={3: Drain("x", 1.0, "operator")}, shared={4: 0.25}, decisions=((1.0, 20.0, (0,), 0),))
    assert decode_snapshot(encode_snapshot(s), "n") == s
    for bad, field in (('{"free": "all"}', "free"), ('{"free": [0], "holders": [{"pid": "x"}]}', "holders[].pid"),
                       ('{"free": [0], "lock": {"pid": true}}', "lock"), ('{"free": [0], "shared": {"a": 1}}', "shared")):
        with pytest.raises(StateError, match=field.replace("[", r"\[").replace("]", r"\]")):
            decode_snapshot(bad, "node n")


def test_device_states_are_classified_once_failed_is_failed():
    """Regression: metrics exported a failed device as busy while status said failed."""
    d = catalog.load("dgx1-v100").to_dict()
    d["devices"][7]["health"] = "failed"
    topo = NodeTopology.from_dict(d)
    table = build_table(topo, KEY, True)
    chooser = TableChooser(table, lambda: topo)
    st = fresh_state(table.pools())
    st, g = decide(st, GrantRequest(pid=1, key="a", slots=_gpu(0)), table, chooser=chooser, alive=lambda p: True,
                   now=1.0)
    st, s = decide(st, GrantRequest(pid=2, key="b", slots={"GPU": ((1, 0.5),)}), table, chooser=chooser,
                   alive=lambda p: True, now=1.0)
    st = st._replace(drained={6: Drain("r", 1.0, "operator")})
    snap = snapshot_of(st, table.device_of, at=2.0)
    pool, parts = frozenset(gpu_pool(topo)), frozenset()
    states = {i: device_state(i, snap, pool=pool, partitioned=parts) for i in topo.indices}
    assert states[7] == "failed" and states[6] == "drained"
    assert states[g.devices[0]] == "busy" and states[s.devices[0]] == "shared"
    assert set(states.values()) <= set(STATES)


def test_metrics_export_the_same_states_as_status(monkeypatch):
    from rayaccel.ray.node import metrics
    recorded: dict = {}

    class Rec:
        def __init__(self, name, *a, **k):
            self.name = name

        def set(self, v, tags):
            recorded[(self.name, tuple(sorted(tags.items())))] = v

        observe = inc = set

    for cls in ("Gauge", "Counter", "Histogram"):
        monkeypatch.setattr(f"ray.util.metrics.{cls}", Rec)
    d = catalog.load("dgx1-v100").to_dict()
    d["devices"][7]["health"] = "failed"
    topo = NodeTopology.from_dict(d)

    class Agent:
        node_key = KEY
        record = type("R", (), {"topology": topo, "dynamic_mig": ()})()
        last = Snapshot(at=1.0, free=(0, 1, 2, 3, 4, 5))

    metrics.Exporter(Agent())(Agent())
    state_of = {int(dict(t)["device"]): dict(t)["state"] for (n, t), v in recorded.items()
                if n.endswith("device_state") and v == 1.0}
    assert state_of[7] == "failed" and state_of[6] == "busy" and state_of[0] == "free"


# ------------------------------------------------------------------ the worker's start-up
def _run(code: str, env: dict) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_hook_imports_no_topology_and_no_placer(tmp_path):
    out = _run("""
        import sys, ray
        import rayaccel.ray.worker.hook
        heavy = sorted(m for m in sys.modules if m.startswith(("rayaccel.topology", "rayaccel.placement",
                                                              "rayaccel.discovery", "rayaccel.catalog")))
        print(heavy)
    """, {"RAYACCEL_NODE_DIR": str(tmp_path)})
    assert out.strip() == "[]"


def test_a_first_grant_the_table_answers_loads_no_placer(tmp_path):
    topo = catalog.load("dgx1-v100")
    (tmp_path / "table.json").write_bytes(encode_table(build_table(topo, KEY, True)))
    out = _run("""
        import os, sys, ray
        import rayaccel.ray.worker.hook as h
        from rayaccel.arbiter.decide import GrantRequest
        ns = h.node()
        g = ns.arbiter.grant(GrantRequest(pid=os.getpid(), key="task:1", slots={"GPU": ((0, 1.0), (1, 1.0))}))
        import json
        print(json.dumps([sorted(g.devices), ns.arbiter.chooser.answered, "rayaccel.placement" in sys.modules,
                          "rayaccel.topology" in sys.modules]))
    """, {"RAYACCEL_NODE_DIR": str(tmp_path)})
    devs, answered, placer, topo_loaded = json.loads(out)
    assert len(devs) == 2 and answered == 1 and not placer and not topo_loaded, out


def test_the_agent_and_status_name_a_stuck_lock_holder(tmp_path, monkeypatch):
    """The agent never blocks on a stuck lock: it publishes its last snapshot with the holder named."""
    from rayaccel.contract import TABLE_FILE
    from rayaccel.cli.views import status_tables
    from rayaccel.ray.node import agent as agent_mod
    from rayaccel.ray.driver import status
    from rayaccel.ray.record import NodeRecord

    topo = catalog.load("dgx1-v100")
    (tmp_path / "record.json").write_text(NodeRecord(KEY, topo, True).to_json())
    (tmp_path / TABLE_FILE).write_bytes(encode_table(build_table(topo, KEY, True)))
    monkeypatch.setattr(agent_mod, "LOCK_TIMEOUT_S", 0.2)
    body = agent_mod.NodeAgent(KEY, str(tmp_path))
    assert body.tick(publish=False).lock is None
    holder = _hold_lock(tmp_path, 1.5)
    try:
        snap = body.tick(publish=False)
    finally:
        holder.wait(10)
    assert snap.lock is not None and snap.lock.pid == holder.pid

    class NodeView:
        node_id, node_key, topology, gpus_available, labels = "n" * 12, KEY, topo, 8.0, {}
        record = NodeRecord(KEY, topo, True)

    row = status._node_row(NodeView(), snap, "answered", time.time())
    assert row["lock"]["pid"] == holder.pid
    from rich.console import Console

    console = Console(width=200, record=True)
    for x in status_tables({"nodes": [row], "bad": [], "unmanaged": []}):
        console.print(x)
    assert f"pid {holder.pid}" in console.export_text()


@pytest.mark.parametrize("machine", ["dgx1-v100", "nvl72"])
def test_a_rehearsal_saves_nothing_counts_nothing_and_loads_no_placer(tmp_path, machine):
    topo = catalog.load(machine)
    loaded = []
    arb = Arbiter(tmp_path, build_table(topo, "0" * 12, True), topology=lambda: loaded.append(1) or topo)
    arb.rehearse("GPU")
    arb.rehearse("no_such_resource")
    assert not (tmp_path / contract.STATE_FILE).exists() and not loaded
    assert (arb.chooser.answered, arb.chooser.placed) == (0, 0)
    g = arb.grant(GrantRequest(pid=os.getpid(), key="task:1", slots={"GPU": ((0, 1.0),)}))
    before = (tmp_path / contract.STATE_FILE).read_bytes()
    arb.rehearse("GPU")  # on a node with holders too: the state file is untouched
    assert (tmp_path / contract.STATE_FILE).read_bytes() == before and len(g.devices) == 1


def test_a_rehearsal_never_waits_for_the_node_lock(tmp_path):
    """Worker start takes no node-wide lock: a rehearsal while another process holds the lock returns."""
    import fcntl
    import threading

    topo = catalog.load("dgx1-v100")
    arb = Arbiter(tmp_path, build_table(topo, "0" * 12, True))
    fd = os.open(tmp_path / contract.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    child = os.fork()
    if child == 0:  # another process holds the node's lock until killed
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"x")
        time.sleep(60)
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while os.fstat(fd).st_size == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        done = threading.Event()
        threading.Thread(target=lambda: (arb.rehearse("GPU"), done.set()), daemon=True).start()
        assert done.wait(20), "a rehearsal waited for the node lock another process holds"
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
        os.close(fd)


def test_a_new_worker_starts_while_another_process_holds_the_node_lock(tmp_path):
    """Worker start takes no node-wide lock: the whole hook installs (table read, the arbiter's files opened, a
    grant rehearsed, the releaser started) in a fresh process while this one holds the node's lock."""
    import fcntl

    (tmp_path / contract.TABLE_FILE).write_bytes(encode_table(build_table(catalog.load("dgx1-v100"), KEY, True)))
    child = textwrap.dedent("""
        import json
        from rayaccel.ray import _ray_private as rp
        from rayaccel.ray.worker import hook
        ns = hook._W.node
        print(json.dumps([ns is not None and ns.gpus, rp._PATCHED, hook._W.release_event is not None]))
    """)
    env = {**os.environ, contract.NODE_DIR_ENV: str(tmp_path)}
    fd = os.open(tmp_path / contract.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    finally:
        os.close(fd)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [True, True, True]
    assert not (tmp_path / contract.STATE_FILE).exists()
