"""``rayaccel plan --bundles``: the placement map a node's arbiter would give a placement group (dry run, no Ray).

The map comes from :func:`rayaccel.arbiter.groupmap.dry_run` (the arbiter's own reservation of a group's
devices, :func:`rayaccel.arbiter.decide.reserve_group`, on a fresh state with the busy devices held), the
rank order from :func:`rayaccel.placement.ranks.rank_order` over :func:`~rayaccel.arbiter.groupmap.rank_sites`
-- what :func:`rayaccel.placement_map` and :func:`rayaccel.rank_order` use on a live group.
"""

from __future__ import annotations

import json
from typing import Any, Collection

import typer

from ..errors import RequestError
from ._common import MAX_INDEX_TEXT, console, fail, print_json

#: Most bundles ``--bundles`` may name.
MAX_BUNDLES = 1024
#: What ``--bundles`` reads (its help and its error lines).
BUNDLES_SYNTAX = ("NxK (N bundles of K GPUs, e.g. 4x2), GPU counts per bundle (2,2,4; 1x4,2x2) or a JSON list "
                  "of bundles ('[{\"GPU\": 2}, {\"GPU\": 2}]')")
#: The options ``--bundles`` does not combine with (the arbiter reserves a group's devices by its bundles alone).
NOT_WITH_BUNDLES = ("--gpus", "--mig", "--gpu-memory", "--shared", "--required", "--near", "--interconnect",
                    "--same-numa", "--nic")


def parse_bundles(text: str) -> list[dict[str, Any]]:
    """The bundles of ``--bundles`` (:data:`BUNDLES_SYNTAX`) as Ray's bundle dicts (``[{"GPU": 2.0}, ...]``).

    Raises:
        RequestError: (field ``--bundles``) unreadable, too long, more than :data:`MAX_BUNDLES` bundles, or a JSON
            value that is not a list of objects.
    """
    text = (text or "").strip()
    if not text:
        raise RequestError(f"empty; expected {BUNDLES_SYNTAX}", "--bundles")
    if len(text) > MAX_INDEX_TEXT:
        raise RequestError(f"{len(text)} characters, at most {MAX_INDEX_TEXT}", "--bundles")
    if text.startswith("["):
        try:
            got = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise RequestError(f"not valid JSON ({str(e)[:80]}); expected {BUNDLES_SYNTAX}", "--bundles") from None
        if not isinstance(got, list) or not all(isinstance(b, dict) for b in got):
            raise RequestError(f"a JSON value that is not a list of objects; expected {BUNDLES_SYNTAX}", "--bundles")
        if len(got) > MAX_BUNDLES:
            raise RequestError(f"{len(got)} bundles; give at most {MAX_BUNDLES}", "--bundles")
        return got
    out: list[dict[str, Any]] = []
    for part in text.split(","):
        part = part.strip().lower()
        n_s, x, k_s = part.partition("x")
        n_s, k_s = (n_s.strip(), k_s.strip()) if x else ("1", n_s.strip())
        if not (n_s.isdecimal() and k_s.isdecimal()) or len(n_s) > 6 or len(k_s) > 6:
            raise RequestError(f"cannot read {part[:40]!r}; expected {BUNDLES_SYNTAX}", "--bundles")
        n = int(n_s)
        if n < 1:
            raise RequestError(f"{part!r} names no bundle; expected N >= 1 in NxK", "--bundles")
        if len(out) + n > MAX_BUNDLES:
            raise RequestError(f"more than {MAX_BUNDLES} bundles; give at most {MAX_BUNDLES}", "--bundles")
        out += [{"GPU": float(k_s)} for _ in range(n)]
    return out


def plan_bundles(topo: Any, text: str, busy: Collection[int], group_size: int | None, as_json: bool) -> None:
    """Print the map and rank order of a group of ``text``'s bundles on ``topo`` (``--json``: as data).

    Exits 2 with one ``error:`` line for bad bundles (:func:`parse_bundles`,
    :func:`~rayaccel.arbiter.groupmap.dry_run`) or a ``--group-size`` that does not divide them; 1 when the
    arbiter would reserve nothing.
    """
    from ..arbiter.groupmap import dry_run, rank_sites
    from ..placement.ranks import rank_order
    from ..ray.record import node_spec

    try:
        bundles = parse_bundles(text)
        m, why = dry_run(topo, bundles, busy, spec=node_spec(topo))
    except RequestError as e:
        fail(f"--{e}" if e.field == "bundles" else str(e))
    k = 1 if group_size is None else group_size
    if k < 1:
        fail(f"--group-size: {k} ranks per group; give a positive number (the tensor-parallel size)")
    if len(bundles) % k:
        divisors = [d for d in range(1, len(bundles) + 1) if len(bundles) % d == 0]
        fail(f"--group-size: {k} does not divide the group's {len(bundles)} bundles; give one of "
             f"{', '.join(map(str, divisors))}")
    ro = rank_order(rank_sites(m), k, {b.node_id: topo for b in m.bundles}) if why is None else None
    if as_json:
        print_json({"topology": topo.name, "busy": sorted(busy), "ok": why is None, "why": why, "map": m.to_dict(),
                    "rank_order": ro.to_dict() if ro is not None else None})
    else:
        from .placements import placement_map_view, rank_order_table

        gpus = sum(len(b.devices) for b in m.bundles)
        title = (f"placement map on {topo.name} (dry run: all {len(m)} bundles placed on this machine, {gpus} GPUs"
                 + (f", busy {','.join(map(str, sorted(busy)))}" if busy else "") + ")")
        md = m.to_dict()
        for item in placement_map_view(md, title, node=False):
            console.print(item)
        if ro is not None:
            console.print(rank_order_table(ro.to_dict(), md))
        else:
            console.print(f"no map: {why}", markup=False)
    if why is not None:
        raise typer.Exit(1)
