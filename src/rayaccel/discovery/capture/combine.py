"""Merge fragments of one machine (from one or several captures) into a NodeTopology.

Rules:

* Devices are matched by index. Captures that list every device (topology
  matrices, ``nvidia-smi -L``, rocm-smi, amd-smi, neuron-ls, hl-smi) must agree
  on the set of indices; MIG tables may cover a subset but must not name a
  device the others do not have. Otherwise: :class:`CaptureError`.
* Each device field comes from the first capture that knows it; a later,
  different value is reported in a warning. Vendors must agree.
* Links: a direct link (``NV12``) from ``topo -m`` plus the PCIe class of the
  same pair from ``topo -mp`` gives ``nvlink`` with ``pcie`` set. Two
  different PCIe classes or lane counts: the first is kept, with a warning.
* MIG: profiles from ``-lgip`` rows, exact placements from ``-lgipp`` (or
  inferred, with a warning); ``-lgipp`` alone gives profiles named by the GPU's
  model (``-L``) through the catalog, or ``#<id>`` (with a warning); partitions
  from ``-lgi`` (GI ids, placement) and
  ``nvidia-smi -L`` (UUIDs), paired by profile in order of appearance. A
  partition's memory, SMs and size are filled from its profile when known.
* The NVLink fabric (``nvidia-smi -q``) is a device field like the others: first capture wins.
* Captures naming two different hosts are not one machine: CaptureError.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Sequence

from ...errors import CaptureError, TopologyError
from ...topology import Device, Link, Nic, NodeTopology, Partition
from ._base import Fragment
from .mig import build_profiles, placement_profiles

_DEVICE_FIELDS = {f.name for f in fields(Device)}
_MERGED = {"index", "partitions", "mig_profiles", "mig_mode", "_mig_rows"}


def combine(frags: Sequence[Fragment], *, name: str | None, sources: tuple[str, ...]) -> tuple[NodeTopology, tuple[str, ...]]:
    """One validated topology (and all warnings) from ``frags``.

    Raises:
        CaptureError: the fragments cannot describe one machine.
    """
    warnings: list[str] = [w for f in frags for w in f.warnings]
    where0 = frags[0].path if frags else None
    hosts = {f.hostname for f in frags if f.hostname}
    if len(hosts) > 1:
        raise CaptureError(f"the captures come from different hosts ({', '.join(sorted(hosts))}); "
                           "import captures of one machine together", where0)
    _check_device_sets(frags)

    devices: dict[int, dict[str, Any]] = {}
    owner: dict[tuple[int, str], str] = {}
    vendors: dict[str, str] = {}
    parts: dict[int, list[list[Partition]]] = {}
    rows: dict[int, tuple[list[tuple], str]] = {}
    placements: dict[tuple[int, int], tuple] = {}
    placed_by: dict[int, str] = {}
    for f in frags:
        placements.update({k: v for k, v in f.placements.items() if k not in placements})
        for g, _ in f.placements:
            placed_by.setdefault(g, f.path)
        for idx, d in sorted(f.devices.items()):
            out = devices.setdefault(idx, {"index": idx})
            for key, val in d.items():
                if key in _MERGED or key not in _DEVICE_FIELDS or val is None:
                    continue
                if key not in out:
                    out[key] = val
                    owner[(idx, key)] = f.path
                elif out[key] != val:
                    if key == "vendor":
                        raise CaptureError(f"device {idx} is {val!r} here but {out[key]!r} in "
                                           f"{owner[(idx, key)]}; captures must come from one machine", f.path)
                    warnings.append(f"{f.path}: device {idx} {key} {val!r} differs from {out[key]!r} "
                                    f"({owner[(idx, key)]}); kept the first")
            if d.get("mig_mode"):
                out["mig_mode"] = True
            elif d.get("mig_mode") is False:  # `nvidia-smi -q` says Disabled; a MIG listing's True wins
                out.setdefault("mig_mode", False)
            if d.get("partitions"):
                parts.setdefault(idx, []).append(list(d["partitions"]))
            if d.get("_mig_rows"):
                if idx in rows:
                    warnings.append(f"{f.path}: a second MIG profile table for GPU {idx} ignored "
                                    f"(first from {rows[idx][1]})")
                else:
                    rows[idx] = (d["_mig_rows"], f.path)
        for d in f.devices.values():
            vendors.setdefault(d.get("vendor", "nvidia"), f.path)
    if len(vendors) > 1:
        raise CaptureError(f"captures of different vendors ({', '.join(f'{v} in {p}' for v, p in vendors.items())}) "
                           "cannot describe one machine", where0)

    built: list[Device] = []
    for idx, d in sorted(devices.items()):
        profiles = ()
        if idx in rows:
            profiles, inferred = build_profiles(idx, rows[idx][0], placements)
            if inferred:
                warnings.append(f"{rows[idx][1]}: GPU {idx}: `mig -lgip` has no placements; inferred a "
                                f"conservative subset for {', '.join(inferred)} "
                                "(import `nvidia-smi mig -lgipp` too for the exact ones)")
        elif idx in placed_by:
            profiles, note = placement_profiles(idx, placements, d.get("model"))
            warnings.append(f"{placed_by[idx]}: {note}")
        partitions = _merge_partitions(idx, parts.get(idx, []), warnings)
        partitions = tuple(_fill_partition(p, profiles) for p in partitions)
        d = {k: v for k, v in d.items() if k in _DEVICE_FIELDS}
        built.append(Device(**{**d, "partitions": partitions, "mig_profiles": profiles}))

    if any(f.pcie_only for f in frags) and not any(l.direct for f in frags for l in f.links.values()):
        mp = next(f for f in frags if f.pcie_only)
        warnings.append(f"{mp.path}: `nvidia-smi topo -mp` shows PCIe paths only: NVLink, if any, is not "
                        "visible (import it together with `nvidia-smi topo -m` of the same machine)")
    slices = [f for f in frags if f.slice is not None]
    for f in slices[1:]:
        if f.slice != slices[0].slice:
            warnings.append(f"{f.path}: slice {f.slice} differs from {slices[0].slice} ({slices[0].path}); kept the first")
    topo = NodeTopology(
        devices=tuple(built),
        links=_merge_links(frags, warnings),
        nics=_merge_nics(frags),
        hostname=next(iter(hosts), None),
        name=name,
        sources=sources,
        slice=slices[0].slice if slices else None,
    )
    try:
        topo.validate()
    except TopologyError as e:
        raise CaptureError(f"the imported topology is inconsistent: {e}", where0) from None
    return topo, tuple(warnings)


def _check_device_sets(frags: Sequence[Fragment]) -> None:
    full = [f for f in frags if f.enumerates_devices]
    if full:
        ref = full[0]
        ref_set = set(ref.devices)
        for f in full[1:]:
            if set(f.devices) != ref_set:
                raise CaptureError(
                    f"captures disagree on the devices: {ref.path} ({ref.format}) shows {_describe(ref_set)} but "
                    f"{f.path} ({f.format}) shows {_describe(set(f.devices))}; captures combined must come from "
                    "one machine with the same devices visible", f.path, f.first_line)
        for f in frags:
            extra = set(f.devices) - ref_set
            if extra:
                raise CaptureError(f"{f.format} names device(s) {sorted(extra)}, which {ref.path} ({ref.format}) "
                                   f"does not have ({_describe(ref_set)})", f.path, f.first_line)


def _describe(s: set[int]) -> str:
    if not s:
        return "no devices"
    xs = sorted(s)
    body = f"{xs[0]}-{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2 else ", ".join(map(str, xs))
    return f"{len(xs)} device{'s' if len(xs) != 1 else ''} ({body})"


def _merge_partitions(idx: int, groups: list[list[Partition]], warnings: list[str]) -> tuple[Partition, ...]:
    if not groups:
        return ()
    with_gi = [g for g in groups if any(p.gi_id is not None for p in g)]
    base = list(with_gi[0]) if with_gi else list(groups[0])
    rest = [g for g in groups if g is not (with_gi[0] if with_gi else groups[0])]
    paired_by_order: set[str] = set()
    for g in rest:
        for p in g:
            if p.uuid and any(q.uuid == p.uuid for q in base):
                continue
            cands = [k for k, q in enumerate(base) if q.profile == p.profile and q.uuid is None
                     and (p.gi_id is None or q.gi_id is None or q.gi_id == p.gi_id)]
            if not cands:
                base.append(p)
                continue
            if len([q for q in base if q.profile == p.profile]) > 1 and p.gi_id is None:
                paired_by_order.add(p.profile)
            q = base[cands[0]]
            base[cands[0]] = replace(q, uuid=q.uuid or p.uuid, gi_id=q.gi_id if q.gi_id is not None else p.gi_id,
                                     ci_id=q.ci_id if q.ci_id is not None else p.ci_id)
    if paired_by_order:
        warnings.append(f"GPU {idx}: MIG UUIDs (nvidia-smi -L) matched to GPU instances (mig -lgi) by order "
                        f"within profile {', '.join(sorted(paired_by_order))}; the listings do not say which is which")
    return tuple(base)


def _fill_partition(p: Partition, profiles) -> Partition:
    prof = next((m for m in profiles if m.name == p.profile), None)
    if prof is None:
        return p
    return replace(
        p,
        memory_bytes=p.memory_bytes if p.memory_bytes is not None else
        (prof.memory_mib << 20 if prof.memory_mib is not None else None),
        sms=p.sms if p.sms is not None else prof.sms,
        size=p.size if p.size is not None else prof.slots,
    )


def _merge_links(frags: Sequence[Fragment], warnings: list[str]) -> tuple[Link, ...]:
    out: dict[tuple[int, int], Link] = {}
    src: dict[tuple[int, int], str] = {}
    for f in frags:
        for key, l in f.links.items():
            old = out.get(key)
            if old is None:
                out[key], src[key] = l, f.path
                continue
            merged, conflict = _merge_link(old, l)
            if conflict:
                warnings.append(f"{f.path}: link {key[0]}-{key[1]} is {_show(l)} but {src[key]} says "
                                f"{_show(old)}; kept {_show(merged)}")
            out[key] = merged
    return tuple(out[k] for k in sorted(out))


def _show(l: Link) -> str:
    return l.label if l.kind != "pcie" else f"PCIe {l.pcie}"


def _merge_link(old: Link, new: Link) -> tuple[Link, bool]:
    if old.direct and new.direct:
        if old.kind != new.kind or (old.count and new.count and old.count != new.count):
            return old, True
        pcie = old.pcie or new.pcie
        conflict = bool(old.pcie and new.pcie and old.pcie != new.pcie)
        return replace(old, count=old.count or new.count, pcie=pcie), conflict
    if old.direct or new.direct:
        direct, other = (old, new) if old.direct else (new, old)
        conflict = bool(direct.pcie and other.pcie and direct.pcie != other.pcie)
        return replace(direct, pcie=direct.pcie or other.pcie), conflict
    return old, old.pcie != new.pcie


def _merge_nics(frags: Sequence[Fragment]) -> tuple[Nic, ...]:
    out: dict[str, Nic] = {}
    for f in frags:
        for n in f.nics:
            old = out.get(n.name)
            if old is None:
                out[n.name] = n
                continue
            paths = dict(old.paths)
            for dev, cls in n.paths:
                paths.setdefault(dev, cls)
            out[n.name] = replace(old, numa_node=old.numa_node if old.numa_node is not None else n.numa_node,
                                  paths=tuple(sorted(paths.items())))
    return tuple(out.values())
