"""benchmarks/profile_verify.py: one decode forward against one verification forward, op by op."""

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
