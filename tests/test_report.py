"""`wb report`: a micro sweep (baseline + 2 points) and a single run -> report.md, PNGs, HTML; clear errors."""

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.report import markdown_to_html

runner = CliRunner()

SWEEP = ["sweep", "micro", "drafter=ngram", "k=1,2", "grpo.steps=2", "grpo.eval_every=0", "rollout.max_new_tokens=24",
         "grpo.group_size=2", "--name", "rep-sweep", "--quiet"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tmp cwd whose sqlite store holds one micro sweep (ngram, k=1,2 + baseline)."""
    tmp = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
        mp.setenv("WB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wb-cache"))  # as conftest's
        res = runner.invoke(app, SWEEP)
        assert res.exit_code == 0, res.output
        yield tmp


def test_sweep_report_has_table_plots_and_html(store):
    res = runner.invoke(app, ["report", "rep-sweep", "--html"])
    assert res.exit_code == 0, res.output
    out = store / "reports" / "rep-sweep"
    md = (out / "report.md").read_text()
    for png in ("speedup_vs_k", "acceptance_per_position", "acceptance_length_steps", "stage_times", "reward_curves"):
        f = out / f"{png}.png"
        assert f.stat().st_size > 5000 and f.read_bytes()[:4] == b"\x89PNG", png
        assert f"]({png}.png)" in md  # relative link
    assert "Skipped" not in md
    assert "| drafter | k | acc.len | acc.rate | gen s | step s | gen× | step× | reward | status |" in md
    assert md.count("| ngram | ") == 2 and "| none | - |" in md and "★" in md and "best speedup" in md
    assert "| **total** |" in md and "| gen |" in md
    html = (out / "report.html").read_text()
    assert "<table>" in html and '<img alt="Speedup vs k" src="speedup_vs_k.png">' in html


def test_single_run_report_skips_what_has_no_data(store, tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store}/mlflow.db")
    exp = client.get_experiment_by_name("workbench-micro")
    run = client.search_runs([exp.experiment_id], "tags.`workbench.axis.drafter.k` = '2'")[0]
    for name in (run.info.run_name, run.info.run_id):
        res = runner.invoke(app, ["report", name, "--out", str(tmp_path / "r")])
        assert res.exit_code == 0, res.output
        md = (tmp_path / "r" / "report.md").read_text()
        assert md.startswith("# Report: run") and run.info.run_id in md
        assert "_Skipped: needs at least 2 speculative runs" in md and not (tmp_path / "r" / "speedup_vs_k.png").exists()
        assert (tmp_path / "r" / "acceptance_length_steps.png").stat().st_size > 5000
        assert "| ngram |" in md


def test_unknown_name_is_a_clear_error(store):
    res = runner.invoke(app, ["report", "no-such-sweep"])
    assert res.exit_code == 2
    assert "no sweep, study, run name or run id 'no-such-sweep'" in res.output and "rep-sweep" in res.output


def test_ui_print_url_compares_the_last_sweep(store):
    res = runner.invoke(app, ["ui", "--print-url", "--port", "5123"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "compare-runs" in x)
    assert line.startswith('http://127.0.0.1:5123/#/compare-runs?runs=["') and "&experiments=[" in line
    assert line.count(",") >= 2  # 3 child runs
    res = runner.invoke(app, ["ui", "--print-url", "--sweep", "nope"])
    assert res.exit_code == 2


def test_markdown_to_html_subset():
    h = markdown_to_html("# T\n\n- a `b`\n\n| x | y |\n|---|---:|\n| 1 | 2 |\n\n![p](p.png)\n", "t")
    assert "<h1>T</h1>" in h and "<li>a <code>b</code></li>" in h and '<td style="text-align:right">2</td>' in h
    assert '<img alt="p" src="p.png">' in h
