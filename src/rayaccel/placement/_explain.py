"""Stage 4 of a node's decision, the explanation: which criterion decided, and the sentences that say why.

Each tie-break (:mod:`._tiebreak`) reports a :class:`Cut`: the sets it kept and,
when it set some apart, its criterion with two sentences -- one for when it is the
first to decide (``"decided by: ..."``), one for when an earlier criterion already
did and this one chose among the sets left (``"then: ..."``). :func:`explain` puts
them in order and, when no tie-break decided, says what did: the score itself
(the first criterion on which the chosen set beats the best runner-up), the lowest
indices among equal sets, or that only one set met the request. Sentences may be
zero-argument callables, written only when the allocation is materialized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ._index import TopoIndex
from .search import EXACT_UP_TO

#: How the criteria are named in the sentences (index 4: criterion 5, the PCIe paths).
CRITERIA = ("criterion 1 (weakest link)", "criterion 2 (total pair bandwidth)", "criterion 3 (NUMA nodes)",
            "criterion 3 (devices near an RDMA NIC)",
            "criterion 5 (PCIe path under the links: same switch > same root complex > same socket)")


@dataclass(slots=True)
class Cut:
    """What one tie-break did.

    Attributes:
        kept: the sets (masks) it kept.
        criterion: its name for ``Allocation.decided_by`` (``"near"``, ``"criterion 4"``,
            ``"criterion 5"``) when it set some sets apart, else None.
        first: the sentence when it is the first stage to decide (str or zero-argument callable).
        then: the sentence when an earlier stage decided.
        dropped: sets it set apart that are shown as runners-up (near).
        quality: criterion 4 of the sets it compared, ``{mask: quality}`` (fragmentation).
    """

    kept: list[int]
    criterion: str | None = None
    first: Any = None
    then: Any = None
    dropped: list[int] = field(default_factory=list)
    quality: dict = field(default_factory=dict)


def explain(ix: TopoIndex, cuts: list[Cut], chosen: int, left: int, n_tied: int, cap: int, sigs: dict | None,
            res) -> tuple[str, list]:
    """(``decided_by``, the sentences) of a decision.

    Args:
        ix: the topology index. cuts: the tie-breaks that set sets apart, in order.
        chosen: the chosen set. left: how many sets were equal on every criterion (the
            last tie-break, lowest indices, chose among them). n_tied: how many sets tied on
            criteria 1-3 (after ``near``). cap: the search's tie cap. sigs: the symmetry
            classes, or None. res: the search result.
    """
    why: list = []
    decided = None
    for cut in cuts:
        if decided is None:
            decided = cut.criterion
            why.append(cut.first)
        else:
            why.append(cut.then)
    if decided is not None and left > 1:
        why.append(f"then: tie: lowest indices ({left} sets left equal on every criterion)")
    if decided is None:
        if n_tied > 1:
            decided = "tie: lowest indices"
            extra = "" if ix.n <= EXACT_UP_TO else f"; criterion 4 is computed up to {EXACT_UP_TO} devices"
            cap_note = "+" if n_tied >= cap else ""
            if sigs is not None:
                extra += f"; {len(sigs)} symmetry classes"
            why.append(f"decided by: tie: lowest indices ({n_tied}{cap_note} sets equal on every criterion{extra})")
        elif res.runners:
            decided = criterion_of(res.key, res.runners[0][0])
            why.append(partial(_why_criteria, ix, chosen, res.key, res.runners[0]))
        else:
            decided = "only set"
            why.append("decided by: the only set that meets the request")
    return decided, why


def criterion_of(key: tuple, rkey: tuple) -> str:
    """The first criterion on which ``key`` differs from ``rkey`` (packed search keys)."""
    for i, (a, b) in enumerate(zip(key, rkey)):
        if a != b:
            return ("criterion 1", "criterion 2", "criterion 3", "criterion 3")[i] if i < 4 else "criterion 5"
    return "tie: lowest indices"


def _why_criteria(ix: TopoIndex, chosen: int, key: tuple, runner: tuple) -> str:
    """``"decided by: ..."``: the first criterion on which ``chosen`` beats the best runner-up, with the numbers."""
    rkey, rmask = runner
    devs = list(ix.devices_of(rmask))
    for i, (a, b) in enumerate(zip(key, rkey)):
        if a == b:
            continue
        if i == 0:
            line = f"{CRITERIA[0]}: {weakest_label(ix, chosen)} vs {weakest_label(ix, rmask)} in runner-up {devs}"
        elif i == 1:
            line = f"{CRITERIA[1]}: {a / 1000:g} vs {b / 1000:g} GB/s for runner-up {devs}"
        elif i == 2:
            line = f"{CRITERIA[2]}: {-a} vs {-b} for runner-up {devs}"
        elif i == 3:
            line = f"{CRITERIA[3]}: {a} vs {b} for runner-up {devs}"
        else:
            line = f"{CRITERIA[4]}: score {a} vs {b} for runner-up {devs}"
        return "decided by: " + line
    return "decided by: tie: lowest indices"


def weakest_label(ix: TopoIndex, mask: int) -> str:
    """The ``nvidia-smi topo -m`` label of the weakest pair of ``mask`` (``"one device"`` for one)."""
    ps = [p for p in range(ix.n) if mask >> p & 1]
    if len(ps) < 2:
        return "one device"
    a, b = min(((x, y) for i, x in enumerate(ps) for y in ps[i + 1:]), key=lambda e: (ix.level[e[0]][e[1]], ix.bw[e[0]][e[1]]))
    return ix.label(a, b)
