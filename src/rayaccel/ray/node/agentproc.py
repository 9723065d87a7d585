"""The node agent's process: started beside the raylet, stopped with the node, never one of the user's actors.

``python -m rayaccel.ray.node.agentproc --address GCS --node-key K --node-id ID --dir D`` is
started by whoever starts the node (``rayaccel start``, :func:`rayaccel.init`, ``SimulatedCluster``;
:func:`rayaccel.ray.node.agent.start`). It is a small supervisor (no ``ray`` import) that runs the
agent itself as a child (``--serve``) and starts it again when it dies of anything but its node's
end, as Ray restarted the actor the agent once was.

The child connects to the cluster as a Ray driver in namespace ``_ray_internal_rayaccel``
(:data:`rayaccel.contract.AGENT_NAMESPACE`): like Ray's own dashboard, a process beside the
raylet that talks to the GCS. Ray's views hide jobs of a ``_ray_internal_`` namespace, and a
driver is no actor, so ``ray.util.state.list_actors()`` / ``list_jobs()`` show the user's alone.
Being a driver, it has Ray's KV, node table and placement-group state, can create the drain
placeholders, and exports its metrics through ``ray.util.metrics`` (so they appear on Ray's
Prometheus endpoint as before).

Drivers ask it through a TCP connection (``multiprocessing.connection``, authenticated by a
random key): where it listens, its pid and the key are published in the GCS KV
(``agent/<node key>``, :data:`rayaccel.contract.AGENT_SCHEMA`); anyone who can read the GCS KV
can already run code on the cluster. The child exits (0) when its node is gone from Ray's node
table or the GCS is unreachable; the supervisor then exits too. SIGTERM to the supervisor stops both.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Any

log = logging.getLogger("rayaccel.agent")
MODULE = "rayaccel.ray.node.agentproc"
#: A child that ran this long before dying is restarted at once; sooner, after RESTART_DELAY_S.
RESTART_DELAY_S = 1.0
#: How often the child checks that its node is still in Ray's node table, seconds.
ALIVE_EVERY_S = 2.0
#: Exit code of a child whose node is gone (the supervisor does not restart it).
NODE_GONE = 0
#: The supervisor gives up after this many children in a row each died within FAST_FAIL_S of starting
#: (connecting to a GCS that is gone takes Ray about a minute to give up).
FAST_FAILS = 5
FAST_FAIL_S = 120.0


def raylet_gone(pid: int | None) -> bool:
    """True when the raylet ``pid`` is no longer running (a zombie not yet reaped counts as gone); False when
    it runs or ``pid`` is None (unknown: the agent asks Ray's node table instead)."""
    from rayaccel._proc import state

    return pid is not None and state(pid) in (None, "Z", "X")


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rayaccel-agent")
    p.add_argument("--address", required=True)
    p.add_argument("--node-key", required=True)
    p.add_argument("--node-id", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--raylet-pid", type=int, default=None, help="the node's raylet (the agent ends with it)")
    p.add_argument("--serve", action="store_true", help="run the agent (else: supervise a child that does)")
    return p.parse_args(argv)


def _raylet_arg(argv: list[str]) -> int | None:
    return _args(argv).raylet_pid


def supervise(argv: list[str]) -> int:
    """Run the agent as a child; start it again when it dies while its node lives. Returns the exit code."""
    stop = {"sig": None}
    child: dict[str, Any] = {"p": None}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["sig"] = signum
        p = child["p"]
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    raylet = _raylet_arg(argv)
    fast = 0
    while stop["sig"] is None and not raylet_gone(raylet):
        t0 = time.monotonic()
        child["p"] = subprocess.Popen([sys.executable, "-m", MODULE, *argv, "--serve"])
        rc = _wait_child(child["p"], raylet)
        if stop["sig"] is not None or rc == NODE_GONE or raylet_gone(raylet):
            return 0
        fast = fast + 1 if time.monotonic() - t0 < FAST_FAIL_S else 0
        if fast >= FAST_FAILS:
            log.error("rayaccel agent: exited %d times in a row within %.0f s of starting (last: %s); giving up",
                      fast, FAST_FAIL_S, rc)
            return 1
        log.warning("rayaccel agent: exited with %s; starting it again", rc)
        time.sleep(RESTART_DELAY_S)
    return 0


def _wait_child(p: subprocess.Popen, raylet: int | None) -> int:
    """Wait for the agent child; when its raylet is gone, end the child (it may hang on a GCS gone with the node)."""
    gone = 0
    while True:
        try:
            return p.wait(ALIVE_EVERY_S)
        except subprocess.TimeoutExpired:
            pass
        gone = gone + 1 if raylet_gone(raylet) else 0
        if gone >= 2:  # the child would have exited by now: ask, then make it
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            return NODE_GONE


class Server:
    """Answers drivers' requests on the agent's body (one thread per connection)."""

    def __init__(self, body: Any, host: str):
        from multiprocessing.connection import Listener

        self.body = body
        self.key = secrets.token_bytes(32)
        self.listener = Listener((host, 0), authkey=self.key)
        self.host = host

    def published(self) -> str:
        from rayaccel.contract import AGENT_SCHEMA

        port = self.listener.address[1]
        return json.dumps({"schema": AGENT_SCHEMA, "host": self.host, "port": port, "pid": os.getpid(),
                           "key": self.key.hex()})

    def serve_forever(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except OSError:  # closed, or a peer with the wrong key
                if self.listener._listener is None:  # noqa: SLF001 - closed: the agent is ending
                    return
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="rayaccel-agent-conn").start()

    def _serve(self, conn: Any) -> None:
        try:
            while True:
                try:
                    method, args, kwargs = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    conn.send(("ok", self.call(method, *args, **kwargs)))
                except Exception as e:  # noqa: BLE001 - the asker gets the error (type and message)
                    conn.send(("error", type(e).__name__, str(e)))
        finally:
            conn.close()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "ping":
            return self.body.node_key
        if method == "pid":
            return os.getpid()
        if method.startswith("_") or not callable(getattr(self.body, method, None)):
            raise AttributeError(f"the node agent has no request {method!r}")
        return getattr(self.body, method)(*args, **kwargs)


def serve(a: argparse.Namespace) -> int:
    """The agent: connect to Ray, start the body's loop, answer requests; return when the node is gone."""
    import ray

    from rayaccel.contract import AGENT_NAMESPACE, AGENT_PREFIX, NAMESPACE
    from rayaccel.ray import _ray_private as rp
    from rayaccel.ray.node import dynmig, health, leaks, metrics, usage
    from rayaccel.ray.node.agent import NodeAgent

    from rayaccel._proc import start_time

    if raylet_gone(a.raylet_pid):  # started (or restarted) after its node ended: nothing to do
        return NODE_GONE
    born = start_time(a.raylet_pid) if a.raylet_pid else None
    raylet = (a.raylet_pid, born) if born is not None else None  # else: asks Ray's node table
    ray.init(address=a.address, namespace=AGENT_NAMESPACE, logging_level="ERROR", log_to_driver=False)
    body = NodeAgent(a.node_key, a.dir)
    body.node_id = a.node_id
    body.raylet_pid = a.raylet_pid
    body._is_head = "node:__internal_head__" in rp.total_resources_per_node().get(a.node_id, {})
    server = Server(body, ray.util.get_node_ip_address())
    threading.Thread(target=server.serve_forever, daemon=True, name="rayaccel-agent-serve").start()
    health.attach(body)
    usage.attach(body)  # after the health watcher (a simulated node's FakeNVML), before the metrics that export it
    leaks.attach(body)  # after the usage watch (its NVML read), before the metrics
    metrics.attach(body)
    try:  # holds the units without an instance before the agent answers (its start waits for that)
        dynmig.attach(body)
    except Exception:  # noqa: BLE001 - the agent's other duties go on; the log and status say why
        body.errors += 1
        log.exception("rayaccel agent %s: dynamic MIG could not start", a.node_key)
    body.start()
    rp.kv_put(AGENT_PREFIX + a.node_key, server.published(), NAMESPACE)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    misses = 0
    while not stop.wait(ALIVE_EVERY_S):
        if raylet is not None:  # a zombie (its parent has not reaped it yet: SimulatedCluster) is gone too
            alive = start_time(raylet[0]) == raylet[1] and not raylet_gone(raylet[0])
        else:
            try:
                alive = any(n["NodeID"] == a.node_id and n["Alive"] for n in ray.nodes())
            except Exception:  # noqa: BLE001 - the GCS unreachable: count it as a miss
                alive = False
        misses = 0 if alive else misses + 1
        if misses >= 2:
            log.warning("rayaccel agent %s: node %s is gone; exiting", a.node_key, a.node_id[:12])
            break
    body.stop()
    if body.dynmig is not None:  # the node is gone: its holds (detached placement groups) go with it
        try:
            body.dynmig.holds.release_all()
        except Exception:  # noqa: BLE001 - best effort at exit (the GCS may be gone with the node)
            log.warning("rayaccel agent %s: dynamic MIG holds not removed", a.node_key, exc_info=True)
    try:  # leave no stale address behind (unless a newer agent of the node has published its own)
        raw = rp.kv_get(AGENT_PREFIX + a.node_key, NAMESPACE)
        if raw and json.loads(raw).get("pid") == os.getpid():
            rp.kv_del(AGENT_PREFIX + a.node_key, NAMESPACE)
    except Exception:  # noqa: BLE001 - best effort at exit (the GCS may be gone with the node)
        pass
    return NODE_GONE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if a.serve:
        return serve(a)
    return supervise([x for x in argv if x != "--serve"])


if __name__ == "__main__":
    sys.exit(main())
