"""Every library's NIC variables (issue 21 item 4), the pure part: which names ``--nic-env`` accepts, the form
each variable takes (NCCL's ``=`` for exact names), interfaces from the host's sysfs; a bad name is one error line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rayaccel import contract
from rayaccel.errors import ClusterError
from rayaccel.ray.node.start import nic_env_names


def test_each_variable_takes_its_librarys_form():
    nics = ("mlx5_0:1", "mlx5_1:1")
    got = contract.nic_env_values(tuple(contract.NIC_ENV_VARS), nics, {"mlx5_0": ("ib0",), "mlx5_1": ("ib1",)})
    assert got == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NVSHMEM_HCA_LIST": "mlx5_0:1,mlx5_1:1",
                   "NCCL_SOCKET_IFNAME": "=ib0,ib1", "GLOO_SOCKET_IFNAME": "ib0,ib1",
                   "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "ib0"}


def test_no_nic_or_no_known_interface_writes_nothing():
    assert contract.nic_env_values(("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"), (), {}) == \
        {"NCCL_IB_HCA": None, "NCCL_SOCKET_IFNAME": None}
    assert contract.nic_env_values(("NCCL_SOCKET_IFNAME",), ("mlx5_0:1",), {}) == {"NCCL_SOCKET_IFNAME": None}


def test_interfaces_come_from_the_hosts_sysfs(tmp_path, monkeypatch):
    (tmp_path / "mlx5_0" / "device" / "net" / "ib0").mkdir(parents=True)
    (tmp_path / "mlx5_1").mkdir()
    monkeypatch.setenv(contract.IB_DIR_ENV, str(tmp_path))
    assert contract.host_netdevs("mlx5_0") == ("ib0",)
    assert contract.host_netdevs("mlx5_1") == () == contract.host_netdevs("mlx5_9")


@pytest.mark.parametrize("given, want", [("NCCL_IB_HCA,NVSHMEM_HCA_LIST", ("NCCL_IB_HCA", "NVSHMEM_HCA_LIST")),
                                         (" NCCL_IB_HCA , NCCL_IB_HCA ", ("NCCL_IB_HCA",)),
                                         (["NCCL_SOCKET_IFNAME"], ("NCCL_SOCKET_IFNAME",)), (None, ()), ("", ())],
                         ids=["two", "spaces-and-twice", "a-list", "none", "empty"])
def test_names_are_parsed(given, want):
    assert nic_env_names(given) == want


def test_an_unknown_name_is_named_with_the_accepted_ones():
    with pytest.raises(ClusterError, match="unknown variable.*NCCL_IB_HCAS.*NCCL_IB_HCA, NVSHMEM_HCA_LIST"):
        nic_env_names("NCCL_IB_HCAS")


def test_rayaccel_start_with_a_bad_name_is_one_error_line_before_anything_starts():
    from rayaccel.cli import app

    r = CliRunner().invoke(app, ["start", "--topology", "dgx1-v100", "--nic-env", "NCCL_IB_HCAS"])
    assert r.exit_code == 2, r.output
    lines = [l for l in r.output.splitlines() if l.strip()]
    assert lines[0].startswith("error:") and "NCCL_IB_HCAS" in r.output and "Traceback" not in r.output
