"""CI cannot hang or skip silently (issue 33 item 10): each guard of tests/conftest.py and .ci/check_suite.py is fed
the case it exists for, in an inner pytest run on a throwaway project that uses this repository's own
pyproject.toml and tests/conftest.py (copied), and must catch it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.conftest import MARKER_TIMEOUTS_S, MODULE_TIMEOUTS_S, RUNNING_FILE_ENV, item_timeout

REPO = Path(__file__).resolve().parents[1]
ALLOWED = "allowed for this test only"  # appended to the inner conftest's CI_SKIP_ALLOWLIST, never to the real one
# the inner test files are indented here (dedented when written), so that no line of this file opens a def test_
SLEEPER = """
    import time

    import pytest


    @pytest.mark.timeout(2)
    def test_sleeps_forever():
        while True:
            time.sleep(60)


    def test_after_it():
        pass
"""


def _project(tmp_path: Path, files: dict[str, str], allow: bool = False) -> Path:
    """A throwaway pytest project: the repository's pyproject.toml and tests/conftest.py, plus ``files``."""
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    conftest = (REPO / "tests" / "conftest.py").read_text()
    if allow:
        conftest += f"\nCI_SKIP_ALLOWLIST[{ALLOWED!r}] = 'the test of the allowlist'\n"
    (tmp_path / "conftest.py").write_text(conftest)
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def _env(ci: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "EBPO_SKIP_", RUNNING_FILE_ENV))}
    return {**env, "CI": "true" if ci else "", **extra}


def _pytest(project: Path, *args: str, ci: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=project, env=_env(ci), capture_output=True, text=True, timeout=timeout)


def test_a_test_that_sleeps_forever_under_ci_is_stopped_and_named(tmp_path):
    """As CI runs the suite (xdist workers): the worker is ended at the limit, xdist names the test, the rest runs."""
    project = _project(tmp_path, {"test_inner.py": SLEEPER})
    start = time.monotonic()
    proc = _pytest(project, "-n", "1", "test_inner.py")
    took, out = time.monotonic() - start, proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "worker 'gw0' crashed while running 'test_inner.py::test_sleeps_forever'" in out
    assert re.search(r'test_inner\.py", line \d+ in test_sleeps_forever', out), out  # where: the worker's stack
    assert re.search(r"\b1 failed, 1 passed\b", out), out
    assert took < 60, f"the 2 s limit took {took:.0f} s to stop the run"


def test_without_xdist_the_limit_ends_the_run_with_the_test_in_its_stack(tmp_path):
    project = _project(tmp_path, {"test_inner.py": SLEEPER})
    proc = _pytest(project, "-p", "no:xdist", "test_inner.py")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "+ Timeout +" in out, out
    assert re.search(r'test_inner\.py", line \d+, in test_sleeps_forever', out), out


SKIPS = f"""
    import pytest


    def test_skip_off_the_list():
        pytest.skip("a reason CI does not accept")


    def test_skip_on_the_list():
        pytest.skip("{ALLOWED}: the details")


    @pytest.mark.skipif(True, reason="a skipif off the list")
    def test_skipif_off_the_list():
        pass


    @pytest.mark.xfail(reason="an expected failure is not a skip", strict=True)
    def test_xfail():
        assert False


    @pytest.mark.slow
    @pytest.mark.heavy
    def test_limits_from_the_markers(request):
        assert request.node.get_closest_marker("timeout").args == ({MARKER_TIMEOUTS_S["heavy"]},)
"""
MODULE_SKIP = 'import pytest\n\npytest.importorskip("no_such_module_here")\n\n\ndef test_never():\n    pass\n'


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """name -> (outcome, message) per testcase of a junit file."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        child = next(iter(case), None)
        found[case.get("name")] = ("passed", "") if child is None else (child.tag, child.get("message", ""))
    return found


def test_under_ci_a_skip_off_the_allowlist_fails_and_one_on_it_passes(tmp_path):
    project = _project(tmp_path, {"test_skips.py": SKIPS, "test_modskip.py": MODULE_SKIP}, allow=True)
    proc = _pytest(project, "--junitxml=ci.xml", "--continue-on-collection-errors")
    got = _outcomes(project / "ci.xml")
    refused = "skipped under CI for a reason not on CI_SKIP_ALLOWLIST (tests/conftest.py): "
    assert got["test_skip_off_the_list"] == ("failure", refused + "a reason CI does not accept"), proc.stdout
    outcome, message = got["test_skipif_off_the_list"]  # skipif skips in the setup: an error there
    assert outcome == "error" and refused + "a skipif off the list" in message
    assert got["test_skip_on_the_list"] == ("skipped", f"{ALLOWED}: the details")
    assert got["test_xfail"][0] == "skipped" and got["test_limits_from_the_markers"] == ("passed", "")
    assert got["test_modskip"][0] == "error"  # the module-level skip: a collection error
    assert refused + "could not import 'no_such_module_here'" in proc.stdout
    last = proc.stdout.splitlines()[-1]
    assert proc.returncode == 1 and all(f" {n}," in f" {last}," for n in ("1 failed", "1 passed", "1 xfailed")), last
    assert all(f" {n}" in f" {last}" for n in ("1 skipped", "2 errors")), last

    # not CI: the same skips are skips
    outside = _pytest(project, "--junitxml=local.xml", "--continue-on-collection-errors", ci=False)
    assert outside.returncode == 0, outside.stdout
    assert {o for o, _ in _outcomes(project / "local.xml").values()} == {"passed", "skipped"}


def test_ebpo_skip_variables_are_refused_under_ci(tmp_path):
    project = _project(tmp_path, {"test_ok.py": "def test_ok():\n    pass\n"})
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_ok.py"]
    ci = subprocess.run(cmd, cwd=project, env=_env(True, EBPO_SKIP_CPU_SMOKE="1"), capture_output=True, text=True)
    assert ci.returncode == 4 and "EBPO_SKIP_CPU_SMOKE set under CI: CI runs every test; unset it" in ci.stderr
    local = subprocess.run(cmd, cwd=project, env=_env(False, EBPO_SKIP_CPU_SMOKE="1"), capture_output=True)
    assert local.returncode == 0


def test_the_limits_of_the_slow_and_heavy_tests():
    assert item_timeout(set(), "test_x.py") is None  # pyproject.toml's default
    assert item_timeout({"slow"}, "test_x.py") == 900 and item_timeout({"slow", "heavy"}, "test_x.py") == 1200
    assert item_timeout({"slow", "heavy"}, "test_cluster.py") == 2400
    assert item_timeout(set(), "test_cpu_smoke.py") == 1800
    assert min(MODULE_TIMEOUTS_S.values()) >= max(MARKER_TIMEOUTS_S.values())


def _check_suite():
    spec = importlib.util.spec_from_file_location("check_suite", REPO / ".ci" / "check_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_running_tests_are_named_when_the_suite_is_stopped(tmp_path):
    """.ci/run's overall limit: pytest (xdist, as in CI) is stopped from outside mid-test; the file the conftest
    keeps names the test that was running, and for how long."""
    project = _project(tmp_path, {"test_inner.py": SLEEPER.replace("@pytest.mark.timeout(2)", "")})  # 300 s limit
    running = tmp_path / "running.tsv"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1"]
    env = _env(False, **{RUNNING_FILE_ENV: str(running)})
    proc = subprocess.Popen([*cmd, "test_inner.py"], cwd=project, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "test_sleeps_forever" not in (running.read_text() if running.is_file() else ""):
            assert time.monotonic() < deadline and proc.poll() is None, "the test never started"
            time.sleep(0.2)
        time.sleep(1.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` stops its process group
        proc.wait(timeout=30)
    (line,) = _check_suite().running(running, time.time())
    match = re.fullmatch(r"test_inner\.py::test_sleeps_forever \(running for (\d+) s\)", line)
    assert match and 1 <= int(match[1]) <= 60, line


def _fake_suite(tmp_path: Path, cases: str) -> tuple[Path, Path]:
    """A junit file of these cases and a tests folder (two test files, one other file; the allowlist of the test)."""
    tests = tmp_path / "tests"
    tests.mkdir(parents=True)
    _project(tests, {"test_a.py": "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n"}, allow=True)
    (tests / "test_b.py").write_text("class TestC:\n    def test_m(self):\n        pass\n")
    (tests / "helper.py").write_text("def test_not_a_test_file():\n    pass\n")
    junit = tmp_path / "junit.xml"
    junit.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return junit, tests


ONE = '<testcase classname="tests.test_a" name="test_one[x]"/>'
TWO = '<testcase classname="tests.test_a" name="test_two"/>'
M = '<testcase classname="tests.test_b.TestC" name="test_m"/>'


def test_check_suite_passes_a_whole_run_and_names_what_did_not_run(tmp_path):
    check = _check_suite()
    assert check.junit_problems(*_fake_suite(tmp_path / "whole", ONE + TWO + M)) == (
        [], "3 tests ran, 0 skipped; 3 test functions ran at least once")  # fmt: skip
    problems, _ = check.junit_problems(*_fake_suite(tmp_path / "missing", ONE + M))
    assert problems == ["test_a.py::test_two: defined but never ran (not collected, deselected or skipped)"]
    trl_venv = tmp_path / "junit-trl.xml"  # .ci/run: a file run in a second venv, its own junit
    trl_venv.write_text(f'<testsuites><testsuite name="pytest">{TWO}</testsuite></testsuites>')
    assert check.junit_problems(*_fake_suite(tmp_path / "split", ONE + M), trl_venv)[0] == []
    skipped = f'<testcase classname="tests.test_a" name="test_two"><skipped message="{ALLOWED}: x"/></testcase>'
    assert check.junit_problems(*_fake_suite(tmp_path / "allowed", ONE + M + skipped))[0] == []
    off = '<testcase classname="tests.test_b.TestC" name="test_m"><skipped message="why not"/></testcase>'
    problems, summary = check.junit_problems(*_fake_suite(tmp_path / "off", ONE + TWO + off))
    assert problems == [
        "test_b.py::TestC::test_m: skipped under CI for a reason not on CI_SKIP_ALLOWLIST (tests/conftest.py): why not",
        "test_b.py::TestC::test_m: defined but never ran (not collected, deselected or skipped)",
    ]
    assert summary == "2 tests ran, 1 skipped; 2 test functions ran at least once"


GROUPED = """
    import pytest


    @pytest.mark.heavy
    @pytest.mark.parametrize("x", [1, 2])
    def test_heavy(x):
        pass


    @pytest.mark.xdist_group("own")
    def test_own_group():
        pass


    def test_plain():
        pass
"""


def test_check_suite_reads_the_junit_of_the_ci_command(tmp_path):
    """The junit file pytest-xdist writes under .ci/run's options (`-n 2 --dist loadgroup`, this repository's
    pyproject.toml and tests/conftest.py) passes whole, though xdist appends `@group` to a grouped test's name; a
    test left out of that run is named. (The hand-written junit above missed this: CI once named every heavy test.)"""
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tests / "test_grouped.py").write_text(textwrap.dedent(GROUPED))
    ci_options = ["-n", "2", "--dist", "loadgroup"]
    whole = _pytest(tmp_path, *ci_options, "--junitxml=whole.xml")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    names = set(_outcomes(tmp_path / "whole.xml"))
    assert {"test_heavy[1]@heavy", "test_heavy[2]@heavy", "test_own_group@own", "test_plain"} == names
    check = _check_suite()
    assert check.junit_problems(tmp_path / "whole.xml", tests) == (
        [], "4 tests ran, 0 skipped; 3 test functions ran at least once")  # fmt: skip
    deselect = ["--deselect", "tests/test_grouped.py::test_own_group"]
    left_out = _pytest(tmp_path, *ci_options, "--junitxml=part.xml", *deselect)
    assert left_out.returncode == 0, left_out.stdout + left_out.stderr
    (problem,) = check.junit_problems(tmp_path / "part.xml", tests)[0]
    assert problem == "test_grouped.py::test_own_group: defined but never ran (not collected, deselected or skipped)"


def test_check_suite_counts_every_test_function_of_this_repository():
    """Counted independently: the lines that open a module-level test function (the suite has no Test* class)."""
    pattern = re.compile(r"^(?:async )?def test\w*\(", re.M)
    by_line = sum(len(pattern.findall(p.read_text())) for p in (REPO / "tests").glob("test_*.py"))
    assert len(_check_suite().defined_tests(REPO / "tests")) == by_line > 380


def test_ci_run_refuses_ebpo_skip_variables_before_anything_else(tmp_path):
    """.ci/run, copied alone into an empty tree (if it went on, its next step would fail: no .ci/wheel.sh)."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    env = {**_env(True), "EBPO_SKIP_CPU_SMOKE": "1", "EBPO_SKIP_OTHER": ""}
    proc = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr == ""
    assert proc.stdout == "ci: EBPO_SKIP_CPU_SMOKE EBPO_SKIP_OTHER set: CI runs every test; unset it\n"
