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


# ---------------------------------------------------------------- part 1: files heal or say how

FAST = (  # a micro run of seconds: one step, a small drafter init
    "--quiet",
    "grpo.steps=1",
    "grpo.eval_every=0",
    "tracking.enabled=false",
    "task.num_train=8",
    "task.num_eval=4",
    "drafter.init.steps=4",
    "drafter.init.num_prompts=16",
)


def _safetensors(path, n=64):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.arange(n, dtype=torch.float32)}, str(path))
    return path


def test_problem_names_what_is_wrong(tmp_path):
    import os

    from workbench.files import problem, seal

    good = _safetensors(tmp_path / "a.safetensors")
    assert problem(good) is None
    os.truncate(good, good.stat().st_size - 10)
    assert "truncated" in problem(good)[1]
    os.truncate(good, 5)
    assert "shorter than a safetensors header" in problem(good)[1]
    (tmp_path / "b.safetensors").write_bytes(os.urandom(64))
    assert problem(tmp_path / "b.safetensors") is not None
    (tmp_path / "c.json").write_text('{"a": ')
    assert "not valid JSON" in problem(tmp_path / "c.json")[1]
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n{"a": 2')
    assert "middle of a line" in problem(tmp_path / "d.jsonl")[1]
    (tmp_path / "d.jsonl").write_text('{"a": 1}\nnope\n')
    assert "line 2" in problem(tmp_path / "d.jsonl")[1]
    assert problem(tmp_path / "nothing")[1] == "it does not exist"
    folder = tmp_path / "sealed"
    folder.mkdir()
    _safetensors(folder / "model.safetensors")
    (folder / "x.bin").write_bytes(b"0123456789")
    seal(folder)
    assert problem(folder) is None
    (folder / "x.bin").write_bytes(b"0123456780")  # same size, other bytes: only the seal sees it
    assert problem(folder)[0] == folder / "x.bin" and "sha256 differs" in problem(folder)[1]
    (folder / "x.bin").unlink()
    assert problem(folder)[0] == folder / "x.bin"


def test_a_cache_entry_is_checked_after_writing(tmp_path):
    from workbench.cache import CacheError, atomic_dir

    with pytest.raises(CacheError, match="does not read back after writing"):
        with atomic_dir(tmp_path / "entry") as tmp:
            _safetensors(tmp / "model.safetensors")
            (tmp / "model.safetensors").write_bytes((tmp / "model.safetensors").read_bytes()[:-4])


def test_cached_rebuilds_a_damaged_entry_once_and_deletes_nothing_outside(tmp_path, capsys):
    from workbench.cache import CacheError, cached, remove
    from workbench.files import write_text

    entry, built = tmp_path / "cache" / "e.jsonl", []

    def build():
        built.append(1)
        write_text(entry, '{"a": 1}\n')

    assert cached(entry, build, "x", root=tmp_path / "cache") == entry and len(built) == 1
    assert cached(entry, build, "x", root=tmp_path / "cache") == entry and len(built) == 1  # sound: reused
    entry.write_text('{"a": 1}\n{"b"')
    cached(entry, build, "x", root=tmp_path / "cache")
    assert len(built) == 2 and entry.read_text() == '{"a": 1}\n'
    assert "x: the cached" in capsys.readouterr().err
    with pytest.raises(CacheError, match="refusing to delete"):
        remove(tmp_path / "elsewhere.txt", root=tmp_path / "cache")


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """A cache holding what micro runs with eagle3 and mtp heads build: the heads, task data, cost curves."""
    cache = tmp_path_factory.mktemp("built-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WB_CACHE_DIR", str(cache))
        for kind in ("eagle3", "mtp"):
            res = _wb("run", "micro", f"drafter.kind={kind}", *FAST)
            assert res.exit_code == 0, res.output
    return cache


@pytest.fixture()
def cache_copy(built_cache, tmp_path, monkeypatch):
    """A copy of ``built_cache`` as this test's cache, to damage."""
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(built_cache, cache)
    monkeypatch.setenv("WB_CACHE_DIR", str(cache))
    return cache


def _heals(kind: str, damaged):
    """A re-run with drafter ``kind`` exits 0, warns that ``damaged`` was rebuilt, and leaves it whole."""
    from workbench.files import problem

    res = _wb("run", "micro", f"drafter.kind={kind}", *FAST)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and "is damaged" in res.output and "rebuilding it" in res.output
    assert damaged.name in res.output
    assert problem(damaged) is None


@pytest.mark.parametrize("kind, damage", [("eagle3", "truncate"), ("mtp", "truncate"), ("eagle3", "bytes")])
def test_a_damaged_cached_head_is_rebuilt(cache_copy, kind, damage):
    [head] = cache_copy.glob(f"drafters/{kind}-*/model.safetensors")
    data = bytearray(head.read_bytes())
    if damage == "truncate":
        head.write_bytes(data[: len(data) // 2])
    else:  # same size, a header that still parses: the seal's sha256 finds it
        data[-100:] = bytes(100)
        head.write_bytes(data)
    _heals(kind, head)


@pytest.mark.parametrize("sealed", [True, False])
def test_a_truncated_cached_task_file_is_rebuilt(cache_copy, sealed):
    [data] = cache_copy.glob("data/arith_chain-*-train-n8-s0.jsonl")
    text = data.read_text()
    if not sealed:  # a file from before the seals: its last line cut short gives it away
        (data.parent / f".{data.name}.wb-seal.json").unlink()
    data.write_text(text[: len(text) // 2])
    _heals("eagle3", data)
    assert data.read_text() == text


@pytest.fixture()
def my_model(tmp_path):
    """A user's own checkpoint folder (a copy of the shipped micro preset)."""
    import shutil

    from workbench.models import resolve_model

    mine = tmp_path / "my-model"
    shutil.copytree(resolve_model("micro"), mine)
    return mine


@pytest.mark.parametrize(
    "name, why",
    [
        ("model.safetensors", "truncated"),
        ("tokenizer.json", "not valid JSON"),
        ("config.json", "not valid JSON"),
        ("generation_config.json", "not valid JSON"),  # transformers itself passes over this one
    ],
)
def test_a_users_damaged_checkpoint_is_one_line(my_model, name, why):
    f = my_model / name
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    res = _wb("run", "micro", f"model.target={my_model}", "drafter.kind=ngram", *FAST)
    line = _one_line_error(res, "model.target: cannot read", str(f), why, "replace it with a complete copy")
    assert f.is_file() and f.stat().st_size > 0  # a user's file is never deleted
    assert line


def test_a_users_damaged_eagle3_head_is_one_line(tmp_path):
    import json

    from drafters.eagle3_vllm import read_eagle3
    from workbench.files import DamagedFile

    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    w = _safetensors(head / "model.safetensors")
    w.write_bytes(w.read_bytes()[:-8])
    with pytest.raises(DamagedFile) as e:
        read_eagle3(head)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("drafter.model: cannot read") and str(w) in msg and "truncated" in msg


def test_a_damaged_verdicts_file_is_one_line(tmp_path):
    from workbench.files import DamagedFile
    from workbench.vllm.verdicts import load_verdicts

    for text, why in (('{"vllm==1 platform=cpu": {"passed"', "not valid JSON"), ("[1, 2]", "a JSON list")):
        user = tmp_path / "vllm-verdicts.json"
        user.write_text(text)
        with pytest.raises(DamagedFile) as e:
            load_verdicts(user)
        msg = str(e.value)
        assert "\n" not in msg and str(user) in msg and why in msg and "wb audit rollout.backend=vllm" in msg
        assert user.read_text() == text  # evidence: kept as it is, for the user to look at


@pytest.fixture()
def read_only(monkeypatch):
    """``read_only(folder)``: os.access says ``folder`` and what is in it cannot be written (root may write
    anywhere, so the cache's own check is what a read-only cache is made of here)."""
    import os

    real, ro = os.access, []

    def access(path, mode, *a, **k):
        inside = any(os.path.abspath(path).startswith(r) for r in ro)
        return False if inside and mode & os.W_OK else real(path, mode, *a, **k)

    monkeypatch.setattr(os, "access", access)
    return lambda folder: ro.append(os.path.abspath(folder))


def _files(folder):
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_writable_or_temp(tmp_path, read_only):
    from workbench.cache import writable_or_temp

    assert writable_or_temp(tmp_path / "a" / "hf_datasets") == tmp_path / "a" / "hf_datasets"
    read_only(tmp_path)
    alt = writable_or_temp(tmp_path / "a" / "hf_datasets")
    assert alt.name == "hf_datasets" and not alt.is_relative_to(tmp_path) and alt.is_dir()


def test_a_read_only_cache_that_holds_everything_runs(cache_copy, read_only, tmp_path):
    import json

    from workbench.tasks.loading import load_task_data

    read_only(cache_copy)
    before = _files(cache_copy)
    res = _wb("run", "micro", "drafter.kind=eagle3", *FAST)
    assert res.exit_code == 0, res.output
    mine = tmp_path / "mine.jsonl"  # a user's task file: datasets' lock files and arrow copy go elsewhere
    mine.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(6)))
    assert load_task_data("arith_chain", "train", 4, 0, path=str(mine))["answer"] == ["0", "2", "4", "6"]
    assert _files(cache_copy) == before  # nothing written into the cache


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


# `wb run --nproc 2` started from a folder with decoys trains there as one MLflow run:
# tests/test_distributed.py::test_wb_run_nproc_2_finishes_as_one_mlflow_run runs it from ``decoy_dir``.


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


def test_a_second_interrupt_during_a_sweeps_cleanup_still_marks_it_killed(store, monkeypatch):
    """Ctrl-C, then Ctrl-C again while the sweep reads its points back to close the parent, then a third
    during the parent's status write: the parent ends KILLED (it stayed RUNNING), the message says so."""
    import os
    import signal

    from workbench.sweep import run as R
    from workbench.sweep.store import SweepStore

    def interrupted(self):
        raise KeyboardInterrupt

    end_parent, ended = SweepStore.end_parent, []

    def end_parent_interrupted(self, status):
        os.kill(os.getpid(), signal.SIGINT)  # held until the status is written
        end_parent(self, status)
        ended.append(status)

    monkeypatch.setattr(R._Worker, "work", interrupted)
    monkeypatch.setattr(R._Worker, "outcomes", interrupted)  # the second Ctrl-C, in the cleanup
    monkeypatch.setattr(SweepStore, "end_parent", end_parent_interrupted)
    res = _wb("sweep", "micro", "k=2", "--name", "twice", "--quiet")
    assert res.exit_code == 130 and "sweep run marked KILLED" in res.output, res.output
    [parent] = store.search_runs(
        [e.experiment_id for e in store.search_experiments()], "tags.`workbench.sweep.role` = 'parent'"
    )
    assert parent.info.status == "KILLED" and ended == ["KILLED"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers put back


def test_interrupts_held_during_a_write_are_delivered_after_it():
    import os
    import signal

    from workbench.sweep.run import interrupts_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("written")
    with interrupts_deferred(deliver=False):  # already the answer to an interrupt: nothing raised after
        os.kill(os.getpid(), signal.SIGINT)
        done.append("again")
    assert done == ["written", "again"]


# ---------------------------------------------------------------- smaller: names, the UI's host


def test_quote_spells_every_name_mlflow_can_search(store):
    from workbench.runs import RunReader, UnsearchableName, quote

    exp = store.create_experiment("q")
    names = ["plain", "it's", 'say "hi"', "back\\slash", "a\\'b", "x''y"]
    for n in names:
        store.create_run(exp, tags={"t": n})
    reader = RunReader(client=store)
    for n in names:  # found exactly, in a filter with another clause after the value (where a stray quote bites)
        hits = reader.search(f"tags.t = {quote(n)} and attributes.status != 'KILLED'", [exp])
        assert [h.data.tags["t"] for h in hits] == [n], n
    for bad in ("a\\", "both ' and \""):
        with pytest.raises(UnsearchableName, match="cannot be looked up in MLflow"):
            quote(bad)


def test_report_and_sweep_of_an_unsearchable_name_are_one_line(swept):
    _one_line_error(_wb("report", "a\\"), "cannot be looked up in MLflow", "backslash")
    _one_line_error(_wb("sweep", "micro", "k=2", "--name", "a\\"), "--name", "cannot be looked up in MLflow")


def test_ui_on_the_network_says_so_and_prints_its_host(store):
    import socket

    res = _wb("ui", "--print-url", "--host", "0.0.0.0", "--port", "5123")
    assert res.exit_code == 0, res.output
    assert "warning: --host 0.0.0.0 listens beyond this machine" in res.output and "no login" in res.output
    assert f"http://{socket.gethostname()}:5123" in res.output and "http://127.0.0.1" not in res.output
    res = _wb("ui", "--print-url", "--port", "5123")  # loopback: no warning
    assert res.exit_code == 0 and "warning" not in res.output and "http://127.0.0.1:5123" in res.output
