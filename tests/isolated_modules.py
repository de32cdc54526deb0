"""A pytest plugin (tests/conftest.py loads it): test modules marked ``vllm`` run in a pytest subprocess
of their own, one per module, so importing vLLM never changes the process the rest of the suite runs in.

Importing vLLM sets process-wide state (threads, environment variables, torch settings, a multiprocessing
start method); before this plugin the suite stayed correct only because alphabetical order ran
tests/test_vllm.py last. Now the order does not matter, and ``python -m pytest -q`` still runs every test.

How: the first selected item of a marked module starts ``python -m pytest <its selected node ids>`` (same
rootdir and ini, ``--basetemp`` inside this session's) with :data:`CHILD_ENV` naming a file; the child
writes each test report there (pytest's own report serialisation, as pytest-xdist uses); the parent then
replays each item's setup/call/teardown reports, so pass, fail (with the child's traceback), skip (with
its reason, for ``-rs``), ``--durations``, ``-x`` and ``--lf`` behave as for any other test. A test the
child did not report (it crashed or ran past its time) fails with the tail of the child's output.

Per-test timeouts (pytest-timeout) apply inside the child; the parent gives the whole child the sum of
its tests' timeouts. ``WB_TEST_IN_PROCESS=1`` runs marked modules in this process instead (``--pdb``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _pytest.reports import TestReport

MARKERS = ("vllm",)  # modules whose tests carry one of these run in a subprocess
CHILD_ENV = "WB_TEST_ISOLATED_REPORTS"  # set in a child: the JSON-lines file its test reports go to
IN_PROCESS_ENV = "WB_TEST_IN_PROCESS"
DEFAULT_TIMEOUT_S = 600.0  # per test, when pytest-timeout gives none
SLACK_S = 120.0  # the child's start-up and collection, on top of its tests' timeouts

_TIMEOUT_KEY = pytest.StashKey[float]()
_config: pytest.Config | None = None
_results: dict[Path, dict[str, list[TestReport]]] = {}
_output: dict[Path, str] = {}


def _in_child() -> bool:
    return bool(os.environ.get(CHILD_ENV))


def _isolated(item: pytest.Item) -> bool:
    return not _in_child() and not os.environ.get(IN_PROCESS_ENV) and any(item.get_closest_marker(m) for m in MARKERS)


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # In the parent an isolated item only replays reports: its timeout is enforced in the child, and the
    # child as a whole gets the sum of its tests' timeouts (read here, before timeout(0) shadows them).
    for item in items:
        if _isolated(item):
            item.stash[_TIMEOUT_KEY] = _timeout_s(item)
            if config.pluginmanager.hasplugin("timeout"):
                item.add_marker(pytest.mark.timeout(0), append=False)


def pytest_runtest_logreport(report: TestReport) -> None:
    """In a child: append every test report to the parent's file."""
    path = os.environ.get(CHILD_ENV)
    if path and _config is not None:
        data = _config.hook.pytest_report_to_serializable(config=_config, report=report)
        with open(path, "a") as f:
            f.write(json.dumps(data) + "\n")


def _timeout_s(item: pytest.Item) -> float:
    """The item's pytest-timeout (marker, --timeout or ini), else DEFAULT_TIMEOUT_S; 0 means none."""
    m = item.get_closest_marker("timeout")
    if m is not None and (m.args or "timeout" in m.kwargs):
        return float(m.args[0] if m.args else m.kwargs["timeout"]) or DEFAULT_TIMEOUT_S
    cfg = item.config
    opt = cfg.getoption("timeout", None) if cfg.pluginmanager.hasplugin("timeout") else None
    if opt is None and cfg.pluginmanager.hasplugin("timeout"):
        opt = cfg.getini("timeout")
    return float(opt or 0) or DEFAULT_TIMEOUT_S


def _run_module(item: pytest.Item) -> None:
    """Run the session's selected isolated items of ``item``'s module in one child; keep their reports."""
    config = item.config
    mine = [i for i in item.session.items if i.path == item.path and _isolated(i)]
    factory = getattr(config, "_tmp_path_factory", None)  # the session's tmp_path_factory (pytest's tmpdir plugin)
    root = factory.getbasetemp() if factory is not None else Path(tempfile.mkdtemp(prefix="wb-isolated-"))
    base = root / f"isolated-{item.path.stem}"
    base.mkdir(parents=True, exist_ok=True)
    reports_file = base / "reports.jsonl"
    reports_file.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *[i.nodeid for i in mine],
        "-q",
        "-p",
        "no:cacheprovider",
        f"--rootdir={config.rootpath}",
        f"--basetemp={base / 'tmp'}",
    ]
    if config.inipath is not None:
        cmd.append(f"--config-file={config.inipath}")
    if config.pluginmanager.hasplugin("xdist"):  # the child is one module: no workers of its own (addopts' -n)
        cmd += ["-n", "0"]
    if config.pluginmanager.hasplugin("timeout") and config.getoption("timeout", None) is not None:
        cmd.append(f"--timeout={config.getoption('timeout')}")
    budget = sum(i.stash.get(_TIMEOUT_KEY, DEFAULT_TIMEOUT_S) for i in mine) + SLACK_S
    env = {**os.environ, CHILD_ENV: str(reports_file)}
    try:
        proc = subprocess.run(
            cmd,
            cwd=config.rootpath,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=budget,
        )
        out = proc.stdout
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed the child
        raw = e.stdout or b""
        out = (
            raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        ) + f"\n[the child ran past {budget:.0f} s and was killed]"
    got: dict[str, list[TestReport]] = {}
    if reports_file.exists():
        for line in reports_file.read_text().splitlines():
            rep = config.hook.pytest_report_from_serializable(config=config, data=json.loads(line))
            if isinstance(rep, TestReport):
                # JSON turns the tuples pytest's terminal expects (a skip's (path, line, reason)) into lists
                rep.location = tuple(rep.location)
                if isinstance(rep.longrepr, list):
                    rep.longrepr = tuple(rep.longrepr)
                got.setdefault(rep.nodeid, []).append(rep)
    _results[item.path] = got
    _output[item.path] = out


def _missing(item: pytest.Item) -> TestReport:
    tail = _output.get(item.path, "")[-6000:]
    return TestReport(
        nodeid=item.nodeid,
        location=item.location,
        keywords={k: 1 for k in item.keywords},
        outcome="failed",
        longrepr=f"the isolated pytest subprocess of {item.path.name} reported no result for this test "
        f"(it crashed, or ran past its timeout). Its output ends:\n{tail}",
        when="call",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not _isolated(item):
        return None
    if item.path not in _results:
        _run_module(item)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = _results[item.path].get(item.nodeid)
    if not reports or not any(r.when == "call" or r.outcome != "passed" for r in reports):
        reports = [*(reports or []), _missing(item)]
    for rep in reports:
        item.ihook.pytest_runtest_logreport(report=rep)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
