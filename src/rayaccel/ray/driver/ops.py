"""Operator actions on a running cluster: connect (bounded), stop the whole cluster.

Used by the CLI (``status``, ``top``, ``doctor``, ``drain``, ``reclaim``, ``stop --all``): every
command that reaches a cluster first resolves ``auto`` to one address
(:func:`resolve_address`: it refuses when several clusters run here), then answers within
:data:`CONNECT_TIMEOUT_S` when the address cannot be reached, with one line saying why and
what would be right.
"""

from __future__ import annotations

import re
import signal
import socket
import threading
from typing import Any

from rayaccel.errors import ClusterError
from rayaccel.ray.node import agent
from rayaccel.ray.node import processes as lifecycle
from rayaccel.ray.driver.init import init, shutdown
from rayaccel.ray.driver.view import view

CONNECT_TIMEOUT_S = 10.0
_ADDR = re.compile(r"^(?:ray://)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def parse_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` / ``ray://host:port``; None for ``auto``.

    Raises:
        ClusterError: anything else (names what would be right).
    """
    if not isinstance(address, str) or not address or len(address) > 300:
        raise ClusterError(f"bad address {str(address)[:60]!r}: expected 'auto' or HOST:PORT")
    if address == "auto":
        return None
    m = _ADDR.match(address)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise ClusterError(f"bad address {address[:60]!r}: expected 'auto' or HOST:PORT such as 127.0.0.1:6379 "
                           f"(the head's address printed by `rayaccel start --head`)")
    return m.group(1).strip("[]"), int(m.group(2))


def resolve_address(address: str) -> str:
    """The address a command reads: ``address`` as given, or for ``auto`` the cluster Ray would pick.

    ``auto`` is ``RAY_ADDRESS`` when set, else the one Ray cluster running on this machine
    (Ray's own search: :func:`rayaccel.ray._ray_private.local_gcs_addresses`). Ray itself
    connects to the most recently started of several; rayaccel refuses instead, listing them.

    Raises:
        ClusterError: a bad address, no cluster here, or several (names each).
    """
    import os

    parse_address(address)
    if address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        parse_address(env)
        return env
    from rayaccel.ray import _ray_private as rp

    found = rp.local_gcs_addresses()
    if not found:
        raise ClusterError("no Ray cluster runs on this machine (--address auto found none): start one with "
                           "`rayaccel start --head`, or give --address HOST:PORT of a head elsewhere")
    if len(found) > 1:
        raise ClusterError(f"{len(found)} Ray clusters run on this machine ({', '.join(found)}): --address auto "
                           f"cannot tell which you mean; give one, e.g. --address {found[0]} (or set RAY_ADDRESS)")
    return found[0]


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S, quiet: bool = True, **kwargs: Any) -> None:
    """``ray.init(address=...)`` as a driver that answers within ``timeout_s`` (SIGTERM ends it at once).

    ``quiet``: Ray's own C++ log lines written while connecting (retries, timeouts) are
    kept off stderr, so a failure is the one line raised here.

    Raises:
        ClusterError: bad or unreachable address, or Ray did not connect in time.
    """
    import os

    hp = parse_address(address)
    if hp is not None and not address.startswith("ray://"):
        try:
            with socket.create_connection(hp, timeout=min(3.0, timeout_s)):
                pass
        except OSError as e:
            raise ClusterError(f"cannot reach Ray at {address}: {e.strerror or e} (is a head node running there? "
                               f"start one with `rayaccel start --head`)") from None
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            init(address=address, logging_level="ERROR", log_to_driver=False, **kwargs)
            box["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported below as one line
            box["error"] = e

    old = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    saved_fd = None
    if quiet:
        import sys

        sys.stderr.flush()
        saved_fd = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    t = threading.Thread(target=run, daemon=True, name="rayaccel-connect")
    try:
        t.start()
        t.join(timeout_s)
    finally:
        if saved_fd is not None:
            if t.is_alive():
                # Ray's C++ threads go on retrying (and logging to fd 2) after we give up: fd 2 stays on
                # /dev/null, and Python's own stderr moves to the real one, so our error is the one line.
                import sys

                sys.stderr = os.fdopen(saved_fd, "w", buffering=1, encoding="utf-8", errors="replace")
            else:
                os.dup2(saved_fd, 2)
                os.close(saved_fd)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, old)
    if t.is_alive():
        raise ClusterError(f"Ray at {address} did not answer within {timeout_s:.0f} s (is it a Ray head's GCS "
                           f"address? `rayaccel start --head` prints it)")
    err = box.get("error")
    if err is not None:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ClusterError(f"cannot connect to Ray at {address!r}: {msg[:300]} (expected 'auto' on a node of the "
                           f"cluster, or HOST:PORT of a head started with `rayaccel start --head`)")


def stop_cluster(address: str, force: bool = False) -> list[str]:
    """Stop every rayaccel node of the cluster at ``address``: each node's agent stops its own node, the head last.

    Returns:
        One line per node.
    """
    import ray

    connect(address)
    lines = []
    try:
        nodes = view().nodes(fresh=True)
        here = {n.node_key for n in lifecycle.local_nodes()}
        head_id = ray.get_runtime_context().get_node_id()
        remote = [n for n in nodes if n.node_key not in here and n.node_id != head_id]
        for n in remote:
            h = agent.handle(n.node_key)
            if h is None:
                lines.append(f"node {n.node_key}: no agent answered (stop it on its machine: rayaccel stop)")
                continue
            try:
                h.ask("stop_node", force, timeout_s=30)  # the agent starts stopping its node, then answers
            except ClusterError as e:
                lines.append(f"node {n.node_key}: its agent did not take the request ({e}); stop it on its "
                             "machine: rayaccel stop")
                continue
            lines.append(f"node {n.node_key}: asked its agent to stop it")
        for n in nodes:
            if n.node_key in here:
                lines.append(f"node {n.node_key}: stopping (this machine)")
    finally:
        shutdown()
    for n in sorted(lifecycle.local_nodes(), key=lambda n: n.head):  # workers before the head
        count = lifecycle.stop_local(n, force=force)
        lines.append(f"node {n.node_key}: stopped {count} recorded Ray process(es)")
    return lines


def resolve_target(spec: str) -> tuple[Any, int]:
    """``NODE:DEVICE`` -> (NodeView, device). NODE: a node key, a Ray node id (or a unique prefix of
    either, 6+ chars), a hostname or a topology name that names exactly one node.

    Raises:
        ClusterError: malformed, unknown or ambiguous (lists the nodes).
    """

    if not isinstance(spec, str) or ":" not in spec:
        raise ClusterError(f"expected NODE:DEVICE such as 3f2a9c1b7d4e:2 (node key or id, then device index), "
                           f"got {str(spec)[:60]!r}")
    node, _, dev = spec.rpartition(":")
    if not dev.isdigit() or len(dev) > 6:
        raise ClusterError(f"{spec[:60]!r}: the device must be an index such as 0, got {dev[:20]!r}")
    nodes = view().nodes(fresh=True)

    def matches(n: Any) -> bool:
        if len(node) >= 6 and (n.node_key.startswith(node) or n.node_id.startswith(node)):
            return True
        return node in (n.topology.hostname, n.topology.name)

    hits = [n for n in nodes if matches(n)]
    listing = ", ".join(f"{n.node_key} ({n.topology.name or n.topology.hostname or n.node_id[:12]})" for n in nodes)
    if not hits:
        raise ClusterError(f"no rayaccel node {node[:60]!r} (nodes: {listing or 'none'})")
    if len(hits) > 1:
        raise ClusterError(f"{node[:60]!r} names {len(hits)} nodes; use a node key (nodes: {listing})")
    n = hits[0]
    d = int(dev)
    if d not in n.topology.indices:
        raise ClusterError(f"node {n.node_key} has no device {d} (devices {list(n.topology.indices)})")
    return n, d


def drain(spec: str, reason: str, kill: bool = False, timeout_s: float = 30.0) -> dict:
    """Drain ``NODE:DEVICE`` through its node agent (see :meth:`.agent.NodeAgent.drain`)."""
    n, d = resolve_target(spec)
    h = agent.handle(n.node_key)
    if h is None:
        raise ClusterError(f"node {n.node_key} has no running agent (restart it with `rayaccel start`)")
    out = h.ask("drain", d, reason, "operator", kill, timeout_s=timeout_s)
    out["node_key"] = n.node_key
    return out


def reclaim(spec: str, timeout_s: float = 60.0) -> dict:
    """End the leaked processes of ``NODE:DEVICE`` that belong to its node's Ray workers (see
    :meth:`.agent.NodeAgent.reclaim`); the others are reported, never ended.

    Returns:
        ``{"node_key", "device", "ended": [...], "left": [...], "fence": "lifted" | "kept" | "none"}``.
    """
    n, d = resolve_target(spec)
    h = agent.handle(n.node_key)
    if h is None:
        raise ClusterError(f"node {n.node_key} has no running agent (restart it with `rayaccel start`)")
    out = h.ask("reclaim", d, timeout_s=timeout_s)
    out["node_key"] = n.node_key
    return out


def undrain(spec: str, timeout_s: float = 30.0) -> bool:
    """Lift the drain of ``NODE:DEVICE``; False when it was not drained."""
    n, d = resolve_target(spec)
    h = agent.handle(n.node_key)
    if h is None:
        raise ClusterError(f"node {n.node_key} has no running agent (restart it with `rayaccel start`)")
    return h.ask("undrain", d, timeout_s=timeout_s)
