"""benchmarks/gpu.sh: its CPU-sized smoke mode runs end to end and writes every file (no GPU needed)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # builds two Qwen3 checkpoints and benchmarks them through benchmarks/gpu.sh
def test_gpu_script_smoke_writes_json_and_markdown(tmp_path):
    # one set, the Qwen3 checkpoint pair (the GPU run's own code path: `wb models init`, a checkpoint folder,
    # Qwen3's real vocabulary); the smoke default adds `micro`, the same bench through preset names
    env = os.environ | {
        "GPU_BENCH_OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "GPU_BENCH_MODELS": str(tmp_path / "models"),
        "GPU_BENCH_SETS": "qwen3-tiny",
    }
    env.pop("WB", None)
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--smoke"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for name in ("gpu-cpu-qwen3-tiny",):
        r = json.loads((tmp_path / f"{name}.json").read_text())
        assert set(r) >= {"ar", "assisted", "model", "meta", "command"}
        assert [x["batch"] for x in r["ar"]] == [1, 2]
        assert all(
            {"ours_tok_s", "hf_generate_tok_s", "hf_static_tok_s", "ratio", "ours_peak_mib"} <= set(x) for x in r["ar"]
        )
        assert {(x["drafter"], x["k"]) for x in r["model"]["rows"]} == {
            (d, k) for d in ("draft_model", "eagle3") for k in (1, 2)
        }
        assert r["meta"]["dtype"] == "bfloat16" and r["meta"]["device"] == "cpu"
        assert "ours / best transformers" in (tmp_path / f"{name}.md").read_text()
    qwen3 = json.loads((tmp_path / "gpu-cpu-qwen3-tiny.json").read_text())
    assert "qwen3-tiny" in qwen3["meta"]["target"] and "--target" in qwen3["command"]
    for name in ("qwen3-tiny", "qwen3-tiny-draft"):  # Qwen3's real vocabulary, small layers (issue #24)
        assert json.loads((tmp_path / "models" / name / "config.json").read_text())["vocab_size"] == 151936
    for name in ("gpu-cpu-qwen3-tiny",):  # the engine checks ran (skipped on the CPU: nothing to prove)
        checks = json.loads((tmp_path / f"{name}-engine-checks.json").read_text())
        assert [r["engine"] for r in checks["results"]] == ["autoregressive", "draft_model k=3"]
        assert all("skipped" in r["checks"] and r["tokens"] == 2 * 8 for r in checks["results"])
    summary = (tmp_path / "gpu-cpu-summary.md").read_text()
    assert "## gpu-cpu-qwen3-tiny" in summary and "## gpu-cpu-micro" not in summary and "eagle3 best k" in summary


def test_gpu_script_rejects_unknown_arguments():
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--fast"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "--smoke" in res.stderr


def test_cuda_parity_script_runs_its_checks_on_the_cpu(tmp_path):
    """benchmarks/cuda_parity.py (the GPU lease's exactness checks) on the CPU at a small n: every
    asserted check passes, the law section ran for each drafter, the bf16 rows are reported."""
    out = tmp_path / "parity.json"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "cuda_parity.py"),
            "--device",
            "cpu",
            "--n",
            "2000",
            "--cases",
            "qwen3",
            "--sections",
            "law,families",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert all(r["ok"] is not False for r in rows)
    laws = [r["check"] for r in rows if r["check"].startswith("law ")]
    assert {c.split()[1] for c in laws} == {"draft_model", "ngram", "suffix", "mtp", "eagle3"}
    assert sum(r["ok"] is None and r["check"].startswith("bf16 qwen3") for r in rows) == 4
    assert any("plain greedy == transformers generate()" in r["check"] and r["ok"] for r in rows)


def test_gpu_lease_script_rejects_unknown_phases():
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_lease.sh"), "checks"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"GPU_LEASE_SMOKE": "1", "OUT": "/tmp/wb-lease-test"},
    )
    assert res.returncode == 2 and "parity, engine, bench" in res.stderr


def test_gpu_script_fails_loudly_on_a_skipped_cuda_graph():
    """graphs.py promises that gpu.sh's --cuda-graphs runs set TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1."""
    text = (ROOT / "benchmarks" / "gpu.sh").read_text()
    assert re.search(r'TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 run_set "\$\{OURS\[@\]\}"', text)


def test_gpu_script_qwen3_sets_have_the_real_vocabulary():
    """A 512-id vocabulary hid the cost of float32 probabilities, top-p sorts and q tensors over
    Qwen3's 151936 ids: both qwen3 sets (GPU and smoke) build their checkpoints at that size."""
    text = (ROOT / "benchmarks" / "gpu.sh").read_text()
    assert "QWEN3_VOCAB=151936" in text
    inits = [line for line in text.splitlines() if line.strip().startswith("init_qwen3 qwen3")]
    assert len(inits) == 4 and all('--vocab-size "$QWEN3_VOCAB"' in line for line in inits)
