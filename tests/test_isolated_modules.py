"""tests/isolated_modules.py: a vllm-marked module runs in a pytest subprocess of its own, and its results
(pass, fail with the child's message, skip with its reason, a timeout, a crash) reach the parent's report."""

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

MARKED = """
import os, pytest
pytestmark = pytest.mark.vllm

def test_runs_in_a_child():
    assert os.environ.get("WB_TEST_ISOLATED_REPORTS")  # set only in the child
    assert os.getpid() != int(os.environ["PARENT_PID"])

def test_fails_with_its_message():
    assert 1 == 2, "the child's own message"

@pytest.mark.skipif(True, reason="the child's skip reason")
def test_skipped():
    pass

@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    pass

@pytest.mark.timeout(1)
def test_times_out():
    import time
    time.sleep(30)  # pytest-timeout fails it inside the child, which goes on

def test_crash():
    os._exit(3)  # the child dies: this test and the ones after it get no report
"""

PLAIN = """
import os

def test_parent_process():
    assert not os.environ.get("WB_TEST_ISOLATED_REPORTS")
    assert os.getpid() == int(os.environ["PARENT_PID"])
"""


@pytest.fixture()
def suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("WB_TEST_ISOLATED_REPORTS", raising=False)  # as in any parent run, even inside a child
    monkeypatch.delenv("WB_TEST_IN_PROCESS", raising=False)
    monkeypatch.delenv("PARENT_PID", raising=False)
    pytester.makeini("[pytest]\naddopts = -rfEs\nmarkers =\n    vllm: isolated\n")
    pytester.makeconftest(
        "import os\nos.environ.setdefault('PARENT_PID', str(os.getpid()))\npytest_plugins = ['isolated_modules']\n"
    )
    pytester.makepyfile(test_a_marked=MARKED, test_b_plain=PLAIN)
    return pytester


def test_marked_module_runs_in_a_child_and_reports_each_test(suite):
    res = suite.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(passed=4, failed=3, skipped=1)
    out = res.stdout.str()
    assert "Timeout" in out and "test_times_out" in out
    assert "the child's own message" in out and "SKIPPED [1]" in out and "the child's skip reason" in out
    assert "reported no result for this test" in out and "test_crash" in out  # the crash fails, with the child's output


def test_selection_reaches_the_child(suite):
    res = suite.runpytest_subprocess("-p", "no:cacheprovider", "-k", "param or plain")
    res.assert_outcomes(passed=3)


def test_in_process_env_runs_it_here(suite, monkeypatch):
    monkeypatch.setenv("WB_TEST_IN_PROCESS", "1")
    res = suite.runpytest_subprocess("-p", "no:cacheprovider", "-k", "runs_in_a_child")
    res.assert_outcomes(failed=1)  # not in a child: the test's own check fails
