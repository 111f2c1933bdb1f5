"""The random-kill campaign (tests/harness/campaign.py): its invariant checks fed broken cases, its plan, marker and
landing logic on fabricated events, and (slow, heavy) a small campaign of real verl trainer starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ebpo_verl.algos.ebpo_state import EBPOState
from tests.harness import campaign, invariants

REPO = Path(__file__).resolve().parents[1]


def _dump_lines(groups: dict[str, list[float]]) -> list[str]:
    return [json.dumps({"input": text, "score": s}) for text, scores in groups.items() for s in scores]


BATCH_1 = {"algebra: x+1": [1.0, 0.0, 1.0, 1.0], "algebra: 2x": [0.0, 0.0, 0.0, 1.0], "geometry: circle": [1.0, 1.0]}
BATCH_2 = {"geometry: square": [0.0, 1.0, 1.0, 0.0], "number theory: 7": [1.0, 1.0, 1.0, 1.0]}


def _label(text: str) -> str:
    return text.split(":")[0]


def _by_hand(values: list[float]) -> list[float]:
    """[n, mean, M2] straight from the definition (two passes over the values)."""
    v = np.array(values, dtype=np.float64)
    return [float(v.size), float(v.mean()), float(((v - v.mean()) ** 2).sum())]


def _state_after(*batches: dict[str, list[float]]) -> dict:
    state = {"steps": 0, "prompts_seen": 0, "responses_seen": 0, "global": None, "clusters": {}}
    for batch in batches:
        state = invariants.expected_state(state, invariants.batch_groups(_dump_lines(batch), _label))
    return state


def test_expected_state_equals_the_definition_over_all_batches():
    state = _state_after(BATCH_1, BATCH_2)
    groups = [g for b in (BATCH_1, BATCH_2) for g in b.values()]
    assert (state["steps"], state["prompts_seen"], state["responses_seen"]) == (2, 5, 18)
    want = {
        "rewards": _by_hand([x for g in groups for x in g]),
        "group_means": _by_hand([np.mean(g) for g in groups]),
        "within_var": _by_hand([np.var(g, ddof=1) for g in groups]),
        "inv_group_size": _by_hand([1 / len(g) for g in groups]),
    }
    invariants.check_state({**state, "global": want, "clusters": state["clusters"]}, state, "global")
    geometry = [BATCH_1["geometry: circle"], BATCH_2["geometry: square"]]
    assert state["clusters"]["geometry"]["rewards"] == pytest.approx(_by_hand([x for g in geometry for x in g]))
    assert state["clusters"]["geometry"]["within_var"] == pytest.approx(_by_hand([np.var(g, ddof=1) for g in geometry]))
    assert sorted(state["clusters"]) == ["algebra", "geometry", "number theory"]


def test_check_state_accepts_the_package_merge():
    """The package's own EB state after the same two batches (its Chan merge, ``Moments.merged``) passes
    the numpy recomputation."""
    from ebpo_verl.algos.ebpo_state import PriorStats
    from ebpo_verl.algos.moments import Moments

    def stats(groups: list[list[float]]) -> PriorStats:
        series = ([x for g in groups for x in g], [np.mean(g) for g in groups], [np.var(g, ddof=1) for g in groups],
                  [1 / len(g) for g in groups])  # fmt: skip
        return PriorStats(*(Moments(*_by_hand(values)) for values in series))

    state = EBPOState()
    for batch in (BATCH_1, BATCH_2):
        state.global_stats = state.global_stats.merged(stats(list(batch.values())))
        for label in {_label(t) for t in batch}:
            part = stats([g for t, g in batch.items() if _label(t) == label])
            state.clusters[label] = state.clusters.get(label, PriorStats()).merged(part)
        state.steps, state.prompts_seen = state.steps + 1, state.prompts_seen + len(batch)
        state.responses_seen += sum(len(g) for g in batch.values())
    saved = json.loads(json.dumps(state.state_dict()))
    invariants.check_state(_state_after(BATCH_1, BATCH_2), saved, "package")


@pytest.mark.parametrize(
    ("field", "change", "message"),
    [
        (("global", "rewards", 2), 1e-6, "global rewards"),  # a wrong M2
        (("global", "within_var", 2), -1e-3, "global within_var"),
        (("clusters", "geometry", "group_means", 1), 1e-7, "cluster 'geometry' group_means"),
        (("global", "rewards", 0), 1.0, "global rewards"),  # a wrong count
        (("prompts_seen",), 1, "prompts_seen"),
    ],
)
def test_check_state_refuses_a_wrong_moment(field, change, message):
    want = _state_after(BATCH_1, BATCH_2)
    got = json.loads(json.dumps(want))
    *path, last = field
    target = got
    for key in path:
        target = target[key]
    target[last] += change
    with pytest.raises(AssertionError, match=message):
        invariants.check_state(want, got, "step 2")


def test_check_state_refuses_a_missing_or_extra_cluster():
    want = _state_after(BATCH_1, BATCH_2)
    got = json.loads(json.dumps(want))
    del got["clusters"]["number theory"]
    with pytest.raises(AssertionError, match="clusters"):
        invariants.check_state(want, got, "step 2")


def test_a_batch_left_out_or_counted_twice_is_refused():
    once = _state_after(BATCH_1, BATCH_2)
    with pytest.raises(AssertionError, match="steps"):
        invariants.check_state(_state_after(BATCH_1, BATCH_2, BATCH_2), once, "replayed batch")
    skipped = _state_after(BATCH_1)
    with pytest.raises(AssertionError):
        invariants.check_state(once, {**skipped, "steps": 2, "prompts_seen": 5, "responses_seen": 18}, "lost batch")


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([1, 2, 2, 3, 4], r"duplicated \[2\]"),
        ([1, 2, 4], r"missing \[3\]"),
        ([1, 3, 2, 4], "want 1..4"),
        ([], "missing"),
    ],
)
def test_check_steps_once_refuses_a_duplicated_missing_or_reordered_step(steps, message):
    with pytest.raises(AssertionError, match=message):
        invariants.check_steps_once(steps, 4)
    invariants.check_steps_once([1, 2, 3, 4], 4)


def test_compare_metrics_within_tolerance_and_beyond():
    ref = {1: {"actor/pg_loss": 0.5, "critic/score/mean": 0.25, "timing_s/gen": 3.0, "rollout_corr/chi2_seq": 0.01}}
    close = {
        1: {"actor/pg_loss": 0.5 + 1e-7, "critic/score/mean": 0.25, "timing_s/gen": 9.0, "rollout_corr/chi2_seq": 0.03}
    }
    out = invariants.compare_metrics(ref, close, [1], None, set(), set())
    assert out["compared_keys"] == 2 and out["exact_keys"] == 1 and out["beyond_tolerance"] == []
    assert out["max_abs_diff"]["actor/pg_loss"] == pytest.approx(1e-7)
    # the edge of the tolerance: 5e-3 x max(1, |0.5|) passes, a hair more fails
    edge = {1: {**ref[1], "actor/pg_loss": 0.5 + 0.9999 * invariants.METRIC_TOL}}
    assert invariants.compare_metrics(ref, edge, [1], None, set(), set())["beyond_tolerance"] == []
    with pytest.raises(AssertionError, match="actor/pg_loss"):
        invariants.compare_metrics(ref, {1: {**ref[1], "actor/pg_loss": 0.5 + 1.01 * invariants.METRIC_TOL}}, [1],
                                   None, set(), set())  # fmt: skip


STEPS5 = {s: {"actor/grad_norm": 2.0, "critic/score/mean": 0.25, "val-core/x/acc/mean@2": 0.5} for s in range(1, 6)}


def _moved(step: int, key: str, value: float) -> dict[int, dict]:
    got = json.loads(json.dumps(STEPS5), object_hook=lambda d: {int(k) if k.isdigit() else k: v for k, v in d.items()})
    got[step][key] = value
    return got


def test_a_training_metric_moved_at_a_middle_step_fails_the_campaign():
    """Step 3 of 5, no flip anywhere (or only from step 4 on): the grad norm moved by 1% fails; from the first
    rollout flip on it is only listed."""
    got = _moved(3, "actor/grad_norm", 2.02)
    for first_flip in (None, 4, 5):
        with pytest.raises(AssertionError, match=r"step 3 actor/grad_norm: campaign 2\.02 vs uninterrupted 2\.0"):
            invariants.compare_metrics(STEPS5, got, [1, 2, 3, 4, 5], first_flip, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5})
    out = invariants.compare_metrics(STEPS5, got, [1, 2, 3, 4, 5], 3, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5})
    assert out["beyond_tolerance"] == ["step 3 actor/grad_norm (after the rollout flip at step 3)"]
    assert out["training_steps_bound"] == [1, 2]


def test_val_metrics_bind_where_the_validation_dumps_agree_and_a_flip_excuses_only_its_step():
    got = _moved(3, "val-core/x/acc/mean@2", 0.5625)  # one of 16 validation responses flipped at step 3
    with pytest.raises(AssertionError, match="step 3 val-core/x/acc/mean@2"):
        invariants.compare_metrics(STEPS5, got, [1, 2, 3, 4, 5], None, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5})
    # step 3's dumps differ
    out = invariants.compare_metrics(STEPS5, got, [1, 2, 3, 4, 5], None, {1, 2, 4, 5}, {1, 2, 4, 5})
    assert out["beyond_tolerance"] == ["step 3 val-core/x/acc/mean@2 (validation responses differ or were not dumped)"]
    assert out["val_steps_bound"] == [1, 2, 4, 5]
    also = _moved(4, "val-core/x/acc/mean@2", 0.5625)
    also[3]["val-core/x/acc/mean@2"] = 0.5625
    with pytest.raises(
        AssertionError, match="1 metrics beyond .* step 4 val-core"
    ):  # step 3's flip excuses step 3 only
        invariants.compare_metrics(STEPS5, also, [1, 2, 3, 4, 5], None, {1, 2, 4, 5}, {1, 2, 4, 5})
    # a rollout flip does not excuse val-* metrics whose dumps agree
    with pytest.raises(AssertionError, match="step 4 val-core"):
        invariants.compare_metrics(STEPS5, _moved(4, "val-core/x/acc/mean@2", 0.6), [1, 2, 3, 4, 5], 2, {4}, {4})


def test_bootstrap_val_metrics_bind_only_where_the_validation_dumps_agree_in_order():
    """verl resamples each prompt's responses in batch order (seed 42) for best@/worst@/maj@: the same responses in
    swapped order move them, so they bind at steps whose dumps agree line by line; mean@ binds on the multiset."""
    ref = {s: {**STEPS5[s], "val-core/x/acc/best@2/mean": 0.75} for s in STEPS5}
    got = json.loads(json.dumps(ref), object_hook=lambda d: {int(k) if k.isdigit() else k: v for k, v in d.items()})
    got[3]["val-core/x/acc/best@2/mean"] = 0.7725
    every = {1, 2, 3, 4, 5}
    with pytest.raises(AssertionError, match="step 3 val-core/x/acc/best@2/mean"):
        invariants.compare_metrics(ref, got, [1, 2, 3, 4, 5], None, every, every)
    out = invariants.compare_metrics(ref, got, [1, 2, 3, 4, 5], None, every, {1, 2, 4, 5})
    assert out["beyond_tolerance"] == [
        "step 3 val-core/x/acc/best@2/mean (validation responses differ, or not in the same order)"
    ]
    assert out["val_steps_bound"] == [1, 2, 3, 4, 5] and out["val_bootstrap_steps_bound"] == [1, 2, 4, 5]
    got[3]["val-core/x/acc/mean@2"] = 0.5625  # the multiset agrees at step 3: mean@2 still binds
    with pytest.raises(AssertionError, match="1 metrics beyond .* step 3 val-core/x/acc/mean@2"):
        invariants.compare_metrics(ref, got, [1, 2, 3, 4, 5], None, every, {1, 2, 4, 5})


def test_flips_tell_validation_dumps_in_the_same_order_from_swapped_ones(tmp_path):
    lines = [json.dumps({"input": p, "output": o}) for p, o in (("p1", "a"), ("p1", "b"), ("p2", "c"), ("p2", "c"))]
    swapped = [lines[1], lines[0], *lines[2:]]
    for run, steps in (("ref", (lines, lines)), ("camp", (lines, swapped))):
        (tmp_path / f"validation_{run}").mkdir()
        for step, dump in enumerate(steps, 1):
            (tmp_path / f"validation_{run}" / f"{step}.jsonl").write_text("\n".join(dump) + "\n")
    found = campaign.flips(tmp_path, 2)
    assert found == {"flipped": {}, "validation_same": [1, 2], "validation_in_order": [1]}


def test_response_flips_name_the_outputs_that_flipped():
    ref = [json.dumps({"input": p, "output": o}) for p, o in (("p1", "a"), ("p1", "b"), ("p2", "c"))]
    camp = [json.dumps({"input": p, "output": o}) for p, o in (("p2", "c"), ("p1", "b"), ("p1", "z"))]
    assert invariants.response_flips(ref[::-1], ref) == []
    assert invariants.response_flips(camp, ref) == [{"input": "p1", "campaign": ["z"], "uninterrupted": ["a"]}]


def test_responses_ignore_the_finishing_order():
    a = [json.dumps({"input": "p", "output": o}) for o in ("x", "y")]
    assert invariants.responses(a) == invariants.responses(a[::-1])
    assert invariants.responses(a) != invariants.responses([a[0], a[0]])


def _fabricated_attempts(out: Path, first_steps: list[int], resumed: list[int], said: list[int]) -> list[dict]:
    """A campaign folder's log and marker for attempts resuming from ``resumed``, each saying ``said`` times that
    it resumes and first rolling out ``first_steps``."""
    attempts, log, marker = [], b"", b""
    for i, (first, c, times) in enumerate(zip(first_steps, resumed, said, strict=True)):
        attempts.append({"resumed_from": c, "log_offset": len(log), "marker_offset": len(marker),
                         "killed": i < len(resumed) - 1})  # fmt: skip
        log += f"pre-flight: ok (...; resumes from {out / 'ckpt_camp' / f'global_step_{c}'})\n".encode() * times
        marker += (json.dumps(_event(float(i), "enter", first, "rollout")) + "\n").encode()
    (out / "camp.log").write_bytes(log)
    (out / "marker_camp.jsonl").write_bytes(marker)
    return attempts


def test_check_attempts_accepts_resumes_that_continue(tmp_path):
    attempts = _fabricated_attempts(tmp_path, [1, 2, 4], [0, 1, 3], [0, 1, 1])
    rows = campaign.check_attempts(tmp_path, attempts)
    assert [(r["resumed_from"], r["first_step"]) for r in rows] == [(0, 1), (1, 2), (3, 4)]


@pytest.mark.parametrize(
    ("first", "said", "message"),
    [([1, 3, 4], [0, 1, 1], "attempt 2 resumed from step 1 but its first step was 3"),  # a step skipped
     ([1, 1, 4], [0, 1, 1], "attempt 2 resumed from step 1 but its first step was 1"),  # a step redone
     ([1, 2, 4], [0, 0, 1], "attempt 2: said 0 times"),
     ([1, 2, 4], [0, 2, 1], "attempt 2: said 2 times")],
)  # fmt: skip
def test_check_attempts_refuses_a_rerun_that_does_not_continue(tmp_path, first, said, message):
    with pytest.raises(AssertionError, match=message):
        campaign.check_attempts(tmp_path, _fabricated_attempts(tmp_path, first, [0, 1, 3], said))


def test_plan_covers_every_phase_and_depends_on_the_seed():
    plan = campaign.plan_kills(8, 8)
    assert set(p["phase"] for p in plan[:6]) == set(campaign.PHASES) and len(plan) == 8
    assert plan == campaign.plan_kills(8, 8) and plan != campaign.plan_kills(2, 8)
    assert all(p["step_offset"] in (1, 2) and 0.1 <= p["fraction"] <= 0.9 for p in plan)


def _event(t, event, step, phase):
    return {"t": t, "event": event, "step": step, "phase": phase}


STEP = [
    _event(10.0, "enter", 3, "rollout"),
    _event(14.0, "enter", 3, "old_log_prob"),
    _event(15.0, "leave", 3, "old_log_prob"),
    _event(15.5, "enter", 3, "update_actor"),
    _event(17.5, "leave", 3, "update_actor"),
    _event(17.6, "leave", 3, "rollout"),
    _event(17.7, "enter", 3, "save"),
    _event(18.7, "leave", 3, "save"),
    _event(18.8, "enter", 3, "weight_sync"),
    _event(18.9, "leave", 3, "weight_sync"),
    _event(19.0, "enter", 3, "validate"),
    _event(21.0, "leave", 3, "validate"),
]


@pytest.mark.parametrize(
    ("t", "phase", "seconds_in"),
    [
        (5.0, "init", None),
        (12.0, "rollout", 2.0),
        (14.5, "old_log_prob", 0.5),
        (15.2, "after old_log_prob", 0.2),
        (16.0, "update_actor", 0.5),
        (18.0, "save", 0.3),
        (18.75, "after_save", 0.05),
        (18.85, "weight_sync", 0.05),
        (19.5, "validate", 0.5),
        (21.5, "after validate", 0.5),
    ],
)
def test_landing_is_the_innermost_phase_at_the_kill(t, phase, seconds_in):
    got = campaign.landing(STEP, t)
    assert got["phase"] == phase and got["seconds_in"] == (None if seconds_in is None else pytest.approx(seconds_in))


def test_landing_after_a_hold_and_segment_lengths():
    held = [*STEP[:8], _event(18.71, "hold", 3, "after_save")]
    assert campaign.landing(held, 30.0) == {"phase": "after_save", "step": 3, "seconds_in": pytest.approx(11.29)}
    lengths = campaign.segment_lengths(STEP)
    assert lengths["rollout"] == pytest.approx(4.0) and lengths["save"] == pytest.approx(1.0)
    assert lengths["validate"] == pytest.approx(2.0)


def test_marker_records_the_watchdog_phases_and_holds(tmp_path, monkeypatch):
    """In a child process (the wrapper patches the watchdog class): enter/leave events, and the hold after the
    save of the step named in the .hold file."""
    marker = tmp_path / "m.jsonl"
    (tmp_path / "m.jsonl.hold").write_text("2")
    code = (
        "import tests.harness.campaign as c; c.HOLD_S = 0.3\n"
        f"c.install_marker({str(marker)!r})\n"
        "from ebpo_verl.trainer.watchdog import StepWatchdog\n"
        "w = StepWatchdog(None)\n"
        "for step in (1, 2):\n"
        "    p = w.enter(step, 'save'); w.leave(p, 'save')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(campaign.MARKER_ENV, None)
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    events = [(e["event"], e["step"], e["phase"]) for e in campaign.read_events(marker)]
    assert events == [("enter", 1, "save"), ("leave", 1, "save"), ("enter", 2, "save"), ("leave", 2, "save"),
                      ("hold", 2, "after_save")]  # fmt: skip
    assert time.monotonic() - start >= 0.3


def test_read_events_leaves_a_torn_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(_event(1.0, "enter", 1, "rollout")) + "\n" + '{"t": 2.0, "ev')
    assert [e["phase"] for e in campaign.read_events(path)] == ["rollout"]
    assert campaign.read_events(tmp_path / "none.jsonl") == []


def _tagged_setsid_sleeper(seconds: int = 120) -> subprocess.Popen:
    """A process carrying the smoke scan's tag (as every process of an attempt does) in a session of its own, as a
    process that called ``setsid`` is: a count by the attempt's session id would never see it."""
    from tests.harness import scan

    env = {**os.environ, scan.TAG_ENV: scan.TAG}
    proc = subprocess.Popen(["setsid", sys.executable, "-c", f"import time; time.sleep({seconds})"], env=env)
    deadline = time.monotonic() + 30
    while os.getsid(proc.pid) != proc.pid and time.monotonic() < deadline:  # setsid has exec'd python
        time.sleep(0.02)
    assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    return proc


def test_a_leaked_setsid_process_fails_the_leak_check():
    from tests.harness import scan

    proc = _tagged_setsid_sleeper()
    try:
        sighting = campaign.Sighting(period=0.0)
        sighting.sample()
        leak = sighting.leak(proc.pid, grace=0.5)  # the leftover is killed, so the next attempt starts clean
        assert leak["left"] == [(proc.pid, sys.executable)] and leak["trainer_seen"]
        with pytest.raises(AssertionError, match=rf"attempt 3: 1 tagged processes left after it: \[\({proc.pid}, "):
            invariants.check_leaks([("attempt 3", {**leak, "ray_seen": 1})])
        assert proc.pid not in {p.pid for p in scan.tagged_processes()}  # killed (and reaped) by leak()
    finally:
        proc.kill()
        proc.wait()


def test_a_leak_count_that_saw_nothing_fails():
    clean = {"tagged_seen": 9, "ray_seen": 3, "trainer": 42, "trainer_seen": True, "left": []}
    invariants.check_leaks([("attempt 1", clean)])
    with pytest.raises(AssertionError, match=r"saw 3 Ray processes and not its trainer \(pid 42\)"):
        invariants.check_leaks([("attempt 1", {**clean, "trainer_seen": False})])
    with pytest.raises(AssertionError, match="saw 0 Ray processes"):
        invariants.check_leaks([("attempt 1", {**clean, "ray_seen": 0})])
    with pytest.raises(AssertionError, match="no tag-based leak count"):  # a report from before the count
        invariants.check_leaks([("attempt 1", None)])


def _landing_folder(out: Path, kill_t: float, landed: dict) -> list[dict]:
    """A campaign folder whose one killed attempt ran STEP (below) and was killed at ``kill_t``."""
    (out / "marker_camp.jsonl").write_text("".join(json.dumps(e) + "\n" for e in STEP))
    target = {"phase": "update_actor", "step_offset": 1, "fraction": 0.25, "step": 3}
    killed = {"killed": True, "marker_offset": 0, "target": target, "landed": landed, "kill_t": kill_t}
    return [killed, {"killed": False, "marker_offset": (out / "marker_camp.jsonl").stat().st_size}]


def test_check_landed_reads_the_marker_and_refuses_a_kill_that_landed_elsewhere(tmp_path):
    at = {"phase": "update_actor", "step": 3, "seconds_in": 0.5}
    assert campaign.check_landed(tmp_path, _landing_folder(tmp_path, 16.0, at)) == [
        {"kill": 1, "landed": "update_actor", "step": 3}
    ]
    later = {"phase": "save", "step": 3, "seconds_in": 0.3}  # aimed at the update, landed in the save
    with pytest.raises(AssertionError, match=r"kill 1 landed in save of step 3 \(0\.3s in\), not in update_actor"):
        campaign.check_landed(tmp_path, _landing_folder(tmp_path, 18.0, later))
    with pytest.raises(AssertionError, match="the marker says it landed in"):  # the report disagrees with the marker
        campaign.check_landed(tmp_path, _landing_folder(tmp_path, 18.0, at))
    with pytest.raises(AssertionError, match=r"not in validate of step 3"):  # the test's own expectation
        campaign.check_landed(tmp_path, _landing_folder(tmp_path, 16.0, at), [("validate", 3)])


SIGTERM_SUBJECT = """
import sys, time
from pathlib import Path
from tests.harness import runs, scan
from tests.harness import campaign
# an attempt: a tree of processes, one of which left it (setsid + double fork), all carrying the tag
escape = "setsid sh -c 'sleep 300 &' ; sleep 300 & wait"
run = runs.Run(Path(sys.argv[1]), None, "attempt", [], command=["bash", "-c", escape])
runs.LIVE[:] = [run]
campaign.install_signal_handlers()
print(scan.TAG, run.proc.pid, flush=True)
time.sleep(300)
"""


def test_the_campaigns_sigterm_leaves_nothing(tmp_path):
    from tests.harness import scan

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subject = subprocess.Popen([sys.executable, "-c", SIGTERM_SUBJECT, str(tmp_path)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    tag, driver = subject.stdout.readline().split()
    try:
        deadline = time.monotonic() + 30
        while len(found := scan.tagged_processes(tag)) < 3 and time.monotonic() < deadline:  # bash, 2 sleeps
            time.sleep(0.05)
        escaped = [p for p in found if p.name() == "sleep" and p.ppid() != int(driver)]
        assert len(found) == 3 and len(escaped) == 1, [(p.pid, p.name(), p.ppid()) for p in found]
        assert os.getsid(escaped[0].pid) != int(driver)  # out of the attempt's session and tree
        subject.send_signal(signal.SIGTERM)
        _, err = subject.communicate(timeout=90)
        assert subject.returncode == 1 and "stopped by SIGTERM; the running attempt was killed" in err
        assert scan.tagged_processes(tag) == []
    finally:
        subject.kill()
        for proc in scan.tagged_processes(tag):
            proc.kill()


@pytest.mark.slow
@pytest.mark.heavy("own_ray")  # tests/conftest.py: the groups
def test_small_campaign_resumes_to_the_same_state(tmp_path):
    """K = 2 kills (seed 56; 3 steps) on real verl trainer starts: the reference run, two killed attempts and the
    last rerun. Kill 1 holds the first attempt after step 1's checkpoint, before its log call; kill 2 lands early
    in the rollout of step 2, the first step of the attempt resumed from step 1 (before step 2's checkpoint), so
    the last rerun resumes from step 1 again and trains steps 2 and 3. Every invariant holds (the module exits 1
    naming the first that fails): step 1 logged once from its checkpoint, without validation, its EB state checked
    against the uninterrupted run's dump (the kill cut the step before verl's dump). Past its limit the campaign
    gets SIGTERM, which kills the running attempt's process tree."""
    out = tmp_path / "campaign"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "tests.harness.campaign", "--kills", "2", "--seed", "56", "--steps", "3"]
    proc = subprocess.Popen([*cmd, "--out", str(out), "--run-timeout", "600"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        text, _ = proc.communicate(timeout=1500)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, text[-6000:]
    report = json.loads((out / "campaign_report.json").read_text())
    assert report["ok"] and report["kills_done"] == 2 and report["steps"] == 3
    checks = report["checks"]
    assert checks["metrics_log_steps"] == [1, 2, 3] and checks["steps_without_validation_logged"] == [1]
    assert [(a["killed"], a["resumed_from"]) for a in report["attempts"]] == [(True, 0), (True, 1), (False, 1)]
    landed = campaign.check_landed(out, report["attempts"], [("after_save", 1), ("rollout", 2)])  # from the marker
    assert [row["landed"] for row in landed] == ["after_save", "rollout"]
    invariants.check_leaks([(f"attempt {i}", a["leak"]) for i, a in enumerate(report["attempts"], 1)])
    assert [(s["resumed_from"], s["batch_from"]) for s in checks["eb_states"]] == [
        (0, "uninterrupted run (no campaign dump of the step)"),
        (1, "campaign"),
    ]
