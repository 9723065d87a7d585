"""`rayaccel topo` through its real entry points (typer app and the installed script)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from rayaccel import catalog
from rayaccel.cli import app
from rayaccel.cli.topo import cpu_ranges, summary

runner = CliRunner()
DGX1_CAPTURE = "13_dgx1-v100-8gpu-4mlx5-microway.txt"


def invoke(*args, env=None):
    return runner.invoke(app, list(args), env=env)


def test_show_catalog_machine_human():
    r = invoke("topo", "show", "--topology", "dgx1-v100")
    assert r.exit_code == 0, r.output
    out = r.output
    for word in ("NV2", "NV1", "SYS", "GPU7", "NIC0", "mlx5_3", "0-19,40-59", "Tesla V100-SXM2-32GB",
                 "8 GPUs", "1 NVLink domain", "2 NUMA nodes", "4 NICs", "sources:"):
        assert word in out, word
    matrix = [line for line in out.splitlines() if line.startswith("GPU0 ")][0].split()
    assert matrix[1:9] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]


def test_show_json_is_to_dict():
    r = invoke("topo", "show", "--topology", "hgx-h100", "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout) == catalog.load("hgx-h100").to_dict()


def test_show_pictures(tmp_path):
    png, svg = tmp_path / "t.png", tmp_path / "t.svg"
    r = invoke("topo", "show", "-t", "trn1-32xlarge", "--png", str(png), "--svg", str(svg), "--json")
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG" and "<svg" in svg.read_text()
    assert json.loads(r.stdout)["name"] == "trn1-32xlarge"  # "wrote ..." goes to stderr, stdout stays JSON


def test_show_picture_with_wrong_suffix(tmp_path):
    r = invoke("topo", "show", "-t", "dgx1-v100", "--png", str(tmp_path / "x.svg"))
    assert r.exit_code == 2 and "must end in .png" in r.output


def test_unknown_topology_name_exits_2_with_suggestions():
    r = invoke("topo", "show", "--topology", "dgx1-v10")
    assert r.exit_code == 2
    assert "did you mean 'dgx1-v100'" in r.output and "Traceback" not in r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit)


def test_show_wide_machine_uses_neighbour_list():
    r = invoke("topo", "show", "-t", "nvl72")
    assert r.exit_code == 0
    assert "NV18 to all 71 others" in r.output and "72 GPUs" in r.output
    assert max(len(line) for line in r.output.splitlines() if not line.startswith("  - ")) <= 100


def test_show_mig_machine():
    r = invoke("topo", "show", "-t", "a100-mig")
    assert r.exit_code == 0 and "1g.5gb@0" in r.output and "3g.20gb@4" in r.output and "3 MIG instances" in r.output


def test_show_this_machine_without_hardware_explains():
    from rayaccel.discovery.registry import backend_infos

    r = invoke("topo", "show")
    if any(i.available for i in backend_infos() if i.name != "simulated"):  # a machine with accelerators
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 2
    assert "--topology dgx1-v100" in r.output and "RAYACCEL_TOPOLOGY" in r.output and "nvidia" in r.output
    assert "Traceback" not in r.output


def test_show_this_machine_simulated(monkeypatch):
    monkeypatch.setenv("RAYACCEL_TOPOLOGY", "l40s-4x-pcie")
    r = invoke("topo", "show", "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["devices"]) == 4


def test_import_capture_json_contract(data_dir):
    r = invoke("topo", "import", str(data_dir / "captures" / DGX1_CAPTURE), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data["devices"]) == 8
    for d in data["devices"]:
        assert isinstance(d["index"], int)
        assert d["numa_node"] is None or isinstance(d["numa_node"], int)
        assert d["cpus"] is None or all(isinstance(c, int) for c in d["cpus"])
        assert isinstance(d["partitions"], list)
    assert data["devices"][0]["cpus"][:3] == [0, 1, 2]
    assert len(data["links"]) == 28
    for link in data["links"]:
        assert set(link) >= {"a", "b", "kind", "count", "pcie"} and link["a"] < link["b"]
        assert link["pcie"] in (None, "PIX", "PXB", "PHB", "NODE", "SYS")
    pair = {(l["a"], l["b"]): l for l in data["links"]}
    assert (pair[(0, 3)]["kind"], pair[(0, 3)]["count"]) == ("nvlink", 2)
    assert (pair[(0, 5)]["kind"], pair[(0, 5)]["pcie"]) == ("pcie", "SYS")


def test_import_several_mig_captures_contract(data_dir):
    caps = data_dir / "captures"
    r = invoke("topo", "import", str(caps / "44_mig-L-jasmin-a100sxm4-40gb-2gpu-1g10gb.txt"),
               str(caps / "57_mig-lgip-a100-40gb-2gpu-all-used.txt"), "--json", "--name", "jasmin")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["name"] == "jasmin"
    dev = data["devices"][0]
    assert dev["partitions"][0]["profile"] == "1g.10gb" and dev["partitions"][0]["uuid"].startswith("MIG-")
    prof = {p["name"]: p for p in dev["mig_profiles"]}
    for p in prof.values():
        assert set(p) >= {"name", "id", "max_instances", "memory_mib", "placements", "slots"}
    assert prof["3g.20gb"]["id"] == 9 and prof["3g.20gb"]["slots"] == 4
    assert "warning:" in r.stderr


def test_import_human_and_pictures(data_dir, tmp_path):
    png = tmp_path / "n.png"
    r = invoke("topo", "import", str(data_dir / "captures" / "68_neuron-ls-trn1.32xlarge-16dev-collapsed-whitespace.txt"),
               "--png", str(png))
    assert r.exit_code == 0, r.output
    assert "NeuronLink" in r.output and png.exists()


def test_import_missing_file(tmp_path):
    r = invoke("topo", "import", str(tmp_path / "nope.txt"))
    assert r.exit_code == 2 and "no such file" in r.output and "Traceback" not in r.output


def test_import_damaged_capture_names_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV\x00??\n")
    r = invoke("topo", "import", str(bad))
    assert r.exit_code == 2 and "bad.txt" in r.output and "Traceback" not in r.output


def test_backends_json_lists_builtins_with_reasons():
    r = invoke("topo", "backends", "--json")
    assert r.exit_code == 0, r.output
    infos = {i["name"]: i for i in json.loads(r.stdout)}
    assert {"nvidia", "amd", "simulated"} <= set(infos)
    for i in infos.values():
        assert isinstance(i["available"], bool)
        if not i["available"]:
            assert i["reason"]
    human = invoke("topo", "backends")
    assert human.exit_code == 0 and "nvidia" in human.output and "unavailable" in human.output


def test_list():
    r = invoke("topo", "list", "--json")
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == catalog.names()
    assert sum(row["default"] for row in rows) == 1
    human = invoke("topo", "list")
    assert "dgx1-v100 (default)" in human.output and "trn1-32xlarge" in human.output


def test_installed_script_subprocess():
    exe = shutil.which("rayaccel")
    assert exe, "the rayaccel script is not installed (pip install -e .)"
    r = subprocess.run([exe, "topo", "show", "--topology", "dgx1-v100", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["links"][2]["kind"] == "nvlink"
    bad = subprocess.run([exe, "topo", "show", "--topology", "dgx1-v10"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "did you mean" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "cpus,text",
    [((0, 1, 2, 3, 8, 9), "0-3,8-9"), ((5,), "5"), ((), "-"), (None, "N/A"), ((3, 1, 2), "1-3"), ((0, 2, 4), "0,2,4")],
)
def test_cpu_ranges(cpus, text):
    assert cpu_ranges(cpus) == text


@given(st.sets(st.integers(0, 300), min_size=1))
def test_cpu_ranges_round_trip(cpus):
    back = set()
    for part in cpu_ranges(tuple(cpus)).split(","):
        lo, _, hi = part.partition("-")
        back |= set(range(int(lo), int(hi or lo) + 1))
    assert back == cpus


@pytest.mark.parametrize(
    "name,text",
    [("dgx1-v100", "8 GPUs (Tesla V100-SXM2-32GB), 1 NVLink domain, 2 NUMA nodes, 4 NICs"),
     ("l40s-4x-pcie", "4 GPUs (NVIDIA L40S), no direct links (PCIe only), 1 NUMA node"),
     ("a100-pcie-2x-nvbridge", "2 GPUs (NVIDIA A100 80GB PCIe), 1 NVLink domain, 2 NUMA nodes"),
     ("mi300x-8x", "8 GPUs (AMD Instinct MI300X), 1 xGMI domain, 2 NUMA nodes"),
     ("a100-mig", "1 GPU (NVIDIA A100-SXM4-40GB), 1 NUMA node, 3 MIG instances")],
)
def test_summary(name, text):
    assert summary(catalog.load(name)) == text
