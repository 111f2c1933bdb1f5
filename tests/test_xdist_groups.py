"""The README's test command runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``); the heavy
tests (verl trainer launches, vLLM engines, Ray) must then share one worker, one at a time (tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.mark.heavy
def test_heavy_tests_are_grouped_on_one_worker(request):
    """xdist marks a grouped test by its group's name at the end of the node id; pytest 9.2 silently loses it
    (pytest-xdist#1386), so the heavy tests would run at the same time: the test extra pins pytest 9.1.1."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a pytest-xdist worker with --dist loadgroup (the README's command)")
    assert request.node.nodeid.endswith("@heavy"), request.node.nodeid
