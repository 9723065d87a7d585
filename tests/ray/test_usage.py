"""Per-holder usage on a simulated node: what an actor reports, and what NVML (the node's FakeNVML) says of its
process, in ``rayaccel status --json``, ``rayaccel top`` and the metrics on Ray's Prometheus endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest
from raytest_helpers import node_named, wait_for

pytestmark = pytest.mark.ray

GiB = 1 << 30


def _status_rows(cluster, key):
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "status", "--json", "--address", cluster.address],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    node = next(n for n in json.loads(r.stdout)["nodes"] if n["node_key"] == key)
    return node["usage"] or []


def test_an_actors_usage_shows_in_status_top_and_the_metrics(cluster):
    import ray

    from rayaccel import metrics_names as M
    from rayaccel.ray.node import agent

    dgx = node_named(cluster, "dgx1-v100")

    @ray.remote(num_gpus=1, num_cpus=0, label_selector={"rayaccel.io/topology": "dgx1-v100"})
    class UsageProbe:
        def report(self, used, util):
            import rayaccel

            rayaccel.report_usage(used_bytes=used, utilization=util)
            return os.getpid(), rayaccel.get_devices().indices[0]

    a = UsageProbe.options(name="usage-probe").remote()
    dev = 0
    try:
        pid, dev = ray.get(a.report.remote("3GiB", 40), timeout=60)

        def reported():
            rows = [r for r in _status_rows(cluster, dgx.node_key) if r["pid"] == pid]
            return rows if rows and rows[0]["used_bytes"] == 3 * GiB else None

        (row,) = wait_for(reported, 30, "the actor's reported usage in status --json")
        assert (row["device"], row["kind"], row["actor_class"], row["actor_name"], row["task_function"]) == \
            (dev, "actor", "UsageProbe", "usage-probe", "")
        assert (row["utilization"], row["source"], row["spilled_bytes"]) == (40.0, "reported", None)

        # NVML's figure for the process wins over the report (the node's FakeNVML, as the health watcher's)
        agent.handle(dgx.node_key).ask("inject", "process_usage", dev, pid=pid, used_bytes=5 * GiB, sm_util=70)
        (row,) = wait_for(lambda: [r for r in _status_rows(cluster, dgx.node_key)
                                   if r["pid"] == pid and r["source"] == "nvml"], 30, "NVML's figure")
        assert (row["used_bytes"], row["utilization"], row["actor_class"]) == (5 * GiB, 70.0, "UsageProbe")

        r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "top", "--once", "--address", cluster.address],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
        assert r.returncode == 0 and "actor UsageProbe 'usage-probe'" in r.stdout and "5.0 GiB" in r.stdout

        want = ('actor_class="UsageProbe"', 'actor_name="usage-probe"', f'device="{dev}"', f'node="{dgx.node_key}"')

        def scraped():
            # the agent is a driver of the raylet ray.init picks on this one-host cluster (an arbitrary one on Ray
            # 2.48): its metrics leave through that node's endpoint, so scrape every node's, as Prometheus does
            for n in ray.nodes():
                if not (n["Alive"] and n.get("MetricsExportPort")):
                    continue
                try:
                    text = urllib.request.urlopen(f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics",
                                                  timeout=5).read().decode()
                except OSError:
                    continue
                lines = [l for l in text.splitlines() if l.startswith(M.exported(M.HOLDER_MEMORY_USED_BYTES) + "{")
                         and all(w in l for w in want)]
                if lines and float(lines[0].rsplit(" ", 1)[1]) == 5 * GiB:
                    return lines
            return None

        wait_for(scraped, 90, "the per-holder memory metric on Ray's Prometheus endpoint")
    finally:
        agent.handle(dgx.node_key).ask("inject", "process_gone", dev, pid=pid)
        ray.kill(a)
