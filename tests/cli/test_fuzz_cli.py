"""Fuzz the ``rayaccel`` command (issue 10): bad input to any command that needs no Ray
cluster ends as ONE ``error:`` line (maybe after ``warning:`` lines) and exit code 2; good
input exits 0 (or 1, an answer such as "cannot place"); never a traceback, an exception, a
hang past a few seconds, or unbounded memory (see tests/fuzzing.py).

Commands: ``topo show | import | list | backends | path``, ``plan``, and argument parsing
of ``start | stop | status | demo | bench`` with bad values only (nothing is ever started).
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from pathlib import Path

import pytest
from fuzzing import bounded, fuzz_settings, mutated_captures, mutated_cluster_specs, mutated_topologies
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from rayaccel import catalog
from rayaccel.cli import app

runner = CliRunner()
NAMES = catalog.names()
text = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=60)
long_text = st.text(min_size=1000, max_size=5000, alphabet="x9[]:/.$ -")
values = st.one_of(text, long_text, st.integers(-(10**30), 10**30).map(str), st.just("9" * 400),
                   st.sampled_from(["", "-1", "0", "1", "NaN", "inf", "1e9", "8EiB", "--", "-", "[torch]", ":ab:"]))


def _plan_uses_shared_parser() -> bool:
    from rayaccel.cli import plan

    return "parse_index_list" in inspect.getsource(plan)


def _busy():
    small = st.text(alphabet="0123456789,- x", max_size=12).filter(
        lambda s: all(len(p.partition("-")[2]) < 4 for p in s.split(",")))  # plan.py expands ranges itself
    return st.one_of(small, values) if _plan_uses_shared_parser() else small


def invoke(args: list[str], env: dict | None = None):
    """Run the command bounded; check the output contract; return the result."""
    with bounded():
        r = runner.invoke(app, args, env=env)
    out = r.output
    assert "Traceback" not in out, (args, out[-3000:])
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))
    if r.exit_code == 2:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error: ")]
        assert len(errors) == 1, (args, r.stderr[-3000:])
        assert all(ln.startswith(("error: ", "warning: ")) for ln in lines), (args, r.stderr[-3000:])
        assert lines[-1].startswith("error: ") and r.stdout == "" or args[:1] in (["topo"], []) and "Usage" in out, \
            (args, r.stdout[-2000:])
    else:
        assert r.exit_code in (0, 1), (args, r.exit_code, out[-3000:])
    return r


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _write(scratch: Path, content: bytes, suffix: str) -> str:
    path = scratch / f"t{suffix}"
    path.write_bytes(content)
    return str(path)


files = st.one_of(st.binary(max_size=200), mutated_captures().map(str.encode),
                  mutated_topologies().map(lambda d: json.dumps(d, allow_nan=True).encode()))
suffixes = st.sampled_from([".json", ".txt", ""])


# ---------------------------------------------------------------- topology sources
@fuzz_settings(60, 5000)
@given(content=files, suffix=suffixes, as_json=st.booleans())
def test_topo_show_and_import_files(scratch, content, suffix, as_json):
    path = _write(scratch, content, suffix)
    extra = ["--json"] if as_json else []
    invoke(["topo", "show", "-t", path, *extra])
    invoke(["topo", "import", path, *extra])


@fuzz_settings(40, 5000)
@given(content=files, suffix=suffixes, gpus=st.integers(-2, 10) | st.integers(10**6, 10**30),
       a=values, b=values, nbytes=values)
def test_plan_and_path_on_fuzzed_topologies(scratch, content, suffix, gpus, a, b, nbytes):
    path = _write(scratch, content, suffix)
    invoke(["plan", "-t", path, "--gpus", str(gpus)])
    invoke(["topo", "path", "-t", path, "--bytes", nbytes, "--", a, b])


@fuzz_settings(60, 5000)
@given(value=st.one_of(values, st.sampled_from(NAMES), mutated_captures()))
def test_topo_show_with_rayaccel_topology(value):
    value = value.replace("\x00", "")  # an environment variable cannot hold a NUL byte
    invoke(["topo", "show"], env={"RAYACCEL_TOPOLOGY": value})
    invoke(["topo", "backends", "--json"], env={"RAYACCEL_TOPOLOGY": value})


@fuzz_settings(60, 5000)
@given(source=st.one_of(values, st.sampled_from(NAMES)))
def test_topology_names(source):
    invoke(["topo", "show", "-t", source])
    invoke(["plan", "-t", source])


# ---------------------------------------------------------------- options
@fuzz_settings(120, 5000)
@given(machine=st.sampled_from(["dgx1-v100", "a100-mig", "hgx-h100", "trn1-32xlarge", "mi300x-8x"]),
       gpus=st.none() | st.integers(-3, 12) | st.just(10**30) | values, busy=st.none() | _busy(),
       mig=st.none() | st.sampled_from(["1g.5gb", "3g.20gb", "7g.40gb"]) | text,
       memory=st.none() | values, shared=st.booleans(), interconnect=st.none() | st.sampled_from(["any", "direct", "nvlink"]) | text,
       flags=st.lists(st.sampled_from(["--same-numa", "--nic", "--json"]), unique=True))
def test_plan_options(machine, gpus, busy, mig, memory, shared, interconnect, flags):
    args = ["plan", "-t", machine]
    for opt, v in (("--gpus", gpus), ("--busy", busy), ("--mig", mig), ("--gpu-memory", memory),
                   ("--interconnect", interconnect)):
        if v is not None:
            args += [opt, str(v)]
    invoke(args + (["--shared"] if shared else []) + flags)


def _bundles():
    """``--bundles`` values: NxK and count lists (good and bad), JSON lists of odd bundles, anything."""
    n = st.integers(-2, 12) | st.just(10**12)
    nxk = st.tuples(n, n).map(lambda t: f"{t[0]}x{t[1]}")
    counts = st.lists(st.integers(0, 9).map(str) | nxk, min_size=1, max_size=6).map(",".join)
    amount = st.one_of(st.integers(-2, 10), st.just(10**400), st.floats(), st.booleans(), st.none(), text,
                       st.lists(st.integers(), max_size=2))
    bundle = st.dictionaries(st.sampled_from(["GPU", "CPU", "memory", "TPU", ""]) | text, amount, max_size=3)
    js = st.lists(bundle | st.integers() | text, max_size=10).map(json.dumps)
    return st.one_of(nxk, counts, js, values, st.just("[" * 5000))


@fuzz_settings(120, 5000)
@given(machine=st.sampled_from(["dgx1-v100", "a100-mig", "hgx-h100", "trn1-32xlarge", "mi300x-8x"]),
       bundles=_bundles(), busy=st.none() | _busy(), group=st.none() | st.integers(-2, 9) | values,
       as_json=st.booleans())
def test_plan_bundles(machine, bundles, busy, group, as_json):
    args = ["plan", "-t", machine, "--bundles", bundles]
    for opt, v in (("--busy", busy), ("--group-size", group)):
        if v is not None:
            args += [opt, str(v)]
    invoke(args + (["--json"] if as_json else []))


@fuzz_settings(120, 5000)
@given(machine=st.sampled_from(["dgx1-v100", "hgx-h100", "a100-pcie-2x-nvbridge"]), a=values, b=values,
       nbytes=values, remote=st.none() | st.sampled_from(NAMES) | values, as_json=st.booleans())
def test_topo_path_options(machine, a, b, nbytes, remote, as_json):
    args = ["topo", "path", "-t", machine, "--bytes", nbytes]
    if remote is not None:
        args += ["--remote-topology", remote]
    invoke(args + (["--json"] if as_json else []) + ["--", a, b])


@fuzz_settings(60, 5000)
@given(cmd=st.sampled_from([["topo", "list"], ["topo", "backends"], ["topo", "show", "-t", "dgx1-v100"],
                            ["topo", "import"], ["plan"], ["topo", "path"]]),
       junk=st.lists(values, max_size=3))
def test_listing_and_extra_arguments(cmd, junk):
    invoke(cmd + junk)


# ---------------------------------------------------------------- the Ray commands: argument errors only
bad_option = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(lambda s: "--zz" + s)


@fuzz_settings(60, 5000)
@given(cmd=st.sampled_from(["stop", "status", "demo"]), opt=bad_option, value=values)
def test_ray_commands_reject_bad_options_before_starting_anything(cmd, opt, value):
    r = invoke([cmd, opt, value])
    assert r.exit_code == 2


@fuzz_settings(40, 5000)
@given(which=values.filter(lambda v: v not in ("quality", "churn", "latency", "all")), junk=bad_option)
def test_bench_rejects_bad_values(which, junk):
    assert invoke(["bench", "placement", "--which", which]).exit_code == 2
    assert invoke(["bench", "placement", junk]).exit_code == 2
    assert invoke(["start", "--topology"]).exit_code == 2  # a missing value: nothing is started
    assert invoke(["demo", "--out"]).exit_code == 2


def test_budget_note():
    """The suite's size is in tests/fuzzing.py: derandomized, a few seconds per property."""
    assert os.environ.get("RAYACCEL_FUZZ") in (None, "", "long")


# ---------------------------------------------------------------- plan across nodes (issue 14)
@fuzz_settings(40, 5000)
@given(content=st.one_of(st.binary(max_size=200),
                         st.builds(lambda d: json.dumps(d).encode(), mutated_cluster_specs())),
       workers=st.integers(-2, 40) | values, gpus=st.integers(-1, 9) | values,
       strategy=st.sampled_from(["pack", "spread", "strict-pack"]) | text, as_json=st.booleans())
def test_plan_cluster_specs(scratch, content, workers, gpus, strategy, as_json):
    path = _write(scratch, content, ".json")
    invoke(["plan", "--cluster", path, "--workers", str(workers), "--gpus", str(gpus), "--strategy", strategy]
           + (["--json"] if as_json else []))
