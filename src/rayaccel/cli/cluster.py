"""``rayaccel start | stop | status | demo``: thin over :mod:`rayaccel.ray`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._common import console, fail, na, print_json


def _start(ctx: typer.Context,
           topology: Optional[str] = typer.Option(None, "--topology", help="Simulate this catalog name or topology file instead of discovering."),
           no_publish: bool = typer.Option(False, "--no-publish", help="Do not write the topology into the GCS KV (debugging).")) -> None:
    """Start a Ray node whose devices rayaccel manages (other flags go to `ray start`).

    Example: rayaccel start --head --topology dgx1-v100
    """
    from ..ray.node import start_node

    record, output = start_node(list(ctx.args), topology, publish=not no_publish)
    t = record.topology
    console.print(output.rstrip())
    console.print(f"[bold]rayaccel:[/] node key {record.node_key}: {len(t.devices)} device(s) "
                  f"({t.name or t.hostname or 'discovered'}{', simulated' if record.simulated else ''}), "
                  f"{len(t.partitions())} MIG instance(s); topology published"
                  f"{'' if not no_publish else ' [not published]'}. Ray num_gpus=0 on this node.")


def _stop(force: bool = typer.Option(False, "--force", help="Pass --force to `ray stop`.")) -> None:
    """Stop the Ray processes on this machine (`ray stop`)."""
    from ..ray.node import stop_node

    console.print(stop_node(force).rstrip())


def _status(address: str = typer.Option("auto", "--address", help="Ray address to connect to."),
            as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Every node's devices: busy or free, and which task or actor holds them."""
    import ray

    from ..ray import node, status

    try:
        node.init(address=address, logging_level="ERROR", log_to_driver=False)
    except ConnectionError as e:
        fail(f"cannot connect to Ray at {address!r}: {e} (start a node with `rayaccel start --head`)")
    try:
        data = status.cluster_status()
    finally:
        node.shutdown()
    if as_json:
        print_json(data)
        return
    if not data:
        console.print("no rayaccel-managed nodes (start them with `rayaccel start`)")
        return
    from rich.table import Table

    from ..units import format_bytes

    for n in data:
        table = Table(title=f"{n['name'] or n['node_key']} (node {n['node_id'][:12]}"
                            f"{', simulated' if n['simulated'] else ''}): {n['free']}/{len(n['devices'])} free",
                      title_justify="left")
        for col in ("dev", "model", "memory", "state", "used", "held by"):
            table.add_column(col)
        for d in n["devices"]:
            style = {"free": "green", "busy": "red", "shared": "yellow", "mig": "magenta"}[d["state"]]
            table.add_row(str(d["index"]), na(d["model"]), format_bytes(d["memory_bytes"]),
                          f"[{style}]{d['state']}[/]", format_bytes(d["memory_used_bytes"]) if d["memory_used_bytes"] else "-",
                          ", ".join(d["holders"] + d["mig_held"]) or ("-" if d["state"] == "free" else "(unnamed)"))
        console.print(table)
    del ray


def _demo(out: Path = typer.Option(Path("rayaccel-demo"), "--out", help="Directory for the picture and demo.json."),
          quick: bool = typer.Option(False, "--quick", help="Two nodes and fewer jobs.")) -> None:
    """Run a mixed workload on a (simulated) cluster and compare with plain Ray's choices."""
    from rich.table import Table

    from ..ray.demo import run_demo

    res = run_demo(out, quick=quick, log=lambda m: console.print(f"[dim]{m}[/]"))
    table = Table(title="where each piece landed: rayaccel vs plain Ray num_gpus (same node, same free state)",
                  title_justify="left")
    for col in ("job", "asks", "node", "rayaccel: devices link GB/s", "plain Ray: devices link GB/s", "note"):
        table.add_column(col)

    def cell(devs, link, bw) -> str:
        if not devs:
            return "-"
        text = ",".join(map(str, devs))
        if len(devs) > 1:
            text += f" {link} {bw:.0f}"
        return text

    for r in res["rows"]:
        ours = cell(r["devices"], r["extra"].get("link"), r["bandwidth_gbps"] or 0)
        theirs = cell(r["ray_devices"], r["extra"].get("ray_link"), r["ray_bandwidth_gbps"] or 0)
        better = bool(r["bandwidth_gbps"]) and r["ray_bandwidth_gbps"] is not None \
            and r["bandwidth_gbps"] > r["ray_bandwidth_gbps"] + 1e-9
        table.add_row(r["job"], r["request"], r["node"] or "-", f"[green]{ours}[/]" if better else ours, theirs,
                      r["note"])
    console.print(table)
    t = res["totals"]
    if t["ratio"]:
        console.print(f"[bold]modeled all-reduce bandwidth over {t['compared']} multi-GPU pieces:[/] rayaccel "
                      f"{t['rayaccel_gbps']} GB/s vs plain Ray {t['ray_gbps']} GB/s = [bold]{t['ratio']}x[/] "
                      f"({t['better']} placed better, the rest equal); plain Ray cannot express "
                      f"{t['ray_cannot']} of the pieces (MIG, memory shares)")
    console.print(f"picture of the final placement: [bold]{res['picture']}[/]; data: {res['json']} "
                  f"({res['seconds']} s)")


def register(app: typer.Typer) -> None:
    """Add ``start``, ``stop``, ``status`` and ``demo`` to ``app``."""
    app.command("start", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(_start)
    app.command("stop")(_stop)
    app.command("status")(_status)
    app.command("demo")(_demo)
