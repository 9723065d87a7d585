"""``rayaccel plan``: where would a request go on a machine (dry run, no Ray)."""

from __future__ import annotations

from typing import Optional

import typer

from ._common import console, fail, parse_index_list, print_json, warn_line


def _indices(text: str | None, option: str, known, repeats: bool = True) -> set[int]:
    """Device indices from ``0,3`` / ``4-7`` (the shared, bounded parser); one error line names ``option``.

    ``repeats=False``: naming a device twice is an error (``--required 4,4``).
    """
    from ..errors import RequestError

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
    topology: str = typer.Option(..., "--topology", "-t", help="catalog name, topology JSON file or capture file"),
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
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Show the best devices for a request on a machine, and why (or why not)."""
    from ..discovery.load import load_topology_with_warnings
    from ..placement import plan

    topo, warnings = load_topology_with_warnings(topology)
    for w in warnings:
        warn_line(w)
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


def register(app: typer.Typer) -> None:
    """Add ``rayaccel plan`` to ``app``."""
    app.command("plan")(plan_cmd)
