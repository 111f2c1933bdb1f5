"""Shared fixtures.

Data: the real datasets live in ../shared/data beside the repository (read in place; CI has them). Tests of facts
of those files use ``shared_data``, which skips when the folder is missing (a user's clone) and fails instead under
``CI=true``. Tests that only need rows of the right hub schema use ``hub_data``: the real folder when present, else
tests/fixtures/hub (made-up rows in the same file names and schemas), so they run everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Ray 2.60 writes ~/.ray/auth_token when it starts a local instance and caches the auth mode per process; the
# tests start several local instances and a `ray start` cluster (test_node_check) from one pytest process, so
# they all run with token auth off, consistently (otherwise a later ray.init fails with InvalidAuthToken).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# pytest-xdist (`-n 2 --dist loadgroup`, the README's command): the heavy tests (marked `heavy`, or using a Ray
# instance of the pytest process) run on one worker, one at a time -- verl trainer launches, vLLM engines and Ray
# each use every core and GBs of memory -- while the other worker runs the rest; the vLLM evaluation tests form a
# second such group. A test using an expensive module fixture runs on one worker with the fixture's other tests,
# which builds it once.
HEAVY_FIXTURES = ("ray_local", "two_node_cluster")
SHARED_FIXTURES = ("tiny_study",)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
FIXTURE_HUB = REPO_ROOT / "tests" / "fixtures" / "hub"


def on_ci() -> bool:
    """``CI=true`` (or ``1``), as CI services set it: the real datasets must be there."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real datasets; skips without them (fails under ``CI=true``)."""
    if not SHARED_DATA.is_dir():
        reason = (
            f"real datasets not found at {SHARED_DATA} (../shared/data beside the repository); "
            "fixture-based tests still run"
        )
        if on_ci():
            pytest.fail(f"{reason}; CI=true requires them")
        pytest.skip(reason)
    return SHARED_DATA


@pytest.fixture(scope="session")
def hub_data() -> Path:
    """A folder of hub-schema source files (the names of data_prep.all.LOCAL_FILES, and variants/): the real
    datasets when present, else the made-up rows of tests/fixtures/hub. Assertions must be computed from the
    files read, never counts of the real ones."""
    return SHARED_DATA if SHARED_DATA.is_dir() else FIXTURE_HUB


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer with a ChatML template, trained locally (no hub)."""
    from ebpo_verl.cpu.tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def ray_local():
    """A fresh local Ray instance for one test module (``address="local"``: never attach to a cluster that a
    ``ray start`` elsewhere on this machine left running, which would also refuse ``num_cpus``)."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        heavy = item.get_closest_marker("heavy")
        if heavy or any(f in item.fixturenames for f in HEAVY_FIXTURES):
            item.add_marker(pytest.mark.xdist_group(heavy.args[0] if heavy and heavy.args else "heavy"))
        elif shared := next((f for f in SHARED_FIXTURES if f in item.fixturenames), None):
            item.add_marker(pytest.mark.xdist_group(shared))


# --- the package config and its composer (one composition as ebpo-train's, through Hydra's compose API) ----------


@pytest.fixture(scope="session")
def config_dir() -> Path:
    """The package's Hydra config folder, the checkout's that the tests import (``ebpo_trainer.yaml``, generated from
    the option declarations by ebpo_verl/trainer/config/generate.py)."""
    import ebpo_verl

    folder = Path(ebpo_verl.__file__).parent / "trainer" / "config"
    assert (folder / "ebpo_trainer.yaml").is_file(), folder
    return folder


@pytest.fixture(scope="session")
def compose_config(config_dir):
    """``compose_config(*overrides, config_name="ebpo_trainer")``: the job config Hydra composes for these overrides
    (Hydra's errors propagate as Hydra raises them)."""
    from hydra import compose, initialize_config_dir

    def composed(*overrides: str, config_name: str = "ebpo_trainer"):
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose(config_name, overrides=list(overrides))

    return composed
