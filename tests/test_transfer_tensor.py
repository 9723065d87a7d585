"""The ``rayaccel`` tensor transport's path choice (rayaccel.transfer.tensor_path) on named real machines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayaccel import catalog
from rayaccel.errors import RequestError
from rayaccel.transfer import MODEL, NIXL_HINT, TENSOR_PATHS, Endpoint, TensorPath, near_nics, tensor_path

MiB = 1 << 20


@pytest.fixture(scope="module")
def machines():
    return {n: catalog.load(n) for n in ("dgx-a100", "dgx1-v100", "hgx-h100", "pcie-8gpu-2socket", "l40s-4x-pcie")}


SAME_NODE = [
    # machine, producer device, consumer device, path, copies
    ("dgx-a100", None, None, "shared-memory", 1),   # CPU tensors: one copy into a segment, mapped
    ("dgx-a100", 3, 3, "cuda-ipc", 0),              # one GPU: the consumer maps the producer's memory
    ("dgx-a100", 0, 5, "cuda-ipc", 1),              # NVSwitch NV12: peer copy
    ("dgx1-v100", 0, 3, "cuda-ipc", 1),             # NV2
    ("dgx1-v100", 0, 5, "shared-memory", 2),        # SYS: staged through host
    ("pcie-8gpu-2socket", 0, 1, "cuda-ipc", 1),     # PIX
    ("pcie-8gpu-2socket", 0, 2, "cuda-ipc", 1),     # PXB
    ("pcie-8gpu-2socket", 0, 4, "shared-memory", 2),  # SYS
    ("dgx-a100", 2, None, "shared-memory", 1),      # GPU tensors to a CPU consumer: one copy out
    ("dgx-a100", None, 2, "shared-memory", 1),      # CPU tensors onto a GPU: one copy in
]


@pytest.mark.parametrize("machine,a,b,path,copies", SAME_NODE, ids=[f"{m}-{a}-{b}" for m, a, b, *_ in SAME_NODE])
def test_same_node_paths(machines, machine, a, b, path, copies):
    t = machines[machine]
    p = tensor_path(Endpoint("n", a, t), Endpoint("n", b, t), 64 * MiB)
    assert isinstance(p, TensorPath) and p.path == path and p.path in TENSOR_PATHS
    assert p.copies == copies and p.nbytes == 64 * MiB and p.reason
    assert p.nics == ((), ())
    if copies == 0:
        assert p.bandwidth_gbps is None
    else:
        assert p.bandwidth_gbps > 0 and p.seconds == pytest.approx(p.nbytes / (p.bandwidth_gbps * 1e9), rel=0.1)


def test_a_peer_copy_beats_staging_on_the_same_machine(machines):
    t = machines["dgx1-v100"]
    nv = tensor_path(Endpoint("n", 0, t), Endpoint("n", 3, t), 1 << 30)
    sys_ = tensor_path(Endpoint("n", 0, t), Endpoint("n", 5, t), 1 << 30)
    assert nv.seconds < sys_.seconds and "NV2" in nv.reason and "SYS" in sys_.reason


@pytest.mark.parametrize("machine", ["l40s-4x-pcie", "pcie-8gpu-2socket"])
def test_only_pcie_switches_are_cuda_ipc_paths_without_nvlink(machines, machine):
    """Between GPUs without NVLink, IPC only under one PCIe switch (PIX/PXB); PHB, NODE, SYS stage through host."""
    t = machines[machine]
    pairs = {(l.a, l.b): l.pcie for l in t.links if not l.direct}
    assert {"PIX"} <= set(pairs.values()) and set(pairs.values()) - {"PIX", "PXB"}
    for (a, b), cls in pairs.items():
        p = tensor_path(Endpoint("n", a, t), Endpoint("n", b, t), MiB)
        assert (p.path == "cuda-ipc") == (cls in ("PIX", "PXB")), (a, b, cls, p)


def test_no_shared_memory_falls_back_to_the_object_store(machines):
    t = machines["dgx-a100"]
    p = tensor_path(Endpoint("n", None, t), Endpoint("n", None, t), MiB, shared_memory=False)
    assert p.path == "object-store" and "/dev/shm" in p.reason
    # CUDA IPC needs no shared-memory segment
    assert tensor_path(Endpoint("n", 1, t), Endpoint("n", 1, t), MiB, shared_memory=False).path == "cuda-ipc"


def test_across_dgx_a100_nodes_nixl_through_the_nearest_nics(machines):
    t = machines["dgx-a100"]
    # GPU 0 sits on the PCIe switch of mlx5_0/mlx5_1, GPU 4 on that of mlx5_4/mlx5_5
    p = tensor_path(Endpoint("a", 0, t), Endpoint("b", 4, t), 64 * MiB, gpudirect=True)
    assert p.path == "nixl" and p.route == "gpudirect-rdma" and p.copies == 1
    assert p.nics == (("mlx5_0", "mlx5_1"), ("mlx5_4", "mlx5_5"))
    assert p.bandwidth_gbps == MODEL["rdma_nic_gbps"] and "GPUDirect RDMA" in p.reason


@pytest.mark.parametrize("gpudirect,word", [(None, "not known to work"), (False, "not working")])
def test_without_gpudirect_gpu_memory_is_staged(machines, gpudirect, word):
    t = machines["dgx-a100"]
    p = tensor_path(Endpoint("a", 0, t), Endpoint("b", 4, t), 64 * MiB, gpudirect=gpudirect)
    assert p.path == "nixl" and p.route == "rdma" and word in p.reason
    assert p.bandwidth_gbps < MODEL["rdma_nic_gbps"]


def test_host_memory_across_nodes_uses_the_nics_it_is_given(machines):
    t = machines["dgx-a100"]
    p = tensor_path(Endpoint("a", None, t), Endpoint("b", None, t), MiB, src_nics=("mlx5_2",), dst_nics=("mlx5_6",))
    assert p.path == "nixl" and p.nics == (("mlx5_2",), ("mlx5_6",)) and p.route == "rdma"
    assert p.bandwidth_gbps == MODEL["rdma_nic_gbps"]  # host memory needs no GPUDirect


def test_no_rdma_nic_means_ucx_over_tcp():
    p = tensor_path(Endpoint("a", None, None), Endpoint("b", None, None), MiB)
    assert p.path == "nixl" and p.route == "tcp" and "no RDMA NIC" in p.reason and p.nics == ((), ())


def test_no_nixl_across_nodes_names_what_to_install(machines):
    t = machines["dgx-a100"]
    p = tensor_path(Endpoint("a", 0, t), Endpoint("b", 0, t), MiB, nixl=False)
    assert p.path == "object-store" and NIXL_HINT in p.reason and p.copies == 2


@pytest.mark.parametrize("machine,devices,nics", [
    ("dgx-a100", (0,), ("mlx5_0", "mlx5_1")),
    ("dgx-a100", (6, 7), ("mlx5_6", "mlx5_7")),
    ("dgx-a100", (), ()),
    ("hgx-h100", (3,), ("mlx5_3",)),
    ("dgx1-v100", (0,), ("mlx5_0",)),
], ids=["a100-gpu0", "a100-gpu67", "a100-none", "h100-gpu3", "dgx1-gpu0"])
def test_near_nics(machines, machine, devices, nics):
    assert near_nics(machines[machine], devices) == nics


def test_near_nics_without_a_topology():
    assert near_nics(None, (0, 1)) == ()


def test_to_dict_is_json_ready(machines):
    import json

    t = machines["dgx-a100"]
    d = tensor_path(Endpoint("a", 0, t), Endpoint("b", 4, t), MiB).to_dict()
    assert json.loads(json.dumps(d)) == d and d["path"] == "nixl" and d["nics"][0] == ["mlx5_0", "mlx5_1"]


@pytest.mark.parametrize("bad,field", [
    (dict(nbytes=-1), "nbytes"), (dict(nbytes=1.5), "nbytes"), (dict(nbytes=True), "nbytes"),
    (dict(src="gpu0"), "src"), (dict(dst=Endpoint("", 0)), "dst.node"), (dict(src=Endpoint("n", 99)), "src.device"),
])
def test_bad_input_is_one_request_error(machines, bad, field):
    t = machines["dgx-a100"]
    args = dict(src=Endpoint("n", 0, t), dst=Endpoint("n", 1, t), nbytes=MiB)
    if field == "src.device":
        args["src"] = Endpoint("n", 99, t)
    else:
        args.update(bad)
    with pytest.raises(RequestError) as e:
        tensor_path(args["src"], args["dst"], args["nbytes"])
    assert field in str(e.value)


_DEV = st.one_of(st.none(), st.integers(0, 7))


@settings(max_examples=300, deadline=None)
@given(a=_DEV, b=_DEV, same=st.booleans(), nbytes=st.integers(0, 1 << 40), gd=st.sampled_from([None, True, False]),
       nixl=st.booleans(), shm=st.booleans())
def test_every_pair_gets_one_known_path(a, b, same, nbytes, gd, nixl, shm):
    t = catalog.load("dgx-a100")
    p = tensor_path(Endpoint("a", a, t), Endpoint("a" if same else "b", b, t), nbytes, gpudirect=gd, nixl=nixl,
                    shared_memory=shm)
    assert p.path in TENSOR_PATHS and p.reason and p.seconds >= 0 and p.copies in (0, 1, 2)
    if same:
        assert p.path != "nixl"
    else:
        assert p.path == ("nixl" if nixl else "object-store")
