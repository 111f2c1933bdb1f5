"""ebpo_verl.trainer.watchdog without a cluster: the timeouts' sources, the (step, phase) the mixin records around
verl's trainer phases from model initialisation on, a hang in every watched phase ended within its documented bound
(and the bound check failing on a watchdog that is too slow or misses a phase), a dead actor named, the driver's
one line, and the process-group timeout given to verl's workers. A stand-in trainer plays verl's v1 trainer (no
verl start); the real thing (SIGKILL / SIGSTOP of a rank on a two-node cluster) is tests/test_cluster.py."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import timedelta

import pytest
import ray
from omegaconf import OmegaConf

from ebpo_verl.trainer import watchdog
from ebpo_verl.trainer.run_options import RunOptions, TrainerOptions
from ebpo_verl.trainer.watchdog import (
    INIT_TIMEOUT_ENV,
    STEP_TIMEOUT_ENV,
    RunAbortedError,
    StepWatchdog,
    StepWatchdogMixin,
    failures_reported,
    hang_bound_s,
    timeouts,
)

STEP_S, INIT_S = 0.6, 0.8
"""The stand-in's timeouts (distinct, so that a test sees which one timed a phase)."""
JITTER_S = 0.5
"""Thread scheduling on a loaded two-core machine, allowed on top of a bound."""


def test_timeout_sources(monkeypatch):
    """The watchdog's timeouts are the parsed ``trainer`` options': a key, its declared default when absent, 0 or
    null off, each environment variable replacing its key (checked)."""
    monkeypatch.delenv(STEP_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(INIT_TIMEOUT_ENV, raising=False)

    def seconds(trainer: dict) -> dict:
        return timeouts(TrainerOptions.from_trainer(OmegaConf.create(trainer)))

    both = {"step_timeout_s": 3600, "init_timeout_s": 900}
    assert seconds(both) == {"init": 900.0, "step": 3600.0}
    assert seconds({"step_timeout_s": 0, "init_timeout_s": None}) == {"init": None, "step": None}
    assert seconds({}) == {"init": 3600.0, "step": 3600.0}  # absent: the declared defaults
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "120")
    monkeypatch.setenv(INIT_TIMEOUT_ENV, "45")
    assert seconds(both) == {"init": 45.0, "step": 120.0}
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "two minutes")
    with pytest.raises(ValueError, match=r"EBPO_STEP_TIMEOUT_S='two minutes' is invalid; use null or a number of"):
        seconds({})


class _Trainer:
    """Plays verl's v1 trainer and its TaskRunner: ``run`` is ``init``, the agent loop's start, ``fit``; every
    method the watchdog hooks (and the ray.get calls in between) goes through :meth:`_work`, which records where
    the watchdog says the trainer is and, in the method named ``hang_in``, waits like a ``ray.get`` on a stopped
    worker until the watchdog kills it (``release``)."""

    def __init__(self, hang_in: str | None = None):
        self.options = RunOptions("grpo", trainer=TrainerOptions(step_timeout_s=STEP_S, init_timeout_s=INIT_S))
        self.seen: list[tuple[str, int, str]] = []
        self.hang_in = hang_in
        self.hung, self.release = threading.Event(), threading.Event()
        self.hung_at = 0.0

    def _work(self, method: str):
        where = self._watchdog
        self.seen.append((method, where and where.step, where and where.phase))
        if method == self.hang_in and not self.hung.is_set():
            self.hung_at = time.monotonic()
            self.hung.set()
            self.release.wait(30)
            raise ray.exceptions.ActorDiedError()

    def run(self):
        self.init()
        self._work("agent_loop_start")  # TaskRunner.init_agent_loop_manager, between init and fit
        self.fit(None)

    def init(self):
        self._init_resource_pool_mgr()
        self._work("init_workers")  # worker groups, init_model, rollout servers, reward/checkpoint managers
        self._load_checkpoint()

    def _init_resource_pool_mgr(self):
        self.role_worker_mapping = {}

    def _load_checkpoint(self):
        self.global_steps = 0  # as verl's: no global_steps before its checkpoint load
        self._work("load_checkpoint")

    def fit(self, agent_loop_manager):
        self._validate()  # val_before_train
        for step in (1, 2):
            self.global_steps = step
            self.step({}, {})
            self._save_checkpoint()
            self.on_step_end()
            self._work("log")  # metrics, tracking: between the hooked phases
        self._validate()

    def step(self, metrics, timing_raw):
        self._work("generate")
        self._compute_reward_colocate(None, metrics)
        self._compute_old_log_prob(None, metrics)
        self._compute_ref_log_prob(None, metrics)
        self._compute_values(None, metrics)
        self._compute_advantage(None, metrics)
        self._update_critic(None, metrics)
        self._update_actor(None, metrics)

    def _compute_reward_colocate(self, batch, metrics=None):
        self._work("reward")

    def _compute_old_log_prob(self, batch, metrics):
        self._work("old_log_prob")

    def _compute_ref_log_prob(self, batch, metrics):
        self._work("ref_log_prob")

    def _compute_values(self, batch, metrics):
        self._work("values")

    def _compute_advantage(self, batch, metrics):
        self._work("advantage")

    def _update_critic(self, batch, metrics):
        self._work("update_critic")

    def _update_actor(self, batch, metrics):
        self._work("update_actor")

    def _save_checkpoint(self):
        self._work("save")

    def on_step_end(self):
        self._work("weight_sync")

    def _validate(self):
        self._work("validate")
        return {}


class _Watched(StepWatchdogMixin, _Trainer):
    pass


PHASES = {
    # method that hangs: (phase the line names, step, timeout that applies, its config key)
    "init_workers": ("init", 0, INIT_S, "init_timeout_s"),
    "load_checkpoint": ("load_checkpoint", 0, INIT_S, "init_timeout_s"),
    "agent_loop_start": ("after_init", 0, INIT_S, "init_timeout_s"),
    "validate": ("validate", 0, STEP_S, "step_timeout_s"),
    "generate": ("rollout", 1, STEP_S, "step_timeout_s"),
    "reward": ("reward", 1, STEP_S, "step_timeout_s"),
    "old_log_prob": ("old_log_prob", 1, STEP_S, "step_timeout_s"),
    "ref_log_prob": ("ref_log_prob", 1, STEP_S, "step_timeout_s"),
    "values": ("values", 1, STEP_S, "step_timeout_s"),
    "advantage": ("advantage", 1, STEP_S, "step_timeout_s"),
    "update_critic": ("update_critic", 1, STEP_S, "step_timeout_s"),
    "update_actor": ("update_actor", 1, STEP_S, "step_timeout_s"),
    "save": ("save", 1, STEP_S, "step_timeout_s"),
    "weight_sync": ("weight_sync", 1, STEP_S, "step_timeout_s"),
    "log": ("after_weight_sync", 1, STEP_S, "step_timeout_s"),
}
"""Every phase docs/training.md lists as watched, with where the stand-in's hang in it lands."""

STUCK = {"ActorClassName": "WorkerDict", "Name": "wg_WorkerDict_1:0", "Pid": 4242,
         "Address": {"IPAddress": "10.0.0.2", "NodeID": "ab12cd34ef"}}  # fmt: skip


RECORDED: list[str] = []
"""Lines the watchdog left for the driver (Ray's key-value store in a run)."""


@pytest.fixture
def fast(monkeypatch):
    """The watchdog's clock scaled down; Ray's actor table and the kill played by the stand-in."""
    import verl.workers.engine_workers  # noqa: F401  (imported by the mixin at init: not inside a timed phase)

    monkeypatch.delenv(STEP_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(INIT_TIMEOUT_ENV, raising=False)
    monkeypatch.setattr(watchdog, "TICK_S", 0.05)
    monkeypatch.setattr(watchdog, "END_WITHIN_S", 1.0)
    monkeypatch.setattr(watchdog, "DEATH_CHECK_S", 0.2)
    monkeypatch.setattr(watchdog, "dead_actors", lambda since: [])
    monkeypatch.setattr(watchdog, "stuck_actors", lambda exclude_pid: [(STUCK, "process stopped")])
    monkeypatch.setattr(watchdog, "DEATH_WAIT_S", 0.0)
    RECORDED.clear()
    monkeypatch.setattr(watchdog, "record_abort", RECORDED.append)
    monkeypatch.setattr(watchdog, "_kill_on_nodes", lambda infos: None)
    monkeypatch.setattr(watchdog.os, "_exit", lambda code: None)  # never the test process's end
    started: list[StepWatchdog] = []
    start = StepWatchdog.start
    monkeypatch.setattr(StepWatchdog, "start", lambda self: (started.append(self), start(self))[1])
    yield monkeypatch
    # No watchdog outlives its test (the stand-ins above are undone after this): one still going would print
    # outside the test, call the real record_abort and arm the real 60 s os._exit in this process (a pytest-xdist
    # worker, whose death would end the suite). So the test fails, and every watchdog it started is stopped.
    left = _watchdog_threads(WATCHDOG_JOIN_S)
    for dog in started:
        dog.stop()
    assert not left, f"a watchdog thread outlived the test by {WATCHDOG_JOIN_S} s"


WATCHDOG_JOIN_S = 5.0


def _watchdog_threads(wait_s: float) -> list[threading.Thread]:
    """The step watchdogs' threads still running after waiting up to ``wait_s`` for them."""
    deadline = time.monotonic() + wait_s
    for thread in [t for t in threading.enumerate() if t.name == "ebpo-step-watchdog"]:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threading.enumerate() if t.name == "ebpo-step-watchdog" and t.is_alive()]


def _ended(trainer: _Trainer, bound: float) -> tuple[float, BaseException | None]:
    """Runs the stand-in; (seconds from its hang to its end, the error it ended with). Fails, naming the bound,
    when it is still running ``bound`` (+ :data:`JITTER_S`) seconds after the hang began."""
    outcome: dict = {}

    def target():
        try:
            trainer.run()
        except BaseException as err:  # noqa: BLE001  (the outcome under test)
            outcome["error"] = err
        outcome["end"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert trainer.hung.wait(10), f"the stand-in never reached {trainer.hang_in}"
    thread.join(max(0.0, trainer.hung_at + bound + JITTER_S - time.monotonic()))
    if thread.is_alive():
        trainer.release.set()
        thread.join(5)
        raise AssertionError(f"hang in {trainer.hang_in}: the run was still going {bound + JITTER_S:g} s after it")
    return outcome["end"] - trainer.hung_at, outcome.get("error")


def _check_end(trainer: _Trainer, timeout: float) -> tuple[float, str]:
    """The stand-in's hang ends the run no earlier than its phase's timeout and within :func:`hang_bound_s`; (the
    seconds it took, the driver's line: the trainer's :class:`RunAbortedError`, or for a Ray error raised outside
    the trainer's methods the line the watchdog left, as :func:`failures_reported` prints them)."""
    bound = hang_bound_s(timeout)
    elapsed, error = _ended(trainer, bound)
    if elapsed > bound + JITTER_S:
        raise AssertionError(f"hang in {trainer.hang_in}: the run ended {elapsed:.2f} s after it, bound {bound:g} s")
    assert elapsed >= timeout - 0.01, f"hang in {trainer.hang_in}: ended {elapsed:.2f} s after it, before {timeout}"
    if isinstance(error, RunAbortedError):
        return elapsed, str(error)
    assert isinstance(error, ray.exceptions.RayError) and RECORDED, f"hang in {trainer.hang_in}: ended with {error!r}"
    return elapsed, RECORDED[-1]


def test_the_mixin_records_step_and_phase_from_init_through_super(fast):
    trainer = _Watched()
    trainer.run()
    per_step = [("generate", "rollout"), ("reward", "reward"), ("old_log_prob", "old_log_prob"),
                ("ref_log_prob", "ref_log_prob"), ("values", "values"), ("advantage", "advantage"),
                ("update_critic", "update_critic"), ("update_actor", "update_actor"), ("save", "save"),
                ("weight_sync", "weight_sync"), ("log", "after_weight_sync")]  # fmt: skip
    expected = [("init_workers", 0, "init"), ("load_checkpoint", 0, "load_checkpoint"),
                ("agent_loop_start", 0, "after_init"), ("validate", 0, "validate")]  # fmt: skip
    expected += [(m, s, p) for s in (1, 2) for m, p in per_step] + [("validate", 2, "validate")]
    assert trainer.seen == expected
    assert {phase for _, _, phase in trainer.seen} == {phase for phase, *_ in PHASES.values()}
    assert trainer._watchdog.phase == "after_validate" and trainer._watchdog._stop.is_set()


@pytest.mark.parametrize("method", list(PHASES))
def test_a_hang_in_each_phase_ends_the_run_within_its_bound(fast, method):
    killed = []
    trainer = _Watched(hang_in=method)

    def kill(infos):  # the stopped worker killed: the trainer's ray.get returns with the actor's death
        killed.extend(infos)
        trainer.release.set()

    fast.setattr(watchdog, "_kill_on_nodes", kill)
    phase, step, timeout, key = PHASES[method]
    elapsed, message = _check_end(trainer, timeout)
    assert message.startswith(f"step {step} timed out in phase {phase}: no progress for {timeout:g} s (trainer.{key}")
    assert "did not answer: WorkerDict actor 'wg_WorkerDict_1:0' (pid 4242, node 10.0.0.2 (id ab12cd34)): " in message
    assert "process stopped" in message and "rerun the same command" in message
    assert killed == [STUCK]
    assert elapsed < timeout + watchdog.END_WITHIN_S  # ended by the kill, not by the deadline


@pytest.mark.parametrize("method", ["init_workers", "update_actor"])
def test_a_trainer_that_does_not_return_ends_its_process_at_the_deadline(fast, method, capsys):
    trainer = _Watched(hang_in=method)
    exits = []

    def exit_(code):  # instead of ending the test process: the TaskRunner's death ends the driver's ray.get
        exits.append(code)
        trainer.release.set()

    fast.setattr(watchdog, "_kill_on_nodes", lambda infos: None)  # the kill does not reach the trainer
    fast.setattr(watchdog.os, "_exit", exit_)
    phase, _, timeout, _ = PHASES[method]
    elapsed, message = _check_end(trainer, timeout)
    assert exits == [1] and f"timed out in phase {phase}" in message
    assert elapsed >= timeout + watchdog.END_WITHIN_S - 0.01  # ended by the deadline
    assert capsys.readouterr().err.count("ebpo-train: error:") == 1


def test_the_deadline_holds_when_ray_does_not_answer(fast, capsys):
    """The actors' listing hangs (GCS unreachable): the process still ends at the deadline, with the line."""
    trainer = _Watched(hang_in="update_actor")
    answer = threading.Event()
    fast.setattr(watchdog, "stuck_actors", lambda exclude_pid: answer.wait(10) and [])
    fast.setattr(watchdog.os, "_exit", lambda code: trainer.release.set())
    try:
        elapsed, message = _check_end(trainer, STEP_S)
        printed = capsys.readouterr().err  # before the listing answers (the stubbed os._exit left the thread going)
    finally:
        answer.set()
    assert message.startswith("step 1 timed out in phase update_actor: no progress for 0.6 s")
    assert "did not answer: (the actors are being listed)" in message
    assert printed.count("ebpo-train: error:") == 1


def test_the_bound_check_fails_on_a_watchdog_four_times_too_slow(fast):
    trainer = _Watched(hang_in="update_actor")
    fast.setattr(watchdog, "_kill_on_nodes", lambda infos: trainer.release.set())
    slow = StepWatchdog.timeout_for
    fast.setattr(StepWatchdog, "timeout_for", lambda self, phase: (4 * slow(self, phase)[0], *slow(self, phase)[1:]))
    assert 4 * STEP_S > hang_bound_s(STEP_S) + JITTER_S
    with pytest.raises(AssertionError, match=r"hang in update_actor: the run (was still going|ended .* bound)"):
        _check_end(trainer, STEP_S)


def test_the_bound_check_fails_when_model_initialisation_is_not_watched(fast):
    """The watchdog as it was before: started in ``fit`` only, so a worker stopped in ``init_model`` hung the run."""

    class _FitOnly(_Watched):
        def init(self):
            return _Trainer.init(self)

    trainer = _FitOnly(hang_in="init_workers")
    fast.setattr(watchdog, "_kill_on_nodes", lambda infos: trainer.release.set())
    with pytest.raises(AssertionError, match=r"hang in init_workers: the run was still going 2.35 s after it"):
        _check_end(trainer, INIT_S)


def test_a_dead_actor_is_named_with_step_and_phase(fast):
    from ray.core.generated.common_pb2 import ActorDeathCause

    cause = ActorDeathCause()
    cause.actor_died_error_context.error_message = "The actor is dead because its worker process has died. More"
    info = {"ActorClassName": "WorkerDict", "Name": "", "Pid": 99, "DeathCause": cause,
            "Address": {"IPAddress": "10.0.0.3", "NodeID": "0011223344"}}  # fmt: skip
    fast.setattr(watchdog, "DEATH_CHECK_S", 60)  # the error in the phase, not the thread, finds it
    fast.setattr(watchdog, "dead_actors", lambda since: [info])
    trainer = _Watched(hang_in="old_log_prob")
    trainer.release.set()
    with pytest.raises(RunAbortedError) as err:
        trainer.run()
    assert str(err.value) == (
        "step 1, phase old_log_prob: a worker died: WorkerDict actor (pid 99, node 10.0.0.3 (id 00112233)): The "
        "actor is dead because its worker process has died. The run was stopped; rerun the same command to resume "
        "from the last checkpoint"
    )
    # any other error of a phase is left as it is
    fast.setattr(watchdog, "dead_actors", lambda since: [])
    other = _Watched()
    fast.setattr(other, "_compute_advantage", lambda *a: (_ for _ in ()).throw(ValueError("bad labels")))
    with pytest.raises(ValueError, match="bad labels"):
        other.run()


def test_the_driver_prints_one_line_and_exits_1(monkeypatch, capsys):
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "90")
    monkeypatch.delenv(INIT_TIMEOUT_ENV, raising=False)
    config = OmegaConf.create({"trainer": {"step_timeout_s": 3600, "init_timeout_s": 1200}})
    trainer = TrainerOptions.from_trainer(config.trainer)  # as the pre-flight parses it, the env var applied
    with pytest.raises(SystemExit) as exit_:
        with failures_reported(config, trainer):
            assert config.trainer.step_timeout_s == 90.0  # resolved for the Ray workers, which lack the env var
            assert config.trainer.init_timeout_s == 1200.0
            raise RunAbortedError("step 3 timed out in phase update_actor: ...")
    assert exit_.value.code == 1
    assert capsys.readouterr().err == "ebpo-train: error: step 3 timed out in phase update_actor: ...\n"
    with failures_reported(config, trainer):  # a run that ends well is left alone
        pass


def test_a_crashed_actor_nothing_waits_on_ends_the_run_within_the_death_bound(fast):
    """A dead vLLM server: the rollout waits for responses that never come. The watchdog's look at the actor table
    ends the run without waiting for the step timeout; a trainer that does not return is ended, its line left
    in Ray's key-value store for the driver."""
    info = {"ActorClassName": "vLLMHttpServer", "Name": "vllm_server_1_0", "Pid": 77,
            "Address": {"IPAddress": "10.0.0.4", "NodeID": "ffeeddccbb"}}  # fmt: skip
    trainer = _Watched(hang_in="generate")
    trainer.options = dataclasses.replace(trainer.options, trainer=TrainerOptions(step_timeout_s=3600))
    exits = []
    fast.setattr(watchdog, "dead_actors", lambda since: [info] if trainer.hung.is_set() else [])

    def exit_(code):
        exits.append(code)
        trainer.release.set()

    fast.setattr(watchdog.os, "_exit", exit_)
    bound = watchdog.death_bound_s()
    elapsed, error = _ended(trainer, bound)
    want = "step 1, phase rollout: a worker died: vLLMHttpServer actor 'vllm_server_1_0' (pid 77, node 10.0.0.4 (id "
    assert isinstance(error, RunAbortedError) and str(error).startswith(want)
    assert RECORDED == [str(error)] and exits == [1]
    assert watchdog.END_WITHIN_S <= elapsed <= bound + JITTER_S


# ---- the workers' process-group timeout (actor_rollout_ref.nccl_timeout) --------------------------------------


def test_the_trainer_gives_verls_actor_workers_the_timeout_class():
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.trainer.ppo.utils import Role
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

    class _Pools:
        def _init_resource_pool_mgr(self):
            self.role_worker_mapping = {
                Role.ActorRolloutRef: ray.remote(ActorRolloutRefWorker),
                Role.Critic: ray.remote(TrainingWorker),
            }

    class _Trainer(StepWatchdogMixin, _Pools):
        pass

    trainer = _Trainer()
    trainer._init_resource_pool_mgr()
    actor = trainer.role_worker_mapping[Role.ActorRolloutRef].__ray_actor_class__
    assert actor is watchdog.dist_timeout_worker_cls(ActorRolloutRefWorker) and issubclass(actor, ActorRolloutRefWorker)
    assert actor.init_model is not ActorRolloutRefWorker.init_model
    assert getattr(actor.init_model, MAGIC_ATTR) == getattr(ActorRolloutRefWorker.init_model, MAGIC_ATTR)
    assert trainer.role_worker_mapping[Role.Critic].__ray_actor_class__ is TrainingWorker  # no actor_rollout_ref


def test_the_process_group_verls_worker_reads_gets_the_configured_timeout(monkeypatch):
    """What torch receives on a GPU worker: verl's ``cpu:gloo,cuda:nccl`` group with ``nccl_timeout`` seconds,
    initialised before verl's model init, whose own ``timeout_second=None`` call then changes nothing."""
    import torch.distributed
    import verl.utils.distributed as verl_dist
    from verl.single_controller.base.decorator import Dispatch, register

    calls, order = [], []
    monkeypatch.setattr(verl_dist, "get_device_name", lambda: "cuda")
    monkeypatch.setattr(verl_dist, "get_nccl_backend", lambda: "nccl")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")

    class _Base:  # plays ActorRolloutRefWorker: its init_model builds TrainingWorker, which calls verl's init
        config = OmegaConf.create({"nccl_timeout": 1800})

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self):
            order.append(len(calls))
            verl_dist.initialize_global_process_group_ray(timeout_second=None)

    watchdog.dist_timeout_worker_cls(_Base)().init_model()
    assert order == [1] and len(calls) == 1
    assert calls[0]["backend"] == "cpu:gloo,cuda:nccl" and (calls[0]["rank"], calls[0]["world_size"]) == (3, 8)
    assert calls[0]["timeout"] == timedelta(seconds=1800)


def test_the_composed_config_carries_the_timeout():
    """verl's own default (600 s) and the recipes' explicit setting both reach ``actor_rollout_ref``, the node the
    worker's ``self.config`` is."""
    from hydra import compose, initialize_config_module

    from ebpo_verl.recipes.presets import GPU_FAULTS

    with initialize_config_module(config_module="ebpo_verl.trainer.config", version_base=None):
        config = compose("ebpo_trainer", overrides=[s.override for s in GPU_FAULTS if "env_vars" not in s.key])
    assert [s.override for s in GPU_FAULTS if "nccl_timeout" in s.key] == ["actor_rollout_ref.nccl_timeout=600"]
    assert config.actor_rollout_ref.nccl_timeout == 600


def test_the_table_of_phases_wraps_methods_verl_has():
    """Each row of :data:`watchdog.PHASES` names a method of verl's v1 trainer, which the mixin wraps under its own
    name; with ``init`` (written by hand) they are every phase the stand-in sees recorded."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    for dotted in watchdog.PHASES:
        owner, name = dotted.rsplit(".", 1)
        assert owner == f"{PPOTrainer.__module__}.{PPOTrainer.__qualname__}" and callable(getattr(PPOTrainer, name))
        assert vars(StepWatchdogMixin)[name].__qualname__ == f"StepWatchdogMixin.{name}"
    recorded = {phase for phase, *_ in PHASES.values()} - {"after_init", "after_weight_sync"}
    assert {*watchdog.PHASES.values(), "init"} == recorded and len(watchdog.PHASES) == len(set(watchdog.PHASES))
