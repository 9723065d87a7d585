"""The node's contract: formats other processes read carry their id, and readers refuse ids they do not know."""

from __future__ import annotations

import json

import pytest

from rayaccel import catalog, contract
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.state import Snapshot, decode_snapshot, encode_snapshot
from rayaccel.arbiter.table import decode_table, encode_table
from rayaccel.errors import StateError, TopologyError
from rayaccel.ray.record import NodeRecord

KEY = "0123456789ab"


def _record() -> NodeRecord:
    return NodeRecord(KEY, catalog.load("dgx1-v100"), True)


def test_every_format_names_itself_and_reads_back():
    rec = json.loads(_record().to_json())
    assert rec["schema"] == contract.RECORD_SCHEMA
    assert NodeRecord.from_json(_record().to_json()).node_key == KEY
    snap = Snapshot(at=1.0, node_key=KEY, free=(0, 1))
    assert json.loads(encode_snapshot(snap))["schema"] == contract.SNAPSHOT_SCHEMA
    assert decode_snapshot(encode_snapshot(snap), "kv").free == (0, 1)
    raw = encode_table(build_table(catalog.load("dgx1-v100"), KEY, True, None))
    assert json.loads(raw)["schema"] == contract.TABLE_SCHEMA and decode_table(raw).node_key == KEY


@pytest.mark.parametrize("kind", ["record", "snapshot", "table"])
def test_a_format_this_release_does_not_know_is_refused_by_name(kind):
    if kind == "record":
        d = json.loads(_record().to_json())
        d["schema"] = "rayaccel.record/9"
        with pytest.raises(TopologyError, match=r"rayaccel.record/9.*reads 'rayaccel.record/1'"):
            NodeRecord.from_json(json.dumps(d), where="kv:topology/x")
    elif kind == "snapshot":
        d = json.loads(encode_snapshot(Snapshot(at=1.0, node_key=KEY, free=())))
        d["schema"] = "rayaccel.snapshot/2"
        with pytest.raises(StateError, match="rayaccel.snapshot/2"):
            decode_snapshot(json.dumps(d), "kv")
    else:
        d = json.loads(encode_table(build_table(catalog.load("dgx1-v100"), KEY, True, None)))
        d.pop("schema")
        with pytest.raises(StateError, match="reads 'rayaccel.table/1'"):
            decode_table(json.dumps(d).encode())


def test_records_and_snapshots_of_the_release_before_format_ids_still_read():
    d = json.loads(_record().to_json())
    d.pop("schema")
    assert NodeRecord.from_json(json.dumps(d)).node_key == KEY
    s = json.loads(encode_snapshot(Snapshot(at=1.0, node_key=KEY, free=(3,))))
    s.pop("schema")
    assert decode_snapshot(json.dumps(s), "kv").free == (3,)


@pytest.mark.parametrize("raw, why", [(b"x" * 200, "at most 100"), (b"[" * 100_000, "nested too deeply|not JSON"),
                                      (b"{", "not JSON"), (b"[1]", "must be a JSON object")])
def test_the_one_guarded_loader_names_what_was_wrong(raw, why):
    with pytest.raises(StateError, match=why):
        contract.load_json(raw[:200] if b"x" in raw else raw, what="thing", max_bytes=100 if b"x" in raw else 1 << 20,
                           error=StateError)


def test_devices_variable_round_trips_and_reads_the_old_json_form():
    assert contract.format_devices([3, 0]) == "3,0"
    assert contract.parse_devices("3,0") == (3, 0) and contract.parse_devices("[3, 0]") == (3, 0)
    assert contract.parse_devices(None) is None and contract.parse_devices("a,b") is None
