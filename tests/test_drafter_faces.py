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
    "workbench/cli/bench.py": 1,  # --vllm: the kinds the vLLM bench runs at any k with nothing extra installed
    "workbench/cli/drafter.py": 1,  # `wb drafter export` is EAGLE-3's export: other kinds are made eagle3
    "workbench/vllm/measure/bench.py": 2,  # not kinds: --vllm-predict's setting "suffix"
    "workbench/vllm/runtime/engine.py": 1,  # vLLM's own method name: its engine cannot reload a DFlash head
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


@pytest.mark.parametrize("kind", sorted(DRAFTERS))
def test_each_class_writes_its_own_vllm_speculative_config(kind):
    """vLLM's method is the kind's name, k its num_speculative_tokens; mtp, whose heads vLLM cannot run, refuses
    naming the field; a kind without a vLLM method gets the base class's refusal."""
    from workbench.specs import DrafterSpec

    cls = DRAFTERS[kind]
    spec = DrafterSpec(kind=kind, k=3, dflash_block_size=4)
    if kind == "mtp":
        with pytest.raises(ValueError, match="drafter.kind=mtp with rollout.backend=vllm"):
            cls.vllm_speculative_config(spec, "/h")
        return
    sc = cls.vllm_speculative_config(spec, "/h", require_installed=False)
    assert sc["method"] == kind and sc["num_speculative_tokens"] == 3
    assert ("model" in sc) == (cls.vllm_weights and sc["model"] == "/h")


def test_drafters_without_weights_have_no_vllm_folder(tmp_path):
    from workbench.specs import DrafterSpec

    for kind in ("ngram", "suffix"):
        assert DRAFTERS[kind].vllm_folder(DrafterSpec(kind=kind), None, None, None, tmp_path) is None
    init = tmp_path / "init"
    assert DRAFTERS["draft_model"].vllm_folder(DrafterSpec(kind="draft_model"), None, init, None, tmp_path) == str(init)


def test_the_base_class_has_no_vllm_method():
    from workbench.rollout.drafter import Drafter
    from workbench.specs import DrafterSpec

    with pytest.raises(ValueError, match="drafter.kind='ngram' has no vLLM speculative method"):
        Drafter.vllm_speculative_config(DrafterSpec(kind="ngram"), None)


def test_the_performance_model_reads_the_draft_cost_on_the_classes():
    """host drafters run no model forward; a draft model of its own is one curve for every k; heads read the
    target's hidden states (eagle3 fuses 3 of them into its fc, mtp the hidden state and an embedding)."""
    from drafters import draft_cost_of

    assert {kind: draft_cost_of(kind) for kind in DRAFTERS} == {
        "ngram": "host",
        "suffix": "host",
        "draft_model": "model",
        "mtp": "head",
        "eagle3": "head",
        "dflash": "head",
    }
    assert draft_cost_of("none") is None
    assert (DRAFTERS["eagle3"].head_fc_inputs, DRAFTERS["mtp"].head_fc_inputs) == (3, 2)
    assert sorted(kind for kind, cls in DRAFTERS.items() if cls.reduced_draft_vocab) == ["dflash", "eagle3"]


@pytest.mark.parametrize(
    "kind, k, forwards",
    [
        ("eagle3", 3, ((4, 1), (1, 2))),  # vLLM's proposer: k + 1 positions, then k - 1 single tokens
        ("mtp", 1, ((2, 1), (1, 0))),
        ("draft_model", 5, ((1, 5),)),
        ("dflash", 3, ((4, 1),)),  # one block of k + 1 slots
        ("ngram", 3, ()),
        ("eagle3", 0, ()),
    ],
)
def test_draft_forwards_per_step(kind, k, forwards):
    assert DRAFTERS[kind].draft_forwards(k) == forwards


def test_roofline_draft_seconds_follow_the_classes_forwards():
    from workbench.perf.simulate.rollout import draft_s

    def fwd(rows, q, context):
        return rows * (10.0 + q)  # seconds of one forward of q tokens per row

    assert draft_s(None, 2, 0, 3, fwd, "eagle3") == fwd(2, 4, 0) + 2 * fwd(2, 1, 0)
    assert draft_s(None, 2, 0, 3, fwd, "draft_model") == 3 * fwd(2, 1, 0)
    assert draft_s(None, 2, 0, 0, fwd, "eagle3") == 0.0


def test_served_as_given_is_a_draft_model_with_nothing_to_train():
    from workbench.specs import DrafterSpec

    cls = DRAFTERS["draft_model"]
    assert cls.served_as_given(DrafterSpec(kind="draft_model"))
    assert not cls.served_as_given(DrafterSpec(kind="draft_model", draft_layers=2))
    assert not DRAFTERS["eagle3"].served_as_given(DrafterSpec(kind="eagle3"))
