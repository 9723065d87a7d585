#!/usr/bin/env python3
"""Memory shares that hold, on this machine's real GPU (torch, no Ray): ``rayaccel.ray.worker.memcap``.

Usage (run by ``scripts/device_check.py``, or alone)::

    python scripts/memcap_check.py [--fraction 0.25]

Each case runs in a fresh child process, as a Ray worker would: the share is applied *before*
the child imports torch (the lazy hook must fire when CUDA initialises), then the child
allocates within its cap (must succeed) and past it (must raise torch's ``OutOfMemoryError``,
with rayaccel's stderr line naming the share where torch has the OOM observer):

* ``num_gpus=<fraction>``: torch's per-process memory fraction from Ray's slot fraction;
* ``gpu_memory``: bytes (the fraction computed from the device's total memory at CUDA init);
* a neighbour: a second child holding its own share of the same GPU allocates and fills a
  tensor, the first one runs past its cap, and the neighbour's tensor is intact and it can
  still allocate within its share;
* MPS: only where an MPS control daemon already runs (``$CUDA_MPS_PIPE_DIRECTORY`` or
  ``/tmp/nvidia-mps`` holds ``control``), a child with ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  from the share runs past it with torch's fraction off; else ``skip`` (this script starts no daemon).

Always exits 0; the last line is a one-line summary. Without CUDA every case is ``skip``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)

GiB = 1 << 30

_CHILD = r'''
import json, os, sys, time
sys.path.insert(0, {src!r})
from rayaccel.ray.worker import memcap
from rayaccel.ray.worker.memcap import Share
case = json.loads(sys.argv[1])
total = case["total"]
share = Share(case["label"], case["fraction"], {{0: case["cap"]}}, (0,), case["gpu_memory"])
memcap.apply(share, simulated=case.get("torch_off", False))
out = {{"torch_imported_before": "torch" in sys.modules}}
import torch
x = torch.empty(int(case["within"]), dtype=torch.uint8, device="cuda:0")   # within the cap
x.fill_(7)
torch.cuda.synchronize()
out["within_ok"] = True
if case.get("hold"):
    open(case["hold"] + ".ready", "w").close()
    while not os.path.exists(case["hold"] + ".go"):
        time.sleep(0.02)
    out["intact"] = bool((x[:: 1 << 20] == 7).all().item())
    y = torch.empty(int(case["more"]), dtype=torch.uint8, device="cuda:0")
    out["still_allocates"] = True
else:
    try:
        y = torch.empty(int(case["beyond"]), dtype=torch.uint8, device="cuda:0")  # past it
        torch.cuda.synchronize()
        out["beyond"] = "allocated"
    except torch.OutOfMemoryError as e:
        out["beyond"] = "OutOfMemoryError"
        out["message"] = str(e).splitlines()[0][:200]
    except RuntimeError as e:  # the driver's MPS limit: CUDA error, not torch's allocator
        out["beyond"] = type(e).__name__
        out["message"] = str(e).splitlines()[0][:200]
print("RESULT " + json.dumps(out))
'''


def _child(case: dict, env: dict | None = None, wait: bool = True):
    p = subprocess.Popen([sys.executable, "-c", _CHILD.format(src=SRC), json.dumps(case)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    return _result(p) if wait else p


def _result(p) -> tuple[dict, str]:
    out, err = p.communicate(timeout=300)
    line = next((l for l in out.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        return {"error": f"rc {p.returncode}: {err.strip().splitlines()[-1] if err.strip() else 'no output'}"}, err
    return json.loads(line[7:]), err


def _case(label: str, total: int, cap: int, fraction, gpu_memory) -> dict:
    return {"label": label, "total": total, "cap": cap, "fraction": fraction, "gpu_memory": gpu_memory,
            "within": int(cap * 0.6), "beyond": int(cap * 0.6)}


def _verdict(name: str, r: dict, err: str, want_line: bool) -> bool:
    ok = (r.get("within_ok") is True and r.get("beyond") == "OutOfMemoryError"
          and r.get("torch_imported_before") is False)
    named = "rayaccel: this worker holds a memory share" in err
    print(f"{'ok  ' if ok else '!!  '} {name:28} within: {'ok' if r.get('within_ok') else r.get('error', 'failed')}; "
          f"past the cap: {r.get('beyond', '-')}; share named on stderr: {named if want_line else 'n/a'}"
          + (f"\n      torch said: {r['message']}" if r.get("message") else ""))
    return ok


def run(fraction: float = 0.25) -> str:
    print("\n== memory shares (rayaccel.ray.worker.memcap) ==")
    try:
        import torch
    except ImportError:
        print("skip: torch is not installed")
        return "memcap skipped (no torch)"
    if not torch.cuda.is_available():
        print("skip: no CUDA device")
        return "memcap skipped (no GPU)"
    total = torch.cuda.get_device_properties(0).total_memory
    observer = hasattr(torch._C, "_cuda_attach_out_of_memory_observer")
    print(f"GPU 0: {total / GiB:.1f} GiB; torch {torch.__version__}; OOM observer: {observer}")
    del torch  # the children import their own
    passed = failed = 0
    t0 = time.perf_counter()

    cap = int(total * fraction)
    r, err = _child(_case(f"num_gpus={fraction:g}", total, cap, fraction, None))
    passed, failed = (passed + 1, failed) if _verdict(f"num_gpus={fraction:g}", r, err, observer) else (passed, failed + 1)

    gm = min(4 * GiB, total // 5)
    r, err = _child(_case(f"gpu_memory={gm / GiB:.1f} GiB", total, gm, None, gm))
    passed, failed = (passed + 1, failed) if _verdict("gpu_memory", r, err, observer) else (passed, failed + 1)

    # a neighbour holding its own share of the same GPU is untouched when the other one runs past its cap
    hold = os.path.join(tempfile.mkdtemp(prefix="rayaccel-memcap-"), "n")
    nb_case = {**_case(f"num_gpus={fraction:g}", total, cap, fraction, None), "hold": hold,
               "more": int(cap * 0.2)}
    nb = _child(nb_case, wait=False)
    deadline = time.monotonic() + 120
    while not os.path.exists(hold + ".ready") and nb.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    r, err = _child(_case(f"num_gpus={fraction:g}", total, cap, fraction, None))
    Path(hold + ".go").touch()
    nr, _ = _result(nb)
    ok = r.get("beyond") == "OutOfMemoryError" and nr.get("intact") is True and nr.get("still_allocates") is True
    print(f"{'ok  ' if ok else '!!  '} {'neighbour untouched':28} the other's OOM: {r.get('beyond', r.get('error'))}; "
          f"neighbour's tensor intact: {nr.get('intact', nr.get('error'))}; it still allocates: "
          f"{nr.get('still_allocates', '-')}")
    passed, failed = (passed + 1, failed) if ok else (passed, failed + 1)

    from rayaccel.ray.worker.memcap import mps_pipe

    pipe = mps_pipe()
    if pipe is None:
        print("skip MPS: no MPS control daemon here (this script starts none)")
    else:
        env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={cap >> 20}M"}
        r, err = _child({**_case("mps", total, cap, fraction, None), "torch_off": True}, env)
        ok = r.get("within_ok") is True and r.get("beyond") not in (None, "allocated")
        print(f"{'ok  ' if ok else '!!  '} {'MPS pinned memory limit':28} past the cap: {r.get('beyond', r.get('error'))}"
              + (f"\n      said: {r['message']}" if r.get("message") else ""))
        passed, failed = (passed + 1, failed) if ok else (passed, failed + 1)
    return f"memcap {passed} ok / {failed} failed in {time.perf_counter() - t0:.1f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fraction", type=float, default=0.25, help="the num_gpus share to test (default 0.25)")
    a = ap.parse_args()
    if not 0 < a.fraction < 1:
        print(f"error: --fraction must be between 0 and 1 (exclusive), got {a.fraction}")
        return 2
    print(f"SUMMARY: {run(a.fraction)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
