"""benchmarks/metric_histories.py: two checkouts' micro histories compared, wall-clock metrics aside."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "metric_histories.py"


def _compare(tmp_path, a, b):
    for name, h in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(h))
    args = [sys.executable, str(SCRIPT), "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_equal_histories_pass(tmp_path):
    h = {"ngram+eval": [{"reward/mean": 0.5, "loss/policy": 0.1}, {"reward/mean": 0.6, "loss/policy": 0.2}]}
    res = _compare(tmp_path, h, h)
    assert res.returncode == 0 and "0 differing" in res.stdout


def test_one_float_apart_or_a_missing_step_fails_naming_it(tmp_path):
    a = {"dflash": [{"reward/mean": 0.5}, {"reward/mean": 0.6}]}
    res = _compare(tmp_path, a, {"dflash": [{"reward/mean": 0.5}, {"reward/mean": 0.6000001}]})
    assert res.returncode == 1 and "(1, 'reward/mean', 0.6, 0.6000001)" in res.stdout
    res = _compare(tmp_path, a, {"dflash": [{"reward/mean": 0.5}]})
    assert res.returncode == 1 and "(1, 'reward/mean', 0.6, None)" in res.stdout
