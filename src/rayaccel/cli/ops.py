"""``rayaccel drain | undrain | reclaim | doctor | top``: operating a cluster (thin over :mod:`rayaccel.ray`).

Each command imports what it needs inside itself, so ``rayaccel --help`` and the offline
commands never load Ray, matplotlib or the placer they do not use.
"""

from __future__ import annotations

import sys
import time
import typer
from rich.table import Table
from rich.text import Text

from ._common import connect_cluster, console, print_json

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "n/a": "dim"}


def _drain(target: str = typer.Argument(..., metavar="NODE:DEVICE", help="Node key (or id, hostname) and device index."),
           reason: str = typer.Option("drained by an operator", "--reason", help="Shown by status, top and doctor."),
           kill: bool = typer.Option(False, "--kill", help="Also stop the work running on it (default: let it finish)."),
           address: str = typer.Option("auto", "--address", help="Ray address to connect to.")) -> None:
    """Give a device no new work; it stays held in Ray's ledger until `rayaccel undrain`."""
    from ..ray.driver import init as node
    from ..ray.driver import ops
    connect_cluster(address)
    try:
        out = ops.drain(target, reason, kill=kill)
    finally:
        node.shutdown()
    what = "drained" if out["new"] else "already drained"
    killed = f"; stopped pid(s) {', '.join(map(str, out['killed']))}" if out["killed"] else ""
    console.print(Text(f"rayaccel: device {out['device']} of node {out['node_key']} {what}{killed}"))


def _undrain(target: str = typer.Argument(..., metavar="NODE:DEVICE"),
             address: str = typer.Option("auto", "--address", help="Ray address to connect to.")) -> None:
    """Give a drained device work again."""
    from ..ray.driver import init as node
    from ..ray.driver import ops
    connect_cluster(address)
    try:
        was = ops.undrain(target)
    finally:
        node.shutdown()
    console.print(Text(f"rayaccel: {target} {'undrained' if was else 'was not drained'}"))


def _reclaim(target: str = typer.Argument(..., metavar="NODE:DEVICE", help="Node key (or id, hostname) and device index."),
             address: str = typer.Option("auto", "--address", help="Ray address to connect to."),
             as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """End a device's leaked processes (a worker's child that outlived it) that belong to the node's Ray workers.

    Only processes of this user that carry the node's markers or descend from one of its workers are ended
    (SIGTERM, then SIGKILL); any other process on the device is reported and left running. The device's leak
    fence lifts once none is left.
    """
    from ..ray.driver import init as node
    from ..ray.driver import ops

    resolved = connect_cluster(address, as_json)
    try:
        out = ops.reclaim(target)
    finally:
        node.shutdown()
    if as_json:
        print_json({"address": resolved, **out})
        return
    where = f"device {out['device']} of node {out['node_key']}"
    if not out["ended"] and not out["left"]:
        console.print(Text(f"rayaccel: {where} has no leaked processes"))
    for r in out["ended"]:
        console.print(Text(f"rayaccel: {where}: ended pid {r['pid']} ({r['command'] or '?'}) from {r['holder']} "
                           f"[{r['signal']}]"))
    for r in out["left"]:
        console.print(Text(f"  not ours: pid {r['pid']} ({r['command'] or '?'}), left running: {r['why']}"))
    fence = {"lifted": "its leak fence is lifted", "kept": "its leak fence stays (leaked processes remain)",
             "none": ""}[out["fence"]]
    if fence:
        console.print(Text(f"rayaccel: {where}: {fence}"))


def _doctor(address: str = typer.Option("auto", "--address", help="Ray address to connect to."),
            as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Check that the cluster is sound: versions, hooks, drivers, CUDA, NCCL, MIG, fabric, P2P, GPUDirect, queues."""
    from ..ray.driver import doctor
    from ..ray.driver import init as node

    resolved = connect_cluster(address, as_json)
    try:
        rows = doctor.run()
    finally:
        node.shutdown()
    failed = sum(1 for r in rows if r.status == "fail")
    if as_json:
        print_json({"address": resolved, "rows": [r.to_dict() for r in rows], "fail": failed,
                    "warn": sum(1 for r in rows if r.status == "warn")})
    else:
        t = Table(title="rayaccel doctor", title_justify="left")
        for col in ("node", "check", "status", "detail", "what to do"):
            t.add_column(col)
        for r in rows:
            t.add_row(Text(r.node), Text(r.name), Text(r.status, style=STATUS_STYLE.get(r.status, "")),
                      Text(r.detail), Text(r.fix or ""))
        console.print(t)
        console.print(Text(f"{failed} failed, {sum(1 for r in rows if r.status == 'warn')} warnings, "
                           f"{sum(1 for r in rows if r.status == 'ok')} ok, "
                           f"{sum(1 for r in rows if r.status == 'n/a')} not applicable"))
    if failed:
        raise typer.Exit(1)


def _top(address: str = typer.Option("auto", "--address", help="Ray address to connect to."),
         once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
         interval: float = typer.Option(1.0, "--interval", min=0.2, max=60.0, help="Seconds between frames.")) -> None:
    """A live view of every node: devices, links, holders, health, drains, waiting requests (q quits the live view)."""
    from ..ray.driver import init as node
    from ..ray.driver import status
    from .views import top_frame

    resolved = connect_cluster(address)
    try:
        if once or not sys.stdin.isatty():
            console.print(top_frame(status.cluster_status(), address=resolved))
            return
        _live(lambda: top_frame(status.cluster_status(), address=resolved, live=True), interval)
    finally:
        node.shutdown()


def _live(frame, interval: float) -> None:
    """Redraw ``frame()`` every ``interval`` seconds until ``q`` (or Ctrl-C)."""
    import select
    import termios
    import tty

    from rich.live import Live

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        with Live(frame(), console=console, screen=True, auto_refresh=False) as live:
            next_at = time.monotonic() + interval
            while True:
                wait = max(0.0, next_at - time.monotonic())
                ready, _, _ = select.select([sys.stdin], [], [], wait)
                if ready:
                    ch = sys.stdin.read(1)
                    if ch in ("q", "Q"):
                        return
                if time.monotonic() >= next_at:
                    live.update(frame(), refresh=True)
                    next_at = time.monotonic() + interval
    except KeyboardInterrupt:
        return
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def register(app: typer.Typer) -> None:
    """Add ``drain``, ``undrain``, ``reclaim``, ``doctor`` and ``top`` to ``app``."""
    app.command("drain")(_drain)
    app.command("undrain")(_undrain)
    app.command("reclaim")(_reclaim)
    app.command("doctor")(_doctor)
    app.command("top")(_top)
