"""The shipped Grafana dashboard queries only rayaccel's exported metric names (rayaccel.metrics_names)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rayaccel import metrics_names as M

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "rayaccel-grafana.json"
#: PromQL words that are not metric names (functions, keywords, Grafana variables).
PROMQL = {"sum", "max", "min", "avg", "count", "by", "without", "rate", "increase", "histogram_quantile", "vector",
          "or", "and", "unless", "label_values", "le", "node", "device", "state", "holder", "kind", "on", "ignoring",
          "group_left", "group_right", "bool", "path"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", ()))
    return out


def exprs(d: dict) -> list[str]:
    return [t["expr"] for p in panels(d) for t in p.get("targets", ())]


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: words before ``{`` and any ``ray_...`` word."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_ranges = re.sub(r"\[[^\]]*\]", "", no_strings)
    selected = set(re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{", no_ranges))
    words = set(re.findall(r"\b(ray_[A-Za-z0-9_:]*)", no_ranges))
    return selected | words


ALLOWED = {s for n in M.ALL for s in M.series(n)}


def _documented_metrics() -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Constant -> (name, type, tags) as the ``#:`` comment above each constant of metrics_names states them."""
    out = {}
    lines = Path(M.__file__).read_text().splitlines()
    for prev, line in zip(lines, lines[1:]):
        m = re.match(r'^([A-Z][A-Z_]+) = "([a-z_]+)"$', line)
        if m:
            doc = re.match(r"^#: (gauge|counter|histogram), tags? ([a-z_, ]+?): ", prev)
            assert doc, f"metrics_names.{m.group(1)} lacks its '#: <type>, tags <...>: meaning' comment"
            out[m.group(1)] = (m.group(2), doc.group(1), tuple(t.strip() for t in doc.group(2).split(",")))
    return out


def test_all_is_every_documented_metric_with_its_type_and_tags():
    documented = _documented_metrics()
    assert len(M.ALL) == len(set(M.ALL))
    assert sorted(M.ALL) == sorted(name for name, _, _ in documented.values())
    for const, (name, kind, tags) in documented.items():
        assert getattr(M, const) == name and name.startswith("rayaccel_"), const
        assert M.TYPES[name] == kind, f"{const}: documented as a {kind}, TYPES says {M.TYPES[name]}"
        assert M.TAGS[name] == tags, f"{const}: documented tags {tags}, TAGS says {M.TAGS[name]}"
    assert set(M.TYPES) == set(M.TAGS) == set(M.ALL)
    assert M.exported(M.DEVICE_STATE) == "ray_rayaccel_device_state"
    assert M.series(M.ARBITER_DECISION_SECONDS) == tuple(f"ray_rayaccel_arbiter_decision_seconds_{s}"
                                                         for s in ("bucket", "sum", "count"))
    assert M.series(M.DEVICE_STATE) == ("ray_rayaccel_device_state",)


def test_the_docs_list_every_exported_metric_with_its_tags():
    # the metrics table of the operations page (docs/operations.md, "Metrics")
    rows = re.findall(r"^\| `(ray_rayaccel_\w+)` \| ([a-z_, ]+) \|", (ROOT / "docs" / "operations.md").read_text(),
                      re.M)
    assert sorted(name for name, _ in rows) == sorted(M.exported(n) for n in M.ALL)
    for name, tags in rows:
        assert tuple(t.strip() for t in tags.split(",")) == M.TAGS[name[len("ray_"):]], name


def test_dashboard_parses_and_has_panels(dashboard):
    assert dashboard["title"] == "rayaccel" and dashboard["uid"] == "rayaccel"
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    assert all({"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
               for p in panels(dashboard))
    assert len(exprs(dashboard)) >= 12


def test_every_query_names_only_known_metrics(dashboard):
    for expr in exprs(dashboard):
        names = metric_names(expr) - PROMQL
        assert names, f"no metric in {expr!r}"
        assert names <= ALLOWED, f"{expr!r} names {sorted(names - ALLOWED)}, not in rayaccel.metrics_names"


def test_every_query_is_filtered_by_node(dashboard):
    for expr in exprs(dashboard):
        selectors = re.findall(r"ray_\w+\{([^}]*)\}", expr)
        assert selectors and all('node=~"$node"' in s for s in selectors), expr


def test_every_metric_is_on_the_dashboard(dashboard):
    used = set().union(*(metric_names(e) for e in exprs(dashboard)))
    for name in M.ALL:
        assert used & set(M.series(name)), f"{name} has no panel"


def test_latency_quantiles(dashboard):
    text = " ".join(exprs(dashboard))
    for q in ("0.5", "0.99"):
        assert f"histogram_quantile({q}, sum by (le, node) (rate({M.exported(M.ARBITER_DECISION_SECONDS)}_bucket" in text


def test_node_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    node = variables["node"]
    assert node["type"] == "query" and node["multi"] and node["includeAll"]
    assert node["query"]["query"] == f"label_values({M.exported(M.DEVICE_STATE)}, node)"
    assert metric_names(node["definition"]) <= ALLOWED
    assert variables["datasource"]["query"] == "prometheus"
    assert all(t["datasource"]["uid"] == "${datasource}" for p in panels(dashboard) for t in p.get("targets", ()))


def test_the_checker_catches_an_unknown_name():
    assert metric_names('sum(rate(ray_rayaccel_typo_total{node=~"$node"}[5m]))') - PROMQL == {"ray_rayaccel_typo_total"}
    assert metric_names('up{job="ray"}') == {"up"}


def test_dashboard_is_generated_from_the_names():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "build_dashboard.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
