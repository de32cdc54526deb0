"""vLLM-CPU's library preload (workbench/vllm/runtime/preload.py): when `wb` re-executes itself with
tcmalloc and Intel OpenMP in LD_PRELOAD, and that the loader then really maps them."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from workbench.vllm.runtime import preload as P

LIBS = P.Preload(("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/venv/lib/libiomp5.so"), ())


def test_ld_preload_prepends_and_keeps_what_was_there():
    assert LIBS.ld_preload("") == "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/venv/lib/libiomp5.so"
    assert LIBS.ld_preload("/x/libfoo.so") == LIBS.ld_preload("") + ":/x/libfoo.so"


def test_ld_preload_does_not_add_a_library_already_named():
    assert LIBS.ld_preload("/opt/libiomp5.so") == "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/opt/libiomp5.so"
    full = LIBS.ld_preload("")
    assert LIBS.ld_preload(full) == full


@pytest.mark.parametrize(
    "argv,expect",
    [
        (["run", "quickstart", "rollout.backend=vllm"], True),
        (["bench", "membound", "--vllm", "draft_model", "--only-vllm"], True),
        (["bench", "membound", "--vllm=ngram"], True),
        (["sweep", "quickstart", "rollout.backend=workbench,vllm"], True),
        (["run", "quickstart", "drafter.kind=ngram"], False),
        (["bench", "membound", "--batch-sizes", "1,4"], False),
        (["run", "quickstart", "rollout.backend=vllm", "rollout.backend=workbench"], False),  # the last one wins
    ],
)
def test_starts_vllm_from_the_command_line(argv, expect):
    assert P.starts_vllm(argv) is expect


def test_starts_vllm_from_an_experiment_file(tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text("name: mine\nrollout:\n  backend: vllm\n  temperature: 1.0\n")
    assert P.starts_vllm(["run", str(spec)])
    spec.write_text("name: mine\nrollout:\n  backend: workbench\n")
    assert not P.starts_vllm(["run", str(spec)])
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00")
    assert not P.starts_vllm(["run", str(tmp_path / "binary.yaml")])  # not text: not a spec, and no error


def _would_preload(monkeypatch):
    """plan() on a machine with vLLM-CPU and both libraries, nothing preloaded yet: argv -> re-executes?"""
    monkeypatch.setattr(P, "wanted", lambda machine=None: LIBS)
    monkeypatch.setattr(P, "vllm_cpu_installed", lambda: True)
    return lambda argv: P.plan(argv, env={}) == LIBS


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "quickstart", "tracking.run_name=my-vllm-test"],
        ["sweep", "quickstart", "k=1..3", "--name", "vllm-vs-ours"],
        ["report", "my-vllm-sweep"],
        ["run", "quickstart", "drafter.init.data=/data/vllm_prompts.jsonl"],
    ],
)
def test_a_name_containing_vllm_does_not_preload(monkeypatch, argv):
    """Names are not commands: only what starts vLLM re-executes the process."""
    assert not _would_preload(monkeypatch)(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "quickstart", "rollout.backend=vllm"],
        ["run", "rollout.backend=vllm"],
        ["sweep", "quickstart", "rollout.backend=workbench,vllm"],
        ["bench", "membound", "--vllm", "draft_model"],
        ["bench", "membound", "--vllm", "ngram", "--only-vllm"],
    ],
)
def test_a_command_that_starts_vllm_preloads(monkeypatch, argv):
    assert _would_preload(monkeypatch)(argv)


def test_a_spec_decides_by_its_backend_not_its_file_name(monkeypatch, tmp_path):
    would = _would_preload(monkeypatch)
    notes = tmp_path / "vllm_notes.yaml"
    notes.write_text("name: notes\nrollout:\n  backend: workbench\n")
    assert not would(["run", str(notes)])
    assert not would(["run", str(tmp_path / "vllm_gone.yaml")])  # no such file: nothing says vLLM
    spec = tmp_path / "mine.yaml"
    spec.write_text("name: mine\nrollout:\n  backend: vllm\n  temperature: 1.0\n")
    assert would(["run", str(spec)])
    assert not would(["run", str(spec), "rollout.backend=workbench"])  # an override wins over the spec


def test_a_spec_name_is_read_from_the_experiments_wb_loads(monkeypatch, tmp_path):
    """``wb run NAME`` loads experiments/NAME.yaml beside the package, whatever the working directory."""
    (tmp_path / "mine.yaml").write_text("name: mine\nrollout:\n  backend: vllm\n")
    monkeypatch.setattr(P, "EXPERIMENTS_DIR", tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    assert P.starts_vllm(["run", "mine"])
    assert not P.starts_vllm(["run", "quickstart"])


def test_reexec_runs_the_running_script_again_not_python_m(monkeypatch, tmp_path):
    """The `wb` script re-executes itself by its absolute path: ``python -m workbench.cli`` would put the
    working directory first on sys.path and, from another checkout's root, run that checkout's code."""
    script = tmp_path / "bin" / "wb"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env python\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(P, "plan", lambda argv: LIBS)
    monkeypatch.setattr(sys, "argv", [os.path.join("bin", "wb"), "run", "rollout.backend=vllm"])
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # a script has no __spec__
    calls = []

    def execve(path, args, env):
        calls.append((path, args, env))
        raise SystemExit(0)

    monkeypatch.setattr(P.os, "execve", execve)
    with pytest.raises(SystemExit):
        P.reexec_if_needed()
    [(path, args, env)] = calls
    assert path == sys.executable and args[0] == sys.executable
    assert "-m" not in args and args[-3:] == [str(script), "run", "rollout.backend=vllm"]
    assert env["WB_PRELOADED"] == "1" and env["LD_PRELOAD"].startswith(LIBS.ld_preload(""))


def test_reexec_argv_for_each_way_of_starting(tmp_path, monkeypatch):
    exe = "/venv/bin/python"
    (tmp_path / "wb").write_text("")
    monkeypatch.chdir(tmp_path)
    # a script (the installed wb): the file by its absolute path
    assert P.reexec_argv(["run"], "wb", executable=exe) == [exe, str(tmp_path / "wb"), "run"]
    # python -m workbench.cli: the same module again, from this workbench's folder, not the working directory
    cmd = P.reexec_argv(["run"], "/src/workbench/cli/__main__.py", "workbench.cli.__main__", exe)
    assert cmd[:2] == [exe, "-c"] and cmd[3:] == ["run"] and "-m" not in cmd
    assert "run_module('workbench.cli'" in cmd[2] and repr(str(Path(P.__file__).resolve().parents[3])) in cmd[2]
    # -c or an embedding: wb's entry point, the working directory taken off sys.path
    cmd = P.reexec_argv(["run"], "-c", executable=exe, options=("-s",))
    assert cmd[:3] == [exe, "-s", "-c"] and cmd[4:] == ["run"]
    assert "del sys.path[0]" in cmd[3] and "from workbench.wb import main" in cmd[3]


def test_interpreter_options_keep_where_imports_come_from():
    def flags(isolated=0, ignore_environment=0, no_user_site=0, safe_path=False):
        return types.SimpleNamespace(
            isolated=isolated, ignore_environment=ignore_environment, no_user_site=no_user_site, safe_path=safe_path
        )

    assert P.interpreter_options(flags(isolated=1, ignore_environment=1)) == ("-I",)
    assert P.interpreter_options(flags(ignore_environment=1, no_user_site=1, safe_path=True)) == ("-E", "-s", "-P")
    assert P.interpreter_options(flags()) == ()


def test_plan_is_off_when_asked_done_or_not_a_vllm_command(monkeypatch):
    monkeypatch.setattr(P, "wanted", lambda machine=None: LIBS)
    monkeypatch.setattr(P, "vllm_cpu_installed", lambda: True)
    argv = ["bench", "membound", "--vllm", "ngram"]
    assert P.plan(argv, env={}) == LIBS
    assert P.plan(argv, env={"WB_PRELOAD": "0"}) is None
    assert P.plan(argv, env={"WB_PRELOADED": "1"}) is None  # the re-executed process never re-executes
    assert P.plan(["run", "quickstart"], env={}) is None  # auto: only commands that start vLLM
    assert P.plan(["run", "quickstart"], env={"WB_PRELOAD": "1"}) == LIBS  # forced: every command
    assert P.plan(argv, env={"LD_PRELOAD": LIBS.ld_preload("")}) is None  # already preloaded


def test_plan_skips_a_cuda_build(monkeypatch):
    monkeypatch.setattr(P, "wanted", lambda machine=None: LIBS)
    monkeypatch.setattr(P, "vllm_cpu_installed", lambda: False)  # vLLM for CUDA needs no preload
    assert P.plan(["bench", "membound", "--vllm", "ngram"], env={}) is None


def test_wanted_asks_intel_openmp_only_on_x86(monkeypatch):
    monkeypatch.setattr(P, "find_tcmalloc", lambda: "/lib/libtcmalloc_minimal.so.4")
    monkeypatch.setattr(P, "find_iomp", lambda: None)
    assert P.wanted("aarch64") == P.Preload(("/lib/libtcmalloc_minimal.so.4",), ())
    assert P.wanted("x86_64") == P.Preload(("/lib/libtcmalloc_minimal.so.4",), (P.IOMP_HINT,))


def test_preloaded_names_the_files():
    assert (
        P.preloaded({"LD_PRELOAD": "/a/libtcmalloc_minimal.so.4:/b/libiomp5.so"})
        == "libtcmalloc_minimal.so.4:libiomp5.so"
    )
    assert P.preloaded({}) == ""


def test_reexec_maps_the_libraries_into_the_new_process():
    """Through the real loader: the re-executed process has both libraries mapped (not only named)."""
    want = P.wanted()
    if want.missing:
        pytest.skip(f"not installed here: {', '.join(want.missing)}")
    code = (
        "import sys; from workbench.vllm.runtime.preload import reexec_if_needed; "
        "reexec_if_needed(['--vllm'], program=('-c', 'print(open(\"/proc/self/maps\").read())'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("WB_PRELOAD", "WB_PRELOADED", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    if not P.vllm_cpu_installed():
        assert "libtcmalloc" not in out.stdout  # auto: no vLLM-CPU, no preload
        return
    assert "preloading" in out.stderr
    for lib in want.libs:
        assert os.path.basename(lib) in out.stdout


def test_installed_wb_reexecutes_and_runs_the_command():
    """The `wb` script (workbench.wb:main) decides before importing torch, re-executes, and the command runs."""
    import shutil

    want, wb = P.wanted(), shutil.which("wb")
    if want.missing or wb is None:
        pytest.skip(f"not here: {', '.join(want.missing) or 'the wb script'}")
    env = {k: v for k, v in os.environ.items() if k not in ("WB_PRELOADED", "LD_PRELOAD")} | {"WB_PRELOAD": "1"}
    out = subprocess.run([wb, "models", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "preloading" in out.stderr and "Usage" in out.stdout
    off = subprocess.run(
        [wb, "models", "--help"], capture_output=True, text=True, env=env | {"WB_PRELOAD": "0"}, timeout=120
    )
    assert off.returncode == 0 and "preloading" not in off.stderr


def test_installed_wb_run_from_another_checkout_runs_the_installed_code(tmp_path):
    """From the root of another checkout (its own ``workbench/`` in the working directory) the
    re-executed `wb` still runs the installed package, as the first process did."""
    import shutil

    want, wb = P.wanted(), shutil.which("wb")
    if want.missing or wb is None:
        pytest.skip(f"not here: {', '.join(want.missing) or 'the wb script'}")
    (tmp_path / "workbench" / "cli").mkdir(parents=True)
    (tmp_path / "workbench" / "__init__.py").write_text("raise SystemExit('the other checkout ran')\n")
    (tmp_path / "workbench" / "cli" / "__init__.py").write_text("")
    (tmp_path / "workbench" / "cli" / "__main__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("WB_PRELOADED", "LD_PRELOAD", "PYTHONPATH")}
    out = subprocess.run(
        [wb, "models", "--help"],
        capture_output=True,
        text=True,
        env=env | {"WB_PRELOAD": "1"},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert "the other checkout ran" not in out.stderr
    assert out.returncode == 0, out.stderr
    assert "preloading" in out.stderr and "Usage" in out.stdout


def test_a_bad_switch_is_refused_naming_the_variable():
    assert P.preload_switch(" Off ") == "0" and P.preload_switch("yes") == "1" and P.preload_switch("auto") == "auto"
    with pytest.raises(ValueError, match=r"WB_PRELOAD='sometimes': use auto .* 1 .* or 0"):
        P.plan(["bench", "--vllm", "ngram"], env={"WB_PRELOAD": "sometimes"})


def test_wb_exits_2_on_a_bad_switch():
    code = "from workbench.vllm.runtime.preload import reexec_if_needed; reexec_if_needed(['models'])"
    env = {k: v for k, v in os.environ.items() if k != "WB_PRELOADED"} | {"WB_PRELOAD": "sometimes"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "WB_PRELOAD='sometimes'" in out.stderr and "Traceback" not in out.stderr
