"""`wb export`: the drafter spec -> vLLM / NeMo RL / verl / TRL mapping per kind (pure), the adaptive policy's
per-batch-size k as vLLM's schedule, the point chosen from hand-logged sweeps (best finished, --point by label
or KEY=VALUE, errors in one line with exit 2), and one real micro sweep exported end to end."""

import json
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from workbench.cli import app
from workbench.report.export import (
    FILES,
    ExportError,
    framework_configs,
    per_batch_size_schedule,
    render_files,
    vllm_speculative_config,
)
from workbench.specs import load_spec

from test_runs import log_run

runner = CliRunner()


def drafter(*overrides):
    return load_spec("micro", ["drafter.init.data=none", *overrides]).drafter


# ----------------------------------------------------------------------------- pure: the mapping per kind


def test_each_kind_maps_to_vllm_names():
    d = drafter("drafter.kind=ngram", "drafter.k=5", "drafter.prompt_lookup_max=3")
    assert vllm_speculative_config(d) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
    }
    assert vllm_speculative_config(d, k=2)["num_speculative_tokens"] == 2
    # suffix: exported without arctic-inference here (the serving machine needs it)
    sc = vllm_speculative_config(drafter("drafter.kind=suffix", "drafter.k=4"))
    assert sc["method"] == "suffix" and sc["suffix_decoding_max_tree_depth"] == 24 and sc["num_speculative_tokens"] == 4
    assert vllm_speculative_config(drafter("drafter.kind=draft_model")) == {
        "method": "draft_model",
        "model": "micro-draft",  # the spec's drafter.model when no folder is given
        "num_speculative_tokens": 3,
    }
    assert vllm_speculative_config(
        drafter("drafter.kind=eagle3", "drafter.k=2"), draft_folder="/h", draft_sample_method="greedy"
    ) == {
        "method": "eagle3",
        "model": "/h",
        "num_speculative_tokens": 2,
        "draft_sample_method": "greedy",
    }
    # dflash: k must be the trained block size - 1; online adaptation is not part of a served config
    d = drafter("drafter.kind=dflash", "drafter.k=7", "drafter.online.enabled=true")
    assert vllm_speculative_config(d, draft_folder="/d") == {
        "method": "dflash",
        "model": "/d",
        "num_speculative_tokens": 7,
    }


@pytest.mark.parametrize(
    "overrides, kwargs, needle",
    [
        (["drafter.kind=mtp"], {}, "no vLLM equivalent"),
        (["drafter.kind=none"], {}, "nothing to export"),
        (["drafter.kind=eagle3"], {}, "draft_folder"),
        (["drafter.kind=dflash", "drafter.k=3"], {"draft_folder": "/d"}, "drafter.k=7"),
    ],
)
def test_kinds_vllm_does_not_run_say_so(overrides, kwargs, needle):
    with pytest.raises(ExportError, match=needle):
        vllm_speculative_config(drafter(*overrides), **kwargs)


def test_framework_wrappers_carry_the_same_dict():
    d = drafter("drafter.kind=eagle3", "drafter.k=4")
    cfgs = framework_configs(d, draft_folder="/heads/e 3", per_batch_size=[(1, 8, 4), (9, 64, 1)])
    sc = cfgs["vllm"]
    assert sc["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 1]]
    assert cfgs["nemo-rl"]["policy"]["generation"]["vllm_kwargs"]["speculative_config"] == sc
    assert cfgs["nemo-rl"]["policy"]["generation"]["backend"] == "vllm"
    rollout = cfgs["verl"]["actor_rollout_ref"]["rollout"]
    assert rollout["name"] == "vllm" and rollout["engine_kwargs"]["vllm"]["speculative_config"] == sc
    argv = shlex.split(cfgs["trl"])
    assert argv[:2] == ["trl", "vllm-serve"] and json.loads(argv[argv.index("--speculative_config") + 1]) == sc
    files = render_files(cfgs, ["exported by a test"], "my/policy")
    assert set(files) == set(FILES.values())
    assert json.loads(files["speculative_config.json"]) == sc
    assert (
        yaml.safe_load(files["nemo_rl.yaml"]) == cfgs["nemo-rl"] and yaml.safe_load(files["verl.yaml"]) == cfgs["verl"]
    )
    assert (
        "# exported by a test" in files["nemo_rl.yaml"]
        and "++policy.generation.vllm_kwargs.speculative_config.method=eagle3" in files["nemo_rl.yaml"]
    )
    assert 'MODEL="${MODEL:-my/policy}"' in files["trl_vllm_serve.sh"] and "vllm serve" in files["trl_vllm_serve.sh"]
    assert set(render_files(cfgs, [], "m", ("vllm",))) == {"speculative_config.json"}


def test_per_batch_size_schedule_is_vllms_inclusive_ranges():
    # bins b hold rows in (b/2, b]; the first range starts at 1, equal neighbours merge, k in 0..k_max
    assert per_batch_size_schedule({1: 3.0, 2: 2.6, 4: 1.2, 8: 1.4, 32: 0.2, 64: -1.0}, 3) == [
        (1, 2, 3),
        (3, 8, 1),
        (9, 64, 0),
    ]
    assert per_batch_size_schedule({2: 2.5, 16: 3.4}, 3) is None  # k_max everywhere: a static k says it
    assert per_batch_size_schedule({4: 1.0}, 3) == [(1, 4, 1)]
    assert per_batch_size_schedule({}, 3) is None


def test_drafter_folders_are_the_vllm_backends_hand_over(tmp_path):
    from workbench.report.export_head import drafter_folder_of
    from workbench.vllm import is_eagle3_folder

    spec = load_spec("micro", ["drafter.kind=eagle3", "drafter.init.data=none"])
    folder, source = drafter_folder_of(spec, tmp_path)
    assert folder == str(tmp_path / "eagle3") and is_eagle3_folder(folder) and "without init" in source
    spec = load_spec("micro", ["drafter.kind=draft_model", "drafter.init.data=none"])
    folder, source = drafter_folder_of(spec, tmp_path)  # the checkpoint as it is: nothing loaded, nothing written
    assert (Path(folder) / "config.json").is_file() and source == "drafter.model=micro-draft"
    assert drafter_folder_of(load_spec("micro", ["drafter.kind=ngram"]), tmp_path) == (None, "")


# ----------------------------------------------------------------------------- points from MLflow (hand-logged)


def logged_sweep(client, name, points):
    """A sweep as `wb sweep` logs it (3 steps, step 1 warm-up); ``points``: (kind, k, ratios of steps 2-3, status,
    extra params, extra metrics of steps 1-3)."""
    exp = client.create_experiment(f"wb-{name}")
    parent = log_run(client, exp, name, tags={"workbench.sweep": name, "workbench.sweep.role": "parent"})
    for kind, k, ratios, status, extra, metrics in points:
        params = {"name": "micro", "model.target": "micro", "seed": 0, "drafter.kind": kind, "drafter.k": k}
        params |= {"measure.paired": True, "tracking.experiment": f"wb-{name}", **extra}
        m = {"timing_s/gen": [1.0, 1.0, 1.0], "timing_s/step": [2.0, 2.0, 2.0], **metrics}
        if ratios:
            m["speedup/gen_per_step"] = [9.0, *ratios]
        tags = {"workbench.sweep": name, "workbench.sweep.role": "point", "workbench.sweep.point": f"{kind}{k}{extra}"}
        tags |= {"workbench.axis.drafter.kind": kind, "workbench.axis.drafter.k": str(k) if kind != "none" else "-"}
        log_run(client, exp, f"{name}: {kind} k={k}", params, m, status, tags=tags, parent=parent)


ADAPTIVE = {
    "spec/k_mean_rows_le_1": [3, 3, 3],
    "spec/k_mean_rows_le_4": [3, 2.8, 3],
    "spec/k_mean_rows_le_16": [1, 1, 1.2],
}


def test_best_finished_point_exported_with_its_per_batch_size_k(store, tmp_path):
    logged_sweep(
        store,
        "fake",
        [
            ("none", 3, None, "FINISHED", {}, {}),
            ("ngram", 2, [1.10, 1.12], "FINISHED", {}, {}),
            ("ngram", 3, [1.50, 1.52], "FINISHED", {"drafter.adaptive": True}, ADAPTIVE),
            ("ngram", 4, [3.0, 3.1], "RUNNING", {}, {}),  # faster, but not finished: never the best
        ],
    )
    res = runner.invoke(app, ["export", "fake", "--out", str(tmp_path / "x")])
    assert res.exit_code == 0, res.output
    assert "ngram k=3" in res.output and "best" in res.output
    sc = json.loads((tmp_path / "x" / "speculative_config.json").read_text())
    assert sc == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
        "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 16, 1]],  # means after warm-up, rounded
    }
    info = json.loads((tmp_path / "x" / "point.json").read_text())
    assert info["point"] == "ngram k=3" and info["decided"] and info["speedup/gen"]["mean"] == pytest.approx(1.51, 0.01)
    assert {p.name for p in (tmp_path / "x").iterdir()} == {*FILES.values(), "point.json"}

    # --point by the report's label and by KEY=VALUE (aliases), --format
    res = runner.invoke(app, ["export", "fake", "--point", "ngram k=2", "-o", str(tmp_path / "y"), "--format", "vllm"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "y" / "speculative_config.json").read_text())["num_speculative_tokens"] == 2
    assert {p.name for p in (tmp_path / "y").iterdir()} == {"speculative_config.json", "point.json"}
    res = runner.invoke(app, ["export", "fake", "--point", "drafter=ngram,k=4", "-o", str(tmp_path / "z")])
    assert res.exit_code == 0, res.output  # named: a running point may be exported on purpose
    assert "num_speculative_tokens_per_batch_size" not in (tmp_path / "z" / "speculative_config.json").read_text()


def test_a_studys_best_trial_is_exported(store, tmp_path):
    exp = store.create_experiment("wb-study")
    parent = log_run(store, exp, "st", tags={"workbench.study": "st"})
    for k, ratios in ((2, [1.2, 1.22]), (5, [1.6, 1.62])):
        params = {"model.target": "micro", "drafter.kind": "draft_model", "drafter.k": k, "drafter.init.data": "none"}
        params |= {"drafter.model": "micro-draft", "measure.paired": True}
        metrics = {"timing_s/gen": [1.0] * 3, "speedup/gen_per_step": [9.0, *ratios]}
        log_run(store, exp, f"trial k={k}", params, metrics, tags={"workbench.study": "st"}, parent=parent)
    res = runner.invoke(app, ["export", "st", "-o", str(tmp_path / "s"), "--format", "nemo-rl"])
    assert res.exit_code == 0, res.output
    sc = yaml.safe_load((tmp_path / "s" / "nemo_rl.yaml").read_text())["policy"]["generation"]["vllm_kwargs"]
    sc = sc["speculative_config"]
    assert sc["method"] == "draft_model" and sc["num_speculative_tokens"] == 5 and Path(sc["model"]).is_dir()
    assert json.loads((tmp_path / "s" / "point.json").read_text())["kind"] == "study"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["export", "no-such-sweep"], "no sweep, study, run name"),
        (["export", "fake", "--point", "k=9"], "names no speculative point"),
        (["export", "fake", "--point", "drafter=ngram"], "names 2 points"),
        (["export", "fake", "--point", "k=2,ngram"], "is not KEY=VALUE"),
        (["export", "fake", "--format", "sglang"], "--format 'sglang'"),
        (["export", "unfinished"], "no FINISHED speculative point"),
    ],
)
def test_errors_are_one_line_exit_2(store, args, needle):
    logged_sweep(
        store, "fake", [("ngram", 2, [1.1, 1.2], "FINISHED", {}, {}), ("ngram", 3, [1.3, 1.2], "FINISHED", {}, {})]
    )
    logged_sweep(
        store, "unfinished", [("none", 3, None, "FINISHED", {}, {}), ("ngram", 2, [1.2, 1.3], "FAILED", {}, {})]
    )
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output


# ----------------------------------------------------------------------------- a real sweep, end to end


@pytest.mark.slow
def test_micro_sweep_then_export_writes_the_best_points_files(store):
    args = ["sweep", "micro", "drafter=ngram", "k=1,2", "grpo.steps=2", "grpo.eval_every=0"]
    res = runner.invoke(app, [*args, "rollout.max_new_tokens=24", "grpo.group_size=2", "--name", "ex", "--quiet"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["export", "ex"])
    assert res.exit_code == 0, res.output
    out = Path("exports") / "ex"
    assert {p.name for p in out.iterdir()} == {*FILES.values(), "point.json"}
    info = json.loads((out / "point.json").read_text())
    assert info["point"] in ("ngram k=1", "ngram k=2") and info["point"] in res.output
    sc = json.loads((out / "speculative_config.json").read_text())
    assert sc["method"] == "ngram" and sc["num_speculative_tokens"] == int(info["point"][-1])
    assert (
        yaml.safe_load((out / "verl.yaml").read_text())["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"][
            "speculative_config"
        ]
        == sc
    )
