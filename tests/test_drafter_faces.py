"""Drafters carry their own faces: what the rest of the project asks of a drafter kind is a capability on
its class (``Drafter.trainable``, ``vllm_weights``, ...), not a switch on its name.

Counts the comparisons against a registered kind's name (``kind == "eagle3"``, ``method in ("mtp",
"eagle3")``) in every module outside ``drafters/``. ``none`` (plain decoding) is not a drafter and may be
compared with anywhere. The modules that still switch on names are listed with their counts; a count may
only go down (the test fails when one grows, when a new module starts switching, and when a count falls
without the list following it), so the list is the work left.
"""

import ast
from pathlib import Path

import pytest

from drafters import DRAFTERS

ROOT = Path(__file__).resolve().parents[1]
KIND_SWITCHES_LEFT = {
    "workbench/audit/setup.py": 1,
    "workbench/cli/bench.py": 1,
    "workbench/cli/drafter.py": 1,
    "workbench/perf/cost_curve.py": 1,
    "workbench/perf/simulate/cpu.py": 1,
    "workbench/perf/simulate/measured.py": 3,
    "workbench/perf/simulate/rollout.py": 5,
    "workbench/perf/simulate/scenario.py": 1,
    "workbench/report/export.py": 1,
    "workbench/report/export_head.py": 1,
    "workbench/vllm/build.py": 3,
    "workbench/vllm/measure/bench.py": 3,
    "workbench/vllm/runtime/engine.py": 1,
    "workbench/vllm/speculative.py": 5,
}


def _names(node: ast.AST) -> set[str]:
    """The string constants ``node`` is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def kind_switches(source: str, kinds: set[str]) -> int:
    """The comparisons in ``source`` with a drafter kind's name on one side."""
    return sum(
        1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare) and any(_names(x) & kinds for x in (node.left, *node.comparators))
    )


def test_kind_switches_are_counted():
    kinds = {"eagle3", "mtp"}
    src = 'a = kind == "eagle3"\nb = m in ("mtp", "x")\nc = kind == "none"\nd = {"eagle3": 1}[kind]\n'
    assert kind_switches(src, kinds) == 2


def test_outside_the_drafters_no_new_switch_on_a_kind_name():
    assert len(DRAFTERS) >= 6  # the registry is loaded: every shipped kind is counted
    kinds = set(DRAFTERS)
    found = {}
    for p in sorted((ROOT / "workbench").rglob("*.py")):
        if n := kind_switches(p.read_text(), kinds):
            found[str(p.relative_to(ROOT))] = n
    grown = {m: (n, KIND_SWITCHES_LEFT.get(m, 0)) for m, n in found.items() if n > KIND_SWITCHES_LEFT.get(m, 0)}
    assert not grown, f"switches on a drafter kind's name (found, allowed): make it a Drafter capability: {grown}"
    fell = {m: (found.get(m, 0), n) for m, n in KIND_SWITCHES_LEFT.items() if found.get(m, 0) < n}
    assert not fell, f"fewer switches than listed (found, listed): lower KIND_SWITCHES_LEFT: {fell}"


def test_vllm_export_faces_are_on_the_classes():
    """The export asks the class: which kinds serve from a head folder `wb export` writes, and what the
    reader must know to serve them (arctic-inference for suffix, the fixed k of a DFlash head)."""
    from workbench.specs import DrafterSpec

    heads = sorted(kind for kind, cls in DRAFTERS.items() if cls.vllm_head_folder)
    assert heads == ["dflash", "eagle3"]
    assert "arctic-inference" in " ".join(DRAFTERS["suffix"].vllm_serving_notes(DrafterSpec(kind="suffix")))
    assert "k=7" in " ".join(DRAFTERS["dflash"].vllm_serving_notes(DrafterSpec(kind="dflash", k=7)))
    assert DRAFTERS["ngram"].vllm_serving_notes(DrafterSpec(kind="ngram")) == []


def test_an_export_of_a_head_without_its_folder_is_refused():
    from workbench.report.export import ExportError, vllm_speculative_config
    from workbench.specs import DrafterSpec

    with pytest.raises(ExportError, match="drafter.kind=eagle3: give draft_folder"):
        vllm_speculative_config(DrafterSpec(kind="eagle3"), k=3)
