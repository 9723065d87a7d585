"""One local check's outcome (:class:`Check`) and reports over several, shared by the doctor's check modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

#: Check outcomes, best first.
STATUSES = ("ok", "n/a", "warn", "fail")
#: The checks of an NVIDIA node, in report order.
NVIDIA_CHECKS = ("driver", "cuda", "nvml", "torch", "nccl", "mig", "persistence", "fabric", "p2p", "gpudirect",
                 "imex")
#: The checks of an AMD node, in report order.
AMD_CHECKS = ("driver", "amdsmi", "torch", "nccl", "p2p", "gpudirect")
#: What a simulated node lacks, per check (the ``detail`` reads "simulated node: no <this>").
SIMULATED_LACKS = {
    "driver": "GPU driver", "cuda": "CUDA driver", "nvml": "NVML (FakeNVML answers instead)",
    "amdsmi": "amdsmi (FakeAmdSmi answers instead)", "torch": "GPU for torch to use", "nccl": "GPU for NCCL",
    "mig": "MIG hardware", "persistence": "driver persistence mode", "fabric": "NVSwitch fabric",
    "p2p": "peer-to-peer hardware", "gpudirect": "GPUDirect RDMA kernel module to check",
    "imex": "IMEX daemon or channels to check",
}


@dataclass(frozen=True, slots=True)
class Check:
    """The outcome of one local check.

    Attributes:
        name: e.g. ``"driver"``, ``"p2p"`` (see :data:`NVIDIA_CHECKS`, :data:`AMD_CHECKS`).
        status: one of :data:`STATUSES`.
        detail: what was found, one line.
        fix: what to do about it; None when nothing needs doing.

    Raises:
        ValueError: an unknown status or an empty name.
    """

    name: str
    status: str
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Check.name must be a non-empty string, not {self.name!r}")
        if self.status not in STATUSES:
            raise ValueError(f"Check.status {self.status!r} is not one of {list(STATUSES)}")

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form: ``{"name", "status", "detail", "fix"}``."""
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Check":
        """The inverse of :meth:`to_dict` (e.g. for checks sent back from other nodes).

        Raises:
            ValueError: a missing or mistyped field, or an unknown status.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a check must be an object, not {type(data).__name__}")
        for key in ("name", "status", "detail"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"check field {key!r} must be a string, not {data.get(key)!r}")
        fix = data.get("fix")
        if fix is not None and not isinstance(fix, str):
            raise ValueError(f"check field 'fix' must be a string or null, not {fix!r}")
        return cls(data["name"], data["status"], data["detail"], fix)


def worst(checks: Iterable[Check]) -> str:
    """The worst status among ``checks`` (``"ok"`` for none): fail > warn > n/a > ok."""
    return max((c.status for c in checks), key=STATUSES.index, default="ok")


def summarize(checks: Iterable[Check]) -> str:
    """A plain-text report: one line per check (status, name, detail), a ``fix:`` line under
    each one that has a fix, and a closing count per status."""
    checks = list(checks)
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    counts = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    lines.append(", ".join(f"{counts[s]} {s}" for s in ("ok", "warn", "fail", "n/a")))
    return "\n".join(lines)
