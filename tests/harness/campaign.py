"""A random-kill campaign: SIGKILL verl's trainer at seeded points of a step's phases, rerun, check nothing is lost.

``python -m tests.harness.campaign --kills K --seed S --out DIR`` (from a checkout) runs the one-node CPU smoke
configuration (run A of :mod:`tests.harness`, with a checkpoint and a validation every step and a per-topic prior)
uninterrupted (the reference), then K attempts, each SIGKILLed with its whole process tree at a drawn point and rerun
(``resume_mode=auto``), and a last rerun to the end; it checks the invariants of a run that loses nothing and writes
``DIR/campaign_report.json`` (also printed). ``--out DIR --recheck`` reruns the checks on a finished campaign's
folder (:func:`load_report`). docs/training_faults.md has the invariants and a K=8 run.

Where a kill lands. Imported in verl's processes (``VERL_USE_EXTERNAL_MODULES``; the runs have the checkout first on
``PYTHONPATH``, :func:`checkout_path`) with ``EBPO_CAMPAIGN_MARKER`` set, this module wraps the step watchdog's
``enter``/``leave`` so that the trainer appends ``{t, event, step, phase}`` to that marker file. Each kill is drawn from
the seed as (phase, step of the attempt, fraction ``u``): the campaign polls the marker and kills ``u`` times the
phase's length in the reference run after the phase began (``rollout``: generation, up to the first nested phase;
``old_log_prob``; ``update_actor``; ``save``; ``validate``). For ``after_save`` (after the checkpoint, before the step's
log call) the trainer holds after the save when the marker's ``.hold`` file names that step, and is killed there. Where
the kill landed (the innermost open phase, or the phase last left) is read back from the marker at the kill's time; the
check fails unless it is the aimed phase and step.

What is left of an attempt: its processes are found by the smoke scan's environment tag (:class:`Sighting`), sampled
while it lives (the check fails unless that saw the trainer and a Ray process) and counted 30 s after the kill.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import MISSING, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import psutil

from ebpo_verl.cpu import tiny_runs
from ebpo_verl.ops.errors import one_line, shorten
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import PATH, OptionSection, Rule, ints, is_int, nullable, option, reals, text
from tests.harness import checks, runs, scan, settings
from tests.harness.invariants import (
    batch_groups,
    check_leaks,
    check_state,
    check_steps_once,
    compare_metrics,
    expected_state,
    response_flips,
)

MARKER_ENV = "EBPO_CAMPAIGN_MARKER"
MODULE = "tests.harness.campaign"
CHECKOUT = Path(__file__).resolve().parents[2]
"""The checkout this module runs from; verl's processes import :data:`MODULE` from it (:func:`checkout_path`)."""
PHASES = ("rollout", "old_log_prob", "update_actor", "save", "after_save", "validate")
"""The phases a kill is aimed at, in the order of a verl v1 step (validation follows the weight sync)."""
HOLD_S = 600.0
"""How long the trainer holds after a save the ``.hold`` file names (the campaign kills it within seconds)."""


# ------------------------------------------------------------------ the marker (runs inside verl's trainer)
def _write_event(path: str, event: str, step: int, phase: str) -> None:
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, "step": step, "phase": phase})
    with open(path, "a") as out:
        out.write(line + "\n")


def _hold_step(path: str) -> int | None:
    try:
        return int(Path(f"{path}.hold").read_text().strip())
    except (OSError, ValueError):
        return None


def install_marker(path: str) -> None:
    """Wrap :class:`~ebpo_verl.trainer.watchdog.StepWatchdog`'s ``enter``/``leave`` to append events to ``path``."""
    from ebpo_verl.trainer.watchdog import StepWatchdog

    enter, leave = StepWatchdog.enter, StepWatchdog.leave

    def marked_enter(self, *args, **kwargs):  # whatever the signature: the watchdog's step and phase after it
        result = enter(self, *args, **kwargs)
        _write_event(path, "enter", self.step, self.phase)
        return result

    def marked_leave(self, *args, **kwargs) -> None:  # the innermost phase, the one being left
        step, phase = self.step, self.phase
        leave(self, *args, **kwargs)
        _write_event(path, "leave", step, phase)
        if phase == "save" and _hold_step(path) == step:
            _write_event(path, "hold", step, "after_save")
            time.sleep(HOLD_S)

    StepWatchdog.enter, StepWatchdog.leave = marked_enter, marked_leave


if os.environ.get(MARKER_ENV):
    install_marker(os.environ[MARKER_ENV])


# ------------------------------------------------------------------------------- plan and landing
def plan_kills(seed: int, kills: int) -> list[dict[str, Any]]:
    """K kill points from ``seed``: every phase once per round of six (shuffled), the attempt's first or second
    step, and the fraction of the phase's length at which to kill."""
    rng = random.Random(seed)
    phases: list[str] = []
    while len(phases) < kills:
        phases += rng.sample(PHASES, len(PHASES))
    return [{"phase": p, "step_offset": rng.choice((1, 2)), "fraction": round(rng.uniform(0.1, 0.9), 3)}
            for p in phases[:kills]]  # fmt: skip


def read_events(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The marker's events from byte ``offset`` on (a torn last line is left for the next read)."""
    return _new_events(path, offset)[0]


def segment_lengths(events: list[dict[str, Any]]) -> dict[str, float]:
    """Median seconds from a phase's start to the next event (its end, or its first nested phase)."""
    spans: dict[str, list[float]] = {}
    for event, following in zip(events, events[1:], strict=False):
        if event["event"] == "enter":
            spans.setdefault(event["phase"], []).append(following["t"] - event["t"])
    return {phase: float(np.median(values)) for phase, values in spans.items()}


def landing(events: list[dict[str, Any]], kill_time: float) -> dict[str, Any]:
    """Where a kill at ``kill_time`` landed: the innermost open phase, ``after_save`` (held after a save, or
    between a save's end and the next phase), ``after <phase>``, or ``init`` (before the first phase)."""
    stack: list[dict[str, Any]] = []
    last = None
    for event in (e for e in events if e["t"] <= kill_time):
        last = event
        if event["event"] == "enter":
            stack.append(event)
        elif event["event"] == "leave" and stack:
            stack.pop()
    if last is None:
        return {"phase": "init", "step": None, "seconds_in": None}
    since_last = {"step": last["step"], "seconds_in": round(kill_time - last["t"], 3)}
    if last["event"] == "hold" or (not stack and last["phase"] in ("save", "weight_sync")):
        return {"phase": "after_save", **since_last}
    if not stack or (stack[-1]["phase"] == "rollout" and last["event"] == "leave"):  # or between nested phases
        return {"phase": f"after {last['phase']}", **since_last}
    return {"phase": stack[-1]["phase"], "step": stack[-1]["step"], "seconds_in": round(kill_time - stack[-1]["t"], 3)}


# ------------------------------------------------------------------------------------- the runs
def checkout_path() -> dict[str, str]:
    """The runs' ``PYTHONPATH``: :data:`CHECKOUT` first (its ``tests`` before verl's own top-level ``tests``), then
    the campaign's own; Ray's raylet and workers inherit it from the run's driver."""
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(CHECKOUT), *([rest] if rest else [])])}


def campaign_overrides(out: Path, run: str) -> list[str]:
    """Run A's configuration changed for ``run`` (``ref``/``camp``): save, validate every step, topic prior, marker."""
    return ["trainer.save_freq=1", "trainer.test_freq=1", "trainer.resume_mode=auto",
            "algorithm.ebpo.cluster_key=topic", f"trainer.validation_data_dir={out / f'validation_{run}'}",
            f"{tiny_runs.ENV_VARS}.VERL_USE_EXTERNAL_MODULES='{tiny_runs.BACKEND},{MODULE}'",
            f"{tiny_runs.ENV_VARS}.{MARKER_ENV}={out / f'marker_{run}.jsonl'}"]  # fmt: skip


class Sighting:
    """The processes of one run or attempt (by the environment tag, :func:`tests.harness.scan.tagged_processes`),
    sampled every ``period`` s while it lives; :meth:`leak` counts those left after it."""

    def __init__(self, period: float = 2.0) -> None:
        self.period, self.due = period, 0.0
        self.seen: dict[int, str] = {}
        self.ray: set[int] = set()

    def sample(self) -> None:
        """Record the live tagged processes (at most once per period); an unreadable one raises (scan's rule)."""
        if time.monotonic() < self.due:
            return
        self.due = time.monotonic() + self.period
        for proc in scan.tagged_processes():
            try:
                self.seen.setdefault(proc.pid, scan.title(proc)[:60])
                if scan.is_ray(proc):
                    self.ray.add(proc.pid)
            except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
                continue

    def leak(self, trainer: int, grace: float = 30.0) -> dict[str, Any]:
        """What the scan saw, and the tagged processes alive up to ``grace`` s later (killed)."""
        deadline = time.monotonic() + grace
        while (left := scan.tagged_processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        described = scan.describe(left)
        runs.kill_procs(left, timeout=30)
        return {"tagged_seen": len(self.seen), "ray_seen": len(self.ray), "trainer": trainer,
                "trainer_seen": trainer in self.seen, "left": described}  # fmt: skip


def _new_events(path: Path, pos: int) -> tuple[list[dict[str, Any]], int]:
    """The marker's complete lines from byte ``pos`` on, and the byte after the last of them."""
    data = path.read_bytes()[pos:] if path.is_file() else b""
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.decode().splitlines() if line.strip()], pos + len(complete)


def _aim(run, marker: Path, pos: int, target: dict, lengths: dict[str, float], timeout: int,
         sighting: Sighting) -> tuple[float, int]:  # fmt: skip
    """Poll the marker every 5 ms until the target point (module docstring): (time to kill at, trainer's pid); tagged
    processes are sampled until the first training phase."""
    from ebpo_verl.trainer.watchdog import INIT_PHASES

    deadline, kill_at, trainer, training = time.monotonic() + timeout, None, 0, False
    while kill_at is None or time.time() < kill_at:
        if not training:
            sighting.sample()
        if run.proc.poll() is not None:
            raise SystemExit(f"[campaign] the run ended (exit {run.proc.returncode}) before the kill at {target}; "
                             f"see {run.log}")  # fmt: skip
        if time.monotonic() > deadline:
            run.kill()
            raise SystemExit(f"[campaign] no {target['phase']} at step {target['step']} within {timeout}s")
        events, pos = _new_events(marker, pos) if kill_at is None else ([], pos)
        for event in events:
            trainer, training = event["pid"], training or event["phase"] not in INIT_PHASES
            if event["step"] != target["step"] or kill_at is not None:
                continue
            if target["phase"] == "after_save" and event["event"] == "hold":
                kill_at = time.time()
            elif event["event"] == "enter" and event["phase"] == target["phase"]:
                kill_at = event["t"] + target["fraction"] * lengths.get(target["phase"], 1.0)
        time.sleep(0.005 if kill_at is None else max(0.0, min(0.005, kill_at - time.time())))
    return kill_at, trainer


def _kill(run, trainer: int) -> float:
    """SIGKILL the trainer first (the time taken right after), then the attempt's process tree (:meth:`Run.kill`)."""
    if trainer > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(trainer, signal.SIGKILL)
    killed = time.time()
    run.kill()
    return killed


def _on_signal(signum: int, frame: Any) -> None:
    """SIGTERM/SIGINT: kill the running attempt's process tree, then every process with the tag (one that left it)."""
    runs.kill_all()
    runs.kill_procs(scan.tagged_processes(), timeout=30)
    raise SystemExit(f"[campaign] stopped by {signal.Signals(signum).name}; the running attempt was killed")


def install_signal_handlers() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_signal)


def _finish(run, timeout: int, marker: Path, offset: int) -> tuple[float, dict[str, Any]]:
    """Wait for ``run`` (sampling its tagged processes) to succeed: its seconds and its leak record."""
    start, sighting = time.monotonic(), Sighting()
    while run.proc.poll() is None and time.monotonic() - start < timeout:
        sighting.sample()
        time.sleep(0.5)
    code = run.wait(max(1.0, timeout - (time.monotonic() - start)))
    if code != 0:
        raise SystemExit(f"[campaign] run {run.name} failed (exit {code}); last lines of {run.log}:\n{run.tail(60)}")
    wall, first = round(time.monotonic() - start, 1), read_events(marker, offset)[:1]
    return wall, sighting.leak(first[0]["pid"] if first else 0)


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def run_attempts(out: Path, files: dict, plan: list[dict], total: int, timeout: int) -> list[dict[str, Any]]:
    """The killed attempts and the last rerun (``killed: False``) of the campaign run ``camp``."""
    from ebpo_verl.trainer.checkpoint.resume import tracked_step

    marker, hold = out / "marker_camp.jsonl", out / "marker_camp.jsonl.hold"
    lengths = segment_lengths(read_events(out / "marker_ref.jsonl"))
    attempts: list[dict[str, Any]] = []
    for drawn in [*plan, None]:
        resumed = tracked_step(out / "ckpt_camp") or 0
        if drawn is not None and resumed >= total:
            print(f"[campaign] the run reached step {total} before kill {len(attempts) + 1}", flush=True)
            continue
        target = None if drawn is None else {**drawn, "step": min(resumed + drawn["step_offset"], total)}
        if target and target["phase"] == "after_save":
            hold.write_text(str(target["step"]))
        else:
            hold.unlink(missing_ok=True)
        record = {"resumed_from": resumed, "marker_offset": _size(marker), "log_offset": _size(out / "camp.log")}
        run = runs.Run(out, files, "camp", campaign_overrides(out, "camp"), steps=total, env=checkout_path())
        start, sighting = time.monotonic(), Sighting()
        if target is None:
            wall, leak = _finish(run, timeout, marker, record["marker_offset"])
            attempts.append({**record, "killed": False, "wall_s": wall, "leak": leak})
            break
        _, trainer = _aim(run, marker, record["marker_offset"], target, lengths, timeout, sighting)
        kill_time = _kill(run, trainer)
        where = landing(read_events(marker, record["marker_offset"]), kill_time)
        wall, leak = round(time.monotonic() - start, 1), sighting.leak(trainer)
        attempts.append(
            {**record, "killed": True, "target": target, "landed": where, "kill_t": kill_time,
             "kill_utc": _utc(kill_time), "wall_s": wall, "leak": leak, "left_processes": len(leak["left"])}
        )  # fmt: skip
        print(f"[campaign] kill {len(attempts)}: aimed at {target['phase']} of step {target['step']}, landed in "
              f"{where['phase']} of step {where['step']} ({where['seconds_in']}s in) at {_utc(kill_time)}",
              flush=True)  # fmt: skip
    hold.unlink(missing_ok=True)
    return attempts


# ------------------------------------------------------------------------------------ the checks
def _dump(out: Path, run: str, step: int) -> list[str] | None:
    """The lines of ``run``'s rollout dump of ``step``, or None (not written, or torn by a kill)."""
    lines = checks.dump_lines(out / f"rollouts_{run}" / f"{step}.jsonl")
    return lines if lines and len(lines) == settings.BATCH * settings.N else None


def _saved_state(out: Path, step: int) -> dict[str, Any]:
    if step == 0:
        return {"steps": 0, "prompts_seen": 0, "responses_seen": 0, "global": None, "clusters": {}}
    return checks.saved_state(out, "camp", step)


def _during(path: Path, attempts: list[dict], i: int, offset: str) -> str:
    """What ``path`` got during attempt ``i``: from its ``offset`` (a key of the attempt) to the next attempt's."""
    end = attempts[i + 1][offset] if i + 1 < len(attempts) else None
    return path.read_bytes()[attempts[i][offset] : end].decode(errors="replace")


def check_attempts(out: Path, attempts: list[dict]) -> list[dict[str, Any]]:
    """Every rerun said once that it resumes from the tracker's step and its first step was the next one."""
    marker, log, ckpt = out / "marker_camp.jsonl", out / "camp.log", out / "ckpt_camp"
    rows = []
    for i, attempt in enumerate(attempts):
        text = _during(log, attempts, i, "log_offset")
        events = [json.loads(line) for line in _during(marker, attempts, i, "marker_offset").splitlines()]
        c = attempt["resumed_from"]
        said = text.count(f"resumes from {ckpt / f'global_step_{c}'}")
        assert c == 0 or said == 1, f"attempt {i + 1}: said {said} times that it resumes from step {c}, expected once"
        first = next((e["step"] for e in events if e["event"] == "enter" and e["phase"] == "rollout"), None)
        assert first in (None, c + 1), f"attempt {i + 1} resumed from step {c} but its first step was {first}"
        rows.append({"attempt": i + 1, "resumed_from": c, "first_step": first})
    assert attempts[-1]["killed"] is False, "the campaign's last rerun did not run to the end"
    return rows


def check_resumed_states(out: Path, files: dict, attempts: list[dict], total: int) -> list[dict[str, Any]]:
    """At each resume from step c: the saved EB state of step c+1 equals step c's merged with step c+1's batch
    (verl's dump of the campaign run, or the uninterrupted run's when the kill cut the step after its checkpoint
    and before the dump); and step c+1 trained on the uninterrupted run's prompts (the curriculum's position)."""
    label_of, rows = checks.topic_of(files["train"]), []
    for c in sorted({a["resumed_from"] for a in attempts if a["resumed_from"] < total}):
        lines, source = _dump(out, "camp", c + 1), "campaign"
        if lines is None:
            lines, source = _dump(out, "ref", c + 1), "uninterrupted run (no campaign dump of the step)"
        want = expected_state(_saved_state(out, c), batch_groups(lines, label_of))
        check_state(want, _saved_state(out, c + 1), f"resume from step {c}, step {c + 1}")
        if source == "campaign":
            got, ref = (checks.step_rows(out, run, c + 1, files["train"]) for run in ("camp", "ref"))
            assert got == ref, f"step {c + 1} after the resume from step {c} trained rows {got}, uninterrupted {ref}"
        rows.append({"resumed_from": c, "step": c + 1, "batch_from": source, "clusters": sorted(want["clusters"]),
                     "curriculum_checked": "rows" if source == "campaign" else "topic (the EB clusters)"})  # fmt: skip
    return rows


def check_landed(out: Path, attempts: list[dict], want: list[tuple[str, int]] | None = None) -> list[dict]:
    """Each kill landed (:func:`landing`, read back from the marker) at the phase and step the report lists and
    ``want`` aims at (default: the targets); raises naming the first that did not."""
    marker, rows = out / "marker_camp.jsonl", []
    killed = [(i, a) for i, a in enumerate(attempts) if a["killed"]]
    want = want if want is not None else [(a["target"]["phase"], a["target"]["step"]) for _, a in killed]
    if len(want) != len(killed):
        raise AssertionError(f"{len(killed)} kills, {len(want)} expected landings")
    for (i, attempt), (phase, step) in zip(killed, want, strict=True):
        if "kill_t" not in attempt:
            raise AssertionError(f"kill {len(rows) + 1}: no kill time in the report (it predates it): its landing "
                                 "cannot be read back from the marker")  # fmt: skip
        events = [json.loads(line) for line in _during(marker, attempts, i, "marker_offset").splitlines()]
        where = landing(events, attempt["kill_t"])
        if where != attempt["landed"]:
            raise AssertionError(f"kill {len(rows) + 1}: the marker says it landed in {where}, the report "
                                 f"{attempt['landed']}")  # fmt: skip
        if (where["phase"], where["step"]) != (phase, step):
            raise AssertionError(f"kill {len(rows) + 1} landed in {where['phase']} of step {where['step']} "
                                 f"({where['seconds_in']}s in), not in {phase} of step {step}")  # fmt: skip
        rows.append({"kill": len(rows) + 1, "landed": where["phase"], "step": where["step"]})
    return rows


def check_campaign(out: Path, files: dict, report: dict[str, Any]) -> dict[str, Any]:
    """Every invariant (raises AssertionError on the first that fails); what was checked."""
    from ebpo_verl.ops.metrics_log import read_metrics_log, read_records

    attempts, total = report["attempts"], report["steps"]
    leaks = [("the uninterrupted run", report.get("reference_leak"))]
    check_leaks(leaks + [(f"attempt {i}", a.get("leak")) for i, a in enumerate(attempts, 1)])
    landed = check_landed(out, attempts)
    log = out / "ckpt_camp" / "metrics.jsonl"
    training = [step for step, data in read_records(log) if "actor/grad_norm" in data]
    check_steps_once(training, total)
    resumes = check_attempts(out, attempts)
    states = check_resumed_states(out, files, attempts, total)
    dumped = [s for s in range(1, total + 1) if _dump(out, "camp", s) is not None]
    for step in dumped:  # the curriculum's position at every step the campaign dumped
        got, ref = (checks.step_rows(out, run, step, files["train"]) for run in ("camp", "ref"))
        assert got == ref, f"campaign step {step} trained rows {got}, the uninterrupted run {ref}"
    ref_metrics, camp = read_metrics_log(out / "ckpt_ref" / "metrics.jsonl"), read_metrics_log(log)
    no_val = [s for s in range(1, total + 1) if settings.VAL_KEY not in camp[s]]
    found = flips(out, total)
    first = min((s for s, kinds in found["flipped"].items() if "rollout" in kinds), default=None)
    same, in_order = set(found["validation_same"]), set(found["validation_in_order"])
    compared = compare_metrics(ref_metrics, camp, list(range(1, total + 1)), first, same, in_order)
    return {"leaks": "every run's and attempt's processes seen by the tag scan; none left after it", "landed": landed,
            "metrics_log_steps": training, "resumes": resumes, "eb_states": states, "curriculum_steps_compared": dumped,
            "steps_without_validation_logged": no_val, "first_rollout_flip": first,
            "flipped_responses": found["flipped"], "validation_same": found["validation_same"],
            "validation_in_order": found["validation_in_order"],
            "vs_uninterrupted": compared}  # fmt: skip


def flips(out: Path, total: int) -> dict[str, Any]:
    """Per step and kind (rollout, validation), the responses that differ between the campaign's and the
    uninterrupted run's dumps; and the steps whose validation dumps both exist and agree (as multisets, and line by
    line: their order is the batch's)."""
    flipped: dict[int, dict[str, list]] = {}
    same, in_order = [], []
    for step in range(1, total + 1):
        for kind in ("rollout", "validation"):  # a validation dump is complete with as many lines as the other
            val = [checks.dump_lines(out / f"validation_{run}" / f"{step}.jsonl") for run in ("camp", "ref")]
            dumps = [_dump(out, run, step) for run in ("camp", "ref")] if kind == "rollout" else val
            if None in dumps or len(dumps[0]) != len(dumps[1]):
                continue
            differ = response_flips(*dumps)
            if differ:
                flipped.setdefault(step, {})[kind] = differ
            elif kind == "validation":
                same.append(step)
                camp, ref = ([(e["input"], e["output"]) for e in map(json.loads, lines)] for lines in dumps)
                if camp == ref:
                    in_order.append(step)
    return {"flipped": flipped, "validation_same": same, "validation_in_order": in_order}


def _checked(report: dict[str, Any], out: Path, files: dict) -> dict[str, Any]:
    """``report`` with the checks of its attempts (``ok``, or ``failed`` naming the first invariant that failed)."""
    report = {k: v for k, v in report.items() if k not in ("checks", "ok", "failed")}
    try:
        report["checks"] = check_campaign(out, files, report)
        report["ok"] = report["kills_done"] == report["kills_drawn"]
    except AssertionError as err:
        report["ok"], report["failed"] = False, str(err)
    return report


_INT, _COUNT, _BOOL = Rule(is_int, "an integer"), ints(0), Rule(lambda x: isinstance(x, bool), "true or false")
_LIST, _OBJECT = Rule(lambda x: isinstance(x, list), "a list"), Rule(lambda x: isinstance(x, dict), "an object")


def _require(obj: Any, where: str, **rules: Rule) -> None:
    """ValueError naming ``where`` unless ``obj`` is an object whose fields ``rules`` names pass those rules."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is not an object")
    for key, rule in rules.items():
        if key not in obj or not rule.test(obj[key]):
            found = f", not {shorten(obj[key])}" if key in obj else ""
            raise ValueError(f"{where}: {key} must be {rule.text}{found}")


def load_report(path: Path) -> dict[str, Any]:
    """A finished campaign's report; SystemExit (one line) unless UTF-8 JSON with each field the checks read, typed
    as :func:`_campaign` writes it (integers JSON integers >= 0 but ``seed``; ``kill_t`` and the leaks optional)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        _require(report, "the report", seed=_INT, kills_drawn=_COUNT, steps=_COUNT, kills_done=_COUNT, plan=_LIST,
                 attempts=Rule(lambda x: isinstance(x, list) and x != [], "a non-empty list"))  # fmt: skip
        leaks = [("reference_leak", report.get("reference_leak"))]
        for i, attempt in enumerate(report["attempts"], 1):
            where = f"attempt {i}"
            _require(attempt, where, resumed_from=_COUNT, marker_offset=_COUNT, log_offset=_COUNT, killed=_BOOL)
            if attempt["killed"]:
                _require({"kill_t": 0.0, **attempt}, where, target=_OBJECT, landed=_OBJECT, kill_t=reals())
                _require(attempt["target"], f"{where}'s target", phase=text("a string"), step=_INT)
            leaks.append((f"{where}'s leak", attempt.get("leak")))
        for where, leak in (pair for pair in leaks if pair[1] is not None):
            _require(leak, where, trainer_seen=_BOOL, ray_seen=_COUNT, trainer=_INT, left=_LIST)
    except (OSError, ValueError, RecursionError) as err:  # JSON's errors and a non-UTF-8 byte are ValueErrors
        why = "nested too deeply" if isinstance(err, RecursionError) else one_line(err)
        raise SystemExit(f"[campaign] --recheck: {path} is not a campaign report: {why}") from err
    return report


def _campaign(args: CampaignOptions, out: Path) -> dict[str, Any]:
    total, start = args.steps or args.kills + 3, time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    files = settings.prepare(out)
    install_signal_handlers()
    ref = runs.Run(out, files, "ref", campaign_overrides(out, "ref"), steps=total, env=checkout_path())
    ref_wall, ref_leak = _finish(ref, args.run_timeout, out / "marker_ref.jsonl", 0)
    plan = plan_kills(args.seed, args.kills)
    report: dict[str, Any] = {"seed": args.seed, "kills_drawn": args.kills, "steps": total, "plan": plan,
                              "reference_wall_s": ref_wall, "reference_leak": ref_leak}  # fmt: skip
    report["attempts"] = run_attempts(out, files, plan, total, args.run_timeout)
    report["kills_done"] = sum(a["killed"] for a in report["attempts"])
    report["wall_s"] = round(time.monotonic() - start, 1)
    (out / "campaign_report.json").write_text(json.dumps(report, indent=1) + "\n")  # before the checks
    return _checked(report, out, files)


@dataclass(frozen=True)
class CampaignOptions(OptionSection):
    """The campaign's command line."""

    SECTION: ClassVar[str] = ""

    kills: int | None = nullable("number of kills K", ints(1))
    seed: int | None = nullable("seed of the kill points", Rule(is_int, "an integer"))
    out: str = option(MISSING, "a new or empty folder for the runs and the report", rule=PATH)
    steps: int | None = nullable("training steps (null: kills + 3)", ints(1))
    run_timeout: int = option(900, "seconds allowed per attempt", rule=ints(1))
    recheck: bool = option(False, "only rerun the checks on a finished campaign's --out", choices=(True, False))

    def __post_init__(self) -> None:
        super().__post_init__()
        report = Path(self.out).resolve() / "campaign_report.json"
        if self.recheck and not report.is_file():
            raise ValueError(f"--recheck: {report} not found; pass a finished campaign's --out")
        if not self.recheck and (self.kills is None or self.seed is None):
            raise ValueError("give --kills K (K >= 1) and --seed S")
        if not self.recheck and report.parent.exists() and any(report.parent.iterdir()):
            raise ValueError(f"--out {report.parent} is not empty; pass a new or empty folder")


def main(argv: list[str] | None = None) -> int:
    args = parse(CampaignOptions, f"python -m {MODULE}", argv, __doc__.splitlines()[0])
    out = Path(args.out).resolve()
    report = (_checked(load_report(out / "campaign_report.json"), out, {"train": out / "train.parquet"})
              if args.recheck else _campaign(args, out))  # fmt: skip
    (out / "campaign_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1), flush=True)
    print(f"[campaign] {'OK' if report['ok'] else 'FAILED'}: report {out / 'campaign_report.json'}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
