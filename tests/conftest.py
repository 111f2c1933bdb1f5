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


# ---------------------------------------------------------------- the trainer stand-in (estimator and checkpoint tests)


class ActorGroupStandIn:
    """Plays the actor worker group in verl's checkpoint code: writes a marker under ``actor/``, records loads."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        Path(local_path, "weights.txt").write_text(str(global_step))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(local_path)


class StandInTrainers:
    """Makes EBPO's sync trainer on a composed config without workers or Ray (:meth:`__call__`) and runs a test's
    steps on it (:meth:`run`). A step's advantages come from ``trainer.estimate_advantages(data, row_keys,
    metrics)``, as in the trainer's advantage step."""

    def __call__(self, config, rows=range(32), batch_size: int = 8):
        """The trainer: the actor group is an :class:`ActorGroupStandIn`, the training data an unshuffled
        ``StatefulDataLoader`` over ``rows``, ``_data_iter`` started."""
        from torchdata.stateful_dataloader import StatefulDataLoader

        from ebpo_verl.trainer.ray_trainer import ebpo_trainer_cls

        trainer = ebpo_trainer_cls("sync")(config)
        trainer.actor_rollout_wg = ActorGroupStandIn()
        trainer.train_dataloader = StatefulDataLoader(list(rows), batch_size=batch_size, shuffle=False)
        trainer._data_iter = iter(trainer.train_dataloader)
        return trainer

    @staticmethod
    def run(trainer, steps, step) -> list:
        """``step(trainer, n)`` for each global step ``n`` of ``steps`` (set on the trainer first); the results."""
        out = []
        for n in steps:
            trainer.global_steps = n
            out.append(step(trainer, n))
        return out


@pytest.fixture
def stand_in_trainer() -> StandInTrainers:
    """``stand_in_trainer(config, rows, batch_size)`` builds a trainer stand-in; ``stand_in_trainer.run(trainer,
    steps, step)`` runs steps on it (:class:`StandInTrainers`)."""
    return StandInTrainers()
