"""``rayaccel plan``: where would a request go on a machine (dry run, no Ray)."""

from __future__ import annotations

from typing import Optional

import typer

from ._common import console, fail, print_json


def _parse_busy(text: str | None) -> set[int]:
    if not text:
        return set()
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, _, b = part.partition("-")
            if not (a.isdigit() and b.isdigit()):
                fail(f"--busy: cannot read {part!r}; expected device indices like 0,3 or 4-7")
            if int(a) > int(b):
                fail(f"--busy: range {part!r} runs backwards; expected low-high like 4-7")
            out.update(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.add(int(part))
        else:
            fail(f"--busy: cannot read {part!r}; expected device indices like 0,3 or 4-7")
    return out


def plan_cmd(
    topology: str = typer.Option(..., "--topology", "-t", help="catalog name, topology JSON file or capture file"),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-g", help="whole devices (default 1; 0 with --mig or shared memory)"),
    busy: Optional[str] = typer.Option(None, "--busy", help="devices already in use, e.g. 0,3 or 4-7"),
    mig: Optional[str] = typer.Option(None, "--mig", help="one MIG instance of this profile, e.g. 3g.40gb"),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", help="memory per device, e.g. 20GiB"),
    shared: bool = typer.Option(False, "--shared", help="share one device by --gpu-memory instead of whole devices"),
    interconnect: str = typer.Option("any", "--interconnect", help="any | nvlink"),
    same_numa: bool = typer.Option(False, "--same-numa", help="all devices on one NUMA node"),
    nic: bool = typer.Option(False, "--nic", help="require an RDMA NIC near the set"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Show the best devices for a request on a machine, and why (or why not)."""
    from ..discovery.load import load_topology
    from ..placement import plan

    topo = load_topology(topology)
    fields = dict(mig=mig, gpu_memory=gpu_memory, interconnect=interconnect, same_numa=same_numa, nic=nic,
                  exclusive=not shared)
    if gpus is not None:
        fields["gpus"] = gpus
    elif mig is not None or shared:
        fields["gpus"] = 0
    busy_set = _parse_busy(busy)
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
