"""`wb report`: hand-logged sweeps (paired CIs, repeats pooled, best vs tie, the `~` fallback and the
baseline rule, the training-signal test), one micro sweep end to end (table, plots, HTML, single run,
errors, `wb ui` URL), and the Markdown -> HTML rendering."""

import random

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.report import make_report, markdown_to_html
from workbench.stats import ratio_ci, runs_ci

from test_runs import log_run

runner = CliRunner()


def fake_sweep(client, name, points, stored="per_step"):
    """A sweep as `wb sweep` logs it, 4 GRPO steps per point (step 1: warm-up). ``points``: dicts with
    kind, k, seed, gen_s, reward, optional ratios (paired speedup/gen of steps 2-4; absent: unpaired)
    and params (extra params, also axis tags). ``stored``: ``per_step`` (``speedup/gen_per_step``, and
    ``speedup/gen`` as the running estimate: not ratios) or ``before_per_step`` (issue #22's older
    stores: the per-step ratios under ``speedup/gen``)."""
    exp = client.create_experiment(f"wb-{name}")
    parent = log_run(client, exp, name, tags={"workbench.sweep": name, "workbench.sweep.role": "parent"})
    for p in points:
        kind, k, seed, extra = p["kind"], p.get("k"), p.get("seed", 0), p.get("params", {})
        rng = random.Random(f"{name}{kind}{k}{seed}{extra}")
        params = {
            "name": name,
            "model.target": "micro",
            "seed": seed,
            "drafter.kind": kind,
            "drafter.k": k or 3,
            "measure.paired": "ratios" in p,
            "tracking.experiment": f"wb-{name}",
            **extra,
        }
        gen = [p["gen_s"] * (1 + 0.02 * rng.random()) for _ in range(4)]
        metrics = {
            "timing_s/gen": gen,
            "timing_s/step": [g + 1.0 for g in gen],
            "timing_s/train": [1.0] * 4,
            "reward/mean": [p["reward"] + 0.02 * rng.gauss(0, 1) for _ in range(4)],
        }
        if kind != "none":
            metrics |= {"spec/acceptance_length": [2.0, 2.1, 2.2, 2.3], "spec/acceptance_rate_pos_0": [0.7] * 4}
        if "ratios" in p:
            ratios = {
                "speedup/gen": [9.0, *p["ratios"]],
                "speedup/step": [9.0, *[1 + (r - 1) / 3 for r in p["ratios"]]],
            }
            if stored == "per_step":
                metrics |= {f"{k}_per_step": v for k, v in ratios.items()} | {k: [40.0] * 4 for k in ratios}
            else:
                metrics |= ratios
        axes = {"drafter.kind": kind, "drafter.k": str(k) if k else "-", "seed": str(seed), **extra}
        tags = {
            "workbench.sweep": name,
            "workbench.sweep.role": "point",
            "workbench.sweep.point": f"{kind}{k}{seed}{extra}",
            **{f"workbench.axis.{a}": str(v) for a, v in axes.items()},
        }
        log_run(client, exp, f"{name}: {kind} k={k} seed={seed}", params, metrics, tags=tags, parent=parent)
    return parent


FAST = {0: [1.98, 2.05, 2.01], 1: [1.95, 2.03, 2.0], 2: [2.02, 1.97, 2.04]}  # eagle3 k=2, per seed
SLOW = {0: [1.31, 1.28, 1.3], 1: [1.27, 1.33, 1.29], 2: [1.3, 1.32, 1.26]}  # eagle3 k=4


@pytest.mark.parametrize("stored", ["per_step", "before_per_step"])
def test_decided_best_pooled_repeats_cis_and_no_reward_difference(store, monkeypatch, stored):
    import matplotlib.axes

    points = [{"kind": "none", "seed": s, "gen_s": 1.0, "reward": 0.5} for s in range(3)]
    points += [{"kind": "eagle3", "k": 2, "seed": s, "gen_s": 0.5, "reward": 0.5, "ratios": FAST[s]} for s in range(3)]
    points += [{"kind": "eagle3", "k": 4, "seed": s, "gen_s": 0.8, "reward": 0.5, "ratios": SLOW[s]} for s in range(3)]
    fake_sweep(store, "dec", points, stored)
    bars = []
    real = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "errorbar",
        lambda self, x, y, yerr=None, **kw: bars.append(yerr) or real(self, x, y, yerr=yerr, **kw),
    )
    t, rep = make_report("dec", "out")
    md = rep.markdown.read_text()
    assert [r.point.label for r in t.rows] == ["autoregressive", "eagle3 k=2", "eagle3 k=4"]  # 3 seeds -> one row each
    fast = runs_ci([FAST[s] for s in range(3)])  # 3 repeats: the random-effects interval over the runs
    row = next(line for line in md.splitlines() if line.startswith("| eagle3 | 2 |"))
    assert f"{fast.mean:.2f}× [{fast.low:.2f}, {fast.high:.2f}] ★" in row and "| 3 |" in row
    pooled = ratio_ci([x for s in range(3) for x in FAST[s]])  # what the row showed before issue #22 part 5
    assert f"[{pooled.low:.2f}, {pooled.high:.2f}]" not in row
    assert (
        "- eagle3 k=2: 3 runs, between-run spread τ = " in md
        and "no prediction interval for a new run below 5 runs" in md
    )
    assert "not of a repeat" in md  # the note: what a single run's CI covers
    assert sum("★" in line for line in md.splitlines() if line.startswith("| ")) == 1
    assert "best speedup: eagle3 k=2" in md and "tie:" not in md
    assert (
        "| drafter | k | acc.len | acc.rate | gen s | step s | gen× [95 % CI] | step× [95 % CI] | τ | reward | n | "
        "status | runs |" in md
    )
    assert "| none | - |" in md and "~" not in row
    assert "| **total** |" in md and "| gen |" in md and "| autoregressive (s) | eagle3 k=2 (s) | speedup |" in md
    # error bars: the paired points' CIs (lower, upper distances > 0), gen and step panels
    assert len(bars) == 2 and all(v > 0 for side in bars[0] for v in side)
    # training signal: eagle3 (6 runs over k and seeds) vs none (3): same reward law
    sig = md.split("## Training signal with and without speculation")[1].split("\n## ")[0]
    assert "| none | 3 |" in sig and "| eagle3 | 6 |" in sig
    assert (
        "eagle3 vs none**: no difference detected (p=" in sig
        and "with n=6 (eagle3) and 3 (none) runs per side a difference of ≥ " in sig
    )
    assert "80 % of the time" in sig and rep.plots[-1] == "reward_curves.png"


def test_tie_unpaired_fallback_baseline_rule_and_reward_difference(store):
    g4, g8 = {"grpo.group_size": "4"}, {"grpo.group_size": "8"}
    points = [{"kind": "none", "seed": s, "gen_s": 1.0, "reward": 0.2, "params": g4} for s in range(2)]
    points += [
        {"kind": "eagle3", "k": k, "seed": s, "gen_s": 0.7, "reward": 0.7, "params": g4, "ratios": r}
        for k, rs in ((2, ([1.2, 1.9, 1.5], [1.3, 1.8, 1.6])), (3, ([1.25, 1.8, 1.3], [1.6, 1.4, 1.5])))
        for s, r in enumerate(rs)
    ]
    points += [{"kind": "ngram", "k": 2, "seed": 0, "gen_s": 0.8, "reward": 0.2, "params": g} for g in (g4, g8)]
    points += [
        {"kind": "mtp", "k": 2, "seed": 0, "gen_s": 0.9, "reward": 0.2, "params": g4, "ratios": [1.1, 1.1, 1.12]}
    ]
    fake_sweep(store, "tie", points)
    res = runner.invoke(app, ["report", "tie", "--out", "out", "--html"])
    assert res.exit_code == 0, res.output
    md = open("out/report.md").read()
    assert not any("★" in line for line in md.splitlines() if line.startswith("| ")) and "best speedup" not in md
    assert (
        "**tie: eagle3 k=2 grpo.group_size=4, eagle3 k=3 grpo.group_size=4" in md
        and "** (95 % CIs overlap; `~` points have no CI)" in md
    )
    assert "No speedup for ngram k=2 grpo.group_size=8: not paired and no FINISHED" in md
    ngram = [line for line in md.splitlines() if line.startswith("| ngram |")]
    # unpaired: ~ against the seed-0 group_size=4 baseline (~1.25×, no CI); group_size=8 has no baseline: no other
    # setting's
    assert "| ~1.2" in ngram[0] and "[" not in ngram[0] and "| 4 |" in ngram[0]
    assert "| 8 |" in ngram[1] and "| - | - |" in ngram[1]
    sig = md.split("## Training signal with and without speculation")[1].split("\n## ")[0]
    assert "**eagle3 vs none: difference detected** (p=" in sig and "eagle3 − none = +0." in sig
    assert "ngram vs none**: no difference detected" in sig
    mtp = next(line for line in md.splitlines() if line.startswith("| mtp |"))  # one run: its per-step CI, no τ
    one = ratio_ci([1.1, 1.1, 1.12])
    head = next(line for line in md.splitlines() if line.startswith("| drafter |"))
    tau = [c.strip() for c in head.split("|")].index("τ")
    assert f"{one.mean:.2f}× [{one.low:.2f}, {one.high:.2f}]" in mtp and mtp.split("|")[tau].strip() == "-"
    assert "- eagle3 k=2 grpo.group_size=4: 2 runs" in md and "no prediction interval for a new run below 5 runs" in md
    assert (
        "mtp vs none**: too few runs to test (1 mtp, 2 none" in sig
        and "`wb sweep tie drafter=none,mtp seed=0..4`" in sig
    )
    html = open("out/report.html").read()
    assert "<table>" in html and '<img src="speedup_vs_k.png" alt="Speedup vs k" />' in html


def test_training_signal_per_backend(store):
    """Runs over rollout.backend=workbench,vllm: each backend's drafter is tested against its own backend's
    autoregressive runs, and vLLM's autoregressive runs against the workbench engine's."""
    wb_, vl = {"rollout.backend": "workbench"}, {"rollout.backend": "vllm"}
    points = [{"kind": "none", "seed": s, "gen_s": 1.0, "reward": 0.2, "params": wb_} for s in range(3)]
    points += [{"kind": "none", "seed": s, "gen_s": 1.2, "reward": 0.7, "params": vl} for s in range(3)]
    points += [{"kind": "eagle3", "k": 2, "seed": s, "gen_s": 1.0, "reward": 0.7, "params": vl} for s in range(3)]
    fake_sweep(store, "be", points)
    _, rep = make_report("be", "out")
    sig = rep.markdown.read_text().split("## Training signal with and without speculation")[1].split("\n## ")[0]
    rows = [
        line.split(" | ")[0]
        for line in sig.splitlines()
        if line.startswith("| ") and "runs" not in line and "---" not in line
    ]
    assert rows == ["| none (workbench)", "| none (vllm)", "| eagle3 (vllm)"]
    assert "**eagle3 (vllm) vs none (vllm)**: no difference detected" in sig
    assert (
        "**none (vllm) vs none (workbench): difference detected**" in sig
        and "none (vllm) − none (workbench) = +0.5" in sig
    )


SWEEP = [
    "drafter=ngram",
    "k=1,2",
    "grpo.steps=3",
    "grpo.eval_every=0",
    "rollout.max_new_tokens=24",
    "grpo.group_size=2",
]


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """A tmp cwd whose sqlite store holds one micro sweep (ngram, k=1,2 + baseline, paired, 3 steps)."""
    tmp = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
        mp.setenv("WB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wb-cache"))  # as conftest's
        from rich.console import Console

        from workbench.sweep import plan_sweep, run_sweep

        # run_sweep, not `wb sweep`: the report needs the logged runs, not the sweep command's table
        res = run_sweep(plan_sweep("micro", SWEEP), name="rep-sweep", console=Console(quiet=True), progress=False)
        assert res.status == "FINISHED"
        yield tmp


def test_sweep_report_has_table_plots_and_html(micro):
    res = runner.invoke(app, ["report", "rep-sweep", "--html"])
    assert res.exit_code == 0, res.output
    out = micro / "reports" / "rep-sweep"
    md = (out / "report.md").read_text()
    for png in (
        "speedup_vs_k",
        "acceptance_per_position",
        "acceptance_length_steps",
        "stage_times",
        "reward_curves",
        "completion_lengths",
    ):
        f = out / f"{png}.png"
        assert f.stat().st_size > 5000 and f.read_bytes()[:4] == b"\x89PNG", png
        assert f"]({png}.png)" in md  # relative link
    skipped = [line for line in md.splitlines() if "Skipped" in line]
    # only the adaptive plots: no such run
    assert all("drafter.adaptive" in line for line in skipped) and len(skipped) == 2
    results = md.split("## Results")[1].split("\n## ")[0]
    rows = [line for line in results.splitlines() if line.startswith("| ngram | ")]
    assert len(rows) == 2 and all("× [" in r for r in rows) and "| none | - |" in md  # paired: 2 ratios after warm-up
    starred = any("★" in line for line in rows)
    assert starred != ("**tie: ngram k=" in results)  # decided or a tie, never both
    assert "| **total** |" in md and "| gen |" in md and "## Training signal with and without speculation" in md
    assert "- machine: " in md  # the host's CPU model and instruction sets, from every run's tag
    assert "`wb sweep micro drafter=none,ngram seed=0..4`" in md  # 1 run per side: which sweep to run
    html = (out / "report.html").read_text()
    assert "<table>" in html and '<img src="speedup_vs_k.png" alt="Speedup vs k" />' in html


def test_the_report_files_are_logged_to_the_sweeps_parent_run(micro):
    from mlflow import MlflowClient

    from workbench.report.write import REPORT_ARTIFACTS

    assert runner.invoke(app, ["report", "rep-sweep"]).exit_code == 0
    client = MlflowClient(f"sqlite:///{micro}/mlflow.db")
    exp = client.get_experiment_by_name("workbench-micro")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`workbench.sweep.role` = 'parent'")
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, REPORT_ARTIFACTS)}
    assert f"{REPORT_ARTIFACTS}/report.md" in logged and f"{REPORT_ARTIFACTS}/speedup_vs_k.png" in logged


def test_html_from_the_store_is_shown_as_text_never_as_markup():
    h = markdown_to_html("| machine |\n|---|\n| <img src=x onerror=alert(1)> |\n\n<script>alert(1)</script>\n")
    assert "<img src=x" not in h and "<script>" not in h
    assert "&lt;img src=x onerror=alert(1)&gt;" in h and "&lt;script&gt;alert(1)&lt;/script&gt;" in h


def test_single_run_report_skips_what_has_no_data(micro, tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{micro}/mlflow.db")
    exp = client.get_experiment_by_name("workbench-micro")
    run = client.search_runs([exp.experiment_id], "tags.`workbench.axis.drafter.k` = '2'")[0]
    for name in (run.info.run_name, run.info.run_id):
        res = runner.invoke(app, ["report", name, "--out", str(tmp_path / "r")])
        assert res.exit_code == 0, res.output
        md = (tmp_path / "r" / "report.md").read_text()
        assert md.startswith("# Report: run") and run.info.run_id in md
        assert (
            "_Skipped: needs at least 2 speculative rows" in md and not (tmp_path / "r" / "speedup_vs_k.png").exists()
        )
        assert (tmp_path / "r" / "acceptance_length_steps.png").stat().st_size > 5000
        assert "| ngram |" in md and "× [" in md  # its own paired CI: no baseline needed


def test_unknown_name_is_a_clear_error(micro):
    res = runner.invoke(app, ["report", "no-such-sweep"])
    assert res.exit_code == 2
    assert "no sweep, study, run name, run id or experiment 'no-such-sweep'" in res.output and "rep-sweep" in res.output


def test_ui_print_url_compares_the_last_sweep(micro):
    res = runner.invoke(app, ["ui", "--print-url", "--port", "5123"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "compare-runs" in x)
    assert line.startswith('http://127.0.0.1:5123/#/compare-runs?runs=["') and "&experiments=[" in line
    assert line.count(",") >= 2  # 3 child runs
    # the sweep's k=1,2 plot on its parent
    plot = next(x for x in res.output.splitlines() if x.startswith("k vs speedup: "))
    assert plot.startswith("k vs speedup: http://127.0.0.1:5123/#/experiments/") and plot.endswith(
        "/artifactPath/speedup_vs_k.png"
    )
    res = runner.invoke(app, ["ui", "--print-url", "--sweep", "nope"])
    assert res.exit_code == 2


def test_markdown_to_html_renders_tables_and_images():
    h = markdown_to_html(
        "# T\n\n- a `b`\n\n| x | y |\n|---|---:|\n| 1 | 2 |\n\n![p](p.png)\n\n_Skipped: x_ 1.2× [1.1, 1.3]\n", "t<"
    )
    assert h.startswith("<!doctype html>") and "<title>t&lt;</title>" in h
    assert "<h1>T</h1>" in h and "<li>a <code>b</code></li>" in h
    assert (
        '<th style="text-align:right">y</th>' in h and '<td style="text-align:right">2</td>' in h and "<td>1</td>" in h
    )
    assert '<img src="p.png" alt="p" />' in h and "<em>Skipped: x</em> 1.2× [1.1, 1.3]" in h


def test_adaptive_run_report_plots_the_chosen_k(store, tmp_path):
    res = runner.invoke(
        app,
        [
            "run",
            "micro",
            "drafter.adaptive=true",
            "drafter.kind=ngram",
            "grpo.steps=3",
            "grpo.eval_every=0",
            "tracking.run_name=adaptive-run",
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", "adaptive-run", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "r" / "report.md").read_text()
    for png in ("k_histogram", "k_vs_batch"):
        assert (tmp_path / "r" / f"{png}.png").stat().st_size > 5000 and f"]({png}.png)" in md


def test_mean_and_sd_per_step_across_runs():
    """The band of several seeds' curves (acceptance vs step per arm): sample sd, 0 where one run has the step."""
    from workbench.report.plots import _mean_sd_by_step

    steps, mean, sd = _mean_sd_by_step([[(1, 2.0), (2, 3.0)], [(1, 4.0), (2, 3.0), (3, 5.0)]])
    assert steps == [1, 2, 3] and mean == [3.0, 3.0, 5.0]
    assert sd == pytest.approx([2**0.5, 0.0, 0.0])
