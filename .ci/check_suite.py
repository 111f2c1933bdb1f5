"""The suite's result as CI reads it (.ci/run).

``python check_suite.py junit JUNIT_XML TESTS_DIR [MORE_JUNIT_XML ...]``: over the runs' junit files (the main venv's,
then the ``[trl]`` venv's), every test function defined in ``TESTS_DIR/test_*.py`` (module
level, or a method of a ``Test*`` class) ran at least once, not skipped, unless its every skip is on
``CI_SKIP_ALLOWLIST`` (TESTS_DIR/conftest.py), and no skip has a reason outside that list. This catches what a
count of "tests ran > 0" lets through: a module that is not collected or is skipped whole, a deselected test, a mass
skip. Exit 1 with one line per problem.

``python check_suite.py running FILE``: the tests that were running (the file tests/conftest.py keeps under
``EBPO_CI_RUNNING_FILE``) and for how long, printed when the suite's overall limit stops it.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path


def defined_tests(tests_dir: Path) -> set[str]:
    """``test_x.py::test_f`` and ``test_x.py::TestC::test_f`` for each test function in the folder's test files."""
    found = set()
    for path in sorted(tests_dir.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                found.add(f"{path.name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                found |= {
                    f"{path.name}::{node.name}::{m.name}"
                    for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")
                }
    return found


def _test_id(case: ET.Element) -> str:
    """``test_x.py[::TestC]::test_f`` of a junit testcase (classname ``tests.test_x[.TestC]``, name ``test_f``, with
    ``[params]`` and, under ``--dist loadgroup``, the ``@group`` xdist appends to a grouped test's name)."""
    parts = case.get("classname", "").split(".")[1:]  # drop "tests"
    if not parts:  # not a test function's case (a collection error)
        return case.get("name", "")
    return "::".join([f"{parts[0]}.py", *parts[1:], re.split(r"[\[@]", case.get("name", ""))[0]])


def _skip_refusal(tests_dir: Path):
    spec = importlib.util.spec_from_file_location("ci_conftest", tests_dir / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ci_skip_refusal


def junit_problems(junit: Path, tests_dir: Path, *more: Path) -> tuple[list[str], str]:
    """The problems (empty: the suite ran whole, over ``junit`` and the ``more`` runs' files) and a one-line
    summary."""
    refusal = _skip_refusal(tests_dir)
    cases = [case for path in (junit, *more) for case in ET.parse(path).getroot().iter("testcase")]
    ran, allowed_skips, problems = set(), set(), []
    for case in cases:
        test_id, skipped = _test_id(case), case.find("skipped")
        if skipped is None:
            ran.add(test_id)
        elif (why := refusal(skipped.get("message", ""))) is None:
            allowed_skips.add(test_id)
        else:
            problems.append(f"{test_id}: {why}")
    missing = sorted(defined_tests(tests_dir) - ran - allowed_skips)
    problems += [f"{test_id}: defined but never ran (not collected, deselected or skipped)" for test_id in missing]
    skips = sum(case.find("skipped") is not None for case in cases)
    summary = f"{len(cases) - skips} tests ran, {skips} skipped; {len(ran)} test functions ran at least once"
    return problems, summary


def running(path: Path, now: float) -> list[str]:
    """``<test> (running for N s)`` per line of the running-tests file."""
    if not path.is_file() or not path.read_text().strip():
        return ["(no test was running: the limit fired between tests, in collection or at the session's end)"]
    lines = []
    for line in path.read_text().splitlines():
        start, nodeid = line.split("\t", 1)
        lines.append(f"{nodeid} (running for {now - float(start):.0f} s)")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "junit":
        problems, summary = junit_problems(Path(argv[1]), Path(argv[2]), *map(Path, argv[3:]))
        for line in problems:
            print(f"ci: {line}")
        print(f"ci: {summary}" + (f"; {len(problems)} problem(s)" if problems else ""))
        return 1 if problems else 0
    if len(argv) == 2 and argv[0] == "running":
        for line in running(Path(argv[1]), time.time()):
            print(f"ci:   {line}")
        return 0
    print("usage: python check_suite.py junit JUNIT_XML TESTS_DIR [MORE_JUNIT_XML ...] | running FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
