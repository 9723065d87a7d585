"""``rayaccel topo path A B``: how bytes would move between two devices, and how long that takes (modeled).

Each command imports what it needs inside itself, so ``rayaccel --help`` and the offline
commands never load Ray, matplotlib or the placer they do not use.
"""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from ..errors import RayaccelError
from ..transfer import MODEL, Endpoint, plan
from ..units import format_bytes, parse_bytes
from ._common import console, fail, plain, print_json, warn_line

LOCAL = "local"


def _endpoint(text: str, default_node: str, topologies: dict[str, object], which: str) -> Endpoint:
    """``"3"``, ``"host"``, ``"nodeB:3"`` or ``"nodeB:host"`` -> Endpoint."""
    node, _, dev = text.rpartition(":")
    node = node or default_node
    if dev == "host":
        device = None
    else:
        try:
            device = int(dev)
        except ValueError:
            fail(f"{which}: cannot read {text!r}; expected a device index (3), 'host', or NODE:INDEX (nodeB:3)")
    return Endpoint(node, device, topologies.get(node, topologies[LOCAL]))  # type: ignore[arg-type]


def _load(source: str):
    """The topology of ``source``; capture warnings become ``warning:`` lines (not Python warnings).

    Raises:
        RayaccelError: as :func:`rayaccel.discovery.load.load_topology`.
    """
    from ..discovery.load import load_topology_with_warnings

    topo, warns = load_topology_with_warnings(source)
    for w in warns:
        warn_line(w)
    return topo


def register(topo_app: typer.Typer) -> None:
    """Add the ``path`` command to the ``topo`` sub-app."""

    @topo_app.command("path")
    def path(
        src: str = typer.Argument(..., metavar="A", help="Source: a device index, 'host', or NODE:INDEX."),
        dst: str = typer.Argument(..., metavar="B", help="Destination: a device index, 'host', or NODE:INDEX "
                                                         "(a node other than A's is planned across nodes)."),
        topology: Optional[str] = typer.Option(None, "--topology", "-t", metavar="NAME|FILE",
                                               help="A's node: a catalog machine, a topology JSON or a capture file. "
                                                    "Default: this machine."),
        remote_topology: Optional[str] = typer.Option(None, "--remote-topology", metavar="NAME|FILE",
                                                      help="The other node's topology for NODE:INDEX endpoints "
                                                           "(default: same as --topology)."),
        nbytes: str = typer.Option("1GiB", "--bytes", "-b", help="How many bytes to move (e.g. 64MiB, 1GiB)."),
        as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    ) -> None:
        """Show the route bytes take from A to B (NVLink, PCIe P2P, staged, GPUDirect RDMA, TCP) and the modeled time."""
        try:
            size = parse_bytes(nbytes, "--bytes")
            if topology is not None:
                local = _load(topology)
            else:
                from .topo import discover_here

                local = discover_here()
            remote = _load(remote_topology) if remote_topology is not None else local
            topos = {LOCAL: local}
            a = _endpoint(src, LOCAL, topos, "A")
            if a.node != LOCAL:
                topos = {a.node: local}
                a = Endpoint(a.node, a.device, local)
            b = _endpoint(dst, a.node, {**topos, LOCAL: remote}, "B")
            p = plan(a, b, size)
        except RayaccelError as e:
            fail(str(e))
        if as_json:
            print_json(p.to_dict())
            return
        t = Table(show_header=False, box=None, pad_edge=False)
        t.add_column(style="bold")
        t.add_column()
        t.add_row("route", Text(str(p.route), style="bold cyan"))
        t.add_row("path", plain(" -> ".join(p.hops)))
        t.add_row("bytes", format_bytes(p.nbytes))
        t.add_row("bandwidth", f"{p.bandwidth_gbps:g} GB/s (modeled, per direction)")
        t.add_row("time", f"{_seconds(p.seconds)} (latency {_seconds(p.latency_s)} + bytes / bandwidth)")
        t.add_row("why", plain(p.reason))
        console.print(t)
        console.print(f"[dim]model constants: rayaccel.transfer.MODEL ({len(MODEL)} values); "
                      "link bandwidths: rayaccel.topology tables[/]")


def _seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"
