#!/usr/bin/env python3
"""Compare rayaccel's ``nvidia`` backend with ``nvidia-smi`` on a real NVIDIA machine.

Usage (on a GPU machine with rayaccel installed or run from the repo root)::

    python scripts/device_check.py [--out DIR]

It runs ``NvidiaBackend().discover()``, captures ``nvidia-smi topo -m`` and
``nvidia-smi -L``, imports those captures with rayaccel's importer (when it is
available) and prints, side by side, devices (model, uuid, NUMA node, CPUs) and
every device pair's link (kind, lanes, PCIe class), flagging mismatches with
``!!``; then ``rayaccel doctor``'s local hardware checks, the health watcher's
probe for ``--health-seconds`` (read-only: nothing on the GPU is changed) and the
``rayaccel`` tensor transport's paths on the real devices (``scripts/transport_check.py``:
CUDA IPC and GPU NIXL against torch device copies; ``--no-transport`` skips it, and
without a GPU only its CPU row runs), and memory shares that hold (``scripts/memcap_check.py``: a
child process with a share's torch memory fraction allocates within it and runs out of memory past
it, a neighbour untouched; ``--no-memcap`` skips it). It always exits 0 and ends with a one-line
summary; with ``--out`` it also writes the raw captures and both topologies as JSON.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _run(cmd: list[str]) -> tuple[str | None, str]:
    if shutil.which(cmd[0]) is None:
        return None, f"{cmd[0]} not found"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{' '.join(cmd)}: {e}"
    if r.returncode != 0:
        return None, f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[:200]}"
    return r.stdout, "ok"


def _cpus(c) -> str:
    if not c:
        return "-"
    out, start, prev = [], c[0], c[0]
    for x in list(c[1:]) + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
        if x is not None:
            start = prev = x
    return ",".join(out)


def _link(t, a, b) -> str:
    if t is None:
        return "n/a"
    l = t.link(a, b)
    if l is None:
        return "-"
    return f"{l.kind}:{l.count if l.count is not None else '?'}:{l.pcie or '?'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--health-seconds", type=float, default=5.0, help="how long to run the health probe")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="directory for captures and JSON (default $OUT)")
    ap.add_argument("--no-transport", action="store_true", help="skip the tensor transport checks")
    ap.add_argument("--no-memcap", action="store_true", help="skip the memory-share checks")
    ap.add_argument("--transport-sizes", default="64,256", help="MiB for the transport checks (default 64,256)")
    args = ap.parse_args()
    out_dir = Path(args.out) if args.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)

    from rayaccel.discovery.nvidia import NvidiaBackend

    backend = NvidiaBackend()
    info = backend.available()
    print(f"nvidia backend available: {info.available}" + (f" ({info.reason}; hint: {info.hint})" if not info.available else ""))
    mine = None
    if info.available:
        t0 = time.perf_counter()
        try:
            mine = backend.discover()
        except Exception as e:  # report anything: this is a diagnostic script
            print(f"!! discover() raised {type(e).__name__}: {e}")
        else:
            print(f"discover(): {len(mine.devices)} devices, {len(mine.links)} links in {time.perf_counter() - t0:.3f} s; "
                  f"driver {mine.driver}, host {mine.hostname}")

    texts = {}
    for name, cmd in (("topo-m", ["nvidia-smi", "topo", "-m"]), ("L", ["nvidia-smi", "-L"]),
                      ("mig-lgip", ["nvidia-smi", "mig", "-lgip"])):
        text, status = _run(cmd)
        print(f"{' '.join(cmd)}: {status}")
        if text:
            texts[name] = text
            print(text.rstrip())
            if out_dir:
                (out_dir / f"nvidia-smi-{name}.txt").write_text(text)

    theirs, why = None, ""
    try:
        from rayaccel.discovery.capture import import_captures
    except ImportError as e:
        why = f"capture importer not available ({e})"
    else:
        usable = {k: v for k, v in texts.items() if k != "mig-lgip" or "No MIG" not in v}
        if usable:
            tmp = Path(tempfile.mkdtemp(prefix="rayaccel-check-"))
            paths = []
            for k, v in usable.items():
                p = tmp / f"{k}.txt"
                p.write_text(v)
                paths.append(p)
            try:
                res = import_captures(paths)
                theirs = res.topology
                for w in res.warnings:
                    print(f"importer warning: {w}")
            except Exception as e:  # diagnostic: report and go on with the backend side only
                why = f"importing the captures failed: {type(e).__name__}: {e}"
        else:
            why = "no nvidia-smi output to import"
    if why:
        print(f"note: {why}; showing the backend side only")

    if out_dir:
        for label, t in (("backend", mine), ("nvidia-smi", theirs)):
            if t is not None:
                (out_dir / f"{label}.json").write_text(t.to_json())

    mismatches = 0
    n = max(len(mine.devices) if mine else 0, len(theirs.devices) if theirs else 0)
    print("\n== devices (backend | nvidia-smi) ==")
    for i in range(n):
        a = next((d for d in mine.devices if d.index == i), None) if mine else None
        b = next((d for d in theirs.devices if d.index == i), None) if theirs else None
        fields = [("model", lambda d: d.model), ("uuid", lambda d: d.uuid), ("numa", lambda d: d.numa_node),
                  ("cpus", lambda d: _cpus(d.cpus)), ("mig", lambda d: [p.profile for p in d.partitions])]
        for fname, get in fields:
            va, vb = (get(a) if a else "n/a"), (get(b) if b else "n/a")
            flag = "  "
            if a and b and vb not in (None, "-", []) and va != vb:
                flag, mismatches = "!!", mismatches + 1
            print(f"{flag} GPU{i} {fname:6} {str(va):45.45} | {vb}")
        if a:
            print(f"   GPU{i} memory {a.memory_bytes} cc {a.compute_capability} health {a.health} bus {a.pci_bus_id}")
    print("\n== links: kind:lanes:pcie (backend | nvidia-smi) ==")
    for x in range(n):
        for y in range(x + 1, n):
            la, lb = _link(mine, x, y), _link(theirs, x, y)
            flag = "!!" if theirs is not None and mine is not None and la != lb else "  "
            mismatches += flag == "!!"
            print(f"{flag} {x}-{y}: {la:22} | {lb}")
    nv = len([l for l in mine.links if l.kind == "nvlink"]) if mine else 0
    checks = _doctor(mine) if mine else []
    events = _health(mine, args.health_seconds) if mine else None
    transport = "transport not run" if args.no_transport else _transport(args.transport_sizes)
    shares = "memcap not run" if args.no_memcap else _memcap()
    print(f"\nSUMMARY: backend {'ok' if mine else 'unavailable'}; {n} devices; {nv} NVLink pairs; "
          f"capture import {'ok' if theirs else 'skipped'}; {mismatches} mismatches; doctor "
          f"{sum(c.status == 'fail' for c in checks)} fail / {sum(c.status == 'warn' for c in checks)} warn; "
          f"health watcher {'not run' if events is None else f'{len(events)} event(s)'}; {transport}; {shares}")
    return 0


def _transport(sizes: str) -> str:
    """The tensor transport's paths on these devices (scripts/transport_check.py); its summary."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import transport_check

        return transport_check.run(tuple(int(s) for s in sizes.split(",") if s.strip()))
    except Exception as e:  # noqa: BLE001 - a device script reports, it does not stop
        print(f"!! transport check raised {type(e).__name__}: {e}")
        return "transport check failed"


def _memcap() -> str:
    """Memory shares that hold on GPU 0 (scripts/memcap_check.py); its summary."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import memcap_check

        return memcap_check.run()
    except Exception as e:  # noqa: BLE001 - a device script reports, it does not stop
        print(f"!! memcap check raised {type(e).__name__}: {e}")
        return "memcap check failed"


def _doctor(topo):
    """rayaccel doctor's local hardware checks on this machine (driver, CUDA, NVML, torch, NCCL, MIG, ...)."""
    print("\n== doctor: local hardware checks ==")
    try:
        from rayaccel.doctor import local_checks
    except ImportError as e:
        print(f"!! rayaccel.doctor unavailable: {e}")
        return []
    try:
        checks = local_checks(topo, simulated=False)
    except Exception as e:  # noqa: BLE001 - a device script reports, it does not stop
        print(f"!! local_checks raised {type(e).__name__}: {e}")
        return []
    for c in checks:
        print(f"{c.status:5} {c.name:14} {c.detail}" + (f"  -> {c.fix}" if c.fix else ""))
    return checks


def _health(topo, seconds: float):
    """The health watcher's probe on the real devices for ``seconds`` (what it reports; nothing is changed)."""
    print(f"\n== health probe ({seconds:g} s) ==")
    try:
        from rayaccel.health import probe_for

        probe = probe_for(topo)
    except Exception as e:  # noqa: BLE001
        print(f"!! no health probe: {type(e).__name__}: {e}")
        return None
    if probe is None:
        print("no probe for these devices")
        return None
    events = []
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            for ev in probe.poll(min(1.0, max(0.05, t_end - time.monotonic()))):
                events.append(ev)
                print(f"{ev.severity:8} device {ev.device} {ev.kind}: {ev.detail}")
    finally:
        probe.close()
    if not events:
        print("no health events (a healthy machine)")
    return events


if __name__ == "__main__":
    sys.exit(main())
