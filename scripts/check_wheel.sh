#!/usr/bin/env bash
# The install path of a real cluster, end to end: build rayaccel's wheel, install it into a fresh
# virtual environment (no system site packages, no source tree on the path; Ray comes from PyPI),
# start a rayaccel head node from that environment and run `rayaccel doctor` against it.
#
# `rayaccel doctor` exits 0 when no check fails, 1 on any failed check, 2 when it cannot reach a
# cluster. On a machine without accelerators (CI) the node has no devices and every hardware check
# is `n/a`, so the expected exit code here is 0 with or without GPUs; the script also requires the
# doctor's "worker hook" row to be ok (the installed wheel's hook runs in the node's workers).
#
# Usage: scripts/check_wheel.sh            (PYTHON=python3.12 picks the interpreter of the venv;
#                                           KEEP=1 keeps the temporary directory)
# Prints one line per step; exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d /tmp/rayaccel-wheel.XXXXXX)"  # short: Ray's socket paths live under it
VENV="$WORK/venv"
export RAY_TMPDIR="$WORK/ray" RAYACCEL_STATE_DIR="$WORK/state"
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
unset RAY_ADDRESS RAYACCEL_TOPOLOGY PYTHONPATH || true
mkdir -p "$RAY_TMPDIR"
STARTED=0

step() { printf 'check_wheel: %s\n' "$*"; }
fail() { printf 'check_wheel: FAILED: %s\n' "$*" >&2; exit 1; }
cleanup() {
    if [ "$STARTED" = 1 ]; then
        "$VENV/bin/rayaccel" stop >/dev/null 2>&1 || echo "check_wheel: warning: rayaccel stop failed" >&2
    fi
    if [ "${KEEP:-0}" = 1 ]; then echo "check_wheel: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

step "1/7 build the wheel (python -m build --wheel) into $WORK/dist"
if (cd "$WORK" && "$PYTHON" -m build --version) >/dev/null 2>&1; then  # not a build/ folder of the tree
    BUILD_PY="$PYTHON"
else  # the `build` frontend in a throwaway environment of its own, not in the one under test
    "$PYTHON" -m venv "$WORK/build-env" && "$WORK/build-env/bin/python" -m pip install --quiet build >"$WORK/build-env.log" 2>&1 \
        || fail "could not install the build frontend"
    BUILD_PY="$WORK/build-env/bin/python"
fi
"$BUILD_PY" -m build --wheel --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 \
    || { tail -20 "$WORK/build.log" >&2; fail "python -m build --wheel"; }
WHEELS=("$WORK"/dist/rayaccel-*.whl)
[ "${#WHEELS[@]}" = 1 ] && [ -f "${WHEELS[0]}" ] || fail "expected one rayaccel wheel in $WORK/dist"
WHEEL="${WHEELS[0]}"

step "2/7 fresh virtual environment ($PYTHON -m venv, without system site packages)"
"$PYTHON" -m venv "$VENV" || fail "python -m venv"
grep -qx 'include-system-site-packages = false' "$VENV/pyvenv.cfg" || fail "$VENV sees system site packages"
# shellcheck disable=SC1091
. "$VENV/bin/activate"  # `rayaccel start` runs the venv's `ray`

step "3/7 pip install $(basename "$WHEEL") (Ray from PyPI)"
python -m pip install --quiet --disable-pip-version-check "$WHEEL" >"$WORK/pip.log" 2>&1 \
    || { tail -20 "$WORK/pip.log" >&2; fail "pip install of the wheel"; }

cd "$WORK"  # nothing of the source tree on the path from here on
step "4/7 rayaccel is imported from the installed wheel"
WHERE="$(python -c 'import rayaccel; print(rayaccel.__file__)')" || fail "import rayaccel"
case "$WHERE" in
    "$VENV"/*) ;;
    *) fail "rayaccel imported from $WHERE, not from $VENV" ;;
esac
command -v rayaccel | grep -q "^$VENV/" || fail "the rayaccel command is not the venv's"

step "5/7 rayaccel --version; the catalog ships in the wheel (rayaccel topo show --topology dgx1-v100)"
rayaccel --version >/dev/null || fail "rayaccel --version"
rayaccel topo show --topology dgx1-v100 >/dev/null || fail "rayaccel topo show --topology dgx1-v100"

PORT="$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
step "6/7 rayaccel start --head --port=$PORT (a node with this machine's accelerators, or none)"
STARTED=1
rayaccel start --head --port="$PORT" --num-cpus=2 --include-dashboard=false >"$WORK/start.log" 2>&1 \
    || { tail -20 "$WORK/start.log" >&2; fail "rayaccel start --head"; }

step "7/7 rayaccel doctor --address 127.0.0.1:$PORT (exit 0: no check failed; the worker hook ok)"
set +e
rayaccel doctor --address "127.0.0.1:$PORT" --json >"$WORK/doctor.json" 2>"$WORK/doctor.err"
rc=$?
set -e
[ "$rc" = 0 ] || { cat "$WORK/doctor.json" "$WORK/doctor.err" >&2; fail "rayaccel doctor exited $rc"; }
python - "$WORK/doctor.json" <<'EOF' || fail "rayaccel doctor's report"
import json, sys
report = json.load(open(sys.argv[1]))
hook = [r for r in report["rows"] if r["name"] == "worker hook"]
assert report["fail"] == 0, report
assert hook and all(r["status"] == "ok" for r in hook), f"worker hook rows: {hook}"
print(f"check_wheel: doctor: {len(report['rows'])} rows, {report['fail']} failed, {report['warn']} warnings")
EOF
step "ok"
