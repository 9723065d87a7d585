"""``rayaccel topo``: see how accelerators are wired.

    rayaccel topo show [--topology NAME|FILE] [--json] [--svg F] [--png F]
    rayaccel topo import FILE... [--name N] [--json] [--svg F] [--png F]
    rayaccel topo backends [--json]
    rayaccel topo list [--json]

Human output is a link matrix like ``nvidia-smi topo -m`` (coloured by
strength; a per-device neighbour list beyond 16 devices), a device table, a NIC
table and a summary line. ``--json`` prints exactly ``NodeTopology.to_dict()``.

Each command imports what it needs inside itself, so ``rayaccel --help`` and the offline
commands never load Ray, matplotlib or the placer they do not use.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from pathlib import Path
from typing import List, Optional, Sequence

import typer
from rich.table import Table
from rich.text import Text

from ..errors import BackendUnavailable, RayaccelError
from ..topology import PCIE_CLASSES, Link, NodeTopology
from ..units import format_bytes, shorten
from ._common import console, err_console, fail, na, plain, print_json, warn_line

#: Beyond this many devices the matrix becomes a per-device neighbour list.
MATRIX_MAX_DEVICES = 16

_PCIE_STYLE = {"PIX": "bold cyan", "PXB": "cyan", "PHB": "yellow", "NODE": "dark_orange", "SYS": "red"}
_KIND_STYLE = {"nvlink": "green", "xgmi": "magenta", "neuronlink": "dark_orange3", "ici": "blue", "hccs": "red",
               "roce": "cyan", "direct": "purple"}
_KIND_NAME = {"nvlink": "NVLink", "xgmi": "xGMI", "neuronlink": "NeuronLink", "ici": "TPU ICI", "hccs": "HCCS",
              "roce": "RoCE scale-up", "direct": "direct link"}
_KIND_ABBR = {"nvlink": "NV#", "xgmi": "XGMI#", "neuronlink": "NL", "ici": "ICI", "hccs": "HCCS", "roce": "RoCE#",
              "direct": "DL#"}
_DEVICE_PREFIX = {"nvidia": "GPU", "amd": "GPU", "aws": "ND", "google": "TPU", "habana": "HPU", "huawei": "NPU"}
_DEVICE_WORD = {"aws": "Neuron devices", "amd": "GPUs", "nvidia": "GPUs", "google": "TPU chips", "habana": "Gaudi HPUs",
                "huawei": "Ascend NPUs"}


# ----------------------------------------------------------------- helpers
def cpu_ranges(cpus: Sequence[int] | None) -> str:
    """``(0,1,2,3,8,9)`` -> ``"0-3,8-9"``; None -> ``"N/A"``."""
    if cpus is None:
        return na(None)
    if not cpus:
        return "-"
    out: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = ordered[0]
    for c in ordered[1:] + [None]:  # type: ignore[list-item]
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}-{prev}" if prev != start else str(start))
        if c is not None:
            start = prev = c
    return ",".join(out)


def _index_ranges(indices: Sequence[int]) -> str:
    return cpu_ranges(indices)


def _link_text(link: Link | None) -> Text:
    if link is None:
        return Text("-", style="dim")
    if link.direct:
        style = _KIND_STYLE.get(link.kind, "green")
        return Text(link.label, style=f"bold {style}" if (link.count or 1) >= 4 else style)
    return Text(link.label, style=_PCIE_STYLE.get(link.pcie or "", ""))


def summary(topo: NodeTopology) -> str:
    """One line: ``"8 GPUs (Tesla V100-SXM2-32GB), 1 NVLink domain, 2 NUMA nodes, 4 NICs"``."""
    n = len(topo.devices)
    vendors = {d.vendor for d in topo.devices}
    word = _DEVICE_WORD.get(next(iter(vendors)), "devices") if len(vendors) == 1 else "devices"
    if n == 1:
        word = word.rstrip("s").replace("device", "device")
    models = sorted({d.model for d in topo.devices if d.model})
    parts = [f"{n} {word}" + (f" ({', '.join(models)})" if models else "")]
    domains = [dom for dom in topo.direct_domains() if len(dom) > 1]
    if domains:
        kinds = defaultdict(int)
        for dom in domains:
            kind = next((l.kind for l in topo.links if l.direct and l.a in dom and l.b in dom), "direct")
            kinds[kind] += 1
        for kind, count in kinds.items():
            parts.append(f"{count} {_KIND_NAME.get(kind, kind)} domain{'s' if count != 1 else ''}")
    elif n > 1:
        parts.append("no direct links (PCIe only)")
    numa = [x for x in topo.numa_nodes() if x is not None]
    if numa:
        parts.append(f"{len(numa)} NUMA node{'s' if len(numa) != 1 else ''}")
    if topo.nics:
        parts.append(f"{len(topo.nics)} NIC{'s' if len(topo.nics) != 1 else ''}")
    mig = sum(len(d.partitions) for d in topo.devices)
    if mig:
        parts.append(f"{mig} MIG instance{'s' if mig != 1 else ''}")
    return ", ".join(parts)


def _cell_width(topo: NodeTopology) -> int:
    labels = [len(l.label) for l in topo.links] + [len(f"{_prefix(topo, i)}{i}") for i in topo.indices]
    return max(labels, default=3) + 1


def _matrix_fits(topo: NodeTopology, nics: int, width: int) -> bool:
    return 7 + (len(topo.devices) + nics) * _cell_width(topo) <= width


def _matrix(topo: NodeTopology, with_nics: bool) -> Table:
    idx = list(topo.indices)
    nics = list(topo.nics) if with_nics else []
    table = Table(title="Link matrix", title_justify="left", box=None, pad_edge=False, padding=(0, 1))
    table.add_column("", style="bold")
    for i in idx:
        table.add_column(f"{_prefix(topo, i)}{i}", justify="center")
    for k, _ in enumerate(nics):
        table.add_column(f"NIC{k}", justify="center")
    for a in idx:
        row: list[Text | str] = [f"{_prefix(topo, a)}{a}"]
        for b in idx:
            row.append(Text(" X ", style="dim") if a == b else _link_text(topo.link(a, b)))
        for nic in nics:
            cls = nic.path_to(a)
            row.append(Text(na(cls), style=_PCIE_STYLE.get(cls or "", "dim")))
        table.add_row(*row)
    return table


def _neighbours(topo: NodeTopology) -> Table:
    """Per-device neighbour list for wide machines: peers grouped by link label, as index ranges."""
    table = Table(title="Links per device", title_justify="left", box=None,
                  pad_edge=False, padding=(0, 1))
    table.add_column("dev", style="bold", justify="right")
    table.add_column("links")
    rows: dict[str, tuple[Text, list[int]]] = {}  # identical rows are merged
    for a in topo.indices:
        groups: dict[str, tuple[Link, list[int]]] = {}
        for b in topo.indices:
            if b == a:
                continue
            l = topo.link(a, b)
            key = l.label if l is not None else "-"
            groups.setdefault(key, (l, []))[1].append(b)  # type: ignore[arg-type]
        ordered = sorted(groups.items(), key=lambda kv: kv[1][0].rank if kv[1][0] is not None else (-1, 0), reverse=True)
        text = Text()
        for k, (key, (l, peers)) in enumerate(ordered):
            if k:
                text.append("  ")
            text.append_text(_link_text(l) if l is not None else Text("none", style="dim"))
            if len(peers) == len(topo.devices) - 1:
                text.append(f" to all {len(peers)} others")
            else:
                text.append(f" to {_index_ranges(peers)}")
        rows.setdefault(text.markup, (text, []))[1].append(a)
    for text, devs in rows.values():
        table.add_row(_index_ranges(devs), text)
    return table


def _prefix(topo: NodeTopology, index: int) -> str:
    try:
        vendor = topo.device(index).vendor
    except KeyError:
        return "DEV"
    return _DEVICE_PREFIX.get(vendor, "DEV")


def _devices(topo: NodeTopology) -> Table:
    devs = sorted(topo.devices, key=lambda d: d.index)
    same = {f: len({getattr(d, f) for d in devs}) == 1 for f in ("model", "memory_bytes", "compute_capability")}
    common = []
    if same["model"]:
        common.append(na(devs[0].model))
    if same["memory_bytes"]:
        common.append(format_bytes(devs[0].memory_bytes) if devs[0].memory_bytes is not None else "memory N/A")
    if same["compute_capability"] and devs[0].compute_capability:
        common.append(f"compute capability {devs[0].compute_capability}")
    title = "Devices" + (f": {len(devs)}x " + ", ".join(common) if common else "")
    table = Table(title=plain(title), title_justify="left", header_style="bold")
    cols = [("#", "right")]
    cols += [] if same["model"] else [("model", "left")]
    cols += [] if same["memory_bytes"] else [("memory", "right")]
    cols += [("NUMA", "right"), ("CPUs", "left"), ("PCI bus", "left")]
    cols += [] if same["compute_capability"] else [("CC", "left")]
    cols += [("MIG", "left"), ("health", "left")]
    for col, just in cols:
        table.add_column(col, justify=just, no_wrap=col in ("CPUs", "PCI bus"))  # type: ignore[arg-type]
    for d in devs:
        if d.partitions:
            mig = ", ".join(f"{p.profile}" + (f"@{p.start}" if p.start is not None else "") for p in d.partitions)
        elif d.mig_mode:
            mig = "on, no instances"
        elif d.mig_mode is False:
            mig = f"off, {len(d.mig_profiles)} profiles" if d.mig_profiles else "off"
        else:
            mig = na(None)
        health = Text(str(d.health), style={"ok": "green", "degraded": "yellow", "failed": "bold red"}.get(d.health, "dim"))
        row: list = [str(d.index)]
        row += [] if same["model"] else [plain(d.model)]
        row += [] if same["memory_bytes"] else [format_bytes(d.memory_bytes) if d.memory_bytes is not None else na(None)]
        row += [na(d.numa_node), cpu_ranges(d.cpus), plain(d.pci_bus_id)]  # a bus id ':AB:' is not an emoji
        row += [] if same["compute_capability"] else [plain(d.compute_capability)]
        row += [plain(mig), health]
        table.add_row(*row)
    return table


def _nics(topo: NodeTopology) -> Table:
    table = Table(title="NICs", title_justify="left", header_style="bold")
    for col in ("", "name", "NUMA", "RDMA", "closest devices"):
        table.add_column(col)
    for k, nic in enumerate(topo.nics):
        by_cls: dict[str, list[int]] = defaultdict(list)
        for dev, cls in nic.paths:
            by_cls[cls].append(dev)
        best = [c for c in PCIE_CLASSES if c in by_cls and c != "SYS"][:2]
        text = Text()
        for j, cls in enumerate(best):
            if j:
                text.append("; ")
            text.append(cls, style=_PCIE_STYLE.get(cls, ""))
            text.append(f" {_index_ranges(by_cls[cls])}")
        if not best:
            text.append("SYS to all" if by_cls else na(None), style="dim")
        table.add_row(f"NIC{k}", plain(nic.name), na(nic.numa_node), "yes" if nic.rdma else "no", text)
    return table


def render(topo: NodeTopology, title: str | None = None) -> None:
    """Print the human view of ``topo`` on the console."""
    head = title or topo.name or topo.hostname or "this machine"
    console.print(Text.assemble((str(head), "bold"), "  ", (summary(topo), "")))
    if topo.driver or topo.hostname:
        console.print(Text(f"host {na(topo.hostname)}, driver {na(topo.driver)}", style="dim"))
    if not topo.devices:
        console.print("no devices")
        return
    console.print()
    width = console.width
    if len(topo.devices) <= MATRIX_MAX_DEVICES and _matrix_fits(topo, 0, width):
        console.print(_matrix(topo, with_nics=bool(topo.nics) and _matrix_fits(topo, len(topo.nics), width)))
    else:
        console.print(_neighbours(topo))
    legend = Text("legend: ", style="dim")
    for kind, style in _KIND_STYLE.items():
        if any(l.kind == kind for l in topo.links):
            legend.append(f"{_KIND_ABBR[kind]} ", style=style)
            legend.append(f"= {_KIND_NAME[kind]} (# lanes)  ", style="dim")
    for cls in PCIE_CLASSES:
        legend.append(cls, style=_PCIE_STYLE[cls])
        legend.append(" ", style="dim")
    legend.append("(PCIe, best to worst)  - = unknown", style="dim")
    console.print(legend)
    console.print()
    console.print(_devices(topo))
    if topo.nics:
        console.print(_nics(topo))
    if topo.sources:
        console.print(Text("sources:", style="dim"))
        for s in topo.sources:
            console.print(Text(f"  - {s}", style="dim"), soft_wrap=True)


def _first_clause(reason: str) -> str:
    """``"no NVIDIA driver: nvmlInit failed: ..."`` -> ``"no NVIDIA driver"`` (up to the first ': ' or ' (')."""
    return reason.split(": ", 1)[0].split(" (", 1)[0].strip()


def _absent(reason: str) -> bool:
    """A backend's reason that only says its tool or device is not on this machine."""
    first = _first_clause(reason)
    return first.endswith("not found") or first.startswith("no ")


def no_accelerators(e: BackendUnavailable) -> str:
    """One short line for "discovery found nothing here": why, in a few words each, and what to do instead.

    Args:
        e: what :func:`rayaccel.discovery.discover` raised (``e.reasons`` lists each backend tried).
    """
    from ..catalog import DEFAULT

    if e.reasons:
        # GPU backends say why in full; the other families' "tool or device not here" collapse into one clause
        gpu = [(n, r) for n, r in e.reasons if n in ("nvidia", "amd")]
        absent = [n for n, r in e.reasons if n not in ("nvidia", "amd") and _absent(r)]
        other = [(n, r) for n, r in e.reasons if n not in ("nvidia", "amd") and not _absent(r)]
        parts = [f"{name}: {_first_clause(reason)}" for name, reason in gpu + other]
        if absent:
            parts.append(f"{', '.join(absent)}: none here")
        why = "; ".join(parts)
    else:
        why = f"{e.backend}: {_first_clause(e.reason)}" if e.backend else _first_clause(e.reason)
    return (f"No accelerators found here: no GPU or other accelerator this machine can use ({why}). "
            f"To look at a known machine: rayaccel topo show --topology {DEFAULT} (list: rayaccel topo list); "
            f"to simulate one: RAYACCEL_TOPOLOGY={DEFAULT} rayaccel topo show. Details: rayaccel topo backends")


def discover_here(backend: Optional[str] = None) -> NodeTopology:
    """:func:`rayaccel.discovery.discover`, printing each skipped broken plugin as one ``warning:`` line.

    Raises:
        typer.Exit: (after one ``error:`` line) nothing was found, or a backend failed.
    """
    from ..discovery import discover
    from ..discovery.registry import PluginWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PluginWarning)
        try:
            topo = discover(backend)
        except BackendUnavailable as e:
            fail(no_accelerators(e))
        except RayaccelError as e:
            fail(str(e))
        finally:
            for w in caught:
                if issubclass(w.category, PluginWarning):
                    warn_line(str(w.message))
    return topo


def check_picture_paths(svg: Optional[Path], png: Optional[Path]) -> None:
    """Reject a ``--svg``/``--png`` path with the wrong suffix, a directory, or one in a folder that
    cannot be written (:func:`rayaccel.viz.check_output_file`), before any work.

    Raises:
        typer.Exit: after printing ``error: ...`` (exit code 2).
    """
    from ..discovery.load import path_kind

    for path, suffix in ((svg, ".svg"), (png, ".png")):
        if path is None:
            continue
        shown = shorten(path, 200, quote=False)
        if path.suffix.lower() != suffix:
            fail(f"--{suffix[1:]} {shown}: the file name must end in {suffix}")
        if path_kind(path)[0] == "dir":
            fail(f"--{suffix[1:]} {shown}: is a directory; expected a file name ending in {suffix}")
        from ..viz import check_output_file

        try:
            check_output_file(path, suffixes=None)
        except RayaccelError as e:
            fail(f"--{suffix[1:]} {e}")


def _pictures(topo: NodeTopology, svg: Optional[Path], png: Optional[Path]) -> None:
    from .. import viz

    for path, flag in ((svg, "--svg"), (png, "--png")):
        if path is not None:
            try:
                written = viz.draw_topology(topo, path)
            except RayaccelError as e:
                fail(f"{flag} {e}")
            err_console.print(f"wrote {written}", markup=False, highlight=False)


def _output(topo: NodeTopology, as_json: bool, svg: Optional[Path], png: Optional[Path], title: str | None = None) -> None:
    """Draw the pictures first (an unwritable path fails before anything is printed), then print."""
    check_picture_paths(svg, png)
    _pictures(topo, svg, png)
    if as_json:
        print_json(topo.to_dict())
    else:
        render(topo, title)


# ---------------------------------------------------------------- commands
def register(app: typer.Typer) -> typer.Typer:
    """Add the ``topo`` sub-command group to ``app`` and return it (other modules add to it)."""
    topo_app = typer.Typer(help="Show how accelerators are wired: link matrix, devices, NICs, pictures.",
                           no_args_is_help=True)
    app.add_typer(topo_app, name="topo")

    json_opt = typer.Option(False, "--json", help="Print one JSON object (NodeTopology.to_dict()).")
    svg_opt = typer.Option(None, "--svg", help="Also draw the topology to this .svg file.")
    png_opt = typer.Option(None, "--png", help="Also draw the topology to this .png file.")

    @topo_app.command("show")
    def show(
        topology: Optional[str] = typer.Option(None, "--topology", "-t", metavar="NAME|FILE",
                                               help="A catalog machine (see `rayaccel topo list`), a topology JSON "
                                                    "file or a capture file. Default: this machine."),
        backend: Optional[str] = typer.Option(None, "--backend", "-b", help="Discover with this backend only."),
        as_json: bool = json_opt, svg: Optional[Path] = svg_opt, png: Optional[Path] = png_opt,
    ) -> None:
        """Show this machine's topology, or a named one (--topology)."""
        if topology is not None and backend is not None:
            fail(f"--topology {topology} and --backend {backend} exclude each other; give --topology to look at a "
                 "named machine or file, or --backend to discover this machine with one backend")
        check_picture_paths(svg, png)
        if topology is not None:
            from ..discovery.load import load_topology_with_warnings

            try:
                topo, warns = load_topology_with_warnings(topology)
            except RayaccelError as e:
                fail(str(e))
            for w in warns:
                warn_line(w)
        else:
            topo = discover_here(backend)
        _output(topo, as_json, svg, png)

    @topo_app.command("import")
    def import_(
        files: List[Path] = typer.Argument(..., metavar="FILE...", help="Capture files of ONE machine "
                                           "(nvidia-smi topo -m / -L / mig -lgip, rocm-smi --showtopo, amd-smi "
                                           "topology, neuron-ls) or a topology JSON file."),
        name: Optional[str] = typer.Option(None, "--name", help="Name of the imported topology."),
        as_json: bool = json_opt, svg: Optional[Path] = svg_opt, png: Optional[Path] = png_opt,
    ) -> None:
        """Import text captures of one machine into a topology (warnings go to stderr)."""
        from ..discovery.load import load_topology_with_warnings

        if name is not None and not name.strip():
            fail("--name: empty; expected a name for the imported topology, e.g. --name dgx-a100-rack3")
        from ..discovery.load import path_kind

        for f in files:
            kind, why = path_kind(f)
            shown = shorten(f, 200, quote=False)
            if kind == "dir":
                fail(f"{shown}: is a directory; expected a capture file or a topology JSON file")
            if kind != "file":
                what = "no such file" if why.startswith("tried ") else why
                fail(f"{shown}: {what}; expected a capture file or a topology JSON file")
        check_picture_paths(svg, png)
        try:
            topo, warns = load_topology_with_warnings([str(f) for f in files], name=name)
        except RayaccelError as e:
            fail(str(e))
        for w in warns:
            warn_line(w)
        if name and topo.name != name:
            from dataclasses import replace

            topo = replace(topo, name=name)
        _output(topo, as_json, svg, png)

    @topo_app.command("backends")
    def backends_(as_json: bool = json_opt) -> None:
        """List discovery backends: available or not, with the reason and a hint."""
        from ..discovery.registry import backend_infos

        infos = backend_infos()
        if as_json:
            print_json([{"name": i.name, "available": i.available, "broken": i.broken, "reason": i.reason,
                         "hint": i.hint} for i in infos])
            return
        table = Table(title="Discovery backends", title_justify="left", header_style="bold")
        for col in ("backend", "status", "reason", "hint"):
            table.add_column(col, overflow="fold")
        for i in infos:
            if i.available:
                status = Text("available", style="green")
            else:
                status = Text("broken", style="bold red") if i.broken else Text("unavailable", style="yellow")
            table.add_row(plain(i.name), status, plain(i.reason or ""), plain(i.hint or ""))
        console.print(table)

    @topo_app.command("list")
    def list_(as_json: bool = json_opt) -> None:
        """List the catalog of real machines (use a name with --topology)."""
        from .. import catalog

        rows = []
        for n in catalog.names():
            t = catalog.load(n)
            rows.append({"name": n, "devices": len(t.devices), "description": catalog.describe(n),
                         "default": n == catalog.DEFAULT})
        if as_json:
            print_json(rows)
            return
        table = Table(title="Catalog machines (rayaccel topo show --topology NAME)", title_justify="left",
                      header_style="bold")
        table.add_column("name", style="bold")
        table.add_column("devices", justify="right")
        table.add_column("description", overflow="fold")
        for r in rows:
            table.add_row(plain(r["name"] + (" (default)" if r["default"] else "")), str(r["devices"]),
                          plain(r["description"]))
        console.print(table)
    return topo_app
