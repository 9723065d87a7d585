"""Sets of whole devices that form a ring over direct links, found fast (for NeuronCore grants on a torus).

The node allocator (:func:`rayaccel.placement.allocate`) is exact on weakest link and total
bandwidth, then breaks ties by fragmentation over every tied set -- on a 4x4 torus where
all links are equal that is thousands of sets, too slow under the arbiter's lock. Here, over
device *positions* with adjacency bitmasks:

1. candidates: rings of ``n`` devices found by a bounded depth-first search, and sets grown
   greedily from every free device (each step adds the free neighbour with the most links
   into the set);
2. the best candidate by: its shape (a ring over direct links when an idle node has a ring
   of ``n`` devices, else a path through all of them; a linked pair for 2), then the most
   links inside the set (compact: a 2x2 square or a 2x4 block before a snake), then the
   most of the node's shortest rings left whole among the free devices (what the next
   request wants), then the fewest links to the free devices left, then the lowest
   positions. One device (a whole-device grant) likewise: the one whose taking breaks the
   fewest free shortest rings.

Bounded: the search stops after :data:`STEP_BUDGET` steps; nothing here is exponential in
the node's size beyond that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Depth-first steps per search (ring enumeration, Hamiltonian checks).
STEP_BUDGET = 1500
#: Rings kept from the enumeration.
MAX_RINGS = 16
_CACHE_MAX = 50_000


@dataclass(eq=False)
class Graph:
    """Direct links among ``n`` positions as bitmasks (``adj[i]``: the neighbours of position i)."""

    adj: list[int]
    _ring_ok: dict[int, bool] = field(default_factory=dict)
    _small: list[int] = field(default_factory=list)
    _best: dict[tuple[int, int, int], tuple | None] = field(default_factory=dict)  # (pool, n, partial) -> answer

    def small_rings(self) -> list[int]:
        """Masks of the node's shortest rings (the 2x2 squares and the rows of a 4x4 torus), cached: the
        rings later requests want, which a choice should leave whole when it can."""
        got = self._ring_ok.get(-1)
        if got is None:
            full = (1 << len(self.adj)) - 1
            girth = next((n for n in range(3, len(self.adj) + 1) if self.ring_possible(n)), None)
            self._small = list(dict.fromkeys(m for m, _ in _rings(self, full, girth, 4096))) if girth else []
            self._ring_ok[-1] = True
        return self._small

    def rings_within(self, mask: int) -> int:
        """How many of :meth:`small_rings` lie entirely inside ``mask``."""
        return sum(1 for r in self.small_rings() if r & mask == r)

    def ring_possible(self, n: int) -> bool:
        """Whether an idle node has a ring of ``n`` devices (cached)."""
        got = self._ring_ok.get(n)
        if got is None:
            full = (1 << len(self.adj)) - 1
            got = self._ring_ok[n] = n >= 3 and bool(_rings(self, full, n, 1))
        return got


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _rings(g: Graph, pool: int, n: int, most: int) -> list[tuple[int, tuple[int, ...]]]:
    """Up to ``most`` rings of ``n`` positions of ``pool``: ``(mask, order)``, each found once (smallest start)."""
    out: list[tuple[int, tuple[int, ...]]] = []
    steps = 0
    adj = g.adj
    for s in _bits(pool):
        higher = pool & ~((1 << (s + 1)) - 1)
        stack = [(s, 1 << s, [s])]
        while stack:
            steps += 1
            if steps > STEP_BUDGET:
                return out
            v, seen, path = stack.pop()
            if len(path) == n:
                if adj[v] >> s & 1:
                    out.append((seen, tuple(path)))
                    if len(out) >= most:
                        return out
                continue
            for w in _bits(adj[v] & higher & ~seen):
                stack.append((w, seen | 1 << w, path + [w]))
    return out


def _hamiltonian(g: Graph, mask: int, cycle: bool) -> tuple[int, ...] | None:
    """An order of the positions of ``mask`` along direct links (closing into a ring when ``cycle``), or None."""
    verts = list(_bits(mask))
    n = len(verts)
    if n <= 1:
        return tuple(verts)
    adj = g.adj
    starts = verts[:1] if cycle else sorted(verts, key=lambda v: (adj[v] & mask).bit_count())
    steps = 0
    for s in starts:
        stack = [(s, 1 << s, [s])]
        while stack:
            steps += 1
            if steps > STEP_BUDGET:
                return None
            v, seen, path = stack.pop()
            if len(path) == n:
                if not cycle or adj[v] >> s & 1:
                    return tuple(path)
                continue
            for w in _bits(adj[v] & mask & ~seen):
                stack.append((w, seen | 1 << w, path + [w]))
    return None


def _grown(g: Graph, pool: int, n: int, s: int) -> tuple[int, list[int]]:
    adj = g.adj
    mask, order = 1 << s, [s]
    while len(order) < n:
        frontier = 0
        for v in order:
            frontier |= adj[v]
        frontier &= pool & ~mask
        cands = frontier or (pool & ~mask)
        best, key = -1, None
        for w in _bits(cands):
            k = ((adj[w] & mask).bit_count(), -(adj[w] & pool & ~mask).bit_count(), -w)
            if key is None or k > key:
                best, key = w, k
        if best < 0:
            break
        mask |= 1 << best
        order.append(best)
    return mask, order


def best_devices(g: Graph, pool: int, n: int, partial: int = 0) -> tuple[tuple[int, ...], bool] | None:
    """The best ``n`` positions of ``pool`` (at most one of them in ``partial``): ``(order, shape met)``.

    ``shape met``: a ring when an idle node has one of ``n`` devices, else a path through
    them (a linked pair for 2). None when the pool has fewer than ``n`` positions.
    """
    if pool.bit_count() < n:
        return None
    ck = (pool, n, partial)
    hit = g._best.get(ck, ck)
    if hit is not ck:
        return hit  # type: ignore[return-value]
    got = _best_devices(g, pool, n, partial)
    if len(g._best) >= _CACHE_MAX:
        g._best.clear()
    g._best[ck] = got
    return got


def _best_devices(g: Graph, pool: int, n: int, partial: int) -> tuple[tuple[int, ...], bool] | None:
    if n == 1:
        s = min(_bits(pool & ~partial or pool),
                key=lambda v: (-g.rings_within(pool & ~(1 << v)), (g.adj[v] & pool).bit_count(), v))
        return (s,), True
    want_ring = g.ring_possible(n)
    cands: dict[int, tuple[tuple[int, ...] | None, bool | None]] = {}
    if want_ring:
        for mask, order in _rings(g, pool, n, MAX_RINGS):
            cands.setdefault(mask, (order, True))
    for s in _bits(pool):
        mask, order = _grown(g, pool, n, s)
        if mask.bit_count() == n and mask not in cands:
            cands[mask] = (tuple(order), None)
    best = None
    adj = g.adj
    rest_pool = [(adj[v] & pool).bit_count() for v in range(len(adj))]
    for mask, (order, ok) in cands.items():
        if (mask & partial).bit_count() > 1:
            continue
        inside2 = sum((adj[v] & mask).bit_count() for v in _bits(mask))
        inside = inside2 // 2
        cut = sum(rest_pool[v] for v in _bits(mask)) - inside2
        key_rest = (inside, g.rings_within(pool & ~mask), -cut, -(mask & -mask).bit_length())
        if best is not None and (True,) + key_rest <= best[0]:
            continue  # cannot beat the best even with its shape met: skip the shape check
        if ok is None:
            shaped = _hamiltonian(g, mask, cycle=want_ring)
            ok, order = (shaped is not None), (shaped or order)
        key = (ok, *key_rest)
        if best is None or key > best[0]:
            best = (key, order, ok)
    if best is None:
        return None
    return best[1], best[2]
