"""The KubeRay manifests parse, are shaped as KubeRay wants, and the head's and the workers' shells really
turn KubeRay's generated ``ray start`` into ``rayaccel start`` with every flag (quoted JSON included).

The image: Docker does not run here, so ``deploy/kuberay/Dockerfile`` is read as text -- it starts
from Ray's GPU image of a Ray release that pyproject's ray requirement allows, installs the wheel of
pyproject's version and runs the ``rayaccel`` command -- and every container of the manifest names the
tag its documented ``docker build`` command builds (``scripts/check_wheel.sh`` installs that wheel
for real and runs ``rayaccel doctor`` from it).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")  # pyyaml comes with ray

ROOT = Path(__file__).resolve().parent.parent
RAYCLUSTER = ROOT / "deploy" / "kuberay" / "rayaccel-raycluster.yaml"
PODMONITOR = ROOT / "deploy" / "kuberay" / "podmonitor.yaml"
DOCKERFILE = ROOT / "deploy" / "kuberay" / "Dockerfile"
#: The pages that tell how to build the image; each must give the very command the Dockerfile gives.
BUILD_DOCS = (ROOT / "README.md", ROOT / "docs" / "cluster.md")
#: What KubeRay generates for a worker of the gpu-8x group (the shape of ray-operator's BuildPod).
GENERATED = ("ray start  --address=rayaccel-head-svc.default.svc.cluster.local:6379  --block  "
             "--dashboard-agent-listen-port=52365  --memory=1073741824000  --metrics-export-port=8080  "
             "--num-cpus=96  --num-gpus=8  --resources='{\"team_a\":1}' ")
#: ... and for the head.
GENERATED_HEAD = ("ray start  --head  --block  --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0  "
                  "--memory=17179869184  --metrics-export-port=8080  --num-cpus=4  --num-gpus=0 ")


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


def test_head_runs_rayaccel_without_gpus(cluster):
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    c = ray_container(head["template"])
    assert 'exec /bin/bash -c "rayaccel ${KUBERAY_GEN_RAY_START_CMD#ray }"' in c["args"][0]
    assert "nvidia.com/gpu" not in str(c["resources"])
    # a CUDA image without a device-plugin grant must not see the host's GPUs
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in c["env"]


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


def _run_script(spec: dict, generated: str, tmp_path: Path) -> list[str]:
    """The container's script run by bash with KubeRay's generated command; the argv ``rayaccel`` got."""
    script = ray_container(spec["template"])["args"][0]
    out = tmp_path / "argv"
    _stub(tmp_path, "python", "exit 0\n")  # the GPU check passes
    _stub(tmp_path, "rayaccel", f'for a in "$@"; do printf "%s\\n" "$a"; done > {out}\n')
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "KUBERAY_GEN_RAY_START_CMD": generated}
    subprocess.run(["/bin/bash", "-c", "--", script], env=env, check=True, timeout=60)
    return out.read_text().splitlines()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_worker_script_hands_every_generated_flag_to_rayaccel(cluster, tmp_path):
    (group,) = cluster["spec"]["workerGroupSpecs"]
    argv = _run_script(group, GENERATED, tmp_path)
    assert argv[0] == "start"
    assert "--block" in argv and "--num-gpus=8" in argv and "--metrics-export-port=8080" in argv
    assert '--resources={"team_a":1}' in argv  # the JSON survived the shells
    assert "--address=rayaccel-head-svc.default.svc.cluster.local:6379" in argv


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_head_script_hands_every_generated_flag_to_rayaccel(cluster, tmp_path):
    argv = _run_script(cluster["spec"]["headGroupSpec"], GENERATED_HEAD, tmp_path)
    assert argv[:2] == ["start", "--head"]
    assert "--block" in argv and "--num-gpus=0" in argv and "--dashboard-host=0.0.0.0" in argv


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


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, rest), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _build_command() -> list[str]:
    """The ``docker build ... -t TAG .`` command of the Dockerfile's header, as argv."""
    (line,) = [ln.lstrip("# ").strip() for ln in DOCKERFILE.read_text().splitlines()
               if ln.lstrip("# ").startswith("docker build ")]
    return shlex.split(line)


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_image_starts_from_rays_gpu_image_of_an_allowed_release(cluster):
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    froms = [rest for ins, rest in _dockerfile() if ins == "FROM"]
    assert len(froms) == 1, froms
    m = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)-gpu", froms[0])
    assert m, f"FROM {froms[0]}: expected rayproject/ray:<release>-py3<minor>-gpu (Ray's CUDA build)"
    release, py_minor = m.group(1), m.group(2)
    project = _pyproject()["project"]
    (ray_req,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "ray"]
    assert ray_req.specifier.contains(release), f"Ray {release} is not allowed by {ray_req}"
    assert SpecifierSet(project["requires-python"]).contains(f"3.{py_minor}")
    assert cluster["spec"]["rayVersion"] == release  # KubeRay is told the release the image runs


def test_image_installs_the_wheel_and_runs_the_rayaccel_command():
    instructions = _dockerfile()
    version = _pyproject()["project"]["version"]
    args = dict(rest.split("=", 1) for ins, rest in instructions if ins == "ARG" and "=" in rest)
    assert args.get("RAYACCEL_VERSION") == version, "the wheel the Dockerfile copies is not pyproject's version"
    wheel = f"rayaccel-{version}-py3-none-any.whl"
    expand = lambda s: s.replace("${RAYACCEL_VERSION}", version)  # noqa: E731
    copies = [expand(rest).split() for ins, rest in instructions if ins == "COPY"]
    assert [f"dist/{wheel}", "/tmp/wheels/"] in copies  # the wheel `python -m build --wheel` writes
    runs = " && ".join(expand(rest) for ins, rest in instructions if ins == "RUN")
    assert f"pip install --no-cache-dir /tmp/wheels/{wheel}" in runs
    assert "rayaccel --version" in runs  # the image build fails without the command
    assert _pyproject()["project"]["scripts"]["rayaccel"] == "rayaccel.cli:main"
    # Ray's image starts no server of its own: KubeRay's command (the manifest's) runs in it
    assert not [ins for ins, _ in instructions if ins in ("ENTRYPOINT", "CMD")]


def test_every_container_runs_the_image_the_docs_say_to_build(cluster):
    argv = _build_command()
    assert argv[:4] == ["docker", "build", "-f", "deploy/kuberay/Dockerfile"] and argv[-1] == "."
    tag = argv[argv.index("-t") + 1]
    version = _pyproject()["project"]["version"]
    release = cluster["spec"]["rayVersion"]
    assert tag == f"rayaccel:{version}-ray{release}-gpu"
    specs = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    images = [c["image"] for spec in specs for c in spec["template"]["spec"]["containers"]]
    assert images and set(images) == {tag}
    command = " ".join(argv)
    for page in BUILD_DOCS:
        text = page.read_text()
        assert "python -m build --wheel" in text and command in text, f"{page.name} does not say `{command}`"
