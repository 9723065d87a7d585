"""The neuron, gaudi, ascend and tpu backends, fed real captures through their injected tool runner / sysfs / metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayaccel.discovery.rayspec import HPU, NEURON, NPU, TPU
from rayaccel.discovery.tools import AscendBackend, GaudiBackend, NeuronBackend, run_tool
from rayaccel.discovery.tpu import TpuBackend
from rayaccel.errors import BackendError, BackendUnavailable

CAPTURES = {p.name[:2]: p for p in (Path(__file__).parent.parent / "data" / "captures").glob("*.txt")}


def _body(num: str, start: str) -> str:
    """A capture's text from the line that starts with ``start`` (what the tool itself would print)."""
    lines = CAPTURES[num].read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.lstrip().startswith(start))
    return "\n".join(lines[i:]) + "\n"


def _runner(outputs: dict[tuple[str, ...], tuple[int, str, str]], seen: list):
    def run(argv):
        seen.append(tuple(argv))
        return outputs.get(tuple(argv[1:]), (1, "", "unknown option"))

    return run


def test_neuron_backend_reads_json_and_table():
    seen: list = []
    json_text = _body("94", "[")
    table = _body("94", "instance-type").split("\n$ neuron-ls --json-output")[0] + "\n"
    b = NeuronBackend(which=lambda tool: "/opt/aws/neuron/bin/neuron-ls",
                      run=_runner({("--json-output",): (0, json_text, ""), (): (0, table, "")}, seen))
    assert b.available().available and b.ray_spec is NEURON
    t = b.discover()
    assert seen == [("/opt/aws/neuron/bin/neuron-ls", "--json-output"), ("/opt/aws/neuron/bin/neuron-ls",)]
    assert t.device(0).model == "Trainium2" and t.device(0).cores == 4


def test_neuron_backend_keeps_the_view_that_worked():
    json_text = _body("93", "[")
    b = NeuronBackend(which=lambda tool: "/x/neuron-ls",
                      run=_runner({("--json-output",): (0, json_text, "")}, []))
    assert b.discover().device(0).cores == 2


def test_neuron_backend_without_tool_or_device():
    b = NeuronBackend(which=lambda tool: None)
    info = b.available()
    assert not info.available and "neuron-ls not found" in info.reason and "aws-neuronx-tools" in info.hint
    with pytest.raises(BackendUnavailable, match="neuron-ls not found"):
        b.discover()
    err = 'time="2026-09-12T02:42:06Z" level=fatal msg="Failed to load MLA system information"'
    b = NeuronBackend(which=lambda tool: "/x/neuron-ls", run=lambda argv: (1, "", err))
    with pytest.raises(BackendUnavailable, match="found no device .*Failed to load MLA system information"):
        b.discover()


def test_tool_output_the_importer_cannot_read_is_an_error_naming_the_tool():
    b = NeuronBackend(which=lambda tool: "/x/neuron-ls", run=lambda argv: (0, "garbage\n", ""))
    with pytest.raises(BackendError, match="cannot read the output of neuron-ls"):
        b.discover()


def test_gaudi_and_ascend_backends():
    g = GaudiBackend(which=lambda tool: "/usr/bin/hl-smi",
                     run=_runner({("topo", "-c", "-N"): (0, CAPTURES["66"].read_text(), "")}, []))
    t = g.discover()
    assert g.ray_spec is HPU and len(t.devices) == 8 and t.device(5).numa_node == 1 and t.device(0).vendor == "habana"
    topo = _body("95", "NPU0       NPU1").split("(valle)")[0]
    info = _body("95", "+-----")
    a = AscendBackend(which=lambda tool: "/usr/local/sbin/npu-smi",
                      run=_runner({("info", "-t", "topo"): (0, topo, ""), ("info",): (0, info, "")}, []))
    t = a.discover()
    assert a.ray_spec is NPU and t.device(0).model == "Ascend910B3" and len(t.links) == 28


def test_run_tool_reports_a_missing_program():
    with pytest.raises(BackendError, match="could not be started"):
        run_tool(["/nonexistent/tool-xyz"])
    rc, out, _ = run_tool(["echo", "hi"])
    assert (rc, out) == (0, "hi\n")


# ---------------------------------------------------------------------- TPU
def _sysfs(root: Path, n: int, device_id: str = "0x005e") -> Path:
    for i in range(n):
        d = root / f"0000:00:{4 + i:02x}.0"
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x1ae0\n")
        (d / "device").write_text(device_id + "\n")
    other = root / "0000:00:01.0"
    other.mkdir()
    (other / "vendor").write_text("0x8086\n")
    (other / "device").write_text("0x1234\n")
    return root


def test_tpu_backend_on_a_v4_vm_with_metadata(tmp_path):
    env_text = "\n".join(CAPTURES["99"].read_text().splitlines()[1][2:].strip('"').split("\\n"))
    meta = {"tpu-env": env_text}
    b = TpuBackend(sysfs=_sysfs(tmp_path, 4), fetch=meta.get, environ={})
    assert b.available().available and b.ray_spec is TPU
    t = b.discover()
    assert [d.coords for d in t.devices] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    assert t.slice.name == "penghao-tpu-1" and t.slice.accelerator_type == "v4-256" and t.slice.worker_id == 0
    assert t.device(0).pci_bus_id == "0000:00:04" and t.device(0).model == "TPU v4"


def test_tpu_backend_on_gke_without_metadata(tmp_path):
    env = {"TPU_NAME": "my-slice", "TPU_WORKER_ID": "2", "TPU_TOPOLOGY": "4x4", "TPU_ACCELERATOR_TYPE": "v6e-16"}
    b = TpuBackend(sysfs=_sysfs(tmp_path, 4, "0x006f"), fetch=lambda key: None, environ=env)
    t = b.discover()
    assert t.slice.name == "my-slice" and t.slice.worker_id == 2 and t.device(0).model == "TPU v6e"
    assert [d.coords for d in t.devices][3] == (1, 1, 0)


def test_tpu_backend_elsewhere_is_unavailable_without_a_network_call(tmp_path):
    calls = []
    b = TpuBackend(sysfs=_sysfs(tmp_path, 0), fetch=lambda key: calls.append(key))
    info = b.available()
    assert not info.available and "no Google TPU PCI device" in info.reason and "RAYACCEL_TOPOLOGY" in info.hint
    with pytest.raises(BackendUnavailable):
        b.discover()
    assert calls == []


def test_tpu_backend_metadata_that_contradicts_the_chips(tmp_path):
    env_text = "\n".join(CAPTURES["99"].read_text().splitlines()[1][2:].strip('"').split("\\n"))
    b = TpuBackend(sysfs=_sysfs(tmp_path, 8, "0x0063"), fetch={"tpu-env": env_text}.get, environ={})
    with pytest.raises(BackendError, match="4 chips per host .* but 8 TPU PCI devices"):
        b.discover()
