"""Bounds for the fuzz suites: each example must finish within a few seconds and must not
grow the process's address space by more than a bound (RLIMIT_AS, lowered for the example
and restored after). Hypothesis settings shared by both suites.

``RAYACCEL_FUZZ=long`` runs ten times the examples with fresh random seeds; the default is
derandomized (the same examples every run), so CI is repeatable and stays under a minute.
"""

from __future__ import annotations

import os
import resource
import signal
from contextlib import contextmanager
from typing import Iterator

from hypothesis import HealthCheck, settings

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
