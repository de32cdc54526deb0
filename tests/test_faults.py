"""Fault injection (#59): each test breaks one thing the user does not type (a file, a store, a folder, a
signal, the working directory) and checks the workbench either heals or answers with one line on stderr
naming what is wrong and the fix, exit code 2, no traceback. docs/testing.md lists what is covered."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from workbench.cli import app

runner = CliRunner()


def _wb(*args: str, **kw):
    return runner.invoke(app, list(args), catch_exceptions=False, **kw)


def _one_line_error(res, *needles: str) -> str:
    """The result is rc 2 with a single 'error: ...' line naming each of ``needles``; returns that line."""
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ---------------------------------------------------------------- part 3: messages are text


@pytest.mark.parametrize("arg", ["[/]", "[bold]x[/]y[/]", "a[red]"])
def test_markup_in_an_argument_prints_as_text(arg):
    line = _one_line_error(_wb("run", "--dry-run", arg), arg)
    assert "not found" in line


def test_yaml_error_keeps_line_column_and_expectation(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("drafter:\n  kind: ngram\nrollout: [1, 2\ntask: x\n")
    line = _one_line_error(_wb("run", "--dry-run", str(bad)), "bad.yaml", "line 4, column 5", "expected ','")
    assert "'task: x'" in line and "while parsing a flow sequence from line 3" in line


def test_yaml_scanner_error_with_brackets_in_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("drafter:\n  k: 3\n   x: [bold]\n")
    _one_line_error(_wb("run", "--dry-run", str(bad)), "line 3, column 5", "'x: [bold]'", "mapping values")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_spec_file_is_refused(tmp_path, text):
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    _one_line_error(_wb("run", "--dry-run", str(empty)), "empty.yaml is empty", "quickstart")


def test_unreadable_spec_file_is_one_line(tmp_path):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    _one_line_error(_wb("run", "--dry-run", str(binary)), "bin.yaml", "cannot be read")


@pytest.mark.parametrize(
    "override, field",
    [
        ("drafter.k=true", "drafter.k"),
        ("grpo.steps=true", "grpo.steps"),
        ("rollout.temperature=false", "rollout.temperature"),
        ("task.num_eval=false", "task.num_eval"),
    ],
)
def test_a_bool_is_not_a_number(override, field):
    res = _wb("run", "--dry-run", "micro", override)
    assert res.exit_code == 2, res.output
    assert f"{field}: expected a number, got the boolean" in res.output
    assert "Traceback" not in res.output


def test_numbers_and_real_bools_stay_accepted():
    from workbench.specs import load_spec

    s = load_spec(
        "micro", ["grpo.lr=1e-5", "rollout.temperature=1", "task.chat_template=false", "rollout.compile=false"]
    )
    assert s.grpo.lr == 1e-5 and s.rollout.temperature == 1.0 and s.task.chat_template is False
    assert load_spec("micro", ["drafter.k=3"]).drafter.k == 3


# ---------------------------------------------------------------- part 4: no code from the working directory

DECOYS = ("mlflow", "workbench", "torch")


@pytest.fixture()
def decoy_dir(tmp_path):
    """A folder holding decoy ``mlflow/``, ``workbench/`` (with ``cli/``) and ``torch/`` packages, each of which
    leaves a marker file and exits when imported."""
    here = tmp_path / "decoys"
    for name in DECOYS:
        (here / name).mkdir(parents=True)
        marker = tmp_path / f"{name}.ran"
        (here / name / "__init__.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nraise SystemExit('decoy {name} ran')\n"
        )
    (here / "workbench" / "cli").mkdir()
    (here / "workbench" / "cli" / "__init__.py").write_text("")
    (here / "workbench" / "cli" / "__main__.py").write_text("")
    return here


def _no_decoy_ran(decoy_dir, out: str = ""):
    ran = [p.name for p in decoy_dir.parent.glob("*.ran")]
    assert not ran and "decoy" not in out, (ran, out[-2000:])


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k not in ("WB_PRELOADED", "LD_PRELOAD")} | {"WB_PRELOAD": "0"}


def test_wb_ui_runs_the_installed_mlflow_not_a_decoy(decoy_dir):
    import subprocess

    from workbench.isolated import python_module
    from workbench.ui import wait_ready

    from conftest import free_port

    port = free_port()
    cmd = python_module("workbench.cli", "ui", "--port", str(port), "--backend-store-uri", "sqlite:///ui.db")
    assert "-m" not in cmd
    proc = subprocess.Popen(cmd, cwd=decoy_dir, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}", 180, proc)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
    _no_decoy_ran(decoy_dir, out)
    assert ready, out[-3000:]
    assert (decoy_dir / "ui.db").is_file()  # a relative store still means the user's folder


def test_server_command_and_store_paths_do_not_depend_on_the_folder(tmp_path):
    from workbench.ui import absolute_store, server_command

    cmd = server_command("sqlite:///mlflow.db", "127.0.0.1", 5000)
    assert "-m" not in cmd and cmd[1] == "-c" and "run_module('mlflow'" in cmd[2]
    assert absolute_store("sqlite:///mlflow.db", str(tmp_path)) == f"sqlite:///{tmp_path}/mlflow.db"
    assert absolute_store("sqlite:////abs/m.db", str(tmp_path)) == "sqlite:////abs/m.db"
    assert absolute_store("mlruns", str(tmp_path)) == str(tmp_path / "mlruns")
    assert absolute_store("http://host:5000", str(tmp_path)) == "http://host:5000"


def test_nproc_launcher_and_ranks_run_this_workbench_not_a_decoy(decoy_dir):
    import subprocess

    from workbench.cli.run import launch_command

    cmd = launch_command(2, ["--help"])
    assert "-m" not in cmd and "--no-python" in cmd
    r = subprocess.run(cmd, cwd=decoy_dir, env=_env(), capture_output=True, text=True, timeout=300)
    _no_decoy_ran(decoy_dir, r.stdout + r.stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("--nproc") >= 2  # both ranks printed wb run's help


def test_preload_reexec_of_python_m_runs_this_workbench_not_a_decoy(decoy_dir):
    import subprocess

    from workbench.vllm.runtime import preload as P

    cmd = P.reexec_argv(["models", "--help"], "/x/workbench/cli/__main__.py", "workbench.cli.__main__")
    assert "-m" not in cmd
    r = subprocess.run(cmd, cwd=decoy_dir, env=_env(), capture_output=True, text=True, timeout=300)
    _no_decoy_ran(decoy_dir, r.stdout + r.stderr)
    assert r.returncode == 0 and "Usage" in r.stdout, r.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_wb_run_nproc_2_from_a_folder_with_decoys(decoy_dir):
    import subprocess

    pytest.importorskip("deepspeed")
    from workbench.isolated import python_module

    db = f"sqlite:///{decoy_dir / 'mlflow.db'}"
    args = ["run", "micro", "--nproc", "2", "--quiet", "grpo.backend=deepspeed", "drafter.kind=ngram"]
    cmd = python_module("workbench.cli", *args, f"tracking.tracking_uri={db}", same_workbench=True)
    r = subprocess.run(cmd, cwd=decoy_dir, env=_env(), capture_output=True, text=True, timeout=800)
    _no_decoy_ran(decoy_dir, r.stdout + r.stderr)
    assert r.returncode == 0, r.stderr[-3000:]


# ---------------------------------------------------------------- part 5: environment faults


@pytest.fixture()
def no_models(monkeypatch):
    """build_parts refused: a store fault must be reported before any model is built."""
    import workbench.experiment as E

    def refuse(*a, **k):
        raise AssertionError("models were built before the store was checked")

    monkeypatch.setattr(E, "build_parts", refuse)


@pytest.mark.parametrize("kind", ["bogus", "random-bytes"])
def test_a_broken_store_is_one_line_before_the_models(tmp_path, monkeypatch, no_models, kind):
    monkeypatch.chdir(tmp_path)
    if kind == "bogus":
        uri = "bogus://nowhere"
    else:
        (tmp_path / "rand.db").write_bytes(bytes(range(256)) * 16)
        uri = f"sqlite:///{tmp_path / 'rand.db'}"
    res = _wb("run", "micro", "--quiet", f"tracking.tracking_uri={uri}")
    _one_line_error(res, f"MLflow store {uri} cannot be used", "tracking.tracking_uri")


def test_wb_cache_dir_that_is_a_file(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    for where in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        monkeypatch.setenv("WB_CACHE_DIR", str(where))
        from workbench.cache import CacheError, cache_dir

        with pytest.raises(CacheError, match="is not a folder"):
            cache_dir()
        res = _wb("run", "micro", "--quiet", "tracking.enabled=false", "task.num_train=4")
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output


@pytest.fixture()
def swept(store):
    from test_report import fake_sweep

    fake_sweep(store, "fs", [{"kind": "ngram", "k": 2, "gen_s": 1.0, "reward": 0.5, "ratios": [1.5, 1.6, 1.4]}])
    return store


def test_report_out_that_cannot_be_written(swept, tmp_path):
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        _one_line_error(_wb("report", "fs", "--out", str(out)), "cannot write the report", "--out")


def test_report_on_a_missing_db_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _one_line_error(_wb("report", "fs"), "no MLflow store at mlflow.db")
    _one_line_error(_wb("report", "fs", "--tracking-uri", f"sqlite:///{tmp_path}/x.db"), "x.db")
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- part 6: signals


def test_interrupt_before_a_run_opens_says_no_run_was_marked(store, monkeypatch):
    import workbench.experiment as E

    def interrupted(*a, **k):  # SIGTERM during drafter init: wb's handler raises KeyboardInterrupt
        raise KeyboardInterrupt("signal 15")

    monkeypatch.setattr(E, "build_parts", interrupted)
    res = _wb("run", "micro", "--quiet")
    assert res.exit_code == 130
    assert "before an MLflow run was opened" in res.output and "marked KILLED" not in res.output
    assert not store.search_runs([e.experiment_id for e in store.search_experiments()])


def test_interrupt_during_a_run_names_the_run_marked_killed(store, monkeypatch):
    from workbench.grpo import trainer as trainer_mod

    def interrupted(self, step, on_stage=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_mod.GRPOTrainer, "step", interrupted)
    res = _wb("run", "micro", "--quiet", "grpo.eval_every=0")
    assert res.exit_code == 130
    [run] = store.search_runs([e.experiment_id for e in store.search_experiments()])
    assert run.info.status == "KILLED" and f"MLflow run {run.info.run_id} marked KILLED" in res.output
