"""A dead or hung worker ends the run, in one line that says what happened and where.

:class:`StepWatchdogMixin` records the step and phase (:data:`PHASES`) and: on an error in a phase, stops with
:class:`RunAbortedError` naming a crashed actor, its node, step and phase; a thread checks Ray's actor table every
:data:`DEATH_CHECK_S` s and, when no phase starts or ends for ``trainer.init_timeout_s`` / ``trainer.step_timeout_s``
(``EBPO_INIT_TIMEOUT_S`` / ``EBPO_STEP_TIMEOUT_S``; 0 or null: off), names and kills the stuck actors and stops the
run; a trainer still running :data:`END_WITHIN_S` later ends its process (:func:`hang_bound_s`, :func:`death_bound_s`).
Workers get ``actor_rollout_ref.nccl_timeout`` (:func:`dist_timeout_worker_cls`). :func:`failures_reported` prints
the error as ``ebpo-train: error: ...``, exit status 1; rerunning resumes from the last checkpoint.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import ray

from ebpo_verl.ops.node_check import on_nodes
from ebpo_verl.trainer.run_options import INIT_TIMEOUT_ENV, STEP_TIMEOUT_ENV, RunOptions, TrainerOptions

STEP_TIMEOUT_KEY = "step_timeout_s"
INIT_TIMEOUT_KEY = "init_timeout_s"
INIT_PHASES = frozenset({"start", "init", "load_checkpoint", "after_init"})
"""Phases timed by ``trainer.init_timeout_s`` (model initialisation, checkpoint load, the agent loop's start)."""
TICK_S = 1.0
"""Seconds between two looks of the watchdog thread at the clock."""
DEATH_CHECK_S = 5.0
"""Seconds between two looks at Ray's actor table for a crashed actor of the run."""
PROBE_S = 20.0
"""Limit of each Ray round trip of a firing watchdog (reading the actors' process states, killing them)."""
DEATH_WAIT_S = 10.0
"""How long an actor error in a phase waits for Ray's actor table to record the death behind it."""
END_WITHIN_S = 60.0
"""Seconds from the watchdog firing to the end of a trainer that the killed actors' errors did not stop."""


def hang_bound_s(timeout_s: float) -> float:
    """Seconds from the last phase boundary to the trainer's end when a phase hangs (``timeout_s`` is its
    phase's timeout): the timeout, one tick of the clock, and :data:`END_WITHIN_S`."""
    return timeout_s + TICK_S + END_WITHIN_S


def death_bound_s() -> float:
    """Seconds from Ray recording an actor's death to the trainer's end when nothing waits on that actor."""
    return DEATH_CHECK_S + TICK_S + END_WITHIN_S


RERUN = ". The run was stopped; rerun the same command to resume from the last checkpoint"


class RunAbortedError(RuntimeError):
    """The run stopped because a worker died or a phase timed out; the message is the one line to print."""


def timeouts(options: TrainerOptions) -> dict[str, float | None]:
    """``{"init": s, "step": s}`` (None: not watched) of the run's ``trainer`` options."""
    init = float(options.init_timeout_s) if options.init_timeout_s else None
    return {"init": init, "step": options.watchdog_timeout_s}


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
    context = getattr(info.get("DeathCause"), "actor_died_error_context", None)
    return (context and (context.error_message or "").strip().split(". ")[0]) or "died"


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
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _on_nodes(task: Callable[[list[int]], Any], infos: list[dict]) -> dict[str, Any]:
    """``task(pids)`` as a Ray task on each node of the actors ``infos``, with their pids: node id -> its ref."""
    by_node: dict[str, tuple[list[int]]] = {}
    for info in infos:
        by_node.setdefault(info["Address"]["NodeID"], ([],))[0].append(info["Pid"])
    return on_nodes(task, by_node)


def stuck_actors(exclude_pid: int) -> list[tuple[dict, str]]:
    """This job's live actors that are stopped, or inside a task (their process title names a method), with
    a word on their state; one Ray task per node reads the process states."""
    alive = [info for info in job_actors("ALIVE") if info.get("Pid") and info["Pid"] != exclude_pid]
    states: dict[int, tuple[str, str]] = {}
    for ref in _on_nodes(_process_states, alive).values():
        with suppress(ray.exceptions.RayError):
            states.update(ray.get(ref, timeout=PROBE_S))
    stuck = []
    for info in alive:
        status, title = states.get(info["Pid"], ("unknown", ""))
        if status in ("stopped", "disk-sleep", "zombie"):
            stuck.append((info, f"process {status}"))
        elif "." in title.split("::", 1)[-1] and title.startswith("ray::"):
            stuck.append((info, f"still in {title.split('.', 1)[1]}"))
    stuck.sort(key=lambda item: item[1] != "process stopped")
    return stuck


def _kill_on_nodes(infos: list[dict]) -> None:
    refs = list(_on_nodes(_kill, infos).values())
    ray.wait(refs, num_returns=len(refs), timeout=PROBE_S)


class StepWatchdog:
    """Where the trainer is (step, phase, since when) and, with a timeout, the thread that ends a hung run.

    ``timeouts`` maps ``"init"`` (the :data:`INIT_PHASES`) and ``"step"`` (every other phase) to seconds, None
    for not watched. Between two phases of the trainer's top level the phase reads ``after_<phase>``: the
    clock runs from the last boundary, so a hang there (logging, the agent loop's start) is caught as well."""

    def __init__(self, timeouts: dict[str, float | None]) -> None:
        self.timeouts = timeouts
        self.step, self.phase, self.depth = 0, "start", 0
        self.progress = time.monotonic()
        self.started = time.time()
        self.fired: str | None = None
        self.announced = False
        self._stop = threading.Event()
        self._exit_timer: threading.Timer | None = None

    def start(self) -> None:
        threading.Thread(target=self._watch, name="ebpo-step-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._exit_timer is not None:
            self._exit_timer.cancel()

    def timeout_for(self, phase: str) -> tuple[float | None, str, str]:
        """(seconds, config key, environment variable) that time ``phase``."""
        if phase in INIT_PHASES:
            return self.timeouts.get("init"), INIT_TIMEOUT_KEY, INIT_TIMEOUT_ENV
        return self.timeouts.get("step"), STEP_TIMEOUT_KEY, STEP_TIMEOUT_ENV

    def enter(self, step: int, phase: str) -> str:
        previous = self.phase
        self.step, self.phase, self.progress = step, phase, time.monotonic()
        self.depth += 1
        return previous

    def leave(self, previous: str, left: str) -> None:
        self.depth -= 1
        self.phase = previous if self.depth else f"after_{left}"
        self.progress = time.monotonic()

    def _watch(self) -> None:
        next_death_check = time.monotonic() + DEATH_CHECK_S
        while not self._stop.wait(TICK_S):
            timeout = self.timeout_for(self.phase)
            if timeout[0] is not None and time.monotonic() - self.progress > timeout[0]:
                self._fire(*timeout)
                return
            if time.monotonic() >= next_death_check:
                next_death_check = time.monotonic() + DEATH_CHECK_S
                try:
                    dead = dead_actors(self.started)
                except Exception:  # noqa: BLE001  (GCS unreachable: the next check, or the trainer's own error)
                    continue
                if dead:  # end the run now, waited on or not (a dead vLLM server leaves the rollout waiting)
                    self._arm_exit(self._death_message(dead))
                    self._announce()
                    return

    def _death_message(self, dead: list[dict]) -> str:
        names = "; ".join(f"{describe_actor(info)}: {_death_reason(info)}" for info in dead)
        return f"step {self.step}, phase {self.phase}: a worker died: {names}{RERUN}"

    def _timeout_message(self, step: int, phase: str, setting: tuple[float, str, str], who: str) -> str:
        seconds, key, env = setting
        return (
            f"step {step} timed out in phase {phase}: no progress for {seconds:g} s (trainer.{key}, env {env}); "
            f"did not answer: {who}{RERUN}"
        )

    def _fire(self, *setting) -> None:
        step, phase = self.step, self.phase
        self._arm_exit(self._timeout_message(step, phase, setting, "(the actors are being listed)"))
        note = ""
        try:
            stuck = stuck_actors(exclude_pid=os.getpid())
        except Exception as err:  # noqa: BLE001  (the line must still be printed)
            stuck, note = [], f"; the actors could not be listed ({type(err).__name__}: {err})"
        who = "; ".join(f"{describe_actor(info)}: {state}" for info, state in stuck) or "no actor found stuck"
        self.fired = self._timeout_message(step, phase, setting, who + note)
        self._announce()
        if stuck:
            _kill_on_nodes([info for info, _ in stuck])

    def _arm_exit(self, message: str) -> None:
        """Set the run-ending line and the deadline (:data:`END_WITHIN_S`) at which a trainer that has not
        stopped by itself ends its process."""
        self.fired = message
        self._exit_timer = threading.Timer(END_WITHIN_S, self._hard_exit)
        self._exit_timer.daemon = True
        self._exit_timer.start()

    def _announce(self) -> None:
        """Print the line and leave it for the driver (:func:`failures_reported`) in case this process ends."""
        print(f"ebpo-train: error: {self.fired}", file=sys.stderr, flush=True)
        self.announced = True
        with suppress(Exception):  # GCS unreachable: the driver prints Ray's own error
            record_abort(self.fired)

    def _hard_exit(self) -> None:
        """The trainer did not stop within :data:`END_WITHIN_S` (the killed actors' errors did not reach it)."""
        if not self._stop.is_set():
            if not self.announced:  # the actors' listing did not answer in time
                print(f"ebpo-train: error: {self.fired}", file=sys.stderr, flush=True)
            os._exit(1)

    def failure(self, err: BaseException) -> RunAbortedError | None:
        """The run-ending error for ``err`` raised in the current phase, or None (not a worker failure)."""
        if self.fired:
            return RunAbortedError(self.fired)
        if not any(
            isinstance(e, ray.exceptions.RayActorError) or "gloo" in str(e).lower() or "connection" in str(e).lower()
            for e in _actor_errors(err)
        ):
            return None
        deadline = time.monotonic() + DEATH_WAIT_S
        while not (dead := dead_actors(self.started)) and time.monotonic() < deadline:  # recorded after the errors
            time.sleep(0.5)
        return RunAbortedError(self._death_message(dead)) if dead else None


@contextmanager
def _converted(watchdog: StepWatchdog) -> Iterator[None]:
    """An error of a worker failure (or any error once the watchdog fired) as a :class:`RunAbortedError`."""
    try:
        yield
    except RunAbortedError:
        raise
    except Exception as err:
        failure = watchdog.failure(err)
        if failure is None:
            raise
        raise failure from None


class StepWatchdogMixin:
    """Records (step, phase) around verl's v1 trainer phases, from model initialisation on, and ends the run on
    a dead or hung worker (see the module docstring). Goes in the trainer's bases before verl's trainer; its
    timeouts are those of ``options``, the run's options the TaskRunner parsed (set by the trainer's ``__init__``)."""

    _watchdog: StepWatchdog | None = None
    options: RunOptions

    def _started_watchdog(self) -> StepWatchdog:
        if self._watchdog is None:
            self._watchdog = StepWatchdog(timeouts(self.options.trainer))
            self._watchdog.start()
        return self._watchdog

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        watchdog = self._watchdog
        if watchdog is None:
            yield
            return
        previous = watchdog.enter(int(getattr(self, "global_steps", 0)), name)  # verl sets it in _load_checkpoint
        try:
            with _converted(watchdog):
                yield
        finally:
            watchdog.leave(previous, name)

    def init(self):
        """verl's ``init``: tokenizer, data, worker groups and their models, rollout servers, reward and
        checkpoint-engine managers, checkpoint load; the watchdog runs from here on."""
        watchdog = self._started_watchdog()
        try:
            with self._phase("init"):
                return super().init()
        except BaseException:
            watchdog.stop()
            raise

    def _init_resource_pool_mgr(self) -> None:
        """verl's worker classes, each actor/rollout/ref worker replaced by :func:`dist_timeout_worker_cls`'s."""
        from verl.workers.engine_workers import ActorRolloutRefWorker

        super()._init_resource_pool_mgr()
        mapping = self.role_worker_mapping
        for role, actor_cls in list(mapping.items()):
            worker_cls = getattr(actor_cls, "__ray_actor_class__", None)
            if isinstance(worker_cls, type) and issubclass(worker_cls, ActorRolloutRefWorker):
                mapping[role] = ray.remote(dist_timeout_worker_cls(worker_cls))

    def fit(self, agent_loop_manager):
        watchdog = self._started_watchdog()
        try:
            with _converted(watchdog):
                return super().fit(agent_loop_manager)
        finally:
            watchdog.stop()


PHASES: dict[str, str] = {
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._load_checkpoint": "load_checkpoint",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer.step": "rollout",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_reward_colocate": "reward",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_old_log_prob": "old_log_prob",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_ref_log_prob": "ref_log_prob",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_values": "values",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_advantage": "advantage",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._update_critic": "update_critic",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._update_actor": "update_actor",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._save_checkpoint": "save",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer.on_step_end": "weight_sync",
    "verl.trainer.ppo.v1.trainer_base.PPOTrainer._validate": "validate",
}
"""verl's trainer method -> the phase :class:`StepWatchdogMixin` records around it (``step``: generation, until a
nested phase starts; ``on_step_end``: the weight sync)."""


def _watched(method: str, phase: str) -> Callable[..., Any]:
    """verl's ``method``, called through the mixin's next base inside :meth:`StepWatchdogMixin._phase`."""

    def watched(self: StepWatchdogMixin, *args: Any, **kwargs: Any) -> Any:
        with self._phase(phase):
            return getattr(super(StepWatchdogMixin, self), method)(*args, **kwargs)

    watched.__name__, watched.__qualname__ = method, f"StepWatchdogMixin.{method}"
    return watched


for _method, _name in PHASES.items():
    setattr(StepWatchdogMixin, _method.rsplit(".", 1)[1], _watched(_method.rsplit(".", 1)[1], _name))


@functools.cache
def dist_timeout_worker_cls(base: type) -> type:
    """``base`` (verl's ``ActorRolloutRefWorker`` or a subclass) whose ``init_model`` first initialises the
    process group with ``actor_rollout_ref.nccl_timeout`` seconds.

    verl 0.9.1's v1 ``TrainingWorker`` calls ``initialize_global_process_group_ray(timeout_second=None)`` (torch's
    30 min default), which skips a group already initialised, so this earlier call with the timeout counts. On CPU
    the platform plugin initialises its gloo group itself: the timeout only reaches GPU runs."""
    from verl.single_controller.base.decorator import Dispatch, register

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # as verl's ActorRolloutRefWorker.init_model
    def init_model(self):
        from verl.utils.distributed import initialize_global_process_group_ray

        seconds = self.config.get("nccl_timeout", None)  # verl's own key, unread by its v1 workers
        initialize_global_process_group_ray(timeout_second=int(seconds) if seconds else None)
        return super(cls, self).init_model()

    cls = type(f"DistTimeout{base.__name__}", (base,), {"init_model": init_model, "__module__": __name__})
    return cls


@contextmanager
def failures_reported(config: Any, trainer: TrainerOptions) -> Iterator[None]:
    """Around ``run_ppo`` in the driver: the timeouts of ``trainer`` (the options the pre-flight parsed from
    ``config``, environment variables applied) resolved into ``trainer.step_timeout_s`` and
    ``trainer.init_timeout_s``, the reward's knobs into its ``reward_kwargs`` (the env vars do not reach Ray's
    workers), and a :class:`RunAbortedError` of the trainer as one line ``ebpo-train: error: ...`` and exit
    status 1."""
    from omegaconf import open_dict

    from ebpo_verl.trainer.preflight.config import resolve_reward_options

    resolve_reward_options(config)
    seconds = timeouts(trainer)
    with open_dict(config):
        config.trainer.update({INIT_TIMEOUT_KEY: seconds["init"], STEP_TIMEOUT_KEY: seconds["step"]})
    try:
        yield
    except RunAbortedError as err:
        cause = getattr(err, "cause", None)
        message = str(cause if isinstance(cause, RunAbortedError) else err.args[0] if err.args else err)
        print(f"ebpo-train: error: {message.strip().splitlines()[-1]}", file=sys.stderr, flush=True)
        sys.exit(1)
    except ray.exceptions.RayError:
        if (message := recorded_abort()) is None:  # else the TaskRunner ended itself (a death, an unblocked hang)
            raise
        print(f"ebpo-train: error: {message}", file=sys.stderr, flush=True)
        sys.exit(1)
