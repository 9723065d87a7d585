#!/usr/bin/env python3
"""rayaccel on every supported Ray release: one fresh venv per release, a markdown table.

For each release: ``pip install`` of the project (with ``ray[...]==<release>``) succeeds; the
private-API tests (``tests/ray/test_private_api.py``) pass there; and on an embedded simulated
node (``rayaccel.init(topology="dgx1-v100")``) the worker hook loads, an unchanged
``num_gpus=2`` task and a ``{"GPU": 2} x 2`` placement group get the arbiter's devices
(``CUDA_VISIBLE_DEVICES`` = ``rayaccel.get_devices()``, each pair on dual NVLink, where Ray's
own lowest-index rule gives 0,1: a single link), a ``rayaccel.remote(gpus=2,
interconnect="nvlink")`` task runs (label selectors), ``tensor_transport="rayaccel"`` moves a
tensor (or, on a release without custom transports, goes through the object store with
one warning), and which features ``rayaccel.ray._ray_private.capabilities()`` finds.

Usage::

    python scripts/ray_matrix.py                       # every release, venvs in a temp dir
    python scripts/ray_matrix.py --releases 2.48.0,2.60.0 --venvs /work/venvs/matrix
    python scripts/ray_matrix.py --quick               # no torch/nixl (test extra), no transport run

Venvs are cached under ``--venvs`` (one per release, reused when its Ray is that release).
The table goes to stdout (and to ``--out`` when given); progress to stderr.
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

ROOT = Path(__file__).resolve().parent.parent
#: Newest patch of every minor release rayaccel supports (pyproject: ray>=2.48,<2.61).
RELEASES = ("2.48.0", "2.49.2", "2.50.1", "2.51.2", "2.52.1", "2.53.0", "2.54.1", "2.55.1", "2.56.1", "2.57.1",
            "2.58.1", "2.59.0", "2.60.0")

PROBE = r'''
import json, logging, os, sys, tempfile
out = {}
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
warned = []
class Catch(logging.Handler):
    def emit(self, record):
        warned.append(record.getMessage())
logging.getLogger("rayaccel").addHandler(Catch())
os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
import ray, rayaccel
from rayaccel.ray import _ray_private as rp
from rayaccel.discovery import load_topology
out["ray"] = ray.__version__
out["capabilities"] = rp.capabilities()
topo = load_topology("dgx1-v100")
best = max(l.count for l in topo.links if l.kind == "nvlink")

def pair_ok(devs):
    l = topo.link(*devs) if len(devs) == 2 else None
    return l is not None and l.kind == "nvlink" and l.count == best

@ray.remote(num_gpus=2)
def plain():
    import sys
    devs = [d.index for d in rayaccel.get_devices().devices]
    return {"hook": "rayaccel.ray.worker.hook" in sys.modules, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devs": devs, "ids": [str(i) for i in ray.get_gpu_ids()]}

tmp = tempfile.mkdtemp(prefix="rm-")
rayaccel.init(topology="dgx1-v100", num_cpus=4, _temp_dir=tmp, logging_level="ERROR", log_to_driver=False)
try:
    r = ray.get(plain.remote(), timeout=120)
    out["hook"] = r["hook"]
    out["num_gpus"] = {"ok": r["cvd"] == ",".join(map(str, r["devs"])) and pair_ok(r["devs"])
                       and r["ids"] == r["cvd"].split(","), **r}
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    pg = placement_group([{"GPU": 2, "CPU": 1}, {"GPU": 2, "CPU": 1}], strategy="STRICT_PACK")
    ray.get(pg.ready(), timeout=120)
    rs = ray.get([plain.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote()
                  for i in range(2)], timeout=120)
    remove_placement_group(pg)
    alld = [d for x in rs for d in x["devs"]]
    out["pg"] = {"ok": all(x["cvd"] == ",".join(map(str, x["devs"])) and pair_ok(x["devs"]) for x in rs)
                 and len(set(alld)) == 4, "bundles": [x["cvd"] for x in rs]}

    @rayaccel.remote(gpus=2, interconnect="nvlink")
    def constrained():
        return [d.index for d in rayaccel.get_devices().devices]
    d = ray.get(constrained.remote(), timeout=120)
    out["remote"] = {"ok": pair_ok(d), "devs": d}
    if os.environ.get("RM_TRANSPORT") == "1":
        import torch
        opts = {"num_cpus": 0, **({"enable_tensor_transport": True} if rp.release_tuple() >= (2, 49) else {})}

        @ray.remote(**opts)
        class Producer:
            @ray.method(tensor_transport="rayaccel")
            def make(self):
                return torch.arange(1 << 16, dtype=torch.float32)

        @ray.remote(**opts)
        class Consumer:  # RDT objects go to actors only
            def total(self, t):
                return float(t.sum())
        p, c = Producer.remote(), Consumer.remote()
        ref = p.make.remote()
        s = ray.get(c.total.remote(ref), timeout=120)
        got = ray.get(ref, timeout=120)
        ok = s == float(torch.arange(1 << 16, dtype=torch.float32).sum()) and float(got.sum()) == s
        out["transport"] = {"ok": ok, "warned": [w for w in warned if "tensor transport" in w]}
finally:
    rayaccel.shutdown()
out["warnings"] = warned
print("RESULT " + json.dumps(out))
'''


def log(msg: str) -> None:
    print(f"[ray_matrix {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, f"timed out after {timeout:.0f} s: {(e.stdout or '')[-2000:]}"


def venv_for(release: str, root: Path, quick: bool) -> tuple[Path | None, str, float]:
    """A venv with rayaccel and ``ray==release`` (reused when cached); (python, why-not, seconds)."""
    t0 = time.monotonic()
    d = root / f"ray-{release}{'-quick' if quick else ''}"
    py = d / "bin" / "python"
    if not py.exists():
        rc, text = run([sys.executable, "-m", "venv", str(d)], 120)
        if rc:
            return None, f"venv: {text.strip()[-200:]}", time.monotonic() - t0
    rc, text = run([str(py), "-c", "import ray, rayaccel; print(ray.__version__)"], 60)
    if rc == 0 and text.strip().splitlines()[-1] == release:
        rc2, _ = run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], 300)  # this checkout
        return (py, "", time.monotonic() - t0) if rc2 == 0 else (None, "pip install -e failed", time.monotonic() - t0)
    spec = [f"-e{ROOT}[test]", f"ray[train,serve,data,tune]=={release}"] if not quick else \
        [f"-e{ROOT}", f"ray[serve,train]=={release}", "pytest>=8", "pytest-timeout>=2.2", "hypothesis>=6.100"]
    rc, text = run([str(py), "-m", "pip", "install", "-q", *spec], 1200)
    if rc:
        lines = [l for l in text.splitlines() if l.strip() and "is ignored" not in l]
        return None, "; ".join(lines[-3:])[:300], time.monotonic() - t0
    return py, "", time.monotonic() - t0


def check(release: str, root: Path, quick: bool) -> dict:
    row: dict = {"release": release}
    py, why, secs = venv_for(release, root, quick)
    row["install"] = {"ok": py is not None, "why": why, "s": round(secs)}
    if py is None:
        return row
    rc, text = run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/ray/test_private_api.py"], 600)
    tail = [l for l in text.splitlines() if l.strip()][-1:] or [""]
    row["private_api"] = {"ok": rc == 0, "summary": tail[0][-120:]}
    env = {**os.environ, "RM_TRANSPORT": "0" if quick else "1", "PYTHONPATH": ""}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PROBE)
    rc, text = run([str(py), f.name], 600, env=env)
    os.unlink(f.name)
    got = [l for l in text.splitlines() if l.startswith("RESULT ")]
    if not got:
        row["probe_error"] = "; ".join(l for l in text.strip().splitlines()[-4:])[-400:]
        return row
    row.update(json.loads(got[-1][len("RESULT "):]))
    return row


def yes(ok: bool | None, detail: str = "") -> str:
    if ok is None:
        return "not run"
    return ("yes" if ok else "**no**") + (f" ({detail})" if detail else "")


def table(rows: list[dict]) -> str:
    head = ["Ray", "installs", "private-API tests", "hook loads", "`num_gpus` tasks", "placement groups",
            "`rayaccel.remote` (label selectors)", "tensor transport", "`topology_strategy`", "task-end release"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        caps = r.get("capabilities") or {}
        inst = r["install"]
        cells = [r["release"], yes(inst["ok"], inst["why"] or f"{inst['s']} s")]
        if not inst["ok"]:
            out.append("| " + " | ".join(cells + ["-"] * (len(head) - 2)) + " |")
            continue
        pa = r.get("private_api", {})
        cells.append(yes(pa.get("ok"), pa.get("summary", "").strip("= ")))
        if "probe_error" in r:
            cells += [f"**probe failed**: {r['probe_error'][:200]}"] + ["-"] * (len(head) - 4)
            out.append("| " + " | ".join(cells) + " |")
            continue
        ng, pg = r.get("num_gpus", {}), r.get("pg", {})
        cells += [yes(r.get("hook")), yes(ng.get("ok"), f"CUDA_VISIBLE_DEVICES={ng.get('cvd')}"),
                  yes(pg.get("ok"), "bundles " + " / ".join(pg.get("bundles", []))),
                  yes(r.get("remote", {}).get("ok"), ",".join(map(str, r.get("remote", {}).get("devs", []))))]
        tr = r.get("transport")
        if caps.get("rayaccel tensor transport"):
            cells.append(yes(tr["ok"]) if tr else "yes (not run: --quick)")
        else:
            moved = f"object store, one warning; {'moved the tensor' if tr and tr['ok'] else ''}".rstrip("; ")
            cells.append(f"no, Ray >= 2.56 ({moved})" if tr is not None else "no, Ray >= 2.56 (object store, one warning)")
        cells.append("yes" if caps.get("topology_strategy") else "no, Ray >= 2.57 (doctor says so)")
        cells.append("yes" if caps.get("task-end release") else "no, Ray >= 2.50 (released at the next task)")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", default=",".join(RELEASES), help="comma-separated Ray releases")
    ap.add_argument("--venvs", default=None, help="directory caching one venv per release (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="no test extra (torch, nixl), no tensor transport run")
    ap.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    ap.add_argument("--json", default=None, help="also write the raw results to this file")
    a = ap.parse_args(argv)
    root = Path(a.venvs or tempfile.mkdtemp(prefix="ray-matrix-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for rel in [r.strip() for r in a.releases.split(",") if r.strip()]:
        t0 = time.monotonic()
        log(f"Ray {rel}: venv under {root}")
        rows.append(check(rel, root, a.quick))
        log(f"Ray {rel}: done in {time.monotonic() - t0:.0f} s")
    text = table(rows)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    bad = [r["release"] for r in rows if not (r["install"]["ok"] and r.get("private_api", {}).get("ok")
                                             and r.get("num_gpus", {}).get("ok") and r.get("pg", {}).get("ok"))]
    if bad:
        log(f"failed on: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
