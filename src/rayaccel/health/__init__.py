"""Device health: the probe for a node's devices, :func:`probe_for`.

What can go wrong, as events (the kinds and their severities, :class:`HealthEvent`, the
:class:`HealthProbe` contract), is in :mod:`.health_events` and re-exported here.
:func:`probe_for` picks the probe for a topology: :class:`~.health_nvml.NvmlHealthProbe`
for NVIDIA devices, :class:`~.health_amd.AmdHealthProbe` for AMD ones (both at once, as a
:class:`MultiProbe`, on a mixed node); on a simulated node they run over
:class:`~rayaccel.testing.fakenvml.FakeNVML` / :class:`~rayaccel.testing.fakeamdsmi.FakeAmdSmi`, so faults injected into
the fake reach the caller through the real probe code.
"""

from __future__ import annotations

from typing import Any, Callable

from rayaccel.errors import BackendError
from rayaccel.topology import NodeTopology
from rayaccel.health.amd import AmdHealthProbe
from rayaccel.health.events import (APPLICATION_XIDS, KIND_SEVERITY, KINDS, SEVERITIES, THROTTLE_REARM_S, XID_DESCRIPTIONS,
                            Edges, HealthEvent, HealthProbe, check_timeout, classify_xid, xid_detail)
from rayaccel.health.nvml import NvmlHealthProbe


class MultiProbe:
    """Several probes (a node with NVIDIA and AMD devices) polled as one: the first waits, the rest are read."""

    def __init__(self, probes: list[Any]):
        self.probes = list(probes)

    def poll(self, timeout_s: float) -> list[HealthEvent]:
        """See :meth:`HealthProbe.poll`."""
        timeout_s = check_timeout(timeout_s)
        out: list[HealthEvent] = []
        for i, p in enumerate(self.probes):
            out.extend(p.poll(timeout_s if i == 0 else 0.0))
        return out

    def close(self) -> None:
        """Close every probe."""
        for p in self.probes:
            p.close()


def probe_for(topology: NodeTopology, *, nvml: Any = None, amdsmi: Any = None, simulated: bool = False,
              clock: Callable[[], float] | None = None) -> HealthProbe | None:
    """The health probe for ``topology``'s devices, or None when no device has one (e.g. Trainium).

    Args:
        topology: the node's devices (indices are what events carry).
        nvml: a ``pynvml``-like module for the NVIDIA devices (e.g. a
            :class:`~rayaccel.testing.fakenvml.FakeNVML` to inject faults into); None imports ``pynvml``.
        amdsmi: an ``amdsmi``-like module for the AMD devices (e.g. a :class:`~rayaccel.testing.fakeamdsmi.FakeAmdSmi`).
        simulated: the node has no hardware: vendor modules not given are fakes of ``topology``
            (reach them as ``probe.nvml`` / ``probe.amdsmi``).
        clock: the time source for :attr:`HealthEvent.at` (default ``time.time``).

    Raises:
        BackendUnavailable: the vendor library of the node's devices is missing (with a hint).
        BackendError: the library is present but failed to initialise.
    """
    vendors = {d.vendor for d in topology.devices}
    kw: dict[str, Any] = {} if clock is None else {"clock": clock}
    probes: list[Any] = []
    if "nvidia" in vendors:
        if nvml is None and simulated:
            from rayaccel.testing.fakenvml import FakeNVML  # only simulated nodes need the fakes (~20 ms to import)

            nvml = FakeNVML(topology.subset(d.index for d in topology.devices if d.vendor == "nvidia")
                            if vendors != {"nvidia"} else topology)
        probes.append(NvmlHealthProbe(topology, nvml=nvml, **kw))
    if "amd" in vendors:
        if amdsmi is None and simulated:
            from rayaccel.testing.fakeamdsmi import FakeAmdSmi  # only simulated nodes need the fakes

            amdsmi = FakeAmdSmi(topology.subset(d.index for d in topology.devices if d.vendor == "amd")
                                if vendors != {"amd"} else topology)
        try:
            probes.append(AmdHealthProbe(topology, amdsmi=amdsmi, **kw))
        except BackendError:  # BackendUnavailable included: release the NVIDIA probe before raising
            for p in probes:
                p.close()
            raise
    if not probes:
        return None
    return probes[0] if len(probes) == 1 else MultiProbe(probes)  # type: ignore[return-value]


__all__ = ["APPLICATION_XIDS", "AmdHealthProbe", "Edges", "HealthEvent", "HealthProbe", "KINDS", "KIND_SEVERITY",
           "MultiProbe", "NvmlHealthProbe", "SEVERITIES", "THROTTLE_REARM_S", "XID_DESCRIPTIONS", "check_timeout",
           "classify_xid", "probe_for", "xid_detail"]
