"""Shared fixtures. The real datasets live in ../shared/data beside the repository; they are read in place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Ray 2.60 writes ~/.ray/auth_token when it starts a local instance and caches the auth mode per process; the
# tests start several local instances and a `ray start` cluster (test_node_check) from one pytest process, so
# they all run with token auth off, consistently (otherwise a later ray.init fails with InvalidAuthToken).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"real datasets not found at {SHARED_DATA}: CI expects ../shared beside the repository")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer with a ChatML template, trained locally (no hub)."""
    from ebpo_verl.tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def ray_local():
    """A fresh local Ray instance for one test module (``address="local"``: never attach to a cluster that a
    ``ray start`` elsewhere on this machine left running, which would also refuse ``num_cpus``)."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
