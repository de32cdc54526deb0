"""task.reward: TRL reward functions ("package.module:function") as the one scoring path.

The mechanism (resolve, signature, weights, None, return checks), the built-in tasks through it, Hub and
user data with every column kept, and end to end through `wb run` on the micro models.
"""

import json
import math
import textwrap

import pytest
from typer.testing import CliRunner

from tests.extras import marks, requires
from workbench.cli import app
from workbench.grpo.rewards import RewardFunctionError, RewardState, score, score_rows
from workbench.specs import SpecError, load_spec
from workbench.tasks import TASKS, get_task
from workbench.tasks import rewards as builtin
from workbench.tasks.loading import load_task_data
from workbench.tasks.math_reward import math_accuracy_reward
from workbench.tasks.reward_funcs import (
    RewardFunc,
    check_columns,
    check_signature,
    resolve_reward,
    spec_reward_funcs,
    user_reward_funcs,
)

runner = CliRunner()


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    """Write ``{name}.py`` into tmp_path, on sys.path and PYTHONPATH (as a user's module would be)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


# ---------------------------------------------------------------- resolving "module:function"


def test_resolve_a_good_reference(user_module):
    mod = user_module("rf_good", "def brevity(prompts, completions, completion_ids, **kw):\n    return [1.0]\n")
    f = resolve_reward(f"{mod}:brevity")
    assert f.__name__ == "brevity"
    assert resolve_reward("workbench.tasks.rewards:boxed_format") is builtin.boxed_format


@pytest.mark.parametrize(
    "ref,needle",
    [
        ("no_such_module_xyz:f", r"cannot import module 'no_such_module_xyz'.*PYTHONPATH"),
        ("workbench.tasks.rewards:math_acuracy", r"no attribute 'math_acuracy'.*did you mean 'math_accuracy'"),
        ("math:pi", r"is a float, not a function"),
        ("no_colon_here", r"package\.module:function"),
        ("math:sqrt", r"positional-only"),
    ],
)
def test_bad_references_name_task_reward_and_the_fix(ref, needle):
    with pytest.raises(ValueError, match=r"^task\.reward: .*" + needle):
        resolve_reward(ref)


def test_a_signature_trl_cannot_call_is_refused(user_module):
    mod = user_module(
        "rf_sig", "def two(completions, answer):\n    return []\ndef ok(completions, **kw):\n    return []\n"
    )
    with pytest.raises(ValueError, match=r"task\.reward: .*keyword arguments prompts, completion_ids.*\*\*kwargs"):
        resolve_reward(f"{mod}:two")
    check_signature(resolve_reward(f"{mod}:ok"), "ok")  # **kwargs takes prompts and completion_ids
    for f in (builtin.arith_answer, builtin.math_accuracy, builtin.boxed_format, builtin.last_number):
        check_signature(f, f.__name__)


def test_the_module_raising_on_import_is_named(user_module):
    mod = user_module("rf_broken", "raise RuntimeError('no config file')\n")
    with pytest.raises(ValueError, match=r"raised on import \(RuntimeError: no config file\)"):
        resolve_reward(f"{mod}:f")


def test_spec_validation_refuses_before_any_run(user_module):
    mod = user_module("rf_spec", "def a(completions, **kw):\n    return []\ndef b(completions, **kw):\n    return []\n")
    with pytest.raises(SpecError, match=r"task\.reward: 'nope_mod_q:f' cannot import"):
        load_spec("micro", ["task.reward=nope_mod_q:f"])
    with pytest.raises(SpecError, match=r"task\.reward_weights: 1 weights for 2 task\.reward functions"):
        load_spec("micro", [f"task.reward=[{mod}:a, {mod}:b]", "task.reward_weights=[1.0]"])
    with pytest.raises(SpecError, match=r"task\.reward_weights: weights without task\.reward"):
        load_spec("micro", ["task.reward_weights=[1.0]"])
    with pytest.raises(SpecError, match=r"format_reward: task\.reward replaces.*boxed_format"):
        load_spec("micro", ["task.name=math_word", "task.format_reward=0.5", f"task.reward={mod}:a"])
    spec = load_spec("micro", [f"task.reward=[{mod}:a, {mod}:b]", "task.reward_weights=[1.0, 0.5]"])
    assert [(f.name, f.weight) for f in spec_reward_funcs(spec.task)] == [("a", 1.0), ("b", 0.5)]


# ---------------------------------------------------------------- weights, None, return checks


def _funcs(*pairs):
    return [RewardFunc(n, f, w, f"m:{n}") for n, f, w in pairs]


def test_weighted_sum_and_one_metric_per_function():
    one = lambda completions, **kw: [1.0 if "x" in c else 0.0 for c in completions]  # noqa: E731
    length = lambda completions, **kw: [len(c) / 10 for c in completions]  # noqa: E731
    s = score(_funcs(("has_x", one, 1.0), ("length", length, 0.5)), ["x", "yy", "xxxx"])
    assert s.total == pytest.approx([1.05, 0.1, 1.2])
    m = s.metrics(ci=True)
    assert m["reward/has_x"] == pytest.approx(2 / 3) and m["reward/length"] == pytest.approx(7 / 30)
    assert "reward/has_x_ci95_low" in m and "reward/length_ci95_low" not in m  # intervals for 0/1 rewards only


def test_none_is_not_applicable_as_in_trl_nansum():
    a = lambda completions, **kw: [1.0, None, 0.0]  # noqa: E731
    b = lambda completions, **kw: [None, None, 1.0]  # noqa: E731
    never = lambda completions, **kw: [None] * 3  # noqa: E731
    s = score(_funcs(("a", a, 1.0), ("b", b, 2.0), ("never", never, 1.0)), ["p", "q", "r"])
    assert s.total == [1.0, 0.0, 2.0]  # NaN skipped in the sum; a row no function scored sums to 0
    m = s.metrics()
    assert m["reward/a"] == 0.5 and m["reward/b"] == 1.0 and "reward/never" not in m  # means over scored rows


def test_distinct_metric_names_off_the_step_own():
    funcs = user_reward_funcs(["workbench.tasks.rewards:boxed_format"] * 2, [1.0, 0.0])
    assert [f.name for f in funcs] == ["boxed_format", "boxed_format_2"]


@pytest.mark.parametrize(
    "out,needle",
    [
        ([1.0], r"returned 1 rewards for 2 completions"),
        (["1", 0.0], r"returned '1' \(str\)"),
        (3.0, r"returned float, not a list"),
    ],
)
def test_a_bad_return_names_the_function(out, needle):
    with pytest.raises(RewardFunctionError, match=r"task\.reward: reward function m:bad " + needle):
        score(_funcs(("bad", lambda completions, **kw: out, 1.0)), ["a", "b"])


def test_a_raising_function_is_named_with_its_message():
    def boom(completions, **kw):
        raise KeyError("solution")

    with pytest.raises(RewardFunctionError, match=r"reward function m:boom raised KeyError: 'solution'"):
        score(_funcs(("boom", boom, 1.0)), ["a"])


def test_what_a_function_receives_as_trl_passes_it():
    seen = {}

    def spy(prompts, completions, completion_ids, **kw):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, **kw)
        return [0.0] * len(completions)

    def narrow(completions, solution):  # no **kwargs: only what it names
        return [float(c[0]["content"] == s) for c, s in zip(completions, solution)]

    msgs = json.dumps([{"role": "user", "content": "1+1?"}])
    rows = [{"prompt": msgs, "answer": "2", "solution": "2"}, {"prompt": msgs, "answer": "3", "solution": "3"}]
    s = score_rows(
        _funcs(("spy", spy, 1.0), ("narrow", narrow, 1.0)),
        rows,
        2,
        ["2", "x", "3", "3"],
        [[5], [6], [7], [8]],
        RewardState(4, 9),
    )
    assert seen["prompts"][0] == [{"role": "user", "content": "1+1?"}] and len(seen["prompts"]) == 4
    assert seen["completions"][0] == [{"role": "assistant", "content": "2"}]  # conversational prompts
    assert seen["solution"] == ["2", "2", "3", "3"] and seen["answer"] == ["2", "2", "3", "3"] and "prompt" not in seen
    assert seen["ids"] == [[5], [6], [7], [8]] and seen["trainer_state"].global_step == 4
    assert callable(seen["log_extra"]) and callable(seen["log_metric"])
    assert s.values["narrow"] == [1.0, 0.0, 1.0, 1.0]
    plain = score_rows(_funcs(("spy", spy, 1.0)), [{"prompt": "1+1?", "answer": "2"}], 1, ["2"], [[1]])
    assert seen["completions"] == ["2"] and seen["prompts"] == ["1+1?"] and plain.total == [0.0]


def test_log_metric_becomes_a_reward_metric():
    def f(completions, log_metric, **kw):
        log_metric("parsed_frac", 0.25)
        return [1.0] * len(completions)

    assert score(_funcs(("f", f, 1.0)), ["a"]).metrics()["reward/parsed_frac"] == 0.25


def test_required_columns_are_checked_against_the_data(user_module):
    mod = user_module("rf_cols", "def needs(prompts, completions, completion_ids, solution):\n    return []\n")
    funcs = user_reward_funcs(f"{mod}:needs")
    with pytest.raises(ValueError, match=r"task\.reward: .*requires the column\(s\) solution.*columns: prompt, answer"):
        check_columns(funcs, ["prompt", "answer"])
    check_columns(funcs, ["prompt", "answer", "solution"])


# ---------------------------------------------------------------- the built-in tasks through the same path

COMPLETIONS = ["Answer: 12", "so \\boxed{12}.", "I think 11\nAnswer: 11", "\\boxed{N}", "nothing", "12"]


def _task_param(name: str):
    """A task's name as a parameter; a task rewarded by math-verify needs the [real] extra."""
    needs_math_verify = TASKS[name].reward is math_accuracy_reward
    return pytest.param(name, marks=marks("real", "math_verify") if needs_math_verify else ())


@pytest.mark.parametrize("name", [_task_param(n) for n in sorted(TASKS)])
def test_builtin_tasks_score_as_before(name):
    """The old per-completion verifiers and their TRL-form functions agree, in both completion formats."""
    task = get_task(name)
    answers = ["12", "12", "11", "12", "3", "12"]
    fw = 0.5 if task.format_reward is not None else 0.0
    s = score(task, COMPLETIONS, answers, fw)
    acc = [float(task.reward(c, a)) for c, a in zip(COMPLETIONS, answers)]
    fmt = [float(task.format_reward(c)) for c in COMPLETIONS] if task.format_reward else None
    assert s.accuracy == acc and s.format == fmt
    assert s.last_number == (
        [float(task.anchor_free(c, a)) for c, a in zip(COMPLETIONS, answers)] if task.anchor_free else None
    )
    assert s.total == ([a + fw * f for a, f in zip(acc, fmt)] if fmt else acc)
    conv = score(task, [[{"role": "assistant", "content": c}] for c in COMPLETIONS], answers, fw)
    assert conv.values == s.values and conv.total == s.total
    assert set(s.metrics()) == {f"reward/{k}" for k in ("accuracy", "format", "last_number") if k in s.values}


def test_a_builtin_as_task_reward_matches_the_task():
    funcs = user_reward_funcs(["workbench.tasks.rewards:arith_answer"])
    assert (
        score(funcs, COMPLETIONS, ["12"] * 6).values["arith_answer"]
        == score(get_task("arith_chain"), COMPLETIONS, ["12"] * 6).accuracy
    )


# ---------------------------------------------------------------- data: every column, Hub datasets


def test_every_column_is_kept_for_task_reward(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"P{i}", "solution": str(i), "level": i % 2}) + "\n" for i in range(4)))
    ds = load_task_data("arith_chain", "train", 3, 0, path=str(f), cache_dir=tmp_path, keep_columns=True)
    assert set(ds.column_names) == {"prompt", "answer", "solution", "level"} and ds["answer"] == ["0", "1", "2"]
    assert load_task_data("arith_chain", "train", 3, 0, path=str(f), cache_dir=tmp_path).column_names == [
        "prompt",
        "answer",
    ]
    g = tmp_path / "noanswer.jsonl"  # a reward that needs no gold answer: the answer column may be missing
    g.write_text("".join(json.dumps({"prompt": f"P{i}", "n": i}) + "\n" for i in range(3)))
    ds = load_task_data("arith_chain", "train", 3, 0, path=str(g), cache_dir=tmp_path, keep_columns=True)
    assert ds["answer"] == ["", "", ""] and ds["n"] == [0, 1, 2]


def test_a_dataset_folder_loads_with_datasets_load_dataset(tmp_path):
    d = tmp_path / "my_dataset"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps({"prompt": f"Q{i}", "answer": str(i)}) + "\n" for i in range(5)))
    ds = load_task_data("arith_chain", "eval", 2, 0, path=str(d), cache_dir=tmp_path, hub_split="train")
    assert ds["answer"] == ["3", "4"]
    with pytest.raises(ValueError, match=r"task\.path: .*split 'test', task\.split"):
        load_task_data("arith_chain", "train", 2, 0, path=str(d), cache_dir=tmp_path, hub_split="test")


def test_hub_dataset_offline_is_one_clear_line(tmp_path, monkeypatch):
    import datasets

    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    with pytest.raises(ValueError) as e:
        load_task_data("arith_chain", "train", 2, 0, path="someone/no-such-dataset-xyz", cache_dir=tmp_path)
    msg = str(e.value)
    assert msg.startswith("task.path: could not load the datasets Hub dataset 'someone/no-such-dataset-xyz'")
    assert "HF_DATASETS_OFFLINE" in msg and "HF_HUB_OFFLINE" in msg and "\n" not in msg


# ---------------------------------------------------------------- TRL's own reward functions


@requires("trl", "trl")
@requires("real", "math_verify")
def test_trl_accuracy_reward_directly():
    funcs = user_reward_funcs("trl.rewards:accuracy_reward")
    assert funcs[0].name == "accuracy_reward"
    conv = [[{"role": "assistant", "content": c}] for c in ("so \\boxed{\\frac{1}{3}}", "\\boxed{2}", "\\boxed{1}")]
    s = score(funcs, conv, columns={"solution": ["\\frac{1}{3}", "\\frac{1}{3}", "not latex at all ]["]})
    assert s.values["accuracy_reward"][:2] == [1.0, 0.0]


# ---------------------------------------------------------------- end to end: wb run

RUN = ["run", "micro", "drafter.kind=none", "grpo.steps=1", "grpo.eval_every=0", "rollout.max_new_tokens=16", "--quiet"]


def _data(tmp_path, conversational=False):
    f = tmp_path / "prompts.jsonl"
    rows = []
    for i in range(6):
        p = f"{i} + 1 = "
        rows.append(
            {
                "prompt": [{"role": "user", "content": p}] if conversational else p,
                "solution": str(i + 1),
                "tag": f"t{i}",
            }
        )
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def _only_run(store):
    exp = store.get_experiment_by_name("workbench-micro")
    runs = store.search_runs([exp.experiment_id])
    assert len(runs) == 1
    return runs[0]


def _samples(store, run_id, tmp_path, step=1):
    path = store.download_artifacts(run_id, f"samples/step_{step:05d}.json", str(tmp_path))
    return json.loads(open(path).read())


def test_wb_run_with_a_user_reward_logs_its_value(store, tmp_path, user_module):
    mod = user_module(
        "rf_e2e",
        """
        def digits(prompts, completions, completion_ids, solution, tag, **kwargs):
            assert len(set(map(len, (prompts, completions, completion_ids, solution, tag)))) == 1
            return [sum(ch.isdigit() for ch in c) / 10 for c in completions]
        """,
    )
    res = runner.invoke(
        app, [*RUN, f"task.path={_data(tmp_path)}", f"task.reward={mod}:digits", "grpo.num_samples_logged=8"]
    )
    assert res.exit_code == 0, res.output
    run = _only_run(store)
    assert run.info.status == "FINISHED"
    samples = _samples(store, run.info.run_id, tmp_path)
    assert len(samples) == 8  # prompts_per_step 2 x group_size 4: every rollout
    want = sum(sum(ch.isdigit() for ch in s["completion"]) / 10 for s in samples) / len(samples)
    assert run.data.metrics["reward/mean"] == pytest.approx(want)
    assert run.data.metrics["reward/digits"] == pytest.approx(want)
    assert "reward/accuracy" not in run.data.metrics  # the task's own reward is replaced


def test_a_reward_raising_mid_run_fails_the_run_and_keeps_what_was_logged(store, tmp_path, user_module):
    mod = user_module(
        "rf_raises",
        """
        def flaky(prompts, completions, completion_ids, trainer_state, **kwargs):
            if trainer_state.global_step >= 1:
                raise ZeroDivisionError("judge is down")
            return [0.5] * len(completions)
        """,
    )
    args = [*RUN, "grpo.steps=2", f"task.path={_data(tmp_path)}", f"task.reward={mod}:flaky"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert f"task.reward: reward function {mod}:flaky raised ZeroDivisionError: judge is down" in res.output
    run = _only_run(store)
    assert run.info.status == "FAILED"
    assert "judge is down" in run.data.tags["workbench.error"] and f"{mod}:flaky" in run.data.tags["workbench.error"]
    assert [(m.step, m.value) for m in store.get_metric_history(run.info.run_id, "reward/mean")] == [(1, 0.5)]


def test_a_bad_reference_fails_before_any_run_opens(store, tmp_path):
    res = runner.invoke(app, [*RUN, f"task.path={_data(tmp_path)}", "task.reward=no_such_mod_e2e:f"])
    assert res.exit_code == 2 and "task.reward" in res.output and "no_such_mod_e2e" in res.output
    assert store.get_experiment_by_name("workbench-micro") is None


@requires("trl", "trl")
@requires("real", "math_verify")
def test_wb_run_with_trl_accuracy_reward(store, tmp_path):
    args = [*RUN, f"task.path={_data(tmp_path, conversational=True)}", "task.reward=trl.rewards:accuracy_reward"]
    res = runner.invoke(app, [*args, "grpo.num_samples_logged=8"])
    assert res.exit_code == 0, res.output
    run = _only_run(store)
    m = run.data.metrics
    assert run.info.status == "FINISHED" and m["reward/mean"] == pytest.approx(m["reward/accuracy_reward"])
    samples = _samples(store, run.info.run_id, tmp_path)
    assert m["reward/mean"] == pytest.approx(sum(s["reward"] for s in samples) / len(samples))
    assert not math.isnan(m["reward/mean"])
