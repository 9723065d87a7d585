"""``rayaccel plan``: where would a request go on a machine (dry run, no Ray).

Each command imports what it needs inside itself, so ``rayaccel --help`` and the offline
commands never load Ray, matplotlib or the placer they do not use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import RayaccelError, RequestError
from ._common import console, err_console, fail, parse_index_list, plain, print_json, warn_line


def _indices(text: str | None, option: str, known, repeats: bool = True) -> set[int]:
    """Device indices from ``0,3`` / ``4-7`` (the shared, bounded parser); one error line names ``option``.

    ``repeats=False``: naming a device twice is an error (``--required 4,4``).
    """

    try:
        return _parse(text, option, known, repeats)
    except RequestError as e:
        fail(str(e))


def _parse(text: str | None, option: str, known, repeats: bool) -> set[int]:
    if not text:
        return set()
    if not repeats:
        seen: set[int] = set()
        for part in text.split(","):
            got = parse_index_list(part, option, known=known) if part.strip() else set()
            if got & seen:
                fail(f"{option}: device {min(got & seen)} named twice; name each device once")
            seen |= got
        return seen
    return parse_index_list(text, option, known=known)


def plan_cmd(
    topology: Optional[str] = typer.Option(None, "--topology", "-t", help="catalog name, topology JSON file or capture file"),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="a cluster spec file (rayaccel.cluster/1 JSON: nodes, "
                                          "NVLink domains, network levels): place a gang across its nodes"),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", help="with --cluster: workers of the gang (default 1)"),
    strategy: str = typer.Option("pack", "--strategy", help="with --cluster: pack | spread | strict-pack"),
    svg: Optional[Path] = typer.Option(None, "--svg", help="with --cluster: a picture of the gang on its domains' nodes"),
    png: Optional[Path] = typer.Option(None, "--png", help="with --cluster: the same picture as PNG"),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-g", help="whole devices (default 1, or as many as --required names; 0 with --mig or shared memory)"),
    busy: Optional[str] = typer.Option(None, "--busy", help="devices already in use, e.g. 0,3 or 4-7"),
    mig: Optional[str] = typer.Option(None, "--mig", help="one MIG instance of this profile, e.g. 3g.40gb"),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", help="memory per device, e.g. 20GiB"),
    shared: bool = typer.Option(False, "--shared", help="share one device by --gpu-memory instead of whole devices"),
    interconnect: str = typer.Option("any", "--interconnect", help="any | direct: every pair directly linked, GPU to GPU (NVLink, xGMI, NeuronLink); nvlink is a synonym of direct"),
    same_numa: bool = typer.Option(False, "--same-numa", help="all devices on one NUMA node"),
    nic: bool = typer.Option(False, "--nic", help="require an RDMA NIC near the set"),
    required: Optional[str] = typer.Option(None, "--required", help="devices the set must contain, e.g. 4,5"),
    near: Optional[str] = typer.Option(None, "--near", help="devices holding the input data (soft preference), e.g. 3"),
    bundles: Optional[str] = typer.Option(None, "--bundles", "-b", help="a placement group's bundles, all on this "
                                          "machine: NxK (N bundles of K GPUs, e.g. 4x2), GPU counts per bundle "
                                          "(2,2,4 or 1x4,2x2) or a JSON list ('[{\"GPU\": 2}, {\"GPU\": 2}]'): "
                                          "the placement map the node's arbiter would give the group, then its "
                                          "rank order"),
    group_size: Optional[int] = typer.Option(None, "--group-size", help="with --bundles: ranks per group "
                                             "(tensor-parallel size) of the rank order (default 1)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Show the best devices for a request on a machine, and why (or why not); with --bundles, the placement map
    the node's arbiter would give a placement group (devices, links, NICs, NUMA per bundle) and its rank order;
    with --cluster, where a gang of --workers x --gpus goes across nodes, NVLink domains and network levels."""
    from ..discovery.load import load_topology_with_warnings
    from ..placement import plan

    if (topology is None) == (cluster is None):
        fail("give exactly one of --topology (one machine) or --cluster (a cluster spec file)")
    if cluster is not None and (bundles is not None or group_size is not None):
        fail(f"{'--bundles' if bundles is not None else '--group-size'} maps a placement group on one machine: give "
             "--topology; with --cluster, place a gang with --workers N --gpus K")
    if cluster is not None:
        given = [f for f, v in (("--busy", busy), ("--mig", mig), ("--gpu-memory", gpu_memory), ("--required", required),
                                ("--near", near)) if v] + (["--shared"] if shared else [])
        if given:
            fail(f"{given[0]} is for one machine (--topology); with --cluster give busy devices in the spec file")
        from .topo import check_picture_paths

        check_picture_paths(svg, png)
        _plan_cluster(cluster, workers if workers is not None else 1, 1 if gpus is None else gpus, strategy,
                      interconnect, same_numa, nic, as_json, (svg, png))
        return
    if workers is not None or strategy != "pack" or svg is not None or png is not None:
        fail("--workers, --strategy, --svg and --png place a gang across nodes: give --cluster")
    if group_size is not None and bundles is None:
        fail("--group-size orders the ranks of a placement group: give --bundles too "
             "(e.g. --bundles 8x1 --group-size 4)")
    topo, warnings = load_topology_with_warnings(topology)
    for w in warnings:
        warn_line(w)
    if bundles is not None:
        from .plan_bundles import NOT_WITH_BUNDLES, plan_bundles

        given = dict(zip(NOT_WITH_BUNDLES, (gpus is not None, mig, gpu_memory, shared, required, near,
                                            interconnect != "any", same_numa, nic)))
        clash = [f for f, v in given.items() if v]
        if clash:
            fail(f"{clash[0]} does not apply to --bundles: the arbiter reserves a placement group's devices by its "
                 f"bundles alone; drop {clash[0]}, or drop --bundles to plan one request")
        plan_bundles(topo, bundles, _indices(busy, "--busy", topo.indices), group_size, as_json)
        return
    fields = dict(mig=mig, gpu_memory=gpu_memory, interconnect=interconnect, same_numa=same_numa, nic=nic,
                  exclusive=not shared)
    if required:
        fields["required"] = tuple(sorted(_indices(required, "--required", topo.indices, repeats=False)))
    if near:
        fields["near"] = tuple(sorted(_indices(near, "--near", topo.indices, repeats=False)))
    if gpus is not None:
        fields["gpus"] = gpus
    elif mig is not None or shared:
        fields["gpus"] = 0
    elif "required" in fields:  # `--required 4,5` alone asks for exactly those devices
        fields["gpus"] = len(fields["required"])
    busy_set = _indices(busy, "--busy", topo.indices)
    result = plan(topo, busy=busy_set, **fields)
    layout = None
    if not result and mig is not None:
        # No free instance: propose new ones (dry run) where the profile fits.
        from ..placement import NodeState, plan_mig_layout

        layout = plan_mig_layout(NodeState(topo, busy=frozenset(busy_set)), [mig])
        if not layout.placed:
            layout = None
    if as_json:
        out = result.to_dict()
        if layout is not None:
            out["mig_layout"] = {"commands": layout.commands(),
                                 "create": [{"gpu": n.gpu, "profile": n.profile.name, "start": n.start} for n in layout.create]}
        print_json(out)
    else:
        console.print(result.explain(), markup=False)
        if layout is not None:
            console.print(f"\nproposed MIG layout (dry run, nothing is applied): {layout.placed} new instance(s)",
                          markup=False)
            for line in layout.commands():
                console.print(f"  {line}", markup=False)
            off = sorted({n.gpu for n in layout.create if topo.device(n.gpu).mig_mode is not True})
            if off:
                console.print(f"  (MIG mode is not known to be on for GPU {', '.join(map(str, off))}: "
                              "`nvidia-smi -i N -mig 1` first, with no processes on it)", markup=False)
    if not result:
        raise typer.Exit(1)


#: Most nodes a ``plan --cluster`` picture draws (beyond: only the gang's own nodes).
MAX_PICTURE_NODES = 40


def _picture(spec, result, paths) -> None:
    """Draw the nodes of the domains the gang uses (or only its nodes, when those are too many)."""
    from .. import viz

    used = {w.node for w in result.workers} if result else set()
    doms = {pl.domain for st, pl in zip(spec.nodes, spec.places) if st.node_id in used}
    show = [i for i, (st, pl) in enumerate(zip(spec.nodes, spec.places))
            if st.node_id in used or (pl.domain is not None and pl.domain in doms)]
    if not show or len(show) > MAX_PICTURE_NODES:
        show = [i for i, st in enumerate(spec.nodes) if st.node_id in used][:MAX_PICTURE_NODES] or [0]
    gang = {}
    for w in (result.workers if result else ()):
        gang.setdefault(w.node, {}).update({d: "this gang" for d in w.devices})
    nodes = []
    for i in show:
        st = spec.nodes[i]
        assign = {d: "busy" for d in st.busy}
        assign.update(gang.get(st.node_id, {}))
        nodes.append((st.node_id, st.topology, assign))
    title = f"{len(result.workers)} x {result.workers[0].request.gpus} GPUs: {result.scope}" if result else "no placement"
    for p, flag in zip(paths, ("--svg", "--png")):
        if p is not None:
            try:
                written = viz.draw_cluster(nodes, p, title=title, domains=[spec.places[i].domain for i in show])
            except RayaccelError as e:
                fail(f"{flag} {e}")
            err_console.print(f"wrote {written}", markup=False, highlight=False)


def _plan_cluster(path: str, workers: int, gpus: int, strategy: str, interconnect: str, same_numa: bool, nic: bool,
                  as_json: bool, pictures: tuple = (None, None)) -> None:
    from rich.table import Table

    from ..placement import place_gang
    from .cluster_spec import domain_rows, load_cluster_spec

    spec = load_cluster_spec(path)
    for w in spec.warnings:
        warn_line(w)
    result = place_gang(list(spec.nodes), workers, gpus, strategy=strategy, interconnect=interconnect,
                        places=list(spec.places), same_numa=same_numa, nic=nic)
    rows = domain_rows(spec)
    if any(p is not None for p in pictures):
        _picture(spec, result, pictures)
    if as_json:
        print_json({**result.to_dict(), "domains": rows})
    else:
        t = Table(title="NVLink domains and network levels", title_justify="left")
        for col in ("domain", "clique", "nodes", "free GPUs", "network levels"):
            t.add_column(col)
        for r in rows:
            levels = "; ".join(f"{k}: {', '.join(v[:4])}{' ...' if len(v) > 4 else ''}" for k, v in r["levels"].items())
            t.add_row(plain(r["domain"] or "(none)"), plain(", ".join(r["cliques"]) or "-"), str(r["nodes"]),
                      f"{r['free_gpus']}/{r['gpus']}", plain(levels or "-"))
        console.print(t)
        console.print(result.explain(), markup=False)
    if not result:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``rayaccel plan`` to ``app``."""
    app.command("plan")(plan_cmd)
