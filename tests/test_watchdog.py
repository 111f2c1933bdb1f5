"""ebpo_verl.trainer.watchdog without a cluster: the step timeout's sources, the (step, phase) the mixin records around
verl's trainer phases, a hung phase ended by the watchdog thread, a dead actor named, and the driver's one line.
The real thing (SIGKILL / SIGSTOP of a rank on a two-node cluster) is tests/test_cluster.py."""

from __future__ import annotations

import threading

import pytest
import ray
from omegaconf import OmegaConf

from ebpo_verl.trainer import watchdog
from ebpo_verl.trainer.watchdog import (
    STEP_TIMEOUT_ENV,
    RunAbortedError,
    StepWatchdogMixin,
    failures_reported,
    step_timeout_s,
)


def test_step_timeout_sources(monkeypatch):
    monkeypatch.delenv(STEP_TIMEOUT_ENV, raising=False)
    assert step_timeout_s(OmegaConf.create({"step_timeout_s": 3600})) == 3600.0
    assert step_timeout_s(OmegaConf.create({"step_timeout_s": 0})) is None
    assert step_timeout_s(OmegaConf.create({"step_timeout_s": None})) is None
    assert step_timeout_s(OmegaConf.create({})) is None
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "120")
    assert step_timeout_s(OmegaConf.create({"step_timeout_s": 3600})) == 120.0
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "two minutes")
    with pytest.raises(ValueError, match=r"EBPO_STEP_TIMEOUT_S='two minutes' is not a number of seconds"):
        step_timeout_s(OmegaConf.create({}))


class _Trainer:
    """Plays verl's v1 trainer: fit runs steps of the phases verl's _step_once runs, each recording where the
    watchdog says the trainer is."""

    def __init__(self, timeout, hang_in: str | None = None):
        self.config = OmegaConf.create({"trainer": {"step_timeout_s": timeout}})
        self.global_steps = 0
        self.seen: list[tuple[str, int, str]] = []
        self.hang_in, self.release = hang_in, threading.Event()

    def _record(self, method: str):
        self.seen.append((method, self._watchdog.step, self._watchdog.phase))
        if method == self.hang_in:
            self.release.wait(60)  # a ray.get on a stopped worker, until the watchdog kills it
            raise ray.exceptions.ActorDiedError()

    def fit(self, agent_loop_manager):
        for step in (1, 2):
            self.global_steps = step
            self.step({}, {})
            self._save_checkpoint()
            self.on_step_end()
        self._validate()

    def step(self, metrics, timing_raw):
        self._record("step")
        self._compute_old_log_prob(None, metrics)
        self._compute_advantage(None, metrics)
        self._update_actor(None, metrics)

    def _compute_old_log_prob(self, batch, metrics):
        self._record("old_log_prob")

    def _compute_advantage(self, batch, metrics):
        self._record("advantage")

    def _update_actor(self, batch, metrics):
        self._record("update_actor")

    def _save_checkpoint(self):
        self._record("save")

    def on_step_end(self):
        self._record("on_step_end")

    def _validate(self):
        self._record("validate")
        return {}


class _Watched(StepWatchdogMixin, _Trainer):
    pass


def test_the_mixin_records_step_and_phase_through_super(monkeypatch):
    monkeypatch.delenv(STEP_TIMEOUT_ENV, raising=False)
    trainer = _Watched(timeout=None)
    trainer.fit(None)
    per_step = [("step", "rollout"), ("old_log_prob", "old_log_prob"), ("advantage", "advantage"),
                ("update_actor", "update_actor"), ("save", "save"), ("on_step_end", "weight_sync")]  # fmt: skip
    expected = [(m, s, p) for s in (1, 2) for m, p in per_step] + [("validate", 2, "validate")]
    assert trainer.seen == expected
    assert (trainer._watchdog.step, trainer._watchdog.phase) == (0, "init")  # left every phase


def test_a_hung_phase_is_ended_by_the_watchdog_naming_the_stuck_actor(monkeypatch):
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "0.5")
    info = {"ActorClassName": "WorkerDict", "Name": "wg_WorkerDict_1:0", "Pid": 4242,
            "Address": {"IPAddress": "10.0.0.2", "NodeID": "ab12cd34ef"}}  # fmt: skip
    killed = []
    trainer = _Watched(timeout=3600, hang_in="update_actor")
    monkeypatch.setattr(watchdog, "stuck_actors", lambda exclude_pid: [(info, "process stopped")])

    def kill(infos):
        killed.extend(infos)
        trainer.release.set()

    monkeypatch.setattr(watchdog, "_kill_on_nodes", kill)
    with pytest.raises(RunAbortedError) as err:
        trainer.fit(None)
    message = str(err.value)
    assert message.startswith("step 1 timed out in phase update_actor: no progress for 0.5 s")
    assert "did not answer: WorkerDict actor 'wg_WorkerDict_1:0' (pid 4242, node 10.0.0.2 (id ab12cd34)): " in message
    assert "process stopped" in message and "rerun the same command" in message
    assert killed == [info]  # the stuck actor was killed, which returned the trainer's ray.get


def test_a_dead_actor_is_named_with_step_and_phase(monkeypatch):
    monkeypatch.delenv(STEP_TIMEOUT_ENV, raising=False)
    from ray.core.generated.common_pb2 import ActorDeathCause

    cause = ActorDeathCause()
    cause.actor_died_error_context.error_message = "The actor is dead because its worker process has died. More"
    info = {"ActorClassName": "WorkerDict", "Name": "", "Pid": 99, "DeathCause": cause,
            "Address": {"IPAddress": "10.0.0.3", "NodeID": "0011223344"}}  # fmt: skip
    monkeypatch.setattr(watchdog, "dead_actors", lambda since: [info])
    trainer = _Watched(timeout=None, hang_in="old_log_prob")
    trainer.release.set()
    with pytest.raises(RunAbortedError) as err:
        trainer.fit(None)
    assert str(err.value) == (
        "step 1, phase old_log_prob: a worker died: WorkerDict actor (pid 99, node 10.0.0.3 (id 00112233)): The "
        "actor is dead because its worker process has died. The run was stopped; rerun the same command to resume "
        "from the last checkpoint"
    )
    # any other error of a phase is left as it is
    monkeypatch.setattr(watchdog, "dead_actors", lambda since: [])
    other = _Watched(timeout=None)
    monkeypatch.setattr(other, "_compute_advantage", lambda *a: (_ for _ in ()).throw(ValueError("bad labels")))
    with pytest.raises(ValueError, match="bad labels"):
        other.fit(None)


def test_the_driver_prints_one_line_and_exits_1(monkeypatch, capsys):
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "90")
    config = OmegaConf.create({"trainer": {"step_timeout_s": 3600}})
    with pytest.raises(SystemExit) as exit_:
        with failures_reported(config):
            assert config.trainer.step_timeout_s == 90.0  # resolved for the Ray workers, which lack the env var
            raise RunAbortedError("step 3 timed out in phase update_actor: ...")
    assert exit_.value.code == 1
    assert capsys.readouterr().err == "ebpo-train: error: step 3 timed out in phase update_actor: ...\n"
    with failures_reported(config):  # a run that ends well is left alone
        pass


def test_a_crashed_actor_nothing_waits_on_ends_the_run_and_leaves_the_line_for_the_driver(monkeypatch):
    """A dead vLLM server: the rollout waits for responses that never come. The watchdog's look at the actor table
    ends the run without waiting for the step timeout; a trainer that does not return is ended, its line left
    in Ray's key-value store for the driver."""
    monkeypatch.delenv(STEP_TIMEOUT_ENV, raising=False)
    info = {"ActorClassName": "vLLMHttpServer", "Name": "vllm_server_1_0", "Pid": 77,
            "Address": {"IPAddress": "10.0.0.4", "NodeID": "ffeeddccbb"}}  # fmt: skip
    trainer = _Watched(timeout=None, hang_in="step")
    recorded, exits = [], []
    monkeypatch.setattr(watchdog, "DEATH_CHECK_S", 1)
    monkeypatch.setattr(watchdog, "KILL_GRACE_S", 0.2)
    monkeypatch.setattr(watchdog, "dead_actors", lambda since: [info])
    monkeypatch.setattr(watchdog, "record_abort", recorded.append)

    def exit_(code):  # instead of ending the test process: the TaskRunner's death returns the driver's ray.get
        exits.append(code)
        trainer.release.set()

    monkeypatch.setattr(watchdog.os, "_exit", exit_)
    with pytest.raises(RunAbortedError) as err:
        trainer.fit(None)
    want = "step 1, phase rollout: a worker died: vLLMHttpServer actor 'vllm_server_1_0' (pid 77, node 10.0.0.4 (id "
    assert str(err.value).startswith(want) and recorded == [str(err.value)] and exits == [1]
