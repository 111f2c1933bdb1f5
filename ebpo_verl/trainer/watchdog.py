"""A dead or hung worker ends the run, in one line that says what happened and where.

verl 0.9.1's v1 trainer waits on its workers with plain ``ray.get``: a worker that dies mid-step surfaces as a
Ray traceback (or as a gloo/NCCL error of the rank that waited for it), and a worker that hangs -- a stuck
collective, a dead NFS mount, a wedged GPU, or here a SIGSTOPped process -- leaves every rank waiting with
nothing printed. :class:`StepWatchdogMixin` (in the trainer's bases) records the step and the phase the trainer
is in (rollout, old log-prob, update, save, ...) and:

* on an error inside a phase, looks for an actor of this Ray job that died (Ray's actor table); when there is
  one, the run stops with :class:`RunAbortedError` naming the actor, its node, the step and the phase;
* runs a watchdog thread that looks at Ray's actor table every few seconds (a crashed actor ends the run even when
  nothing waits on it, as a dead vLLM server leaves the rollout waiting), and when no phase starts or ends for
  ``trainer.step_timeout_s`` seconds
  (``EBPO_STEP_TIMEOUT_S`` overrides it; 0 or null disables it), it names the job's actors that are stuck in a
  task or stopped (one Ray task per node reads their process state), kills them so that the trainer's
  ``ray.get`` returns, and the run stops with a :class:`RunAbortedError` that says the step timed out.

:func:`failures_reported` (around ``run_ppo`` in the driver) resolves the timeout into the config and turns that
error into one line ``ebpo-train: error: ...`` and exit status 1; the driver's exit ends the job, and Ray stops
every actor it started. Rerunning the same command resumes from the last checkpoint (``resume_mode=auto``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

from ebpo_verl.trainer.run_options import STEP_TIMEOUT_ENV, TrainerOptions

STEP_TIMEOUT_KEY = "step_timeout_s"
KILL_GRACE_S = 60.0
"""After killing the stuck actors, how long the watchdog waits for the trainer to notice before exiting itself."""
DEATH_CHECK_S = 5
"""Seconds between two looks at Ray's actor table for a crashed actor of the run."""


class RunAbortedError(RuntimeError):
    """The run stopped because a worker died or a phase timed out; the message is the one line to print."""


def step_timeout_s(trainer_config: Any) -> float | None:
    """Seconds without progress before the watchdog ends the run: ``EBPO_STEP_TIMEOUT_S`` if set, else
    ``trainer.step_timeout_s``; None when 0, negative, null or absent (no watchdog). Parsed by the option's one
    declaration (:class:`~ebpo_verl.trainer.run_options.TrainerOptions`); ValueError naming the key or variable."""
    seconds = {STEP_TIMEOUT_KEY: trainer_config.get(STEP_TIMEOUT_KEY, None)}
    return TrainerOptions.from_trainer(seconds).watchdog_timeout_s


def _actor_errors(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the errors it wraps (``__cause__``, ``__context__``, a RayTaskError's ``cause``)."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__, getattr(current, "cause", None)]


def describe_actor(info: dict) -> str:
    """``WorkerDict actor 'name' (pid P, node IP id abcd1234)`` from a row of Ray's actor table."""
    address = info.get("Address", {})
    name = f" {info['Name']!r}" if info.get("Name") else ""
    node = f"node {address.get('IPAddress', '?')} (id {str(address.get('NodeID', '?'))[:8]})"
    cls = str(info.get("ActorClassName", "?")).rsplit(".", 1)[-1]  # verl's colocated class: "<locals>.WorkerDict"
    return f"{cls} actor{name} (pid {info.get('Pid', '?')}, {node})"


def _death_reason(info: dict) -> str:
    cause = info.get("DeathCause")
    context = getattr(cause, "actor_died_error_context", None)
    if context is None:
        return "died"
    message = (context.error_message or "").strip().split(". ")[0]
    return message or "died"


def job_actors(state: str | None = None) -> list[dict]:
    """Rows of Ray's actor table (GCS; no dashboard needed) for this job, optionally in one state."""
    from ray._private.state import actors

    job = ray.get_runtime_context().get_job_id()
    table = actors(job_id=ray.JobID.from_hex(job), actor_state_name=state)
    return list(table.values())


def _died_unexpectedly(cause: Any) -> bool:
    """An actor's death cause is a crash: its process or node died, or it ran out of memory (not ``ray.kill``,
    not a dropped handle)."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext

    which = cause.WhichOneof("context") if cause is not None else None
    if which == "oom_context":
        return True
    reasons = (ActorDiedErrorContext.WORKER_DIED, ActorDiedErrorContext.NODE_DIED)
    return which == "actor_died_error_context" and cause.actor_died_error_context.reason in reasons


def dead_actors(since: float) -> list[dict]:
    """Actors of this job that crashed since ``since`` (a Unix time)."""
    return [
        info
        for info in job_actors("DEAD")
        if _died_unexpectedly(info.get("DeathCause")) and info.get("EndTime", 0) / 1000 >= since
    ]


ABORT_KEY = "ebpo_verl:abort:{job}"
"""Ray's internal key-value store (GCS) entry where the TaskRunner leaves its one line for the driver."""


def record_abort(message: str) -> None:
    """Leave the run-ending line where the driver finds it (:func:`failures_reported`), for a TaskRunner that
    must end itself."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(ABORT_KEY.format(job=ray.get_runtime_context().get_job_id()), message)


def recorded_abort() -> str | None:
    """The line :func:`record_abort` left for this job, if any (None without Ray)."""
    from ray.experimental import internal_kv

    if not ray.is_initialized():
        return None
    value = internal_kv._internal_kv_get(ABORT_KEY.format(job=ray.get_runtime_context().get_job_id()))
    return value.decode() if value else None


def _process_states(pids: list[int]) -> dict[int, tuple[str, str]]:
    """(status, title) of each pid on this node (``ray::Class.method`` while an actor runs a task)."""
    import psutil

    out = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            out[pid] = (process.status(), " ".join(process.cmdline()[:1]) or process.name())
        except psutil.Error:
            out[pid] = ("gone", "")
    return out


def _kill(pids: list[int]) -> None:
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def stuck_actors(exclude_pid: int) -> list[tuple[dict, str]]:
    """This job's live actors that are stopped, or inside a task (their process title names a method), with
    a word on their state; one Ray task per node reads the process states."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    by_node: dict[str, list[dict]] = {}
    for info in job_actors("ALIVE"):
        if info.get("Pid") and info["Pid"] != exclude_pid:
            by_node.setdefault(info["Address"]["NodeID"], []).append(info)
    probe = ray.remote(num_cpus=0, max_retries=0)(_process_states)
    refs = {
        node: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            [info["Pid"] for info in infos]
        )
        for node, infos in by_node.items()
    }
    stuck = []
    for node, ref in refs.items():
        try:
            states = ray.get(ref, timeout=60)
        except ray.exceptions.RayError:
            states = {}
        for info in by_node[node]:
            status, title = states.get(info["Pid"], ("unknown", ""))
            if status == "stopped":
                stuck.append((info, "process stopped"))
            elif status in ("disk-sleep", "zombie"):
                stuck.append((info, f"process {status}"))
            elif "." in title.split("::", 1)[-1] and title.startswith("ray::"):
                stuck.append((info, f"still in {title.split('.', 1)[1]}"))
    stuck.sort(key=lambda item: item[1] != "process stopped")
    return stuck


def _kill_on_nodes(infos: list[dict]) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    by_node: dict[str, list[int]] = {}
    for info in infos:
        by_node.setdefault(info["Address"]["NodeID"], []).append(info["Pid"])
    kill = ray.remote(num_cpus=0, max_retries=0)(_kill)
    refs = [
        kill.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(pids)
        for node, pids in by_node.items()
    ]
    ray.wait(refs, num_returns=len(refs), timeout=60)


class StepWatchdog:
    """Where the trainer is (step, phase, since when) and, with a timeout, the thread that ends a hung run."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.step, self.phase = 0, "init"
        self.progress = time.monotonic()
        self.started = time.time()
        self.fired: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="ebpo-step-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def enter(self, step: int, phase: str) -> tuple[int, str]:
        previous = (self.step, self.phase)
        self.step, self.phase, self.progress = step, phase, time.monotonic()
        return previous

    def leave(self, previous: tuple[int, str]) -> None:
        self.step, self.phase = previous
        self.progress = time.monotonic()

    def _watch(self) -> None:
        ticks = 0
        while not self._stop.wait(1.0):
            ticks += 1
            if self.timeout_s is not None and time.monotonic() - self.progress > self.timeout_s:
                self._fire()
                return
            if ticks % DEATH_CHECK_S == 0 and self._died():
                return

    def _died(self) -> bool:
        """An actor of the run crashed: end the run now, whether or not the trainer is waiting on it (a dead
        vLLM server leaves the rollout waiting for responses that never come)."""
        try:
            dead = dead_actors(self.started)
        except Exception:  # noqa: BLE001  (GCS unreachable: the next check, or the trainer's own error)
            return False
        if not dead:
            return False
        self.fired = self._death_message(dead)
        self._end(stuck=[])
        return True

    def _death_message(self, dead: list[dict]) -> str:
        names = "; ".join(f"{describe_actor(info)}: {_death_reason(info)}" for info in dead)
        return (
            f"step {self.step}, phase {self.phase}: a worker died: {names}. The run was stopped; rerun the same "
            "command to resume from the last checkpoint"
        )

    def _fire(self) -> None:
        step, phase = self.step, self.phase
        try:
            stuck = stuck_actors(exclude_pid=os.getpid())
        except Exception as err:  # noqa: BLE001  (the line must still be printed)
            stuck, note = [], f"; the actors could not be listed ({type(err).__name__}: {err})"
        else:
            note = ""
        who = "; ".join(f"{describe_actor(info)}: {state}" for info, state in stuck) or "no actor found stuck"
        self.fired = (
            f"step {step} timed out in phase {phase}: no progress for {self.timeout_s:g} s "
            f"(trainer.{STEP_TIMEOUT_KEY}, env {STEP_TIMEOUT_ENV}); did not answer: {who}{note}. The run was "
            "stopped; rerun the same command to resume from the last checkpoint"
        )
        self._end(stuck=[info for info, _ in stuck])

    def _end(self, stuck: list[dict]) -> None:
        """Print the line, kill the stuck actors (the trainer's ``ray.get`` then returns with an actor error,
        which :class:`StepWatchdogMixin` turns into :attr:`fired`); a trainer that still has not stopped after
        :data:`KILL_GRACE_S` ends its process, leaving the line for the driver."""
        print(f"ebpo-train: error: {self.fired}", file=sys.stderr, flush=True)
        if stuck:
            _kill_on_nodes(stuck)
        if not self._stop.wait(KILL_GRACE_S):
            try:
                record_abort(self.fired)
            finally:
                os._exit(1)

    def failure(self, err: BaseException) -> RunAbortedError | None:
        """The run-ending error for ``err`` raised in the current phase, or None (not a worker failure)."""
        if self.fired:
            return RunAbortedError(self.fired)
        if not any(isinstance(e, ray.exceptions.RayActorError) for e in _actor_errors(err)) and not any(
            "gloo" in str(e).lower() or "connection" in str(e).lower() for e in _actor_errors(err)
        ):
            return None
        dead: list[dict] = []
        for _ in range(20):  # the actor table records a death a moment after the peers' errors
            dead = dead_actors(self.started)
            if dead:
                break
            time.sleep(0.5)
        return RunAbortedError(self._death_message(dead)) if dead else None


class StepWatchdogMixin:
    """Records (step, phase) around verl's v1 trainer phases and ends the run on a dead or hung worker (see the
    module docstring). Goes in the trainer's bases before verl's trainer."""

    _watchdog: StepWatchdog | None = None

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        watchdog = self._watchdog
        if watchdog is None:
            yield
            return
        previous = watchdog.enter(int(self.global_steps), name)
        try:
            yield
        except RunAbortedError:
            raise
        except Exception as err:
            failure = watchdog.failure(err)
            if failure is None:
                raise
            raise failure from None
        finally:
            watchdog.leave(previous)

    def fit(self, agent_loop_manager):
        self._watchdog = StepWatchdog(step_timeout_s(self.config.trainer))
        self._watchdog.start()
        try:
            return super().fit(agent_loop_manager)
        finally:
            self._watchdog.stop()

    def step(self, metrics: dict, timing_raw: dict):
        with self._phase("rollout"):
            return super().step(metrics, timing_raw)

    def _compute_reward_colocate(self, batch, metrics=None):
        with self._phase("reward"):
            return super()._compute_reward_colocate(batch, metrics=metrics)

    def _compute_old_log_prob(self, batch, metrics: dict):
        with self._phase("old_log_prob"):
            return super()._compute_old_log_prob(batch, metrics)

    def _compute_ref_log_prob(self, batch, metrics: dict):
        with self._phase("ref_log_prob"):
            return super()._compute_ref_log_prob(batch, metrics)

    def _compute_values(self, batch, metrics: dict):
        with self._phase("values"):
            return super()._compute_values(batch, metrics)

    def _compute_advantage(self, batch, metrics: dict):
        with self._phase("advantage"):
            return super()._compute_advantage(batch, metrics)

    def _update_critic(self, batch, metrics: dict):
        with self._phase("update_critic"):
            return super()._update_critic(batch, metrics)

    def _update_actor(self, batch, metrics: dict):
        with self._phase("update_actor"):
            return super()._update_actor(batch, metrics)

    def _save_checkpoint(self) -> None:
        with self._phase("save"):
            return super()._save_checkpoint()

    def on_step_end(self):
        with self._phase("weight_sync"):
            return super().on_step_end()

    def _validate(self, *args, **kwargs):
        with self._phase("validate"):
            return super()._validate(*args, **kwargs)


@contextmanager
def failures_reported(config: Any) -> Iterator[None]:
    """Around ``run_ppo`` in the driver: the step timeout resolved into ``trainer.step_timeout_s`` (the env var
    does not reach Ray's workers), and a :class:`RunAbortedError` of the trainer as one line
    ``ebpo-train: error: ...`` and exit status 1."""
    from omegaconf import open_dict

    try:
        timeout = step_timeout_s(config.trainer)
    except ValueError as err:
        print(f"ebpo-train: error: {err}", file=sys.stderr)
        sys.exit(2)
    with open_dict(config):
        config.trainer[STEP_TIMEOUT_KEY] = timeout
    try:
        yield
    except RunAbortedError as err:
        cause = getattr(err, "cause", None)
        message = str(cause if isinstance(cause, RunAbortedError) else err.args[0] if err.args else err)
        print(f"ebpo-train: error: {message.strip().splitlines()[-1]}", file=sys.stderr, flush=True)
        sys.exit(1)
    except ray.exceptions.RayError:
        message = recorded_abort()  # the TaskRunner ended itself after a death or a hang it could not unblock
        if message is None:
            raise
        print(f"ebpo-train: error: {message}", file=sys.stderr, flush=True)
        sys.exit(1)
