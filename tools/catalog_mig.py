"""MIG GPU-instance profile tables (with placements) by GPU model, for ``build_catalog.py``.

Data only: one row per profile as ``nvidia-smi mig -lgip`` / ``-lgipp`` show it, each table
naming its sources. ``build_catalog.py`` attaches them to catalog machines and writes
``_mig_tables.json``.
"""

from __future__ import annotations

from rayaccel.topology import MigProfile

# Placements are start slots (memory slices out of 8), as the NVIDIA MIG User Guide lists them.
# (name, id, max, memory MiB, placements, slots, SMs)
_MIG_ROWS = {
    # A100-40GB: nvidia-smi mig -lgip (capture 57; NVIDIA forum); MiB from go-nvml mock/gpus/a100.go.
    "A100-40GB": [
        ("1g.5gb", 19, 7, 4864, tuple(range(7)), 1, 14),
        ("1g.5gb+me", 20, 1, 4864, tuple(range(7)), 1, 14),
        ("1g.10gb", 15, 4, 9856, (0, 2, 4, 6), 2, 14),
        ("2g.10gb", 14, 3, 9856, (0, 2, 4), 2, 28),
        ("3g.20gb", 9, 2, 19968, (0, 4), 4, 42),
        ("4g.20gb", 5, 1, 19968, (0,), 4, 56),
        ("7g.40gb", 0, 1, 40192, (0,), 8, 98),
    ],
    # A100-80GB: same ids/SMs/placements as A100-40GB; MiB per go-nvml mock/gpus/a100.go.
    "A100-80GB": [
        ("1g.10gb", 19, 7, 9856, tuple(range(7)), 1, 14),
        ("1g.10gb+me", 20, 1, 9856, tuple(range(7)), 1, 14),
        ("1g.20gb", 15, 4, 19968, (0, 2, 4, 6), 2, 14),
        ("2g.20gb", 14, 3, 19968, (0, 2, 4), 2, 28),
        ("3g.40gb", 9, 2, 40192, (0, 4), 4, 42),
        ("4g.40gb", 5, 1, 40192, (0,), 4, 56),
        ("7g.80gb", 0, 1, 80384, (0,), 8, 98),
    ],
    # H100-80GB: 7g.80gb = 79.25 GiB / 132 SMs (published -lgip output); 1g/2g/3g/4g SMs as H100 NVL / H200
    # (same GH100 die, 16/26/32/60/64); memory per slice scaled from 79.25 GiB (9.75/19.62/39.50 GiB).
    "H100-80GB": [
        ("1g.10gb", 19, 7, 9984, tuple(range(7)), 1, 16),
        ("1g.10gb+me", 20, 1, 9984, tuple(range(7)), 1, 16),
        ("1g.20gb", 15, 4, 20096, (0, 2, 4, 6), 2, 26),
        ("2g.20gb", 14, 3, 20096, (0, 2, 4), 2, 32),
        ("3g.40gb", 9, 2, 40448, (0, 4), 4, 60),
        ("4g.40gb", 5, 1, 40448, (0,), 4, 64),
        ("7g.80gb", 0, 1, 81152, (0,), 8, 132),
    ],
    # H200 (141GB): nvidia-smi mig -lgip in NVIDIA/mig-parted#120 (16.00/32.25/69.50 GiB);
    # max counts from mig-parted config-default.yaml. 7g.141gb memory: not in the excerpt we have;
    # 140.00 GiB taken from a published -lgip test fixture (unverified).
    "H200": [
        ("1g.18gb", 19, 7, 16384, tuple(range(7)), 1, 16),
        ("1g.18gb+me", 20, 1, 16384, tuple(range(7)), 1, 16),
        ("1g.35gb", 15, 4, 33024, (0, 2, 4, 6), 2, 26),
        ("2g.35gb", 14, 3, 33024, (0, 2, 4), 2, 32),
        ("3g.71gb", 9, 2, 71168, (0, 4), 4, 60),
        ("4g.71gb", 5, 1, 71168, (0,), 4, 64),
        ("7g.141gb", 0, 1, 143360, (0,), 8, 132),
    ],
}
MIG = {k: tuple(MigProfile(n, i, m, mem, pl, s, sm) for n, i, m, mem, pl, s, sm in rows) for k, rows in _MIG_ROWS.items()}
MIG_SOURCES = [
    "NVIDIA developer forum: nvidia-smi mig -lgip of an A100-SXM4-40GB (108-SM die; the MIG profiles sum to 98 SMs)",
    "nvidia-smi mig -lgip, 2x A100 40GB (tests/data/captures/57_mig-lgip-a100-40gb-2gpu-all-used.txt)",
    "NVIDIA/go-nvml mock/gpus/a100.go (MIG memory sizes, MiB)",
    "NVIDIA/mig-parted issue #120 (H200 -lgip) and config-default.yaml (max instances)",
    "NVIDIA MIG User Guide, supported profiles (A100/H100/H200 placements {starts}:size), https://docs.nvidia.com/datacenter/tesla/mig-user-guide/",
]
