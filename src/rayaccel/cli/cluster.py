"""``rayaccel start | stop | status | demo``: thin over :mod:`rayaccel.ray`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._common import console, fail, na, print_json


def _start(ctx: typer.Context,
           topology: Optional[str] = typer.Option(None, "--topology", help="Simulate this catalog name or topology file instead of discovering."),
           no_publish: bool = typer.Option(False, "--no-publish", help="Do not publish the topology or start the node agent (debugging).")) -> None:
    """Start a Ray node whose devices rayaccel manages (other flags go to `ray start`).

    Example: rayaccel start --head --topology dgx1-v100
    """
    from rich.markup import escape

    from ..ray.arbiter import gpu_pool
    from ..ray.lifecycle import start_node

    res = start_node(list(ctx.args), topology, publish=not no_publish)
    rec = res.record
    t = rec.topology
    what = t.name or t.hostname or "discovered"
    console.print(f"rayaccel: started a {'head' if res.head else 'worker'} node (key {rec.node_key}, "
                  f"{res.processes} Ray processes)")
    console.print(f"  devices: {len(t.devices)} ({escape(what)}{', simulated' if rec.simulated else ''}); "
                  f"Ray GPU={len(gpu_pool(t))}, MIG instances={len(t.partitions())}")
    console.print("  topology: " + ("published, node agent running" if res.published else "NOT published (--no-publish)"))
    if res.head:
        console.print(f"  add a node:   rayaccel start --address={res.address}")
    console.print(f"  connect:      ray.init(address=\"{res.address}\")   (plain Ray code works unchanged)")
    console.print(f"  stop it:      rayaccel stop --node {rec.node_key}")


def _stop(node: Optional[str] = typer.Option(None, "--node", help="Key of the node to stop (see `rayaccel stop` with several)."),
          address: Optional[str] = typer.Option(None, "--address", help="Stop the local node that joined this cluster address."),
          all_nodes: bool = typer.Option(False, "--all", help="Stop every node of the cluster (run on the head)."),
          force: bool = typer.Option(False, "--force", help="SIGKILL at once instead of SIGTERM and a grace period.")) -> None:
    """Stop the Ray processes `rayaccel start` started on this machine -- never other clusters."""
    from ..ray import lifecycle

    if all_nodes:
        from ..ray.ops import stop_cluster

        for line in stop_cluster(address or _only_local_address(), force=force):
            console.print(line)
        return
    for n in lifecycle.pick(node, address):
        count = lifecycle.stop_local(n, force=force)
        console.print(f"rayaccel: stopped node {n.node_key} ({'head' if n.head else 'worker'} at {n.address}): "
                      f"{count} recorded Ray process(es)")


def _only_local_address() -> str:
    from ..ray import lifecycle

    heads = [n for n in lifecycle.local_nodes() if n.head]
    if len(heads) != 1:
        fail("--all needs the cluster: run it on the head node, or give --address HOST:PORT "
             f"({len(heads)} rayaccel head nodes run here)")
    return heads[0].address


def connect(address: str) -> None:
    """Connect this CLI process to the cluster at ``address`` (bounded; one clear error line on failure)."""
    from ..ray.ops import connect as _connect

    _connect(address)


def _status(address: str = typer.Option("auto", "--address", help="Ray address to connect to."),
            as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Every node's devices: free, held (by which task or actor), shared, MIG, drained."""
    from ..ray import node, status

    connect(address)
    try:
        data = status.cluster_status()
    finally:
        node.shutdown()
    if as_json:
        print_json(data)
        return
    from .views import status_tables

    for item in status_tables(data):
        console.print(item)


def _demo(out: Path = typer.Option(Path("rayaccel-demo"), "--out", help="Directory for placement.png and demo.json."),
          quick: bool = typer.Option(False, "--quick", help="Two nodes and fewer jobs (about half the time).")) -> None:
    """Run a mixed workload on a (simulated) cluster, next to what plain Ray num_gpus would have picked."""
    from rich.table import Table

    from ..ray.demo import run_demo

    res = run_demo(out, quick=quick, log=lambda m: console.print(f"[dim]{m}[/]"))
    table = Table(title="where each job landed: rayaccel (run on Ray) vs plain Ray num_gpus (shadow cluster, same "
                        "arrivals and departures)", title_justify="left", show_lines=True)
    for col, kw in (("job", {"style": "bold", "no_wrap": True}), ("asks", {}), ("rayaccel", {}),
                    ("plain Ray", {}), ("note", {"style": "dim"})):
        table.add_column(col, **kw)

    def cell(side: dict, other: dict) -> str:
        if not side.get("placed"):
            return "[red]queued[/]"
        nodes, devs = side["nodes"], side["devices"]
        where = []
        for i, (n, d) in enumerate(zip(nodes, devs)):
            parts = side["partitions"][i]
            text = ",".join(map(str, d))
            if parts:
                text = f"MIG {','.join(parts)}"
            elif side["memory_bytes"][i]:
                text = f"{text} (shared)"
            elif side.get("whole_for_fraction"):
                text = f"{text} (whole)"
            if not where or where[-1][0] != n:
                where.append([n, text])
            else:
                where[-1][1] += f",{text}"
        lines = [f"{n}: {t}" for n, t in where]
        bw = side.get("bandwidth_gbps")
        if bw is not None:
            ob = other.get("bandwidth_gbps")
            colour = "green" if ob is not None and bw > ob + 1e-6 else "red" if ob is not None and bw < ob - 1e-6 else ""
            link = f"{side['link']} {bw:g} GB/s"
            lines.append(f"[{colour}]{link}[/]" if colour else link)
        return "\n".join(lines)

    for r in res["rows"]:
        end = "" if r["end"] is None or r["kind"] == "task" else f", ends {r['end']}"
        table.add_row(f"{r['job']}\n[dim]at {r['start']}{end}[/]", f"{r['asks']}\n[dim]{r['what']}[/]",
                      cell(r["ours"], r["ray"]), cell(r["ray"], r["ours"]), r["note"])
    console.print(table)
    t = res["totals"]
    summary = Table(title="totals", title_justify="left", show_header=True)
    for col in ("", "rayaccel", "plain Ray"):
        summary.add_column(col)
    if t["multi_gpu_jobs"]:
        summary.add_row(f"modeled all-reduce GB/s over {t['multi_gpu_jobs']} multi-GPU jobs (sum / mean)",
                        f"[bold green]{t['rayaccel_gbps_sum']:g} / {t['rayaccel_gbps_mean']:g}[/]",
                        f"{t['ray_gbps_sum']:g} / {t['ray_gbps_mean']:g}")
        summary.add_row("jobs on their node's best interconnect", f"{t['rayaccel_best']} of {t['multi_gpu_jobs']}",
                        f"{t['ray_best']} of {t['multi_gpu_jobs']}")
    if t["fraction_jobs"]:
        summary.add_row(f"GPUs held by the {t['fraction_jobs']} MIG / memory-share jobs",
                        f"{t['rayaccel_gpu_share_of_fraction_jobs']:g} GPU-equivalents on "
                        f"{t['rayaccel_gpus_for_fraction_jobs']} GPUs",
                        f"{t['ray_gpus_for_fraction_jobs']} whole GPUs")
    console.print(summary)
    if t["ratio"]:
        console.print(f"[bold]rayaccel: {t['ratio']}x the modeled all-reduce bandwidth of plain Ray[/] "
                      f"({t['better']} jobs better, {t['worse']} worse, the rest equal)"
                      + (f"; plain Ray queued {', '.join(t['ray_queued'])}" if t["ray_queued"] else ""))
    if res["skipped"]:
        console.print(f"skipped (do not fit this machine): {', '.join(res['skipped'])}")
    console.print(f"final placement picture: [bold]{res['picture']}[/]\nresults: [bold]{res['json']}[/] "
                  f"({res['seconds']} s)")


def register(app: typer.Typer) -> None:
    """Add ``start``, ``stop``, ``status`` and ``demo`` to ``app``."""
    app.command("start", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(_start)
    app.command("stop")(_stop)
    app.command("status")(_status)
    app.command("demo")(_demo)
