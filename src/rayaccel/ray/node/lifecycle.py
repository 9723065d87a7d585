"""``rayaccel start`` / ``rayaccel stop``: Ray nodes that rayaccel starts, and stops again -- only those.

:func:`start_node` runs ``ray start`` with the node's resources, labels and hook
environment (:mod:`.node`), records the Ray processes that appeared for it (pid,
start time, name; in ``processes.json`` of the node directory), publishes the
node's record and starts its agent through a short-lived driver. If publication
fails, exactly those processes are stopped again.

Stopping exactly those processes is :mod:`.processes` (:func:`~.processes.stop_local`),
which never runs ``ray stop``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rayaccel._proc import start_time as _start_time
from rayaccel.discovery.network import node_levels
from rayaccel.errors import ClusterError
from rayaccel.topology import NodeTopology
from rayaccel.ray.node import nodedir
from rayaccel.ray.node.preset import given
from rayaccel.ray.node import failpolicy, leakpolicy
from rayaccel.ray.node.dynmig import dynamic_gpus
from rayaccel.ray.node.failpolicy import failed_gpu_mode
from rayaccel.ray.node.start import nic_env_names, node_env, node_topology, prepare, zero_gpu_mode
from rayaccel.ray.node.processes import _local, _my_ray_processes, _save_processes, _stop_new, local_nodes, stop_local
from rayaccel.ray.record import node_labels, node_resources



def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _json_object(text: str | None) -> dict | None:
    """``--resources``' object, or None (its errors are :func:`ray_start_command`'s to report)."""
    try:
        v = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        return None
    return v if isinstance(v, dict) else None


def _without(args: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def ray_start_command(topology: NodeTopology, node_key: str, ray_args: Sequence[str], *,
                      simulated: bool, network: dict[str, str] | None = None,
                      dynamic_mig: tuple[int, ...] = (), mig_gpus: bool = False) -> list[str]:
    """The ``ray start`` command line for a node advertising ``topology`` (and ``network``'s level labels;
    ``mig_gpus``: a node given MIG UUIDs, whose ``GPU`` are those instances: :func:`~rayaccel.ray.record.node_resources`).

    Raises:
        ClusterError: ``--num-gpus`` given (rayaccel sets it from the topology), ``--resources``
            that is not a JSON object of numbers or names a resource rayaccel manages (a family's resource
            at the node's own count is kept: it gave the node part of the host, :mod:`.preset`).
    """

    args = list(ray_args)
    gpus = _flag_value(args, "--num-gpus")
    num_gpus, res = node_resources(topology, dynamic_mig, mig_gpus=mig_gpus)
    # KubeRay passes the pod's GPU count: accept it (every device, or the devices not in MIG mode)
    if gpus is not None and gpus not in (str(num_gpus), str(len(topology.devices))):
        raise ClusterError(f"--num-gpus={gpus}: this node has {len(topology.devices)} device(s), {num_gpus} of them "
                           f"for Ray's GPU resource; rayaccel sets --num-gpus={num_gpus} itself: drop the flag")
    args = _without(args, "--num-gpus")
    args = [a for a in args if a != "--block"]  # rayaccel start blocks itself (see start_node)
    user_res = _flag_value(args, "--resources")
    if user_res is not None:
        try:
            extra = json.loads(user_res)
        except (ValueError, RecursionError) as e:
            raise ClusterError(f"--resources is not valid JSON ({e}); expected an object such as "
                               "'{\"my_res\": 2}'") from None
        if not isinstance(extra, dict):
            raise ClusterError(f"--resources must be a JSON object such as '{{\"my_res\": 2}}', got "
                               f"{type(extra).__name__}")
        for k, v in extra.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e15:
                raise ClusterError(f"--resources: {k!r} must be a number >= 0, got {v!r}")
        # the family's resource at the node's own count is what gave it part of the host (preset.py): kept
        clash = sorted(k for k in extra if (k in res and extra[k] != res[k]) or k in ("GPU", "CPU")
                       or k.startswith(("mig_", "rayaccel_")))
        if clash:
            raise ClusterError(f"--resources names {clash[0]!r}, which rayaccel (or --num-cpus/--num-gpus) sets")
        res.update(extra)
        args = _without(args, "--resources")
    labels = node_labels(topology, node_key, simulated=simulated, network=network)
    user_labels = _flag_value(args, "--labels")
    if user_labels:
        args = _without(args, "--labels")
        for item in user_labels.split(","):
            if "=" in item:
                k, v = item.split("=", 1)
                if k.strip().startswith("rayaccel.io/"):
                    raise ClusterError(f"--labels: {k.strip()!r} is set by rayaccel")
                labels[k.strip()] = v.strip()
    label_text = ",".join(f"{k}={v}" for k, v in labels.items())
    return ["ray", "start", *args, f"--num-gpus={num_gpus}", f"--resources={json.dumps(res)}",
            f"--labels={label_text}"]


@dataclass(frozen=True, slots=True)
class Started:
    """What :func:`start_node` did."""

    record: object
    address: str
    head: bool
    processes: int
    published: bool


#: Seconds to wait for a head's GCS port to accept a connection before ``ray start`` runs.
HEAD_PROBE_TIMEOUT_S = 5.0


def check_head(address: str, timeout_s: float = HEAD_PROBE_TIMEOUT_S) -> None:
    """Fail fast when nothing listens at ``address`` (``HOST:PORT`` of the head's GCS).

    ``ray start --address`` waits two minutes for a head that is not there; this probe
    answers within ``timeout_s``. An address that is not ``HOST:PORT`` is left to ``ray start``.

    Raises:
        ClusterError: nothing accepts a connection there (names the address and what to check).
    """
    host, _, port = address.rpartition(":")
    host = host.removeprefix("ray://").strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ClusterError(f"no Ray head answers at {address} ({why}); nothing was started: check that the head "
                           f"runs (`rayaccel start --head` prints the address to join), that {port} is its GCS port "
                           f"(6379 unless --port said otherwise) and that {host} is reachable from here") from None


def start_node(ray_args: Sequence[str] = (), topology: NodeTopology | str | None = None,
               *, publish: bool = True, timeout_s: float = 120.0, network_topology: str | None = None,
               instance_id: str | None = None, nic_env: str | Sequence[str] | None = None,
               zero_gpu_tasks: str | None = None, on_failed_gpu: str | None = None,
               reclaim_leaks: str | float | None = None,
               dynamic_mig: str | Sequence[int] | None = None) -> Started:
    """Start this machine's rayaccel node (see module docstring).

    Args:
        ray_args: ``ray start`` flags passed through (``--head``, ``--address=...``, ``--port`` ...).
        topology: simulate this topology instead of discovering.
        publish: write the record into the GCS KV and start the node's agent.
        network_topology: a Slurm ``topology.conf`` or AWS ``describe-instance-topology`` JSON
            file naming this node (``instance_id`` for AWS): its levels become node labels
            (:func:`rayaccel.discovery.network.node_levels`). Read before anything starts.
        nic_env: other libraries' NIC variables workers get at each grant (``NCCL_IB_HCA,NVSHMEM_HCA_LIST``),
            checked before anything starts.
        zero_gpu_tasks: what a task asking no GPU sees: ``see-none`` (default) or ``see-all`` (plain Ray's).
        on_failed_gpu: what the agent does with the workers of a device its health watcher drains:
            ``leave`` (default) or ``end-workers`` (:mod:`.failpolicy`).
        reclaim_leaks: end leaked device processes of the node's workers once a leak has lasted this long
            (``30s``, ``5m``; default: never, only ``rayaccel reclaim``; :mod:`.leakpolicy`).
        dynamic_mig: GPUs (``"0,1"``, ``"all"``) in MIG mode whose instances the node's agent makes and destroys for
            Ray's waiting ``mig_<profile>`` work (:mod:`.dynmig`), checked before anything starts.

    The node manages the devices it was given (:mod:`.preset`): a visible-devices variable set for it
    (``CUDA_VISIBLE_DEVICES=4,5,6``, UUIDs, empty = none) or ``--num-gpus`` smaller than the host's count;
    a preset the host cannot honour fails before anything starts.

    Raises:
        CaptureError: the network file is malformed or does not name this node (nothing started).
        ClusterError: ``ray start`` failed, or publication failed (the node is stopped again).
    """
    nic_env_names(nic_env)  # a bad name fails before anything starts
    zero_gpu_mode(zero_gpu_tasks)
    failed_gpu_mode(on_failed_gpu)
    leakpolicy.reclaim_after(reclaim_leaks)
    joining = _flag_value(ray_args, "--address")
    if joining is not None and "--head" not in ray_args:
        check_head(joining)  # nothing there: say so in seconds, not after ray start's two minutes
    network = None
    if network_topology is not None:
        network = node_levels(network_topology, socket.gethostname(), instance_id)
    topo, simulated = node_topology(topology, simulate_default=False)
    topo, preset = given(topo, os.environ, num_gpus=_flag_value(ray_args, "--num-gpus"),
                         resources=_json_object(_flag_value(ray_args, "--resources")))
    dyn = dynamic_gpus(dynamic_mig, topo)
    record, directory = prepare(topo, simulated, preset=preset, dynamic_mig=dyn)
    failpolicy.write(directory, on_failed_gpu)
    leakpolicy.write(directory, reclaim_leaks)
    head = "--head" in ray_args
    try:
        cmd = ray_start_command(topo, record.node_key, ray_args, simulated=simulated, network=network,
                                dynamic_mig=dyn, mig_gpus=record.mig_gpus)
    except BaseException:
        nodedir.remove(directory)
        raise
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.update(node_env(topo, record.node_key, directory, base=env, nic_env=nic_env, zero_gpu_tasks=zero_gpu_tasks,
                        dynamic_mig=dyn, mig_gpus=record.mig_gpus))
    if simulated and topology is not None and isinstance(topology, str):
        env["RAYACCEL_TOPOLOGY"] = topology
    before = _my_ray_processes()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_new(before)
        nodedir.remove(directory)
        joined = _flag_value(ray_args, "--address")
        where = f" --address={joined}" if joined else ""
        raise ClusterError(f"`ray start{where}` did not finish within {timeout_s:.0f} s (stopped what it started)"
                           + (f"; check that the head at {joined} is up and reachable from here" if joined else "")
                           ) from None
    except FileNotFoundError:
        nodedir.remove(directory)
        raise ClusterError("the `ray` command is not on PATH (pip install 'ray==2.60.*')") from None
    if proc.returncode != 0:
        _stop_new(before)
        nodedir.remove(directory)
        raise ClusterError(f"`{shlex.join(cmd[:3])} ...` failed (exit {proc.returncode}): "
                           f"{_last_error(proc.stderr or proc.stdout)}")
    address = _flag_value(ray_args, "--address") or _address_from(proc.stdout + proc.stderr) or "auto"
    pids = _new_processes(before, record.node_key)
    _save_processes(directory, record.node_key, address, head, pids)
    if publish:
        raylet = next((p for p, _, name in pids if name == "raylet"), None)
        err = _publish(record, address, env, directory, raylet)
        if err:
            stop_local(_local(directory))
            raise ClusterError(f"the node started but could not be published at {address}, so it was stopped "
                               f"again: {err}")
    return Started(record, address, head, len(pids), publish)


def block(node_key: str, poll_s: float = 1.0) -> int:
    """Stay in the foreground while the node runs (``rayaccel start --block``, e.g. a KubeRay container).

    Returns 1 when the node's raylet exits by itself; on SIGTERM/SIGINT stops the node and returns 0.
    """
    stop = {"sig": None}

    def on_signal(signum, _frame):
        stop["sig"] = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        node = next(n for n in local_nodes() if n.node_key == node_key)
        raylets = [(p, t) for p, t, name in node.pids if name == "raylet"] or [(p, t) for p, t, _ in node.pids]
        while stop["sig"] is None:
            if not any(_start_time(p) == t for p, t in raylets):
                stop_local(node)
                return 1
            time.sleep(poll_s)
        stop_local(node)
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _last_error(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    errs = [l for l in lines if "Error" in l or "error" in l]
    return (errs[-1] if errs else (lines[-1] if lines else "no output"))[-500:]


def _address_from(text: str) -> str | None:
    m = re.search(r"--address='([^']+)'", text)
    return m.group(1) if m else None


def _new_processes(before: dict, node_key: str) -> list[tuple[int, int, str]]:
    """The Ray processes that appeared since ``before`` (waits briefly for the raylet's helpers)."""
    deadline = time.monotonic() + 2.0
    found: dict[int, tuple[int, str]] = {}
    while True:
        now = _my_ray_processes()
        found = {p: v for p, v in now.items() if p not in before or before[p][0] != v[0]}
        if any("raylet" in v[1] and node_key in v[1] for v in found.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return sorted((p, t, _short(cmd)) for p, (t, cmd) in found.items())


def _short(cmd: str) -> str:
    first = cmd.split(" ", 1)[0]
    for n in ("raylet", "gcs_server", "monitor.py", "dashboard.py", "log_monitor.py", "agent.py",
              "runtime_env", "default_worker.py"):
        if n in cmd:
            return n
    return os.path.basename(first)[:40]


def _publish(record, address: str, env: dict, directory: Path, raylet_pid: int | None = None) -> str | None:
    """Publish the record and start the agent process from a short-lived driver; return an error or None.

    The agent's pid joins the node's recorded processes (``rayaccel stop`` stops it with the node)."""
    code = ("import sys, ray\n"
            "from rayaccel.ray import kv\nfrom rayaccel.ray.node import agent\n"
            "from rayaccel.contract import NODE_KEY_LABEL\nfrom rayaccel.ray.record import NodeRecord\n"
            "rec = NodeRecord.from_json(sys.stdin.read())\n"
            "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
            "ids = [n['NodeID'] for n in ray.nodes()\n"
            "       if n.get('Alive') and (n.get('Labels') or {}).get(NODE_KEY_LABEL) == rec.node_key]\n"
            "assert ids, 'the node did not join the cluster'\n"
            "kv.publish(rec)\n"
            "raylet = int(sys.argv[2]) if len(sys.argv) > 2 else None\n"
            "p = agent.start(rec.node_key, ids[0], sys.argv[3], address=ray.get_runtime_context().gcs_address,\n"
            "                raylet_pid=raylet)\n"
            "print('rayaccel-agent-pid', p.pid)\n"
            "ray.shutdown()\n")
    drv_env = {k: v for k, v in env.items() if not k.startswith(("RAYACCEL_NODE", "RAY_preload"))}
    try:
        pub = subprocess.run([sys.executable, "-c", code, address, str(raylet_pid or 0), str(directory)],
                             input=record.to_json(), env=drv_env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "publishing did not finish within 120 s"
    if pub.returncode != 0:
        return _last_error(pub.stderr)
    m = re.search(r"rayaccel-agent-pid (\d+)", pub.stdout)
    if m:
        pid = int(m.group(1))
        node = _local(directory)
        t = _start_time(pid)
        if t is not None:
            _save_processes(directory, node.node_key, node.address, node.head,
                            [*node.pids, (pid, t, "rayaccel-agent")])
    return None


