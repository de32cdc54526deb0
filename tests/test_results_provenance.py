"""The results pages' provenance: every page under docs/results opens with one block (date, machine, commit,
command, conditions) that parses, its commits exist, and docs/results/index.md's page table is the blocks
rendered (benchmarks/results_index.py)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("results_index", ROOT / "benchmarks" / "results_index.py")
ri = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ri)

PAGES = ri.pages_on_disk()

GOOD = """# A page

!!! info "Provenance"
    **Date:** 2026-11-26 – 2026-11-27 · **Machine:** 2-core x86_64 VM, CPU model not recorded ·
    **Commit:** `abc1234`, `def5678` · **Command:** `wb run quickstart` · **Conditions:** quiet; unpaired: medians

Text.
"""


def test_the_pages_are_found():
    assert len(PAGES) >= 30 and "index.md" not in PAGES


@pytest.mark.parametrize("name", sorted(PAGES))
def test_page_opens_with_one_valid_provenance_block(name):
    assert ri.check(PAGES[name]) == []


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: commits cannot be looked up")
def test_every_commit_named_in_a_block_exists():
    missing = []
    for name, text in PAGES.items():
        for h in ri.commits(ri.parse_block(text)["Commit"]):
            res = subprocess.run(["git", "cat-file", "-e", f"{h}^{{commit}}"], cwd=ROOT, capture_output=True)
            if res.returncode:
                missing.append(f"{name}: {h}")
    assert not missing, f"commits not in this repository's history: {missing}"


def test_a_good_block_parses_into_its_fields():
    f = ri.parse_block(GOOD)
    assert list(f) == list(ri.FIELDS)
    assert f["Machine"] == "2-core x86_64 VM, CPU model not recorded"
    assert ri.commits(f["Commit"]) == ["abc1234", "def5678"]
    assert ri.condition(f["Conditions"]) == "quiet"
    assert [d.isoformat() for d in ri.dates(f["Date"])] == ["2026-11-26", "2026-11-27"]
    assert ri.check(GOOD) == []


def test_a_page_without_the_block_fails():
    assert ri.check("# A page\n\nMeasured on some machine.\n")


def test_a_block_not_right_after_the_title_fails():
    lines = GOOD.split("\n")
    moved = "\n".join([lines[0], "", "An introduction first.", *lines[1:]])
    assert ri.check(moved)


def test_two_blocks_fail():
    assert ri.check(GOOD + "\n" + GOOD.split("\n", 1)[1])


def test_a_missing_or_empty_field_fails():
    assert ri.check(GOOD.replace("**Command:** `wb run quickstart` · ", ""))
    assert ri.check(GOOD.replace("**Machine:** 2-core x86_64 VM, CPU model not recorded ·", "**Machine:** ·"))


@pytest.mark.parametrize("bad", ["2026-11-32", "26 Nov 2026", "2026-11-27 – 2026-11-26", "2026-11"])
def test_a_date_that_is_not_iso_fails(bad):
    assert ri.check(GOOD.replace("2026-11-26 – 2026-11-27", bad))


@pytest.mark.parametrize("bad", ["`abc12`", "`xyz1234`", "abc1234 (no backticks)"])
def test_a_commit_that_is_no_hash_fails(bad):
    assert ri.check(GOOD.replace("`abc1234`, `def5678`", bad))


@pytest.mark.parametrize("bad", ["calm", "quietly", "mostly shared"])
def test_conditions_outside_the_three_fail(bad):
    assert ri.check(GOOD.replace("quiet; unpaired: medians", bad))


def test_quickstart_pages_say_they_are_unpaired():
    """Their ours-vs-transformers ratios are medians of runs without intervals: the block says so."""
    names = [n for n in PAGES if n.startswith("cpu-2core-quickstart") or n == "quickstart-cpu.md"]
    assert len(names) == 6
    quiet = [n for n in names if "unpaired" not in ri.parse_block(PAGES[n])["Conditions"]]
    assert not quiet, f"quickstart pages whose block does not say their medians are unpaired: {quiet}"


def test_the_index_table_is_the_blocks_rendered():
    index = ri.INDEX.read_text(encoding="utf-8")
    assert ri.BEGIN in index and ri.END in index
    assert ri.apply(index, ri.render(PAGES)) == index, "stale: run python benchmarks/results_index.py"


def test_a_changed_block_makes_the_index_stale():
    index = ri.INDEX.read_text(encoding="utf-8")
    name = sorted(PAGES)[0]
    changed = {**PAGES, name: PAGES[name].replace("**Date:** ", "**Date:** 2020-01-01 – ", 1)}
    assert ri.apply(index, ri.render(changed)) != index
