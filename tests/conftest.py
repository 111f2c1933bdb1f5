"""Shared fixtures.

Data: the real datasets live in ../shared/data beside the repository (read in place; CI has them). Tests of facts
of those files use ``shared_data``, which skips when the folder is missing (a user's clone) and fails instead under
``CI=true``. Tests that only need rows of the right hub schema use ``hub_data``: the real folder when present, else
tests/fixtures/hub (made-up rows in the same file names and schemas), so they run everywhere.

CI guards (the block at the end): per-test time limits; under CI (``on_ci()``, the one "are we in CI" test) a skip
whose reason is not on ``CI_SKIP_ALLOWLIST`` fails, and ``EBPO_SKIP_*`` variables are refused.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from pathlib import Path

import pytest

# Ray 2.60 writes ~/.ray/auth_token when it starts a local instance and caches the auth mode per process; the
# tests start several local instances and a `ray start` cluster (test_node_check) from one pytest process, so
# they all run with token auth off, consistently (otherwise a later ray.init fails with InvalidAuthToken).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# pytest-xdist (`-n 2 --dist loadgroup`, the README's command): the heavy tests (marked `heavy`, or using a Ray
# instance of the pytest process) run on one worker, one at a time -- verl trainer launches, vLLM engines and Ray
# each use every core and GBs of memory -- while the other worker runs the rest. `heavy("name")` forms another such
# group, which the other worker may run beside the first: the vLLM evaluation tests ("vllm") and the one-node
# trainer runs on a Ray instance of their own with no timed bound ("own_ray": the resume runs, the campaign;
# sharing the cores only slows them; the smoke runs' leak checks leave to them what their processes were seen
# holding). The two groups are sized to keep the two workers' loads level (CI's time; each group's sum, from the
# junit of a clean-clone CI run of 758a0fd: "heavy" ~1,380 s with the two-node smoke's ~910, "own_ray" ~720 s,
# beside "vllm" ~210 s and ~1,060 s of ungrouped tests). A test using an expensive module fixture runs on one
# worker with the fixture's other tests, which builds it once.
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
    """A folder of hub-schema source files (the names of ebpo_verl.data.all.LOCAL_FILES, and variants/): the real
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
    steps on it (:meth:`run`). A step's advantages come from ``adapter.advantage_step(data, trainer.estimator,
    row_values)``, as in the trainer's advantage step."""

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


# ---- CI guards: per-test time limits, skips refused under CI, the running tests logged ----
# Fixtures go above this block; it holds only the CI hooks and their tables.

# Per-test limits (pytest-timeout; the default, `timeout` in pyproject.toml, is 300 s: the fast tier's tests take
# under ~20 s by the `slow` marker's definition). A test's own `timeout` marker wins over these. The method is
# `thread` (pyproject.toml): math-verify's `signal.alarm(0)` cancels the `signal` method's timer in the main thread,
# so a test that graded a response could then hang unbounded. On expiry the thread dumps the stacks and ends the
# process (no teardown: children of the test outlive it): under pytest-xdist (CI) xdist names the test ("worker
# 'gw0' crashed while running '<test>'") and .ci/run's --max-worker-restart=0 ends the suite; the stacks come from
# pytest_runtest_protocol below. Values: at least ~2x the time measured in CI, and above the test's own inner
# subprocess limit where it has one (that limit's message says more), within the suite's 2,400 s (.ci/run).
MARKER_TIMEOUTS_S = {
    "slow": 900,  # trainer/Ray/vLLM/study runs: verl trainer tests ~350 s; inner limits up to 600 s (test_recipes)
    "heavy": 1200,  # the OTB trainer run's inner limit is 900 s
}
MODULE_TIMEOUTS_S = {
    "test_cpu_smoke.py": 1800,  # the one-node A/K/K' flow (module fixture): 348 s in CI; inner limit 1,500 s
    "test_cluster.py": 2400,  # the two-node fault run (module fixture): 936 s in CI before its two planted resumes
}

# Skips CI accepts: reason prefix -> why CI may skip it. Empty: the last clean-clone CI ran 882 of 882 tests (0
# skipped); any other skip under CI is a failure naming its reason. (test_node_check's node-local half runs as root
# through `unshare -m` + a tmpfs mount; a CI machine that cannot do that fails it rather than skipping quietly.)
CI_SKIP_ALLOWLIST: dict[str, str] = {}
RUNNING_FILE_ENV = "EBPO_CI_RUNNING_FILE"  # .ci/run: the tests running when its overall limit fires
WORKER_STDERR = pytest.StashKey[int]()  # an xdist worker's real stderr (a dup), for the stacks of a test past its limit


def item_timeout(markers: set[str], module: str) -> float | None:
    """The per-test limit this file sets for a test with these markers in this module (None: the default)."""
    tiers = [MODULE_TIMEOUTS_S.get(module)] + [MARKER_TIMEOUTS_S[m] for m in markers if m in MARKER_TIMEOUTS_S]
    return max((t for t in tiers if t), default=None)


def ci_skip_refusal(reason: str) -> str | None:
    """Why CI must not accept a skip with this reason (None: it is on CI_SKIP_ALLOWLIST)."""
    if any(reason.startswith(allowed) for allowed in CI_SKIP_ALLOWLIST):
        return None
    return f"skipped under CI for a reason not on CI_SKIP_ALLOWLIST (tests/conftest.py): {reason}"


def _skip_reason(longrepr) -> str:
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_configure(config):
    if on_ci():
        skips = sorted(k for k in os.environ if k.startswith("EBPO_SKIP_"))
        if skips:
            raise pytest.UsageError(f"{', '.join(skips)} set under CI: CI runs every test; unset it")
        if not config.pluginmanager.hasplugin("timeout"):
            raise pytest.UsageError("CI needs pytest-timeout (per-test limits): pip install -e '.[test]'")
    if hasattr(config, "workerinput"):  # an xdist worker: its stderr, before pytest captures it
        config.stash[WORKER_STDERR] = os.dup(sys.__stderr__.fileno())
    path = os.environ.get(RUNNING_FILE_ENV)
    # the outermost pytest only: the xdist controller (or a run without xdist), not a pytest a test started
    if path and not hasattr(config, "workerinput") and "PYTEST_CURRENT_TEST" not in os.environ:
        config.pluginmanager.register(RunningLog(Path(path)), "ebpo-running-log")


def pytest_unconfigure(config):
    if WORKER_STDERR in config.stash:
        os.close(config.stash[WORKER_STDERR])


class RunningLog:
    """Keeps a file listing the tests running now (start time, node id), for a limit that kills the run."""

    def __init__(self, path: Path) -> None:
        self.path, self.running = path, {}

    def _write(self) -> None:
        self.path.write_text("".join(f"{start:.0f}\t{nodeid}\n" for nodeid, start in self.running.items()))

    def pytest_runtest_logstart(self, nodeid, location):
        self.running[nodeid] = time.time()
        self._write()

    def pytest_runtest_logfinish(self, nodeid, location):
        self.running.pop(nodeid, None)
        self._write()


def _limit(item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker and (marker.args or "timeout" in marker.kwargs):
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    return float(item.config.getoption("timeout", None) or item.config.getini("timeout") or 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """In an xdist worker, pytest-timeout's stack dump is lost with the worker; so every thread's stack goes to the
    worker's real stderr (the CI log) just before the limit ends it: where the test hung, besides xdist's "crashed
    while running <test>". faulthandler's own C thread needs no GIL."""
    fd = item.config.stash.get(WORKER_STDERR, None)
    limit = _limit(item) if fd is not None and item.config.pluginmanager.hasplugin("timeout") else 0
    if not limit:
        return (yield)
    faulthandler.dump_traceback_later(max(limit - 1, 0.9 * limit), file=fd)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_itemcollected(item):
    if not item.config.pluginmanager.hasplugin("timeout"):  # not installed: the marker would be unknown
        return
    limit = item_timeout({m.name for m in item.iter_markers()}, item.path.name)
    if limit and item.get_closest_marker("timeout") is None:
        item.add_marker(pytest.mark.timeout(limit))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if on_ci() and report.skipped and not hasattr(report, "wasxfail"):
        refusal = ci_skip_refusal(_skip_reason(report.longrepr))
        if refusal:
            report.outcome, report.longrepr = "failed", refusal
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if on_ci() and report.skipped:  # a module-level skip or importorskip
        refusal = ci_skip_refusal(_skip_reason(report.longrepr))
        if refusal:
            report.outcome, report.longrepr = "failed", refusal
    return report
