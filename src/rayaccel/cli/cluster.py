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
    except (ConnectionError, ValueError) as e:
        fail(f"cannot connect to Ray at {address!r}: {e} (expected 'auto' or HOST:PORT of a node started with "
             "`rayaccel start --head`)")
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
