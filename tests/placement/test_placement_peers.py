"""The peers' own test cases, run on rayaccel: never worse, every required-device case answered.

The cases are data in ``tests/peers/*.json`` (go-gpuallocator's table tests and
test nodes, its open PR #24's 8x A10 node, HAMi's and the ROCm device plugin's
topology cases), each with its source file and test name. For each case
rayaccel places the request on the peer's node with the devices outside
``available`` busy, and is compared with the peer's expected set on the
weakest link, the peer's own link weights and the modeled all-reduce (for one
device: on what the choice leaves; see :mod:`peer_suites`). Where rayaccel's
set differs, the case records rayaccel's set and says why it is better; the
test checks both. ``python benchmarks/placement_peers.py`` prints the counts.
"""

from __future__ import annotations

import pytest

import peer_suites as P

CASES = P.cases()


@pytest.mark.parametrize("suite,case", CASES, ids=[P.case_id(s, c) for s, c in CASES])
def test_peer_case(suite, case):
    out = P.run(suite, case)
    verdict = P.verdict(suite, case, out)
    assert verdict != "refuses", f"rayaccel refuses what {suite['source']} answers: {out.refused}"
    if verdict in ("identical", "both refuse"):
        assert "rayaccel" not in case and "why" not in case, "the case says rayaccel differs, but it does not"
        return
    # rayaccel answers differently: the case records that answer and why it is better
    assert case.get("rayaccel") == list(out.devices), f"rayaccel now answers {list(out.devices)}:\n{out.explain}"
    assert case.get("why"), "a differing case must say why rayaccel's set is better"
    assert set(case["required"]) <= set(out.devices) and len(out.devices) == case["size"]
    if verdict == "differs":
        cmp = P.compare(suite, case, out.devices)
        worse = [k for k, v in cmp.items() if v < 0]
        assert not worse, f"worse than {suite['source']} on {worse}:\n{out.explain}"
        assert any(v > 0 for v in cmp.values()), f"differs but is better on no measure: {cmp}"


@pytest.mark.parametrize("suite,case", [(s, c) for s, c in CASES if c["required"]],
                         ids=[P.case_id(s, c) for s, c in CASES if c["required"]])
def test_every_required_device_case_is_answered(suite, case):
    """A set holding the required devices, or a refusal that names why (a Rejection or a RequestError)."""
    out = P.run(suite, case)
    if out.devices is not None:
        assert set(case["required"]) <= set(out.devices)
    else:
        assert "required" in out.refused, out.refused


def test_counts_never_worse():
    counts = P.summary()
    for source, c in counts.items():
        assert c["worse"] == 0 and c["refuses"] == 0, (source, c)
        assert c["required answered"] == c["required cases"], (source, c)
    total = sum(c["cases"] for c in counts.values())
    assert total >= 150, counts


def test_every_case_names_its_source_and_every_node_imports():
    for suite in P.suites():
        assert suite["source"] and suite["commit"] and suite["what"]
        for name in suite["nodes"]:
            topo = P.topology(suite, name)
            assert len(topo.devices) == suite["nodes"][name]["devices"]
        for case in suite["cases"]:
            assert case["file"] and case["test"] and case["node"] in suite["nodes"]
