"""Shared fixtures. The real datasets live in ../shared/data beside the repository; they are read in place."""

from __future__ import annotations

from pathlib import Path

import pytest

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
