"""Starting, waiting for and killing one training run (``python -m ebpo_verl.main``), and the one-node kill run K."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from ebpo_verl.cpu.tiny_runs import run_env
from tests.harness import limits, scan
from tests.harness.settings import SAVE_FREQ, STEPS, overrides

LIVE: list[Run] = []
"""Runs started and not yet ended or killed (killed by the script's SIGTERM/SIGINT handler)."""


class Run:
    """One ``command`` (default: ``python -m ebpo_verl.main`` with run ``name``'s overrides, ``extra`` replacing
    same keys) in its own session with :data:`scan.TAG`, output appended to ``work/<name>.log``."""

    def __init__(
        self,
        work: Path,
        files: dict | None,
        name: str,
        extra: list[str],
        *,
        rollout: str = "hf",
        steps: int = STEPS,
        cluster=None,
        env: dict[str, str] | None = None,
        device: str = "cpu",
        command: list[str] | None = None,
    ) -> None:
        self.name, self.log = name, work / f"{name}.log"
        self.ray_tmp = ""  # a verl run's own Ray temp folder (short: Ray's socket paths fit 107 bytes)
        full_env = {**os.environ, **run_env(device), **(env or {}), scan.TAG_ENV: scan.TAG}
        full_env.pop("RAY_ADDRESS", None)
        if command is None:
            self.ray_tmp = tempfile.mkdtemp(prefix="ebpo-ray-", dir="/tmp")
            chosen = {o.split("=")[0].lstrip("+") for o in extra}
            address = cluster.address if cluster else None
            base = overrides(work, files, name, self.ray_tmp, rollout, steps, address, device)
            command = [sys.executable, "-m", "ebpo_verl.main"]
            command += [o for o in base if o.split("=")[0].lstrip("+") not in chosen] + extra
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                command, cwd=work, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        LIVE.append(self)

    def wait(self, timeout: float) -> int:
        """Its exit status; past ``timeout`` seconds (capped by the deadline) it is killed and this raises."""
        try:
            code = self.proc.wait(timeout=limits.left(timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            raise SystemExit(
                f"[cpu_smoke] run {self.name} exceeded {timeout:.0f}s (--run-timeout or --deadline) and was killed "
                f"with its process group (Ray, vLLM); last lines of {self.log}:\n{self.tail(40)}"
            ) from None
        self._done()
        return code

    def _done(self) -> None:
        if self in LIVE:
            LIVE.remove(self)
        if self.ray_tmp:
            shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def kill(self, watch: scan.Watch | None = None) -> int:
        """SIGKILL the driver's process tree and group (:func:`kill_tree`); the number of processes killed."""
        killed = kill_tree(self.proc.pid, watch=watch)
        self.proc.wait(timeout=60)
        self._done()
        return killed

    def tail(self, lines: int) -> str:
        return "".join(self.log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def kill_procs(procs: list[psutil.Process], timeout: float = 60.0) -> None:
    """SIGKILL each of ``procs`` (gone already is fine) and wait up to ``timeout`` s for them."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=timeout)


def kill_tree(pid: int, timeout: float = 60.0, watch: scan.Watch | None = None) -> int:
    """SIGKILL ``pid``, its descendants and its process group, waiting up to ``timeout`` s (``watch``: stopped and
    sampled first); the number of processes found."""
    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if watch is not None:
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.suspend()
        watch.sample_now()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    kill_procs(tree, timeout)
    return len(tree)


def kill_all() -> int:
    """Kill every live run's tree (the SIGTERM/SIGINT path); the number of runs killed."""
    runs = list(LIVE)
    for run in runs:
        run.kill()
    return len(runs)


def train(
    work: Path,
    files: dict,
    run: str,
    extra: list[str],
    timeout: float,
    *,
    fault=None,
    watch: scan.Watch | None = None,
    **options,
) -> float:
    """One :class:`Run` to its end: it must succeed, or with ``fault`` fail (:class:`faults.Fault`); with ``watch``
    nothing may be left 30 s after. Returns its duration."""
    print(f"[cpu_smoke] run {run}: {work / f'{run}.log'}", flush=True)
    start = time.monotonic()
    proc = Run(work, files, run, extra, env=fault.env if fault else None, **options)
    try:
        if fault:
            fault.inject(proc.proc, proc.log, options["cluster"])
        code = proc.wait(timeout)
        ended = time.monotonic()
    finally:
        if proc.proc.poll() is None:  # the fault's injection failed or was interrupted: stop what the run started
            proc.kill()
    if fault:
        fault.check(code, proc.log, ended)
    elif code != 0:
        raise SystemExit(f"[cpu_smoke] run {run} failed (exit {code}); last lines of {proc.log}:\n{proc.tail(60)}")
    if watch is not None and (left := watch.wait_gone(30)):
        raise AssertionError(f"[cpu_smoke] run {run}: 30 s after its end its processes are still there: {left}")
    print(f"[cpu_smoke] run {run} done in {ended - start:.0f}s", flush=True)
    return ended - start


def wait_for(what: str, done, run: Run, timeout: float) -> None:
    """Poll ``done()`` every 20 ms until it holds while ``run`` is still running; else raise naming ``what``."""
    deadline = time.monotonic() + limits.left(timeout)
    while not done():
        if run.proc.poll() is not None:
            tail = run.tail(60)
            raise SystemExit(f"[cpu_smoke] run {run.name} ended before {what}; last lines of {run.log}:\n{tail}")
        if time.monotonic() > deadline:
            raise SystemExit(f"[cpu_smoke] run {run.name}: no {what} within {timeout:.0f}s")
        time.sleep(0.02)


def lock_holder(lock: Path) -> int | None:
    """The pid in a run folder's lock file, or None (not there, or being written)."""
    try:
        return json.loads(lock.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def k_overrides(work: Path, resume_mode: str) -> list[str]:
    """Runs K (``resume_path``) and K' (``auto``): from A's step-2 checkpoint, checkpoint and validate every step."""
    start = work / "ckpt_a" / f"global_step_{SAVE_FREQ}"
    mode = [f"trainer.resume_mode={resume_mode}", f"trainer.resume_from_path={start}"]
    return [*mode, "trainer.save_freq=1", "trainer.test_freq=1"]


def refused_second_run(work: Path, files: dict, run: Run, timeout: float, device: str) -> str:
    """A second training started on K's folder while K runs: exit 2, one line naming K's pid, before its
    pre-flight and Ray, K undisturbed; returns that line."""
    from ebpo_verl.trainer.checkpoint.run_lock import RUN_LOCK_FILE

    ckpt = work / "ckpt_k"
    wait_for("its lock", lambda: lock_holder(ckpt / RUN_LOCK_FILE) == run.proc.pid, run, timeout)
    second = Run(work, files, "k-second", [f"trainer.default_local_dir={ckpt}"], device=device)
    code = second.wait(timeout)
    assert run.proc.poll() is None, "run K ended while the second run was refused"
    text = second.log.read_text(errors="replace")
    errors = [line for line in text.splitlines() if line.startswith("ebpo-train: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in text, f"the second run: exit {code}\n{text}"
    held = f"ebpo-train: error: trainer.default_local_dir {ckpt} is in use by pid {run.proc.pid}"
    assert errors[0].startswith(held), errors[0]
    assert "pre-flight: ok" not in text and "Started a local Ray instance" not in text, "refused too late"
    return errors[0]


def run_killed(
    work: Path, files: dict, timeout: float, device: str = "cpu", watch: scan.Watch | None = None
) -> tuple[Run, int, str]:
    """Run K (A's settings, folder ``ckpt_k``, from A's step 2): refuses a second run, trains step 3, SIGKILLed once
    the step-3 tracker is written. Returns (the run, processes killed, the refusal line)."""
    from ebpo_verl.trainer.checkpoint.resume import TRACKER_FILE

    tracker = work / "ckpt_k" / TRACKER_FILE
    print(f"[cpu_smoke] run k: {work / 'k.log'}", flush=True)
    run = Run(work, files, "k", k_overrides(work, "resume_path"), steps=STEPS + 1, device=device)
    try:
        refusal = refused_second_run(work, files, run, timeout, device)
        wait_for(
            f"step-{STEPS} checkpoint",
            lambda: tracker.is_file() and tracker.read_text().strip() == str(STEPS),
            run,
            timeout,
        )
    finally:
        killed = run.kill(watch)
    print(f"[cpu_smoke] second run refused (exit 2, before its pre-flight and Ray): {refusal}", flush=True)
    return run, killed, refusal
