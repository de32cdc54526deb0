"""reasoning-gym's procedural math tasks (data/reasoning_gym_tasks.py): deterministic generation, held-out
splits disjoint from training, a clear error without reasoning-gym, and math-verify's verdicts against
reasoning-gym's own scorer."""

from __future__ import annotations

import sys
from decimal import Decimal

import pytest

from data import reasoning_gym_tasks as rgt
from data.math_word import INSTRUCTION
from tests.extras import requires
from workbench.tasks import TASKS, get_task, is_eval_prompt, load_task_data
from workbench.tasks.math_reward import answer_text, boxed_format_reward, math_accuracy_reward

RG_TASKS = list(rgt.CONFIGS)  # gsm_symbolic, chain_sum, chain_sum_1digit


needs_rg = requires("real", "reasoning_gym")
needs_mv = requires("real", "math_verify")


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_CACHE_DIR", str(tmp_path / "cache"))


def test_registered_with_math_rewards():
    for name in RG_TASKS:
        task = get_task(name)
        assert task.name == name and task.reward is math_accuracy_reward and task.format_reward is boxed_format_reward
        assert task.version == rgt.VERSION and "reasoning-gym" in task.description
    assert {"gsm_symbolic", "chain_sum"} <= set(TASKS)


@needs_rg
@pytest.mark.parametrize("name", RG_TASKS)
def test_generation_deterministic_per_seed_and_prefix_stable(name):
    gen = get_task(name).generate
    items = gen(60, 3)
    assert items == gen(60, 3) and items[:25] == gen(25, 3)  # prefix-stable: generate_split only extends
    assert [it["prompt"] for it in items] != [it["prompt"] for it in gen(60, 4)]
    assert gen(0, 3) == []
    ds_name, config = rgt.CONFIGS[name]
    entries = rgt.dataset(ds_name, 60, 3, **config)
    for i, it in enumerate(items):  # the reasoning-gym entry, word for word, + the boxed-answer instruction
        e = entries[i]
        assert it["prompt"] == f"{e['question'].rstrip()} {INSTRUCTION}" and it["answer"] == e["answer"]
        assert it["index"] == i and Decimal(it["answer"]) == Decimal(it["answer"])  # a plain number


@needs_rg
@pytest.mark.parametrize("name", RG_TASKS)
def test_eval_prompts_never_in_training(name, tmp_path):
    train = load_task_data(name, "train", 1500, 0, cache_dir=tmp_path)
    evals = load_task_data(name, "eval", 64, 0, cache_dir=tmp_path)
    other = load_task_data(name, "train", 1500, 1, cache_dir=tmp_path)  # another seed's training data too
    assert len(train) == 1500 and len(evals) == 64
    assert all(is_eval_prompt(p) for p in evals["prompt"]) and not any(is_eval_prompt(p) for p in train["prompt"])
    assert not set(evals["prompt"]) & (set(train["prompt"]) | set(other["prompt"]))
    assert list(evals["prompt"]) == list(load_task_data(name, "eval", 64, 0, cache_dir=tmp_path / "again")["prompt"])
    assert all(p.endswith(INSTRUCTION) for p in evals["prompt"])


def test_missing_reasoning_gym_is_a_clear_error(monkeypatch, tmp_path):
    rgt.reasoning_gym.cache_clear()
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym -> ImportError
    try:
        for name in ("gsm_symbolic", "chain_sum"):
            with pytest.raises(ValueError, match=r'reasoning-gym: pip install -e "\.\[real\]"'):
                get_task(name).generate(4, 0)
            with pytest.raises(ValueError, match=r'pip install -e "\.\[real\]"'):
                load_task_data(name, "train", 4, 0, cache_dir=tmp_path)
    finally:
        rgt.reasoning_gym.cache_clear()


def _extracted(completion: str) -> str | None:
    """The completion's final answer as math_reward finds it (last box, else the line after the anchor)."""
    found = answer_text(completion)
    return None if found is None else found[0] if found[1] else found[0].rstrip(".")


@needs_rg
@needs_mv
@pytest.mark.parametrize("name", RG_TASKS)
def test_math_verify_agrees_with_reasoning_gym_scorer(name):
    """200 entries: boxed and "Answer:"-anchored gold answers are right for both graders, gold + 1 wrong for
    both. Known difference, asserted so the docs stay true: gsm_symbolic's scorer reads the first number,
    so a thousands comma ("28,080") scores wrong there and right in math-verify (chain_sum strips commas)."""
    ds_name, config = rgt.CONFIGS[name]
    ds = rgt.dataset(ds_name, 200, 0, **config)
    verdicts = {}
    for e in ds:
        gold = e["answer"]
        wrong = str(Decimal(gold) + 1)
        completions = {
            "boxed": f"Step by step: ... The answer is \\boxed{{{gold}}}.",
            "boxed_wrong": f"Step by step: ... The answer is \\boxed{{{wrong}}}.",
            "anchored": f"Step by step: ...\nAnswer: {gold}",
            "anchored_wrong": f"Step by step: ...\nAnswer: {wrong}",
        }
        if Decimal(gold) == int(Decimal(gold)) and abs(int(gold)) >= 1000:
            completions["commas"] = f"The answer is \\boxed{{{int(gold):,}}}."
        for form, c in completions.items():
            mv = math_accuracy_reward(c, gold)
            rg = ds.score_answer(answer=_extracted(c), entry=e)
            verdicts.setdefault(form, []).append((mv == 1.0, rg == 1.0))
    for form in ("boxed", "anchored"):
        assert all(v == (True, True) for v in verdicts[form]), form
    for form in ("boxed_wrong", "anchored_wrong"):
        assert all(v == (False, False) for v in verdicts[form]), form
    commas = verdicts.get("commas", [])
    assert all(mv for mv, _ in commas)
    if name == "gsm_symbolic":
        assert len(commas) >= 20 and not any(rg for _, rg in commas)
    else:
        assert all(rg for _, rg in commas)


@pytest.mark.parametrize("name", ["gsm_symbolic", "chain_sum"])
def test_learning_spec_accepts_the_tasks(name):
    """`wb run smollm2-learn task.name=gsm_symbolic grpo.steps=2`: the spec loads, with its format reward."""
    from workbench.specs import load_spec

    spec = load_spec("smollm2-learn", [f"task.name={name}", "grpo.steps=2"])
    assert spec.task.name == name and spec.grpo.steps == 2 and spec.task.format_reward > 0


@needs_rg
def test_chain_sum_1digit_holds_out_ten_of_its_200_expressions(tmp_path):
    """The documented caveat: a one-digit pair has 200 prompts; the hash holds out 10, and eval repeats them."""
    train = load_task_data("chain_sum_1digit", "train", 2000, 0, cache_dir=tmp_path)
    evals = load_task_data("chain_sum_1digit", "eval", 64, 0, cache_dir=tmp_path)
    assert len(set(evals["prompt"])) == 10 and len(set(train["prompt"])) <= 190
    assert not set(evals["prompt"]) & set(train["prompt"])
