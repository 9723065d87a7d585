"""``rayaccel start | stop | status | demo``: thin over :mod:`rayaccel.ray`.

Each command imports what it needs inside itself, so ``rayaccel --help`` and the offline
commands never load Ray, matplotlib or the placer they do not use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from ._common import connect_cluster, console, fail, print_json


def _start(ctx: typer.Context,
           topology: Optional[str] = typer.Option(None, "--topology", help="Simulate this catalog name or topology file instead of discovering."),
           no_publish: bool = typer.Option(False, "--no-publish", help="Do not publish the topology or start the node agent (debugging)."),
           block: bool = typer.Option(False, "--block", help="Stay in the foreground until the node stops (containers, KubeRay); SIGTERM stops it."),
           network_topology: Optional[str] = typer.Option(None, "--network-topology", help="A Slurm topology.conf or AWS describe-instance-topology JSON naming this node: its network levels become labels (rayaccel.io/net-l1, ...)."),
           instance_id: Optional[str] = typer.Option(None, "--instance-id", help="This node's EC2 instance id (with an AWS --network-topology file)."),
           nic_env: Optional[str] = typer.Option(None, "--nic-env", help="Also write these NIC variables at each grant, from the devices' near NICs (UCX_NET_DEVICES always): NCCL_IB_HCA, NVSHMEM_HCA_LIST, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME. A value the user set is kept."),
           zero_gpu_tasks: Optional[str] = typer.Option(None, "--zero-gpu-tasks", help="What a task asking no GPU sees: see-none (default: no GPU) or see-all (plain Ray's: the node's GPUs)."),
           on_failed_gpu: Optional[str] = typer.Option(None, "--on-failed-gpu", help="When the health watcher drains a failed GPU (an Xid, a lost GPU): leave (default) its workers, or end-workers, so Ray restarts them on a healthy device."),
           reclaim_leaks: Optional[str] = typer.Option(None, "--reclaim-leaks", metavar="AFTER", help="End leaked device processes of this node's Ray workers (a worker's child that outlived it) once a leak has lasted AFTER (30s, 5m, 1h); default: never, only `rayaccel reclaim`."),
           dynamic_mig: Optional[str] = typer.Option(None, "--dynamic-mig", metavar="GPUS", help="GPUs in MIG mode (0,1 or all) whose MIG instances the node's agent creates for waiting mig_<profile> work and destroys when idle and in the way of another profile (never one with work). Enabling MIG mode stays the operator's (a GPU reset).")) -> None:
    """Start a Ray node whose devices rayaccel manages (other flags go to `ray start`).

    CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on AMD) set for the node, or --num-gpus smaller than the host's
    count, gives the node only those devices, as with plain `ray start`.

    Without GPUs and without --topology the node advertises no devices (a CPU node).
    Example: rayaccel start --head --topology dgx1-v100
    """
    from rich.markup import escape

    from ..placement.pools import gpu_pool
    from ..ray.node.lifecycle import start_node

    res = start_node(list(ctx.args), topology, publish=not no_publish, network_topology=network_topology,
                     instance_id=instance_id, nic_env=nic_env, zero_gpu_tasks=zero_gpu_tasks,
                     on_failed_gpu=on_failed_gpu, reclaim_leaks=reclaim_leaks, dynamic_mig=dynamic_mig)
    rec = res.record
    t = rec.topology
    what = t.name or t.hostname or "discovered"
    console.print(f"rayaccel: started a {'head' if res.head else 'worker'} node (key {rec.node_key}, "
                  f"{res.processes} Ray processes)")
    console.print(f"  devices: {len(t.devices)} ({escape(what)}{', simulated' if rec.simulated else ''}); "
                  f"Ray GPU={len(gpu_pool(t))}, MIG instances={len(t.partitions())}")
    if rec.dynamic_mig:
        console.print(f"  dynamic MIG on GPU(s) {', '.join(map(str, rec.dynamic_mig))}: instances made for waiting work")
    if rec.host is not None:
        console.print(f"  given:   {escape(str(rec.given_by))}: this node manages devices "
                      f"{list(t.indices)} of the host's {list(rec.host)}")
    console.print("  topology: " + ("published, node agent running" if res.published else "NOT published (--no-publish)"))
    if res.head:
        console.print(f"  add a node:   rayaccel start --address={res.address}")
    console.print(f"  connect:      ray.init(address=\"{res.address}\")   (plain Ray code works unchanged)")
    if not t.devices:
        console.print("  no accelerator found here: a node without GPUs (simulate one with --topology dgx1-v100)")
    console.print(f"  stop it:      rayaccel stop --node {rec.node_key}")
    if block:
        import sys

        from ..ray.node.lifecycle import block as wait

        sys.stdout.flush()
        raise typer.Exit(wait(rec.node_key))


def _stop(node: Optional[str] = typer.Option(None, "--node", help="Key of the node to stop (see `rayaccel stop` with several)."),
          address: Optional[str] = typer.Option(None, "--address", help="Stop the local node that joined this cluster address."),
          all_nodes: bool = typer.Option(False, "--all", help="Stop every node of the cluster (run on the head)."),
          force: bool = typer.Option(False, "--force", help="SIGKILL at once instead of SIGTERM and a grace period.")) -> None:
    """Stop the Ray processes `rayaccel start` started on this machine -- never other clusters."""
    from ..ray.node import processes as lifecycle
    if all_nodes:
        from ..ray.driver.ops import stop_cluster

        target = address or _only_local_address()
        console.print(Text(f"cluster: {target}"))
        for line in stop_cluster(target, force=force):
            console.print(line)
        return
    for n in lifecycle.pick(node, address):
        count = lifecycle.stop_local(n, force=force)
        console.print(f"rayaccel: stopped node {n.node_key} ({'head' if n.head else 'worker'} at {n.address}): "
                      f"{count} recorded Ray process(es)")


def _only_local_address() -> str:
    from ..ray.node import processes as lifecycle
    heads = [n for n in lifecycle.local_nodes() if n.head]
    if len(heads) != 1:
        fail("--all needs the cluster: run it on the head node, or give --address HOST:PORT "
             f"({len(heads)} rayaccel head nodes run here)")
    return heads[0].address


def _status(address: str = typer.Option("auto", "--address", help="Ray address to connect to."),
            as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
            placement_groups: bool = typer.Option(False, "--placement-groups", help="Also each placement group's map: per bundle its node, devices, NICs, NUMA (asking a placed group's nodes reserves its devices as its first member would).")) -> None:
    """Every node's devices: free, held (by which task or actor), shared, MIG, drained."""
    from ..ray.driver import init as node
    from ..ray.driver import status
    resolved = connect_cluster(address, as_json)
    pgs = None
    try:
        data = status.cluster_status()
        if placement_groups:
            from ..ray.driver.placemap import placement_groups_status

            pgs = placement_groups_status()
    finally:
        node.shutdown()
    if as_json:
        print_json({"address": resolved, **data, **({"placement_groups": pgs} if pgs is not None else {})})
        return
    from .views import status_tables

    for item in status_tables(data):
        console.print(item)
    if pgs is not None:
        from .placements import placement_group_tables

        for item in placement_group_tables(pgs):
            console.print(item)


def _demo(out: Optional[Path] = typer.Option(None, "--out", help="Also write placement.png and demo.json to this folder (created; default: write nothing)."),
          quick: bool = typer.Option(False, "--quick", help="Accepted for scripts; the demo is one short run per side.")) -> None:
    """Run the same unchanged Ray code (Serve, a num_gpus task, Train) on a rayaccel node and a plain Ray node."""
    from rich.table import Table

    from ..demo import run_demo

    res = run_demo(out, quick=quick, log=lambda m: console.print(Text(m, style="dim")))
    table = Table(title=f"where each job's GPUs landed on a {res['machine']}: rayaccel vs plain Ray "
                        "(the same code, both really run)", title_justify="left", show_lines=True)
    for col in ("job (unchanged Ray code)", "rayaccel", "plain Ray"):
        table.add_column(col)

    def cell(side: dict, other: dict) -> Text:
        gpus = side.get("gpus") or []
        t = Text(f"GPUs {gpus}")
        if "after_scale_down" in side:
            t.append(f" (after scaling to 1 replica: {side['after_scale_down']})")
        if "link" in side:
            bw, ob = side.get("bandwidth_gbps", 0), other.get("bandwidth_gbps", 0)
            style = "green" if bw > ob + 1e-6 else "red" if bw < ob - 1e-6 else ""
            t.append(f"\nweakest link {side['link']}, all-reduce {bw:g} GB/s", style=style)
        return t

    for r in res["rows"]:
        table.add_row(Text(r["job"]), cell(r["rayaccel"], r["ray"]), cell(r["ray"], r["rayaccel"]))
    console.print(table)
    t = res["totals"]
    if t["ratio"]:
        console.print(Text(f"rayaccel: {t['ratio']}x plain Ray's modeled all-reduce bandwidth over "
                           f"{t['multi_gpu_jobs']} multi-GPU jobs ({t['better']} better, {t['worse']} worse, "
                           f"the rest equal)", style="bold"))
    kept = res.get("serve_kept") or {}
    if kept.get("rayaccel") != kept.get("ray"):
        console.print(Text(f"(Serve picks which replica to stop: it kept GPU {kept.get('rayaccel')} on the rayaccel "
                           f"node and GPU {kept.get('ray')} on the plain one, so Train found different GPUs free; "
                           "plain Ray gives Train the lowest free slots, whichever those are)", style="dim"))
    train = next((r for r in res["rows"] if r["job"].startswith("train")), None)
    if train and not train["rayaccel"].get("torch"):
        console.print(Text("(PyTorch is not installed: DataParallelTrainer ran, without an all-reduce; "
                           "pip install 'rayaccel[torch]' for TorchTrainer)", style="dim"))
    if res["picture"]:
        console.print(Text(f"picture: {res['picture']}\nresults: {res['json']} ({res['seconds']} s)"))
    else:
        console.print(Text(f"({res['seconds']} s; no files written: --out DIR writes placement.png and demo.json)",
                           style="dim"))


def register(app: typer.Typer) -> None:
    """Add ``start``, ``stop``, ``status`` and ``demo`` to ``app``."""
    app.command("start", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(_start)
    app.command("stop")(_stop)
    app.command("status")(_status)
    app.command("demo")(_demo)
