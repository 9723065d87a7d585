"""Hostile inputs and bounds for the fuzz suites (tests/discovery/test_fuzz_loaders.py,
tests/cli/test_fuzz_cli.py): strategies that damage catalog machines and real captures, and bounds: each example must finish within a few seconds and must not
grow the process's address space by more than a bound (RLIMIT_AS, lowered for the example
and restored after). Hypothesis settings shared by both suites.

``RAYACCEL_FUZZ=long`` runs ten times the examples with fresh random seeds; the default is
derandomized (the same examples every run), so CI is repeatable and stays under a minute.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rayaccel import catalog

LONG = os.environ.get("RAYACCEL_FUZZ") == "long"
#: Per-example limits.
EXAMPLE_SECONDS = 5.0
EXAMPLE_EXTRA_BYTES = 1 << 30


class Hang(BaseException):
    """An example ran past :data:`EXAMPLE_SECONDS` (a BaseException: no ``except Exception`` swallows it)."""


def fuzz_settings(examples: int, deadline_ms: int = 2000) -> settings:
    """Settings of one property: ``examples`` examples (x10 when LONG), a per-example deadline."""
    return settings(max_examples=examples * (10 if LONG else 1), deadline=deadline_ms, derandomize=not LONG,
                    database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                          HealthCheck.filter_too_much])


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@contextmanager
def bounded(seconds: float = EXAMPLE_SECONDS, extra_bytes: int = EXAMPLE_EXTRA_BYTES) -> Iterator[None]:
    """Raise :class:`Hang` past ``seconds``; make allocations beyond ``extra_bytes`` more
    address space fail with MemoryError (Linux; a no-op for memory elsewhere)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = _vm_bytes()
    limited = vm > 0
    if limited:
        cap = vm + extra_bytes
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    def _alarm(signum, frame):
        raise Hang(f"example ran longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if limited:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


CAPTURES = sorted((Path(__file__).parent / "data" / "captures").glob("*.txt"))
BASES = [catalog.load(n).to_dict() for n in ("a100-mig", "dgx1-v100", "mi300x-8x", "trn1-32xlarge", "gb200-nvl72-tray")]

# ---------------------------------------------------------------- strategies
huge_ints = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([10**400, -(10**400), 2**63, 2**63 - 1, -1, 0]))
json_scalars = st.one_of(st.none(), st.booleans(), huge_ints, st.floats(allow_nan=True, allow_infinity=True),
                         st.text(max_size=30), st.text(min_size=3000, max_size=6000, alphabet="x[]{}:$"))
json_values = st.recursive(json_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), c, max_size=4)),
                           max_leaves=12)


def _paths(obj, prefix=()):
    """Every (container, key) path in a JSON object."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_topologies(draw):
    """A catalog machine's dict with 1-3 fields replaced by hostile values (or dropped)."""
    d = json.loads(json.dumps(draw(st.sampled_from(BASES))))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(d))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        if draw(st.booleans()) and isinstance(obj, dict):
            obj.pop(path[-1], None)
        else:
            obj[path[-1]] = draw(json_values)
    return d


@st.composite
def mutated_captures(draw):
    """A real capture, damaged: lines dropped, doubled, shuffled, characters replaced, cut short."""
    text = draw(st.sampled_from(CAPTURES)).read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    rng = random.Random(draw(st.integers(0, 2**32)))
    for _ in range(draw(st.integers(0, 6))):
        if not lines:
            break
        op = rng.choice(["drop", "dup", "swap", "chars", "cut", "long", "numbers"])
        i = rng.randrange(len(lines))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "chars":
            s = list(lines[i]) or [" "]
            for _ in range(rng.randint(1, 5)):
                s[rng.randrange(len(s))] = rng.choice("X9 \t:-|[]$\x00\u00e9NV99999999999999999999")
            lines[i] = "".join(s)
        elif op == "cut":
            lines = lines[:i]
        elif op == "long":
            lines[i] = lines[i] + " " + "9" * rng.randint(50, 5000)
        else:
            lines[i] = " ".join(str(10**rng.randint(1, 400)) if t.isdigit() else t for t in lines[i].split())
    return "\n".join(lines) + "\n"


CLUSTER_SPEC = json.loads((Path(__file__).parent / "data" / "clusters" / "two-racks.json").read_text())


@st.composite
def mutated_cluster_specs(draw):
    """The two-rack cluster spec with 1-3 fields replaced by hostile values (or dropped)."""
    d = json.loads(json.dumps(CLUSTER_SPEC))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(d)) or [("nodes",)]))
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        if draw(st.booleans()) and isinstance(obj, dict):
            obj.pop(path[-1], None)
        else:
            obj[path[-1]] = draw(json_values)
    return d
