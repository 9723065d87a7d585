"""The node half of ``rayaccel doctor``: the facts and local checks a node agent gathers on its node.

Imported by the node agent (:mod:`.agent`); it imports nothing of the cluster half
(:mod:`.doctor_cluster`), which calls the agents and judges their answers together.

Facts: the Ray / rayaccel / Python versions, whether the worker hook is installed and Ray's
GPU-id function patched, GPU slots held by unhooked workers, the health watcher's error, the leak watcher and the
leaked device processes it sees now (:mod:`.leaks`), arbiter
resets, the node's NVLink domain as its published topology says (:func:`~rayaccel.doctor._fabric.domain_summary`:
the domain, or why none), and the hardware checks of :func:`rayaccel.doctor.local_checks`
(``n/a`` on a simulated node), and what caps a worker holding a share of a GPU there (``memory shares``:
MPS, torch's memory fraction, or nothing; ``n/a`` on a simulated node).
"""

from __future__ import annotations

import platform
import sys
from typing import Any

from rayaccel._version import __version__ as _rayaccel_version
from rayaccel.doctor import Check, local_checks
from rayaccel.doctor._fabric import domain_summary
from rayaccel.ray import _ray_private as rp
def node_facts(agent: Any) -> dict:
    """What a node agent reports for the doctor (runs on the node; a JSON-ready dict)."""
    import ray  # the agent is connected to Ray; importing it here keeps `import rayaccel.ray.node.doctor` cheap

    topology = agent.record.topology
    hook, patched = _worker_hook(agent.node_id)
    facts: dict[str, Any] = {"node_key": agent.node_key, "ray": ray.__version__, "rayaccel": _rayaccel_version,
                             "python": platform.python_version(), "hook": hook,
                             "patched": patched, "simulated": agent.record.simulated,
                             "unhooked_slots": agent.last.unhooked_slots if agent.last is not None else 0.0,
                             "health_error": agent.health_error,
                             "resets": agent.last.resets if agent.last is not None else 0,
                             "hostname": topology.hostname, "domain": domain_summary(topology)}
    lw = getattr(agent, "leak_watch", None)
    facts["leaks"] = ({"on": True, "rows": list(lw.rows), "reclaim_after_s": lw.after_s, "error": lw.error}
                      if lw is not None else {"on": False})
    lock = agent.arbiter.lock_info()
    facts["lock"] = lock._asdict() if lock is not None else None
    try:
        fake = getattr(agent.watcher, "fake", None)
        kw = {"nvml": fake} if fake is not None and agent.record.simulated else {}
        facts["checks"] = [c.to_dict() for c in local_checks(topology, simulated=agent.record.simulated, **kw)]
    except Exception as e:  # noqa: BLE001 - reported as one failed row, the other checks still run
        facts["checks"] = [{"name": "hardware checks", "status": "fail", "detail": f"could not run: {e}",
                            "fix": "see the node agent's log"}]
    gpus = any(d.vendor in ("nvidia", "amd") for d in topology.devices)
    facts["checks"].append(share_check(simulated=agent.record.simulated, gpus=gpus).to_dict())
    return facts


def share_check(*, simulated: bool, gpus: bool = True, env: Any = None, torch_present: bool | None = None) -> Check:
    """The ``memory shares`` row: what caps a worker holding a share of a GPU on this node
    (:mod:`rayaccel.ray.worker.memcap`): the MPS daemon, else torch's memory fraction, else nothing."""
    from rayaccel.ray.worker import memcap

    if not gpus:
        return Check("memory shares", "n/a", "no NVIDIA or AMD GPU on this node: no memory share to cap")
    pipe = memcap.mps_pipe(env)
    if simulated:
        return Check("memory shares", "n/a", "simulated node: no device, nothing enforces a share's memory cap"
                     + (f" (an MPS pipe directory {pipe} is there: workers get its variables)" if pipe else ""))
    if pipe is not None:
        return Check("memory shares", "ok", f"MPS control daemon at {pipe}: a share's workers get "
                     f"{memcap.MPS_MEM_ENV} and {memcap.MPS_THREADS_ENV} (every framework), and torch's memory "
                     "fraction where they use torch")
    has_torch = memcap.torch_present() if torch_present is None else torch_present
    if has_torch:
        return Check("memory shares", "ok", "no MPS daemon: a share is capped by torch's per-process memory "
                     "fraction (PyTorch allocations only; the MPS control daemon would cap every framework)")
    return Check("memory shares", "warn", "no MPS daemon and no PyTorch here: nothing caps a worker holding a "
                 "share (num_gpus < 1, gpu_memory) to it", "run the MPS control daemon (nvidia-cuda-mps-control -d) "
                 "or install torch in the workers' environment")


def _hook_facts() -> tuple[bool, bool]:
    """In a worker of the node: is the hook loaded, is Ray's GPU-id function patched?"""
    return "rayaccel.ray.worker.hook" in sys.modules, bool(rp._PATCHED)


def _worker_hook(node_id: str | None, timeout_s: float = 30.0) -> tuple[bool, bool]:
    """Ask one fresh task on the node (the agent itself is no worker of it): (hook loaded, Ray patched)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node_id is None:
        return "rayaccel.ray.worker.hook" in sys.modules, bool(rp._PATCHED)
    probe = ray.remote(num_cpus=0, max_retries=0)(_hook_facts)
    ref = probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    hook, patched = ray.get(ref, timeout=timeout_s)
    return bool(hook), bool(patched)
