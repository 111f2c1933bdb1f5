"""Faults injected into a two-node run, and the bounds on how soon the run must end after each.

Bounds (docs/training.md, :func:`bound_s`): a SIGKILL of a rank's worker or of a vLLM rollout server ends the run
within :data:`KILL_BOUND_S` seconds of the kill; a SIGSTOP (a hung worker) within the step timeout + that.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.harness import limits

KILL_BOUND_S = 90
TARGETS = {"rank": "ray::WorkerDict.", "rollout": "ray::vLLMHttpServer"}
"""What a fault hits on the second node, by process title: an FSDP rank's worker (inside a task), or the vLLM
rollout server of that node's replica."""
INJECT_TIMEOUT_S = 600
"""Seconds a fault may wait for its moment (the step to begin and the target to appear)."""


def bound_s(sig: int, step_timeout: float | None) -> float:
    """How soon after ``sig`` the run must end: SIGKILL 90 s, SIGSTOP the step timeout + 90 s."""
    if sig == signal.SIGKILL:
        return float(KILL_BOUND_S)
    if step_timeout is None:
        raise ValueError("a SIGSTOP fault needs a step timeout (EBPO_STEP_TIMEOUT_S)")
    return step_timeout + KILL_BOUND_S


def check_end(what: str, after_s: float, bound: float) -> str:
    """``after_s`` (fault to the run's end) within ``bound``, else AssertionError; the measured-vs-bound text."""
    text = f"{after_s:.0f} s after the {what} (bound {bound:g} s)"
    if not after_s <= bound:
        raise AssertionError(f"[cpu_smoke] the run ended {text}: past its bound")
    return text


class Fault:
    """``sig`` (SIGKILL: a dead process, SIGSTOP: a hung one) to ``target`` (:data:`TARGETS`) on the second
    node once step ``step`` has begun. The run must then exit non-zero within :func:`bound_s`, with one line
    ``ebpo-train: error:`` naming that process. ``env``: extra environment of the run (the step timeout)."""

    def __init__(self, sig: int, step: int, target: str = "rank", step_timeout: float | None = None) -> None:
        from ebpo_verl.trainer.watchdog import STEP_TIMEOUT_ENV

        self.signal, self.step, self.target, self.step_timeout = sig, step, target, step_timeout
        self.env = {STEP_TIMEOUT_ENV: str(step_timeout)} if step_timeout is not None else {}
        self.bound = bound_s(sig, step_timeout)
        self.pid, self.title, self.injected_at, self.ended_after = 0, "", 0.0, 0.0

    @property
    def name(self) -> str:
        who = "rollout server" if self.target == "rollout" else "rank"
        return f"{signal.Signals(self.signal).name} of a {who}"

    def _ready(self, log: Path, start: int) -> bool:
        """This attempt's fit() began and step ``step - 1`` is in the metrics log."""
        from ebpo_verl.ops.metrics_log import read_records

        with open(log, "rb") as handle:
            handle.seek(start)
            if b"Training Progress" not in handle.read():
                return False
        metrics = log.parent / "ckpt_nodes" / "metrics.jsonl"
        return metrics.is_file() and self.step - 1 in {step for step, _ in read_records(metrics)}

    def inject(self, proc: subprocess.Popen, log: Path, cluster) -> None:
        """Wait (at most :data:`INJECT_TIMEOUT_S`, capped by the deadline) for the moment, then send the signal."""
        start = log.stat().st_size  # this attempt's part of the (appended) log
        deadline = time.monotonic() + limits.left(INJECT_TIMEOUT_S)
        ready = False  # once ready, the log and metrics are not read again: each poll is quick
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"[cpu_smoke] the run ended before the fault could be injected; see {log}")
            if time.monotonic() > deadline:
                raise SystemExit(f"[cpu_smoke] no moment for the {self.name} at step {self.step} within "
                                 f"{INJECT_TIMEOUT_S} s; see {log}")  # fmt: skip
            ready = ready or self._ready(log, start)
            target = cluster.worker_node_process(TARGETS[self.target]) if ready else None
            if target is not None:
                break
            time.sleep(0.05)
        self.pid, self.title = target.pid, " ".join(target.cmdline()[:1])
        cluster.watch.sample_now()  # what the run holds at the fault: the watch unlinks it once the run is gone
        os.kill(self.pid, self.signal)
        self.injected_at = time.monotonic()
        print(f"[cpu_smoke] {signal.Signals(self.signal).name} -> pid {self.pid} ({self.title}) on the second node "
              f"at step {self.step}", flush=True)  # fmt: skip

    def check(self, returncode: int, log: Path, ended_at: float) -> None:
        """Exit non-zero, one error line naming the process, ended within the bound; prints the measured time."""
        text = log.read_text(errors="replace")
        attempt = text[text.rfind("pre-flight: ok") :]  # the last attempt's part of the appended log
        errors = [line for line in attempt.splitlines() if line.startswith("ebpo-train: error:")]
        want = "a worker died" if self.signal == signal.SIGKILL else f"step {self.step} timed out"
        problems = ["the run exited 0"] if returncode == 0 else []
        if len(errors) != 1 or want not in errors[0] or f"pid {self.pid}," not in errors[0]:
            problems.append(f"expected one line 'ebpo-train: error: ...{want}...' naming pid {self.pid}: {errors}")
        if problems:
            tail = "".join(attempt.splitlines(keepends=True)[-60:])
            raise SystemExit(f"[cpu_smoke] fault {self.name}: {'; '.join(problems)}\n{tail}")
        self.ended_after = ended_at - self.injected_at
        timing = check_end(self.name, self.ended_after, self.bound)
        print(f"[cpu_smoke] run ended {timing} (exit {returncode}): {errors[0]}", flush=True)
