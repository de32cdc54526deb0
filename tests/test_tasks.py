"""Task data generators, the reward verifier, the tokenizer convention and dataset loading."""

from __future__ import annotations

import json
import statistics

import pytest

from data import arith_chain, general
from workbench.models.tokenizer import (
    build_tokenizer,
    decode_completion,
    encode_example,
    encode_prompt,
    encode_text,
)
from workbench.tasks import TASKS, answer_reward, get_task, is_eval_prompt, load_general_prompts, load_task_data


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tok():
    texts = [it["prompt"] + it["solution"] for it in arith_chain.generate(1000, 1)]
    texts += [it["prompt"] + it["text"] for it in general.generate(300, 1)]
    return build_tokenizer(texts)


# ----------------------------------------------------------------------------- generators


def test_arith_chain_deterministic_per_seed():
    assert arith_chain.generate(50, 3) == arith_chain.generate(50, 3)
    assert arith_chain.generate(50, 3) != arith_chain.generate(50, 4)
    assert arith_chain.generate(20, 3) == arith_chain.generate(50, 3)[:20]  # prefix-stable


def test_arith_chain_solutions_are_correct_and_bounded():
    for it in arith_chain.generate(500, 0):
        start, ops = arith_chain.parse_prompt(it["prompt"])
        assert 1 <= start <= 20 and 3 <= len(ops) <= 6
        assert it["prompt"].endswith("\n")
        x, steps = start, []
        for op, b in ops:
            y = arith_chain.apply_op(x, op, b)
            assert 0 <= y <= 99, it
            if op == "*":
                assert 2 <= b <= 9
            steps.append(f"{x}{op}{b}={y}")
            x = y
        assert it["answer"] == str(x)
        assert it["solution"] == ", ".join(steps) + f". Answer: {x}"
        assert answer_reward(it["solution"], it["answer"]) == 1.0


def test_arith_chain_rejects_bad_args():
    with pytest.raises(ValueError, match="min_ops"):
        arith_chain.generate(3, 0, min_ops=5, max_ops=4)


def test_general_deterministic_and_different_from_task():
    a = general.generate(40, 0)
    assert a == general.generate(40, 0) and a != general.generate(40, 1)
    assert all(set(it) == {"prompt", "text"} and it["prompt"].endswith("\n") for it in a)
    assert not any(ch.isdigit() for it in a for ch in it["prompt"] + it["text"])


def test_solution_length_at_least_40_tokens(tok):
    lens = [len(encode_text(tok, it["solution"])) for it in arith_chain.generate(500, 2)]
    assert statistics.mean(lens) >= 40


# ----------------------------------------------------------------------------- reward


@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("3+4=7. Answer: 7", "7", 1.0),
        ("3+4=8. Answer: 8", "7", 0.0),
        ("3+4=7.", "7", 0.0),  # no answer
        ("", "7", 0.0),
        ("Answer: 5, no wait. Answer: 7", "7", 1.0),  # the last answer wins
        ("Answer: 7 ... Answer: 5", "7", 0.0),
        ("Answer: 7", "seven", 0.0),  # non-integer gold never raises
    ],
)
def test_reward(completion, answer, expected):
    assert get_task("arith_chain").reward(completion, answer) == expected


def test_get_task_unknown_names_field_and_allowed():
    with pytest.raises(ValueError, match=r"task\.name.*arith_chain"):
        get_task("nope")
    assert "arith_chain" in TASKS


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_and_specials(tok):
    texts = [it["prompt"] + it["solution"] for it in arith_chain.generate(50, 9)]
    texts += ["  two  spaces\n\nand newlines\t tab ", "héllo wörld ✓", general.generate(1, 9)[0]["text"]]
    for t in texts:
        assert tok.decode(encode_text(tok, t)) == t
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id] == [0, 1, 2]
    assert len(tok) == 512


def test_digits_are_single_tokens(tok):
    ids = encode_text(tok, "1234567890")
    assert [tok.decode([i]) for i in ids] == list("1234567890")
    for it in arith_chain.generate(20, 5):
        for i in encode_text(tok, it["solution"]):
            piece = tok.decode([i])
            assert not any(c.isdigit() for c in piece) or len(piece) == 1


def test_prompt_completion_convention(tok):
    it = arith_chain.generate(1, 0)[0]
    ids, plen = encode_example(tok, it["prompt"], it["solution"])
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert ids[:plen] == encode_prompt(tok, it["prompt"])
    # what the model generates after the prompt decodes back to the solution, specials dropped
    assert decode_completion(tok, ids[plen:]) == it["solution"]
    # separate tokenisation equals joint tokenisation: the "\n" ending every prompt is a boundary
    assert ids[1:-1] == encode_text(tok, it["prompt"] + it["solution"])


def test_tokenizer_deterministic():
    texts = [it["prompt"] + it["solution"] for it in arith_chain.generate(300, 0)]
    assert build_tokenizer(texts).get_vocab() == build_tokenizer(texts).get_vocab()


# ----------------------------------------------------------------------------- dataset loading


def test_load_generated_train_eval_held_out(tmp_path):
    tr = load_task_data("arith_chain", "train", 300, seed=0, cache_dir=tmp_path)
    ev = load_task_data("arith_chain", "eval", 40, seed=0, cache_dir=tmp_path)
    assert tr.column_names == ["prompt", "answer"] and len(tr) == 300 and len(ev) == 40
    assert not set(ev["prompt"]) & set(tr["prompt"])
    assert all(is_eval_prompt(p) for p in ev["prompt"]) and not any(is_eval_prompt(p) for p in tr["prompt"])
    assert all(isinstance(a, str) for a in tr["answer"])
    # deterministic, cached
    assert load_task_data("arith_chain", "train", 300, seed=0, cache_dir=tmp_path)["prompt"] == tr["prompt"]
    assert load_task_data("arith_chain", "train", 300, seed=1, cache_dir=tmp_path)["prompt"] != tr["prompt"]


def test_load_generated_default_cache_dir(tmp_path):
    ds = load_task_data("arith_chain", "eval", 5, seed=0)  # default: $WB_CACHE_DIR/data
    assert len(ds) == 5 and any((tmp_path / "cache" / "data").glob("arith_chain-*.jsonl"))


def test_load_user_jsonl_custom_fields(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text("".join(json.dumps({"q": f"Q{i}\n", "a": i, "other": 0}) + "\n" for i in range(10)))
    ds = load_task_data(
        "arith_chain", "train", 4, 0, path=str(f), prompt_field="q", answer_field="a", cache_dir=tmp_path
    )
    assert ds.column_names == ["prompt", "answer"]
    assert ds["prompt"] == [f"Q{i}\n" for i in range(4)] and ds["answer"] == ["0", "1", "2", "3"]
    ev = load_task_data(
        "arith_chain", "eval", 3, 0, path=str(f), prompt_field="q", answer_field="a", cache_dir=tmp_path
    )
    assert ev["answer"] == ["7", "8", "9"]


def test_load_user_parquet(tmp_path):
    import datasets

    f = tmp_path / "mine.parquet"
    datasets.Dataset.from_dict({"prompt": ["a\n", "b\n"], "answer": ["1", "2"]}).to_parquet(str(f))
    ds = load_task_data("arith_chain", "train", 10, 0, path=str(f), cache_dir=tmp_path)
    assert ds["prompt"] == ["a\n", "b\n"]


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match=r"task\.path.*not found"):
        load_task_data("arith_chain", "train", 4, 0, path=str(tmp_path / "missing.jsonl"), cache_dir=tmp_path)
    bad_ext = tmp_path / "data.csv"
    bad_ext.write_text("prompt,answer\n")
    with pytest.raises(ValueError, match=r"task\.path.*extension"):
        load_task_data("arith_chain", "train", 4, 0, path=str(bad_ext), cache_dir=tmp_path)
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"prompt": "x", "answer": \n this is not json\n')
    with pytest.raises(ValueError, match=r"task\.path.*could not read"):
        load_task_data("arith_chain", "train", 4, 0, path=str(corrupt), cache_dir=tmp_path)
    corrupt_pq = tmp_path / "corrupt.parquet"
    corrupt_pq.write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ValueError, match=r"task\.path"):
        load_task_data("arith_chain", "train", 4, 0, path=str(corrupt_pq), cache_dir=tmp_path)
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"question": "x\n", "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"task\.prompt_field.*'prompt'.*question") as e:
        load_task_data("arith_chain", "train", 4, 0, path=str(ok), cache_dir=tmp_path)
    assert "answer" in str(e.value)  # lists the columns that exist
    with pytest.raises(ValueError, match=r"task\.answer_field.*'label'"):
        load_task_data(
            "arith_chain",
            "train",
            4,
            0,
            path=str(ok),
            prompt_field="question",
            answer_field="label",
            cache_dir=tmp_path,
        )
    with pytest.raises(ValueError, match="split"):
        load_task_data("arith_chain", "test", 4, 0, cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"task\.name"):
        load_task_data("nope", "train", 4, 0, cache_dir=tmp_path)


def test_load_general_prompts(tmp_path):
    ds = load_general_prompts(12, seed=0, cache_dir=tmp_path)
    assert ds.column_names == ["prompt", "text"] and len(ds) == 12
    assert ds["prompt"] == [it["prompt"] for it in general.generate(12, 0)]


def test_long_tail_task_spreads_completion_lengths():
    """arith_chain_long: gold completions from 1 to 16 steps, a >= 8x spread of lengths (issue #8 part 3)."""
    from workbench.tasks import get_task

    items = get_task("arith_chain_long").generate(400, 0)
    steps = [it["solution"].count("=") for it in items]
    assert min(steps) == 1 and max(steps) == 16
    chars = sorted(len(it["solution"]) for it in items)
    assert chars[-1] >= 8 * chars[0]
