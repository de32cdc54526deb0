"""benchmarks/profile_verify.py (one decode forward against one verification forward, op by op) and
benchmarks/membound_cost.py --prepack (the packed target timed beside the unpacked one)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_profile_verify_writes_a_cell_per_forward_shape(tmp_path):
    out = tmp_path / "pv"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_verify.py"), "--target", "tiny", "--rows", "1,2"]
        + ["--k", "2", "--repeats", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    cells = json.loads(out.with_suffix(".json").read_text())["cells"]
    assert list(cells) == ["1x1", "1x3", "2x1", "2x3"]  # rows x tokens: decode, then the k = 2 verification
    for c in cells.values():
        gemm_ms = sum(ms for ms, _ in c["gemm"].values())
        assert c["wall_ms"] > 0 and gemm_ms > 0
        assert all(
            name.split(" ")[0] in ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::linear")
            for name in c["gemm"]
        )
    md = out.with_suffix(".md").read_text()
    assert "packed weights" in md and "| 2x3 |" in md and "## GEMMs by input shape" in md


def test_membound_cost_prepack_times_both_copies_in_the_same_rounds(tmp_path):
    out = tmp_path / "cost.json"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "membound_cost.py"),
            "--target",
            "tiny",
            "--draft",
            "",
            "--heads",
            "",
        ]
        + ["--prepack", "--rows", "1,2", "--tokens", "1,2", "--rounds", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    fwd = json.loads(out.read_text())["forward_s"]
    assert set(fwd) == {"target", "target_packed"}
    for name in fwd:  # every cell timed once per round in both copies: the per-round ratios are paired
        assert set(fwd[name]) == {"1x1", "1x2", "2x1", "2x2"} and all(len(v) == 2 for v in fwd[name].values())
    assert "Packed weights (the default on a CPU)" in res.stdout and "packed / unpacked t=2" in res.stdout


def test_membound_cost_compiled_copy_is_timed_in_the_same_rounds(tmp_path):
    """--compiled: a third copy, compiled with packed weights, timed cell by cell beside the eager ones."""
    out = tmp_path / "cost.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "membound_cost.py"), "--target", "tiny", "--draft", "", "--heads"]
        + ["", "--prepack", "--compiled", "--rows", "2", "--tokens", "1", "--rounds", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    fwd = json.loads(out.read_text())["forward_s"]
    assert set(fwd) == {"target", "target_packed", "target_compiled"}
    assert all(set(cells) == {"2x1"} and len(cells["2x1"]) == 2 for cells in fwd.values())
    assert "Compiled, packed weights" in res.stdout and "compiled / eager packed t=1" in res.stdout


def test_membound_cost_compiled_needs_the_packed_copy():
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "membound_cost.py"), "--target", "tiny", "--compiled"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2 and "--prepack" in res.stderr
