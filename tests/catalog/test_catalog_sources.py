"""Catalog sources a person reads in ``topo show`` cite only public places or this repository's files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rayaccel import catalog

ROOT = Path(__file__).resolve().parent.parent.parent
#: a path-like token: something/with/slashes ending in a file suffix
_PATH = re.compile(r"(?<![\w:/.])((?:\.\.?/)?[\w.-]+(?:/[\w.-]+)+\.(?:txt|md|json|tsv|yaml|go|py))")


def _sources(name: str) -> list[str]:
    return list(catalog.load(name).sources)


@pytest.mark.parametrize("name", catalog.names())
def test_sources_never_point_outside_the_repository(name):
    for src in _sources(name):
        assert "../" not in src and "/work/" not in src, src
        assert "research note" not in src, src  # a private note, not something a reader can open


@pytest.mark.parametrize("name", catalog.names())
def test_cited_capture_files_exist_in_the_repository(name):
    for src in _sources(name):
        for path in _PATH.findall(src):
            if path.startswith("tests/") or path.startswith("src/"):
                assert (ROOT / path).is_file(), f"{name}: {path} is cited but not in the repository"


def test_mig_table_sources_are_public():
    import json

    data = json.loads((ROOT / "src" / "rayaccel" / "catalog" / "_mig_tables.json").read_text())
    for src in data["sources"]:
        assert "../" not in src and "research note" not in src, src
    assert any("tests/data/captures/57_" in s for s in data["sources"])
