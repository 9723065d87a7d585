"""The KubeRay manifests parse, are shaped as KubeRay wants, and the worker's shell really turns
KubeRay's generated ``ray start`` into ``rayaccel start`` with every flag (quoted JSON included)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")  # pyyaml comes with ray

ROOT = Path(__file__).resolve().parent.parent
RAYCLUSTER = ROOT / "deploy" / "kuberay" / "rayaccel-raycluster.yaml"
PODMONITOR = ROOT / "deploy" / "kuberay" / "podmonitor.yaml"
#: What KubeRay generates for a worker of the gpu-8x group (the shape of ray-operator's BuildPod).
GENERATED = ("ray start  --address=rayaccel-head-svc.default.svc.cluster.local:6379  --block  "
             "--dashboard-agent-listen-port=52365  --memory=1073741824000  --metrics-export-port=8080  "
             "--num-cpus=96  --num-gpus=8  --resources='{\"team_a\":1}' ")


@pytest.fixture(scope="module")
def cluster() -> dict:
    (doc,) = list(yaml.safe_load_all(RAYCLUSTER.read_text()))
    return doc


def ray_container(pod_template: dict) -> dict:
    return pod_template["spec"]["containers"][0]


def test_raycluster_shape(cluster):
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    groups = cluster["spec"]["workerGroupSpecs"]
    assert groups and all(g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] for g in groups)
    for spec in [cluster["spec"]["headGroupSpec"], *groups]:
        # KubeRay's rayStartParams is a map of strings
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec["rayStartParams"].items())
        c = ray_container(spec["template"])
        assert c["name"] and c["image"] and c["command"] == ["/bin/bash", "-c", "--"]
        assert "ulimit -n 65536" in c["args"][0] and "KUBERAY_GEN_RAY_START_CMD" in c["args"][0]


def test_ray_version_matches_the_pinned_ray(cluster):
    ray = pytest.importorskip("ray")
    assert cluster["spec"]["rayVersion"] == ray.__version__


def test_head_is_plain_ray_without_gpus(cluster):
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    args = ray_container(head["template"])["args"][0]
    assert "rayaccel" not in args and 'exec /bin/bash -c "$KUBERAY_GEN_RAY_START_CMD"' in args
    assert "nvidia.com/gpu" not in str(ray_container(head["template"])["resources"])


def test_gpu_workers_run_rayaccel_on_the_pods_gpus(cluster):
    (group,) = cluster["spec"]["workerGroupSpecs"]
    c = ray_container(group["template"])
    assert 'rayaccel ${KUBERAY_GEN_RAY_START_CMD#ray }' in c["args"][0]
    assert "discover()" in c["args"][0]  # refuses to start when no GPU is visible
    limits, requests = c["resources"]["limits"], c["resources"]["requests"]
    assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"] == "8"
    assert "num-gpus" not in group["rayStartParams"]  # KubeRay derives it from the limit, as the autoscaler does
    assert {"name": "metrics", "containerPort": 8080} in c["ports"]


def _stub(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_worker_script_hands_every_generated_flag_to_rayaccel(cluster, tmp_path):
    (group,) = cluster["spec"]["workerGroupSpecs"]
    script = ray_container(group["template"])["args"][0]
    out = tmp_path / "argv"
    _stub(tmp_path, "python", "exit 0\n")  # the GPU check passes
    _stub(tmp_path, "rayaccel", f'for a in "$@"; do printf "%s\\n" "$a"; done > {out}\n')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "KUBERAY_GEN_RAY_START_CMD": GENERATED}
    subprocess.run(["/bin/bash", "-c", "--", script], env=env, check=True, timeout=60)
    argv = out.read_text().splitlines()
    assert argv[0] == "start"
    assert "--block" in argv and "--num-gpus=8" in argv and "--metrics-export-port=8080" in argv
    assert '--resources={"team_a":1}' in argv  # the JSON survived the shells
    assert "--address=rayaccel-head-svc.default.svc.cluster.local:6379" in argv


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_worker_script_fails_without_gpus_or_with_an_odd_command(cluster, tmp_path):
    (group,) = cluster["spec"]["workerGroupSpecs"]
    script = ray_container(group["template"])["args"][0]
    _stub(tmp_path, "rayaccel", "exit 0\n")
    _stub(tmp_path, "python", "exit 1\n")  # discover() raised: no accelerator visible
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "KUBERAY_GEN_RAY_START_CMD": GENERATED}
    assert subprocess.run(["/bin/bash", "-c", "--", script], env=env, timeout=60).returncode == 1
    _stub(tmp_path, "python", "exit 0\n")
    env["KUBERAY_GEN_RAY_START_CMD"] = "something else"
    proc = subprocess.run(["/bin/bash", "-c", "--", script], env=env, timeout=60, capture_output=True, text=True)
    assert proc.returncode == 1 and "unexpected KUBERAY_GEN_RAY_START_CMD" in proc.stderr


def test_podmonitor_scrapes_the_metrics_port(cluster):
    (doc,) = list(yaml.safe_load_all(PODMONITOR.read_text()))
    assert doc["kind"] == "PodMonitor"
    assert doc["spec"]["selector"]["matchLabels"]["ray.io/cluster"] == cluster["metadata"]["name"]
    assert doc["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
