"""The ``tpu`` backend: Google Cloud TPU chips of this host, on a TPU VM.

What it reads (the same sources Ray's TPU manager and ``tpu-info`` read):

* the chips: PCI devices of Google's vendor id ``0x1ae0`` in ``/sys/bus/pci/devices``
  whose device id is a TPU (``tpu-info``'s table: v4 ``0x005e``, v5e ``0x0063``, v5p
  ``0x0062``, v6e ``0x006f``, 7x ``0x0076``; v2/v3 share ``0x0027``), one per chip
  (functions of one chip share a bus address);
* the host's place: the GKE variables ``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``,
  ``TPU_WORKER_ID``, ``TPU_NAME`` when set, else the metadata server's ``tpu-env``
  attribute (``CHIPS_PER_HOST_BOUNDS``, ``HOST_BOUNDS``, ``WORKER_ID``, ``NODE_ID``, ...)
  and ``accelerator-type`` / ``agent-worker-number`` / ``instance-id``, asked with a
  1-second timeout at ``http://metadata.google.internal``.

Chip coordinates follow ``CHIPS_PER_HOST_BOUNDS`` (and the worker's place in
``HOST_BOUNDS``) when known, else the host shape of that chip count (2x2x1 for 4, 2x4x1
for 8). Off a TPU VM the backend is "unavailable: no Google TPU PCI device (...)" with
a hint; no network call is made then.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..errors import BackendError, BackendUnavailable, CaptureError, TopologyError
from ..topology import NodeTopology, Slice
from .capture import import_captures
from .capture.tpu import host_devices
from .rayspec import TPU
from .registry import BackendInfo

GOOGLE_PCI_VENDOR = "0x1ae0"
#: PCI device id -> TPU generation (tpu-info ``TpuChip.from_pci_device_id``; v2/v3 told apart by subsystem).
TPU_DEVICE_IDS = {"0x005e": "v4", "0x0063": "v5e", "0x0062": "v5p", "0x006f": "v6e", "0x0076": "7x"}
_V2V3 = {"0x004e": "v2", "0x004f": "v3"}
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
_HINT = ("run on a Cloud TPU VM (or a GKE TPU node), or set RAYACCEL_TOPOLOGY to a TPU catalog machine "
         "(e.g. tpu-v4-8; `rayaccel topo list` names them) to simulate one")
Fetch = Callable[[str], "str | None"]


def fetch_metadata(key: str) -> str | None:
    """The TPU VM metadata attribute ``key`` (1 s timeout), or None when there is no metadata server."""
    req = urllib.request.Request(METADATA_URL + key, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(req, timeout=1.0) as r:  # noqa: S310 - fixed http URL of the metadata server
            if r.status == 200:
                return r.read(1 << 20).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return None


class TpuBackend:
    """This host's TPU chips (see the module docstring).

    Args:
        sysfs: the PCI devices directory (tests give a fake tree).
        fetch: reads a metadata attribute (default :func:`fetch_metadata`).
        environ: the environment to read the GKE variables from (default ``os.environ``).
    """

    name = "tpu"
    ray_spec = TPU

    def __init__(self, sysfs: str | Path = "/sys/bus/pci/devices", fetch: Fetch | None = None,
                 environ: dict[str, str] | None = None):
        self._sysfs = Path(sysfs)
        self._fetch = fetch or fetch_metadata
        self._env = environ

    def _chips(self) -> tuple[list[str], str | None]:
        """(PCI addresses of the chips, their generation)."""
        by_chip: dict[str, str] = {}
        try:
            entries = sorted(self._sysfs.iterdir())
        except OSError:
            return [], None
        for dev in entries:
            try:
                if (dev / "vendor").read_text().strip().lower() != GOOGLE_PCI_VENDOR:
                    continue
                did = (dev / "device").read_text().strip().lower()
                gen = TPU_DEVICE_IDS.get(did)
                if gen is None and did == "0x0027":
                    gen = _V2V3.get((dev / "subsystem_device").read_text().strip().lower())
            except OSError:
                continue
            if gen is not None:
                by_chip.setdefault(dev.name.rsplit(".", 1)[0], gen)  # functions of one chip share D:B:D
        gens = set(by_chip.values())
        if len(gens) > 1:
            raise BackendError(f"TPU chips of several generations on one host: {sorted(gens)}", backend=self.name)
        return sorted(by_chip), (gens.pop() if gens else None)

    def available(self) -> BackendInfo:
        """Cheap: looks for TPU PCI devices in sysfs only."""
        try:
            chips, _ = self._chips()
        except BackendError as e:
            return BackendInfo(self.name, False, str(e), None)
        if not chips:
            return BackendInfo(self.name, False, f"no Google TPU PCI device (vendor {GOOGLE_PCI_VENDOR}) in "
                                                 f"{self._sysfs}", _HINT)
        return BackendInfo(self.name, True)

    def discover(self) -> NodeTopology:
        """The host's chips with their grid coordinates and, when known, its pod slice.

        Raises:
            BackendUnavailable: no TPU chip here.
            BackendError: the metadata contradicts the chips found, or cannot be read.
        """
        chips, gen = self._chips()
        if not chips or gen is None:
            raise BackendUnavailable(self.name, f"no Google TPU PCI device (vendor {GOOGLE_PCI_VENDOR}) in "
                                                f"{self._sysfs}", _HINT)
        env = os.environ if self._env is None else self._env
        tpu_env = self._fetch("tpu-env")
        if tpu_env and "CHIPS_PER_HOST_BOUNDS" in tpu_env:
            try:
                topo = import_captures([tpu_env if "\n" in tpu_env else tpu_env + "\n"]).topology
            except CaptureError as e:
                raise BackendError(f"the TPU metadata 'tpu-env' cannot be read: {e}", backend=self.name) from None
            if len(topo.devices) != len(chips):
                raise BackendError(f"tpu-env says {len(topo.devices)} chips per host (CHIPS_PER_HOST_BOUNDS) but "
                                   f"{len(chips)} TPU PCI devices are here", backend=self.name)
            sl = topo.slice or Slice()
            devices, links = list(topo.devices), list(topo.links)
        else:
            try:
                devs, links = host_devices(len(chips), gen)
            except ValueError as e:
                raise BackendError(str(e), backend=self.name) from None
            devices, sl = devs, Slice()
        sl = Slice(  # GKE's variables win, as in Ray's manager
            name=env.get("TPU_NAME") or sl.name or self._attr("instance-id"),
            worker_id=_int(env.get("TPU_WORKER_ID")) if env.get("TPU_WORKER_ID") else
            (sl.worker_id if sl.worker_id is not None else _int(self._attr("agent-worker-number"))),
            topology=(env.get("TPU_TOPOLOGY") or sl.topology or "").strip().lower() or None,
            accelerator_type=env.get("TPU_ACCELERATOR_TYPE") or sl.accelerator_type or self._attr("accelerator-type"),
        )
        devices = [replace(d, pci_bus_id=chips[d.index] if d.index < len(chips) else None) for d in devices]
        topo = NodeTopology(devices=tuple(devices), links=tuple(links), hostname=_hostname(),
                            sources=("tpu: sysfs PCI devices" + (", tpu-env metadata" if tpu_env else ""),),
                            slice=sl if any(v is not None for v in (sl.name, sl.worker_id, sl.topology,
                                                                     sl.accelerator_type)) else None)
        try:
            return topo.validate()
        except TopologyError as e:  # metadata values are outside rayaccel's control: name the source
            raise BackendError(f"the TPU metadata gives an invalid topology: {e}", backend=self.name) from None

    def _attr(self, key: str) -> str | None:
        val = self._fetch(key)
        return val.strip() if val and val.strip() else None


def _int(text: str | None) -> int | None:
    return int(text) if text and re.fullmatch(r"\d{1,6}", text.strip()) else None


def _hostname() -> str | None:
    return socket.gethostname() or None
