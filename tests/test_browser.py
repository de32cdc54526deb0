"""Headless Chromium opens the MLflow UI's comparison view of a micro sweep's child runs (`wb ui` URL).

Needs the `chromium` binary (Debian package `chromium`; .ci/run installs it); skipped without it.
"""

import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from workbench.cli import app

from conftest import mlflow_server_with_sweep

runner = CliRunner()
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium; .ci/run does)"),
]

SWEEP = [
    "sweep",
    "micro",
    "drafter=ngram",
    "k=2",
    "grpo.steps=1",
    "grpo.eval_every=0",
    "rollout.max_new_tokens=16",
    "grpo.group_size=2",
    "--name",
    "ui-sweep",
    "--quiet",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from mlflow_server_with_sweep(tmp_path_factory, "mlflow-ui", SWEEP)


def chromium(url: str, tmp, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        "--window-size=1400,1800",
        "--virtual-time-budget=15000",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_compare_view_of_the_sweep_renders_metrics(server):
    base, port, tmp = server
    res = runner.invoke(app, ["ui", "--print-url", "--port", str(port)])
    assert res.exit_code == 0, res.output
    url = next(x for x in res.output.splitlines() if "compare-runs" in x).strip()
    assert url.startswith(f"{base}/#/compare-runs?runs=[")
    out = chromium(url, tmp, "--dump-dom")
    dom = out.stdout
    if "Comparing 2 Runs" not in dom:  # debug aid: what did the page look like?
        chromium(url, tmp, f"--screenshot={tmp / 'compare.png'}")
    assert "Comparing 2 Runs" in dom, (
        f"compare view did not render (screenshot: {tmp / 'compare.png'}); stderr: {out.stderr[-500:]}"
    )
    assert "ui-sweep: baseline (drafter=none)" in dom and dom.count("ui-sweep: ") >= 2  # both child runs' names
    # Metric names are links in the (virtualised) metrics table, which renders only its first ~14 rows, so
    # these are names that sort early. gen_autoregressive/* is logged only by the paired speculative run:
    # seeing it proves the drafter run's own metrics rendered, not just the baseline's.
    assert "completions/mean_length" in dom and "gen_autoregressive/first" in dom
