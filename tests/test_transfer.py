"""Transfer path planning on named real machines."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rayaccel import catalog
from rayaccel.errors import RequestError
from rayaccel.transfer import MODEL, ROUTES, Endpoint, TransferPlan, locality_cost, plan

GiB = 1 << 30


@pytest.fixture(scope="module")
def machines():
    return {n: catalog.load(n) for n in ("dgx1-v100", "hgx-h100", "pcie-8gpu-2socket", "mi300x-8x", "trn1-32xlarge")}


CASES = [
    # machine, src, dst, route, bandwidth (GB/s)
    ("dgx1-v100", 0, 3, "nvlink", 50.0),          # NV2
    ("dgx1-v100", 0, 1, "nvlink", 25.0),          # NV1
    ("dgx1-v100", 0, 5, "host-staged", 12.0),     # SYS: staged, two PCIe legs
    ("dgx1-v100", 2, 2, "same-device", MODEL["same_device_gbps"]),
    ("dgx1-v100", 0, None, "host-staged", MODEL["host_leg_gbps"]),
    ("dgx1-v100", None, None, "same-device", MODEL["host_memcpy_gbps"]),
    ("hgx-h100", 0, 7, "nvlink", 450.0),          # NV18
    ("pcie-8gpu-2socket", 0, 1, "pcie-p2p", 24.0),  # PIX
    ("pcie-8gpu-2socket", 0, 2, "pcie-p2p", 22.0),  # PXB
    ("pcie-8gpu-2socket", 0, 4, "host-staged", 12.0),  # SYS
]


@pytest.mark.parametrize("machine,a,b,route,gbps", CASES,
                         ids=[f"{m}-{a}-{b}-{r}" for m, a, b, r, _ in CASES])
def test_same_node_routes(machines, machine, a, b, route, gbps):
    t = machines[machine]
    p = plan(Endpoint("n", a, t), Endpoint("n", b, t), GiB)
    assert p.route == route and p.route in ROUTES
    assert p.bandwidth_gbps == pytest.approx(gbps)
    assert p.seconds == pytest.approx(p.latency_s + GiB / (gbps * 1e9))
    assert p.reason and p.hops[0].endswith("@n") and p.hops[-1].endswith("@n")


def test_direct_links_of_other_vendors(machines):
    amd = machines["mi300x-8x"]
    p = plan(Endpoint("n", 0, amd), Endpoint("n", 1, amd), GiB)
    assert p.route == "xgmi"
    trn = machines["trn1-32xlarge"]
    link = next(l for l in trn.links if l.direct)
    assert plan(Endpoint("n", link.a, trn), Endpoint("n", link.b, trn), GiB).route == "neuronlink"


def test_sys_reason_explains_staging(machines):
    t = machines["dgx1-v100"]
    p = plan(Endpoint("n", 0, t), Endpoint("n", 5, t), GiB)
    assert "SYS" in p.reason and "host" in p.reason and p.hops == ("gpu0@n", "host", "gpu5@n")


def test_nvlink_beats_staging_for_the_same_bytes(machines):
    t = machines["dgx1-v100"]
    near = plan(Endpoint("n", 0, t), Endpoint("n", 3, t), GiB)
    far = plan(Endpoint("n", 0, t), Endpoint("n", 5, t), GiB)
    assert near.seconds < far.seconds


def test_cross_node_gpudirect_when_nic_is_pix_on_both_ends(machines):
    h = machines["hgx-h100"]
    p = plan(Endpoint("a", 0, h), Endpoint("b", 1, h), GiB)  # mlx5_0 PIX to GPU0, mlx5_1 PIX to GPU1
    assert p.route == "gpudirect-rdma" and p.bandwidth_gbps == MODEL["rdma_nic_gbps"]
    assert p.hops == ("gpu0@a", "mlx5_0", "mlx5_1", "gpu1@b")


def test_cross_node_dgx1_uses_its_pix_nics(machines):
    t = machines["dgx1-v100"]
    p = plan(Endpoint("a", 6, t), Endpoint("b", 2, t), GiB)
    assert p.route == "gpudirect-rdma" and p.hops[1:3] == ("mlx5_3", "mlx5_1")


@pytest.mark.parametrize("src_machine,why", [("pcie-8gpu-2socket", "no RDMA NIC"), (None, "unknown")],
                         ids=["no-nic", "no-topology"])
def test_cross_node_falls_back_to_tcp(machines, src_machine, why):
    h = machines["hgx-h100"]
    src_topo = machines[src_machine] if src_machine else None
    p = plan(Endpoint("a", 0, src_topo), Endpoint("b", 0, h), GiB)
    assert p.route == "tcp" and why in p.reason
    assert p.seconds == pytest.approx(MODEL["latency_tcp_s"] + GiB / (MODEL["tcp_gbps"] * 1e9))


def test_host_endpoints_across_nodes_use_tcp(machines):
    h = machines["hgx-h100"]
    assert plan(Endpoint("a", None, h), Endpoint("b", 0, h), 10).route == "tcp"


@pytest.mark.parametrize("kwargs,match", [
    (dict(src=Endpoint("n", 9), dst=Endpoint("n", 0), nbytes=1), "no device 9"),
    (dict(src=Endpoint("n", 0), dst=Endpoint("n", 1), nbytes=-1), "nbytes"),
    (dict(src=Endpoint("n", 0), dst=Endpoint("n", 1), nbytes=1.5), "nbytes"),
    (dict(src=Endpoint("n", -1), dst=Endpoint("n", 1), nbytes=1), "src.device"),
    (dict(src=Endpoint("", 0), dst=Endpoint("n", 1), nbytes=1), "src.node"),
    (dict(src="gpu0", dst=Endpoint("n", 1), nbytes=1), "Endpoint"),
], ids=["unknown-device", "negative", "float", "negative-device", "empty-node", "not-endpoint"])
def test_bad_inputs(machines, kwargs, match):
    t = machines["dgx1-v100"]
    kw = dict(kwargs)
    for k in ("src", "dst"):
        if isinstance(kw[k], Endpoint):
            kw[k] = Endpoint(kw[k].node, kw[k].device, t)
    with pytest.raises(RequestError, match=match):
        plan(**kw)


def test_unknown_topology_same_node_is_staged():
    p = plan(Endpoint("n", 0), Endpoint("n", 1), 1 << 20)
    assert p.route == "host-staged" and "no topology" in p.reason


def test_locality_cost(machines):
    t = machines["dgx1-v100"]
    dst = Endpoint("n", 0, t)
    assert locality_cost(dst, [(Endpoint("n", 0, t), GiB)]) == 0.0
    near = locality_cost(dst, [(Endpoint("n", 3, t), GiB)])
    far = locality_cost(dst, [(Endpoint("n", 5, t), GiB)])
    rdma = locality_cost(dst, [(Endpoint("m", 5, t), GiB)])  # mlx5_2 PIX to gpu5, mlx5_0 PIX to gpu0
    remote = locality_cost(dst, [(Endpoint("m", 5, None), GiB)])  # unknown: tcp
    assert 0 < near < rdma < far < remote
    assert locality_cost(dst, [(Endpoint("n", 3, t), GiB), (Endpoint("n", 5, t), GiB)]) == pytest.approx(near + far)
    with pytest.raises(RequestError):
        locality_cost(dst, [(Endpoint("n", 0, t), -5)])


def test_plan_is_json_ready(machines):
    t = machines["dgx1-v100"]
    d = plan(Endpoint("n", 0, t), Endpoint("n", 3, t), 100).to_dict()
    assert json.loads(json.dumps(d))["route"] == "nvlink" and isinstance(plan(Endpoint("n"), Endpoint("n"), 0), TransferPlan)


# ------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def cli():
    import typer

    from rayaccel.cli.path import register

    app = typer.Typer()
    topo_app = typer.Typer()
    app.add_typer(topo_app, name="topo")
    register(topo_app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["topo", "path", *args])


def test_cli_path_json(cli):
    r = cli("0", "3", "--topology", "dgx1-v100", "--bytes", "1GiB", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["route"] == "nvlink" and d["nbytes"] == GiB and d["bandwidth_gbps"] == 50.0


def test_cli_path_table_and_remote(cli):
    r = cli("0", "nodeB:1", "--topology", "hgx-h100", "--remote-topology", "hgx-h100")
    assert r.exit_code == 0, r.output
    assert "gpudirect-rdma" in r.output and "mlx5_0" in r.output
    r = cli("host", "5", "--topology", "dgx1-v100")
    assert r.exit_code == 0 and "host-staged" in r.output


@pytest.mark.parametrize("args,match", [
    (["0", "99", "--topology", "dgx1-v100"], "no device 99"),
    (["zero", "1", "--topology", "dgx1-v100"], "device index"),
    (["0", "1", "--topology", "dgx1-v100", "--bytes", "lots"], "bytes"),
], ids=["unknown-device", "bad-endpoint", "bad-bytes"])
def test_cli_path_bad_input(cli, args, match):
    r = cli(*args)
    assert r.exit_code == 2 and match in r.output
