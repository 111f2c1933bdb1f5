"""Fuzzing the loaders of outside input not covered by the other fuzz files, both ways: a valid input is accepted
as it is (a round trip), an invalid one refused with one line (or, for answer extraction and the run lock's holder,
read as "none"); never another exception. Each property is also run once against a mutant of its loader that
refuses everything, and must fail there (a property that passes by refusing everything cannot pass by accident).

Loaders: a checkpoint's ``ebpo_step_metrics.json`` and verl's ``latest_checkpointed_iteration.txt`` as a resume
reads them, the run lock's holder record, a study's ``study_config.json`` and ``summary.json`` and saved runs,
answer extraction from model output (``reward``, ``paper_reward``, ``evaluate.answers``), KRPO's sample
indices from verl's trajectory keys and the report ``campaign --recheck`` reads."""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpo_verl import paper_reward, reward
from ebpo_verl.evaluate import answers
from ebpo_verl.ops import locking
from ebpo_verl.study import runner, saved
from ebpo_verl.study.presets import ALL_ESTIMATORS, PRESETS
from ebpo_verl.trainer.checkpoint import resume, step_metrics
from tests.fuzzing import edge_floats, edge_integers, edges, fails_on_mutant, long_texts, mutation, one_line, refusing
from tests.harness import campaign

FUZZ = settings(
    max_examples=100, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
"""100 examples per property, derandomized; every health check on but ``too_slow`` (shared cores)."""

scalars = st.none() | st.booleans() | st.integers(-3, 40) | st.floats() | st.text(max_size=6) | edges
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6) | long_texts, inner, max_size=3),
    max_leaves=8,
)
DEEP = "[" * 100_000 + "]" * 100_000
DEEPISH = "[" * 3000 + "]" * 3000
"""Deeper than json.loads can go (RecursionError), short enough for Hypothesis to print."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


# ------------------------------------------------------------------------------- ebpo_step_metrics.json (resume)

STEP = 4
METRICS = {"format": 1, "global_step": STEP, "metrics": {"actor/grad_norm": 0.75, "ebpo/prompts_seen": 16}}
numbers = st.integers(-(10**30), 10**30) | st.floats(allow_nan=True, allow_infinity=True) | edge_integers | edge_floats


def _valid_step_metrics(payload) -> bool:
    """The oracle: exactly format 1, global_step STEP and an object of numbers (never bools)."""
    return (
        isinstance(payload, dict)
        and set(payload) == {"format", "global_step", "metrics"}
        and _is_int(payload["format"])
        and payload["format"] == 1
        and _is_int(payload["global_step"])
        and payload["global_step"] == STEP
        and isinstance(payload["metrics"], dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in payload["metrics"].values())
    )


@FUZZ
@given(metrics=st.dictionaries(st.text(max_size=8), numbers, max_size=5))
def test_fuzz_step_metrics_round_trip(metrics, tmp_path_factory):
    """Any metrics of numbers (NaN and inf included) saved at a step are loaded back as they were."""
    folder = tmp_path_factory.mktemp("step")
    step_metrics.save_step_metrics(folder, metrics, STEP)
    loaded = step_metrics.load_step_metrics(folder, STEP)
    assert loaded.keys() == metrics.keys() and all(_same(loaded[k], metrics[k]) for k in metrics)
    assert all(type(loaded[k]) is type(metrics[k]) for k in metrics)


@FUZZ
@given(payload=st.just(METRICS) | mutation(json_values, METRICS) | json_values)
def test_fuzz_step_metrics_file(payload, tmp_path_factory):
    """Any part of a valid file replaced: loaded exactly when the oracle says valid, else one line naming it."""
    folder = tmp_path_factory.mktemp("step")
    (folder / step_metrics.STEP_METRICS_FILE).write_text(json.dumps(payload))
    try:
        loaded = step_metrics.load_step_metrics(folder, STEP)
    except ValueError as err:
        one_line(err, str(folder / step_metrics.STEP_METRICS_FILE))
        assert not _valid_step_metrics(payload), err
        return
    assert _valid_step_metrics(payload)
    assert (
        all(_same(loaded[k], v) for k, v in payload["metrics"].items()) and loaded.keys() == payload["metrics"].keys()
    )


@pytest.mark.parametrize(
    "text, found",
    [
        ('{"format": 1, "global_step": 4.9, "metrics": {}}', "global_step must be an integer >= 0, got 4.9"),
        ('{"format": 1, "global_step": "4", "metrics": {}}', "global_step must be an integer >= 0, got '4'"),
        ('{"format": 1, "global_step": true, "metrics": {}}', "global_step must be an integer >= 0, got True"),
        ('{"format": 1, "global_step": 1e400, "metrics": {}}', "global_step must be an integer >= 0, got inf"),
        ('{"format": 1, "global_step": 4, "metrics": ' + DEEP + "}", "nested too deeply"),
        ('{"format": 1.0, "global_step": 4, "metrics": {}}', "format 1.0 is not supported"),
        (b'{"format": 1, "global_step": 4, "metrics": {"\xff": 1}}', "can't decode byte 0xff"),
    ],
)
def test_fuzz_step_metrics_refusals(text, found, tmp_path):
    # today: int(4.9) == 4 and int("4") == 4 were accepted, 1e400 escaped as OverflowError, a deep file as
    # RecursionError
    path = tmp_path / step_metrics.STEP_METRICS_FILE
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as err:
        step_metrics.load_step_metrics(tmp_path, STEP)
    one_line(err.value, f"step metrics file {path} is unreadable: ")
    assert found in str(err.value) and "delete it to resume without it" in str(err.value)


def test_fuzz_step_metrics_property_fails_on_a_refusing_loader(monkeypatch, tmp_path_factory):
    for test in (test_fuzz_step_metrics_round_trip, test_fuzz_step_metrics_file):
        mutant = refusing(
            ValueError, lambda d, s: f"step metrics file {Path(d) / step_metrics.STEP_METRICS_FILE} mutant"
        )
        fails_on_mutant(test, monkeypatch, step_metrics, "load_step_metrics", mutant, tmp_path_factory=tmp_path_factory)


# ------------------------------------------------------------------ latest_checkpointed_iteration.txt (resume)

tracker_texts = (
    st.integers(0, 12).map(str)
    | st.integers(0, 12).map(lambda n: f" {n}\n")
    | st.sampled_from(["", " ", "+3", "-1", "1_0", "3.0", "²", "٣", "０3", "\ufeff3", "3 4", "1" * 5000, "0x3"])
    | st.text(max_size=6)
)
folder_names = st.integers(0, 12).map(str) | st.sampled_from(["²", "٣", "x", "1" * 5000, "-1", ""])


def _tracked(text: str, folders: set[str]) -> int | None:
    """The oracle: ASCII digits (whitespace around them aside) naming a step >= 1 whose folder exists."""
    value = text.strip()
    if not re.fullmatch(r"[0-9]{1,18}", value) or int(value) < 1 or str(int(value)) not in folders:
        return None
    return int(value)


@FUZZ
@given(text=tracker_texts, folders=st.sets(folder_names, max_size=4))
def test_fuzz_tracker_file(text, folders, tmp_path_factory):
    """Any tracker text beside any global_step_* folders: the step whose folder exists, or one line naming the
    tracker (verl would fail on ``int('')`` after Ray starts, or silently train from scratch)."""
    base = tmp_path_factory.mktemp("ckpt")
    for name in folders:
        if len(name) < 200:  # a name the file system takes
            (base / f"global_step_{name}").mkdir()
    (base / resume.TRACKER_FILE).write_text(text, encoding="utf-8")
    made = {n for n in folders if len(n) < 200}
    try:
        step = resume.tracked_step(base)
    except ValueError as err:
        one_line(err, str(base / resume.TRACKER_FILE))
        assert _tracked(text, made) is None, err
        return
    assert step == _tracked(text, made) and step is not None


def test_fuzz_tracker_file_absent_or_not_utf8(tmp_path):
    assert resume.tracked_step(tmp_path) is None
    (tmp_path / resume.TRACKER_FILE).write_bytes(b"\xff3")
    with pytest.raises(ValueError) as err:
        resume.tracked_step(tmp_path)
    one_line(err.value, f"checkpoint tracker {tmp_path / resume.TRACKER_FILE} is unreadable")


def test_fuzz_tracker_property_fails_on_a_refusing_loader(monkeypatch, tmp_path_factory):
    mutant = refusing(ValueError, lambda base: f"checkpoint tracker {Path(base) / resume.TRACKER_FILE} mutant")
    fails_on_mutant(
        test_fuzz_tracker_file, monkeypatch, resume, "tracked_step", mutant, tmp_path_factory=tmp_path_factory
    )


# ------------------------------------------------------------------------------------- the run lock's holder

HOLDER = {"pid": 4242, "host": "node-1", "started": "2026-12-04T14:00:00+00:00"}
UNKNOWN = "a process that has not recorded itself yet"


def _named(info) -> str | None:
    """The oracle: the holder a record names (pid a pid_t >= 1, host and start printable text of at most 64 and 32
    characters), else None."""
    if not isinstance(info, dict) or not all(k in info for k in HOLDER):
        return None
    pid, host, started = info["pid"], info["host"], info["started"]
    if not (_is_int(pid) and 1 <= pid <= 2_147_483_647 and isinstance(host, str) and isinstance(started, str)):
        return None
    if not (host.isprintable() and started.isprintable() and len(host) <= 64 and len(started) <= 32):
        return None
    return f"pid {pid} on {host}, started {started}"


holder_records = mutation(json_values, HOLDER) | st.fixed_dictionaries(
    {
        "pid": st.integers(1, 2**22) | edge_integers | st.sampled_from([2**31 - 1, 2**31]),
        "host": st.text(min_size=1, max_size=12) | long_texts | st.sampled_from(["h" * 255, "h" * 256, "h" * 200_000]),
        "started": st.text(max_size=25) | st.sampled_from(["t" * 64, "t" * 65]),
    }
)


@FUZZ
@given(record=holder_records | json_values, raw=st.none() | st.sampled_from([DEEPISH, "", "{", "\xff"]))
def test_fuzz_run_lock_holder(record, raw, tmp_path_factory):
    """The lock file another run finds (a record, or any text): its refusal names the holder the record names, or
    says the holder has not recorded itself; always one line naming the lock file."""
    lock = tmp_path_factory.mktemp("lock") / "ebpo-train.lock"
    with locking.exclusive_lock(lock, what="trainer.default_local_dir X"):
        lock.write_text(json.dumps(record) if raw is None else raw, encoding="utf-8")
        with (
            pytest.raises(locking.LockHeldError) as err,
            locking.exclusive_lock(lock, what="trainer.default_local_dir X"),
        ):
            pass
    one_line(err.value, f"(lock file {lock})")
    named = _named(record) if raw is None else None
    assert f"in use by {named or UNKNOWN} (lock file" in str(err.value)


def test_fuzz_run_lock_names_this_process(tmp_path):
    """The record a lock holder writes is read back: the refusal names this process."""
    import os
    import socket

    from ebpo_verl.trainer.checkpoint.run_lock import RUN_LOCK_FILE

    with locking.exclusive_lock(tmp_path / RUN_LOCK_FILE, what="here"):
        with pytest.raises(locking.LockHeldError, match=rf"pid {os.getpid()} on {re.escape(socket.gethostname())}"):
            with locking.exclusive_lock(tmp_path / RUN_LOCK_FILE, what="here"):
                pass


def test_fuzz_run_lock_property_fails_on_a_refusing_loader(monkeypatch, tmp_path_factory):
    fails_on_mutant(
        test_fuzz_run_lock_holder,
        monkeypatch,
        locking,
        "_holder",
        lambda path: UNKNOWN,
        tmp_path_factory=tmp_path_factory,
    )


# ------------------------------------------------------------ a study's study_config.json, summary.json, runs


def _config(name: str, estimators: list[str] | None = None) -> dict:
    preset = PRESETS[name] if estimators is None else PRESETS[name].with_estimators(tuple(estimators))
    return {**preset.fingerprint(), "code": {"version": "x"}}


STUDY_ESTIMATORS = sorted(ALL_ESTIMATORS)


def _recorded(config):
    """The oracle: a known preset's configuration (its estimators any known ones), ``code`` null or absent or an
    object of strings."""
    if not isinstance(config, dict) or config.get("name") not in PRESETS:
        return False
    estimators = config.get("estimators")
    if not isinstance(estimators, list) or not all(isinstance(e, str) and e in STUDY_ESTIMATORS for e in estimators):
        return False
    if not estimators or len(set(estimators)) < len(estimators):
        return False
    want = _config(config["name"], estimators)
    code = config.get("code")
    if not (code is None or (isinstance(code, dict) and all(isinstance(v, str) for v in code.values()))):
        return False
    return {k: v for k, v in config.items() if k != "code"} == {k: v for k, v in want.items() if k != "code"}


study_configs = (
    st.sampled_from(sorted(PRESETS)).flatmap(lambda name: mutation(json_values, _config(name)))
    | st.tuples(
        st.sampled_from(sorted(PRESETS)), st.lists(st.sampled_from(STUDY_ESTIMATORS), min_size=1, unique=True)
    ).map(lambda ne: _config(*ne))
    | json_values
)


@FUZZ
@given(config=study_configs)
def test_fuzz_study_config(config, tmp_path_factory):
    """Any study_config.json: the preset it records, or one StudyDirError line naming the study."""
    study = tmp_path_factory.mktemp("study")
    (study / "study_config.json").write_text(json.dumps(config))
    try:
        preset = saved.recorded_preset(study)
    except runner.StudyDirError as err:
        one_line(err, str(study))
        assert not _recorded(config), err
        return
    assert _recorded(config)
    assert preset.name == config["name"] and list(preset.estimators) == config["estimators"]


def test_fuzz_study_config_deeply_nested(tmp_path):
    # today: RecursionError escaped from json.loads
    (tmp_path / "study_config.json").write_text('{"name": ' + DEEP + "}")
    with pytest.raises(runner.StudyDirError) as err:
        saved.recorded_preset(tmp_path)
    one_line(err.value, f"{tmp_path / 'study_config.json'} is unreadable (nested too deeply)")


SUMMARY = {
    "preset": "quick",
    "n_runs": 2,
    "wall_seconds": 12.5,
    "command": "python -m ebpo_verl.study",
    "resumed_runs": 1,
}
SUMMARY["provenance"] = {"command": "python -m ebpo_verl.study"}


def _summary_used(summary) -> bool:
    """The oracle: the summary of these runs (preset quick, 2 runs) with a wall time >= 0, a command, a count of
    reused runs in 0..2 and a provenance record."""
    return (
        isinstance(summary, dict)
        and summary.get("preset") == "quick"
        and _is_int(summary.get("n_runs"))
        and summary["n_runs"] == 2
        and isinstance(summary.get("wall_seconds"), int | float)
        and not isinstance(summary["wall_seconds"], bool)
        and math.isfinite(summary["wall_seconds"])
        and summary["wall_seconds"] >= 0
        and isinstance(summary.get("command"), str)
        and _is_int(summary.get("resumed_runs"))
        and 0 <= summary["resumed_runs"] <= 2
        and isinstance(summary.get("provenance"), dict)
    )


@FUZZ
@given(
    summary=st.just(SUMMARY) | mutation(json_values, SUMMARY) | json_values,
    raw=st.none() | st.sampled_from([DEEPISH, "", "{", "\xff"]),
)
def test_fuzz_study_summary(summary, raw, tmp_path_factory):
    """Any summary.json beside a study's saved runs: its wall time and command when it describes them, else the
    span of the files' times (never another exception, never a wall time that is not a number)."""
    study = tmp_path_factory.mktemp("study")
    files = [study / "study_config.json", study / "run.json"]
    for path in files:
        path.write_text("{}")
    (study / "summary.json").write_text(json.dumps(summary) if raw is None else raw)
    timing = saved.study_timing(study, PRESETS["quick"], [{}, {}], files, "study")
    if raw is None and _summary_used(summary):
        assert (timing.seconds, timing.command, timing.resumed) == (
            summary["wall_seconds"],
            summary["command"],
            summary["resumed_runs"],
        )
        assert timing.record == summary["provenance"] and "recorded" in timing.how
    else:
        assert "has not recorded its wall time" in timing.how and timing.resumed == 0
        assert math.isfinite(timing.seconds) and timing.seconds >= 0 and timing.command.endswith(f"--out {study}")


def test_fuzz_study_property_fails_on_a_refusing_loader(monkeypatch, tmp_path_factory):
    def no_summary(study, preset, runs, files, prog):  # the summary never read: the files' span
        (study / "summary.json").unlink()
        return original(study, preset, runs, files, prog)

    original = saved.study_timing
    mutant = refusing(runner.StudyDirError, lambda study: f"{study} mutant")
    fails_on_mutant(
        test_fuzz_study_config, monkeypatch, saved, "recorded_preset", mutant, tmp_path_factory=tmp_path_factory
    )
    fails_on_mutant(
        test_fuzz_study_summary, monkeypatch, saved, "study_timing", no_summary, tmp_path_factory=tmp_path_factory
    )


# ------------------------------------------------------------------------------- answer extraction from output

prose = st.text(alphabet="0123456789 xyz+-=.,()[]{}\t\né∑", max_size=40)
"""Text around an answer: no ``answer``, no backslash (no ``\\boxed``), no ``$`` or ``*``."""
answer_texts = st.text(alphabet="0123456789xyz+-/^()=, ", min_size=1, max_size=12).filter(
    lambda a: a.strip() and not a[0].isspace() and not a.endswith(".")
)
"""An answer as a model writes it: starts with a non-space, no newline."""


earlier_answers = st.lists(
    st.sampled_from(["\\boxed{9}", "\nAnswer: 5\n", "the answer: 4", "$\\frac{1}{2}$", "\n**Final Answer:** 8\n"]),
    max_size=3,
).map("".join)
"""Answers stated before the last one (the last one stated is the one graded)."""


@FUZZ
@given(
    before=prose,
    earlier=earlier_answers,
    answer=answer_texts,
    after=prose,
    boxed=st.booleans(),
    markdown=st.sampled_from(["", "**", "# ", "> ", "- The final "]),
)
def test_fuzz_extract_answer(before, earlier, answer, after, boxed, markdown):
    """reward.extract_answer: a response whose last answer is an ``Answer:`` line or a ``\\boxed{}`` gives that
    answer (stripped), whatever was stated before it; one with neither gives None."""
    stated = f"\\boxed{{{answer}}}" if boxed else f"\n{markdown}Answer: {answer}\n"
    assert reward.extract_answer(before + earlier + stated + after.replace("\n", " ")) == answer.strip()
    assert reward.extract_answer(before + after) is None


@FUZZ
@given(before=prose, answers_=st.lists(answer_texts, min_size=1, max_size=3), after=prose)
def test_fuzz_extract_eval_answer(before, answers_, after):
    """paper_reward.extract_eval_answer: the second-to-last ``Answer:`` of the last 300 characters when there are
    two or more, the only one when one, None when none."""
    response = before + "".join(f"Answer: {a}\n" for a in answers_) + after
    want = answers_[-2] if len(answers_) >= 2 else answers_[0]
    assert paper_reward.extract_eval_answer(response) == want
    assert paper_reward.extract_eval_answer(before + after) is None
    assert paper_reward.extract_eval_answer(response + "x" * 300) is None  # beyond the window


@FUZZ
@given(picks=st.lists(st.sampled_from(["12", "7", "3", None]), min_size=1, max_size=6), before=prose)
def test_fuzz_answer_classes_paper(picks, before):
    """evaluate.answers (paper protocol): samples stating the same answer share a class, numbered in order of
    first appearance; a sample without one has none."""
    responses = [before + (f"\nAnswer: {p}" if p is not None else "") for p in picks]
    firsts = list(dict.fromkeys(p for p in picks if p is not None))
    assert answers.answer_classes("paper", [responses]) == [[None if p is None else firsts.index(p) for p in picks]]


def _no_answer(*args, **kwargs):
    return None


def test_fuzz_extraction_properties_fail_on_a_refusing_extractor(monkeypatch):
    fails_on_mutant(test_fuzz_extract_answer, monkeypatch, reward, "extract_answer", _no_answer)
    fails_on_mutant(test_fuzz_extract_eval_answer, monkeypatch, paper_reward, "extract_eval_answer", _no_answer)
    fails_on_mutant(test_fuzz_answer_classes_paper, monkeypatch, answers, "_paper_key", _no_answer)


# --------------------------------------------------------------------------------- KRPO's sample indices

SAMPLE_INDICES = ("ebpo_verl.trainer.ray_trainer", "sample_indices")
"""Where the parser of verl's trajectory keys lives (the one place to update when it moves)."""


def _sample_indices():
    import importlib

    return getattr(importlib.import_module(SAMPLE_INDICES[0]), SAMPLE_INDICES[1])


def _session(key: str) -> int | None:
    """The oracle: ``{uid}_{session_id}_{index}`` with a non-empty uid and ASCII-digit session id and index."""
    match = re.fullmatch(r"(.+)_([0-9]{1,18})_([0-9]{1,18})", key, re.DOTALL)
    return int(match.group(2)) if match else None


trajectory_keys = st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 64), st.integers(0, 8)).map(
    lambda t: f"{t[0]}_{t[1]}_{t[2]}"
) | st.sampled_from(["uid_²_0", "uid_3_x", "_3_0", "uid_3", "uid__0", "uid_3_", f"uid_{'1' * 5000}_0", "u_٣_0"])


@FUZZ
@given(keys=st.lists(trajectory_keys | st.text(max_size=10), min_size=1, max_size=4))
def test_fuzz_krpo_sample_indices(keys):
    """verl's trajectory keys: each row's session id when every key is ``{uid}_{session_id}_{index}``, else one
    ValueError line naming the key."""
    try:
        got = _sample_indices()(keys)
    except ValueError as err:
        bad = [k for k in keys if _session(k) is None]
        assert bad, err
        one_line(err, "trajectory key")
        return
    assert got.tolist() == [_session(k) for k in keys]


def test_fuzz_krpo_property_fails_on_a_refusing_parser(monkeypatch):
    import importlib

    module = importlib.import_module(SAMPLE_INDICES[0])
    mutant = refusing(ValueError, lambda keys: "krpo: trajectory key mutant")
    fails_on_mutant(test_fuzz_krpo_sample_indices, monkeypatch, module, SAMPLE_INDICES[1], mutant)


SAVED_METRICS = ("reward", "zero_signal", "uniform_groups", "grad_norm", "clipped", "entropy", "kl_ref", "clipfrac",
                 "step_kl", "eval_step", "accuracy", "probe_accuracy", "shrinkage", "train_seen_gain",
                 "train_unseen_gain", "train_seen_fraction")  # fmt: skip
"""What a saved run's metrics hold (the keys of the runs in docs/study_*/runs/, listed by hand)."""


def _saved_run(cfg) -> dict:
    from dataclasses import asdict

    metrics = {key: [0.5] for key in SAVED_METRICS} | {"eval_step": [0], "shrinkage": [], "zero_signal": [1, 0.25]}
    return {"config": asdict(cfg), "metrics": metrics, "seconds": 1.0, "cpu_seconds": 1.0}


def _readable_metrics(metrics) -> bool:
    """The oracle: an object holding every metric of :data:`SAVED_METRICS`, each a list of floats or of integers
    that a float holds (not bools), the accuracy as long as its eval_step list and not empty."""

    def number(v) -> bool:
        return isinstance(v, float) or (_is_int(v) and abs(v) <= 1.7976931348623157e308)

    return (
        isinstance(metrics, dict)
        and all(k in metrics for k in SAVED_METRICS)
        and all(isinstance(v, list) and all(number(x) for x in v) for v in metrics.values())
        and 0 < len(metrics["accuracy"]) == len(metrics["eval_step"])
    )


QUICK_JOB = runner.grid(PRESETS["quick"], dict.fromkeys(PRESETS["quick"].estimators, 1e-4))[0]


@FUZZ
@given(
    run=st.just(_saved_run(QUICK_JOB)) | mutation(json_values, _saved_run(QUICK_JOB)) | json_values,
    raw=st.none() | st.sampled_from([DEEPISH, "", "{", "\xff"]),
)
def test_fuzz_study_saved_run(run, raw, tmp_path_factory):
    """A study's saved run file with any content: reused when it is an object holding the job's config and readable
    metrics, else run again (never an exception: the study resumes past a torn file)."""
    from dataclasses import asdict

    out = tmp_path_factory.mktemp("study")
    path = runner.run_path(out, QUICK_JOB)
    path.parent.mkdir()
    path.write_text(json.dumps(run) if raw is None else raw)
    done = runner.load_done(out, [QUICK_JOB])
    reused = raw is None and isinstance(run, dict) and run.get("config") == asdict(QUICK_JOB)
    reused = reused and _readable_metrics(run.get("metrics"))
    assert done == ({QUICK_JOB: run} if reused else {})


def test_fuzz_study_saved_run_property_fails_on_a_refusing_loader(monkeypatch, tmp_path_factory):
    mutant = lambda out, jobs: {}  # noqa: E731 (nothing ever reused)
    fails_on_mutant(
        test_fuzz_study_saved_run, monkeypatch, runner, "load_done", mutant, tmp_path_factory=tmp_path_factory
    )


# ------------------------------------------------------------------------------- campaign --recheck's report

counts = st.integers(0, 10**6) | st.integers(0, 10**30)
leaks = st.none() | st.fixed_dictionaries(
    {"tagged_seen": counts, "ray_seen": counts, "trainer": st.integers(-(10**6), 10**6), "trainer_seen": st.booleans(),
     "left": st.lists(st.text(max_size=5), max_size=2)}
)  # fmt: skip
targets = st.fixed_dictionaries(
    {"phase": st.sampled_from(campaign.PHASES), "step_offset": st.sampled_from([1, 2]),
     "fraction": st.floats(0.1, 0.9), "step": st.integers(-3, 20)}
)  # fmt: skip
landings = st.fixed_dictionaries(
    {"phase": st.text(max_size=12), "step": st.none() | st.integers(0, 20), "seconds_in": st.none() | st.floats(0, 99)}
)


def _attempts(killed: bool) -> st.SearchStrategy:
    """Attempts as :func:`campaign.run_attempts` writes them (``kill_t`` and ``leak`` optional: older reports)."""
    fields = {"resumed_from": counts, "marker_offset": counts, "log_offset": counts, "killed": st.just(killed),
              "wall_s": st.floats(0, 1e4)}  # fmt: skip
    killed_fields = {"target": targets, "landed": landings, "kill_utc": st.text(max_size=5)}
    optional = {"leak": leaks, **({"kill_t": st.floats(0, 2e9) | st.integers(0, 10**30)} if killed else {})}
    return st.fixed_dictionaries({**fields, **(killed_fields if killed else {})}, optional=optional)


reports = st.fixed_dictionaries(
    {"seed": st.integers(-(10**30), 10**30), "kills_drawn": counts, "steps": counts, "kills_done": counts,
     "plan": st.lists(targets, max_size=3),
     "attempts": st.tuples(st.lists(_attempts(True), max_size=3), _attempts(False)).map(lambda p: [*p[0], p[1]])},
    optional={"reference_leak": leaks, "reference_wall_s": st.floats(0, 1e4), "checks": json_values,
              "ok": st.booleans(), "failed": st.text(max_size=5)},
)  # fmt: skip
"""Well-formed reports (the fields ``_campaign`` and ``_checked`` write; older reports lack the optional ones)."""


def _valid_report(report) -> bool:
    """The oracle: every field the recheck's checks read, with its JSON type (integers never bools or floats)."""

    def count(value) -> bool:
        return _is_int(value) and value >= 0

    def leak(value) -> bool:
        return value is None or (
            isinstance(value, dict)
            and isinstance(value.get("trainer_seen"), bool)
            and count(value.get("ray_seen"))
            and _is_int(value.get("trainer"))
            and isinstance(value.get("left"), list)
        )

    def attempt(a) -> bool:
        if not isinstance(a, dict) or not all(count(a.get(k)) for k in ("resumed_from", "marker_offset", "log_offset")):
            return False
        if not isinstance(a.get("killed"), bool) or not leak(a.get("leak")):
            return False
        target, kill_t = a.get("target"), a.get("kill_t", 0.0)
        return not a["killed"] or (
            isinstance(target, dict)
            and isinstance(target.get("phase"), str)
            and target["phase"] != ""
            and _is_int(target.get("step"))
            and isinstance(a.get("landed"), dict)
            and isinstance(kill_t, int | float)
            and not isinstance(kill_t, bool)
            and abs(kill_t) < math.inf  # NaN and the infinities (1e400 reads as inf) fail; a 31-digit int passes
        )

    return (
        isinstance(report, dict)
        and _is_int(report.get("seed"))
        and all(count(report.get(k)) for k in ("kills_drawn", "steps", "kills_done"))
        and isinstance(report.get("plan"), list)
        and isinstance(report.get("attempts"), list)
        and len(report["attempts"]) > 0
        and all(attempt(a) for a in report["attempts"])
        and leak(report.get("reference_leak"))
    )


def _write_report(folder: Path, report) -> Path:
    path = folder / "campaign_report.json"
    path.write_text(json.dumps(report, indent=1))
    return path


@FUZZ
@given(report=reports)
def test_fuzz_campaign_report_round_trip(report, tmp_path_factory):
    """A well-formed report is read back exactly as written (NaN in its free-form ``checks`` kept)."""
    path = _write_report(tmp_path_factory.mktemp("camp"), report)
    try:
        loaded = campaign.load_report(path)
    except SystemExit as err:
        raise AssertionError(f"a well-formed report was refused: {err}") from None
    assert _valid_report(report) and json.dumps(loaded) == json.dumps(report)


@FUZZ
@given(report=reports.flatmap(functools.partial(mutation, json_values)) | json_values)
def test_fuzz_campaign_report(report, tmp_path_factory):
    """Any part of a well-formed report replaced: read back when the oracle says valid, else one line naming it."""
    path = _write_report(tmp_path_factory.mktemp("camp"), report)
    try:
        loaded = campaign.load_report(path)
    except SystemExit as err:
        assert not _valid_report(report), err
        return one_line(err, f"[campaign] --recheck: {path} is not a campaign report: ")
    assert _valid_report(report) and json.dumps(loaded) == json.dumps(report)


KILLED = {"resumed_from": 0, "marker_offset": 0, "log_offset": 0, "killed": True, "landed": {"phase": "save"},
          "target": {"phase": "save", "step": 1}, "kill_t": 1.5, "leak": None}  # fmt: skip
REPORT = {"seed": 8, "kills_drawn": 1, "steps": 4, "kills_done": 1, "plan": [],
          "attempts": [KILLED, {"resumed_from": 1, "marker_offset": 9, "log_offset": 9, "killed": False}]}  # fmt: skip


@pytest.mark.parametrize(
    "text, found",
    [
        ('{"seed": ' + DEEP + "}", "nested too deeply"),
        (b'{"seed": 8, "\xff": 1}', "can't decode byte 0xff"),
        (json.dumps(REPORT).replace('"kill_t": 1.5', '"kill_t": 1e400'), "attempt 1: kill_t must be a finite number"),
        (json.dumps(REPORT).replace('"kill_t": 1.5', '"kill_t": NaN'), "attempt 1: kill_t must be a finite number"),
        (
            json.dumps(REPORT).replace('"steps": 4', '"steps": 4.0'),
            "the report: steps must be an integer >= 0, not 4.0",
        ),
        (json.dumps(REPORT).replace('"kills_done": 1', '"kills_done": true'), "kills_done must be an integer >= 0"),
        (json.dumps(REPORT).replace('"marker_offset": 9', '"marker_offset": -9'), "attempt 2: marker_offset must"),
        (json.dumps({**REPORT, "attempts": []}), "attempts must be a non-empty list, not []"),
        (
            json.dumps({**REPORT, "attempts": [{**KILLED, "target": ["save", 1]}]}),
            "attempt 1: target must be an object",
        ),
        (json.dumps({**REPORT, "reference_leak": {"left": []}}), "reference_leak: trainer_seen must be true or false"),
        (json.dumps([REPORT]), "the report is not an object"),
    ],
)
def test_fuzz_campaign_report_refusals(text, found, tmp_path):
    # before load_report: a deep file escaped as RecursionError, 1e400 as inf into the checks, a float offset or a
    # list target as TypeError tracebacks, an empty attempts list as IndexError; --recheck exits with the line
    path = tmp_path / "campaign_report.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SystemExit) as err:
        campaign.main(["--out", str(tmp_path), "--recheck"])
    one_line(err.value, f"[campaign] --recheck: {path} is not a campaign report: ")
    assert found in str(err.value)


def test_fuzz_campaign_report_properties_fail_on_a_refusing_loader(monkeypatch, tmp_path_factory):
    mutant = refusing(SystemExit, lambda path: f"[campaign] --recheck: {path} is not a campaign report: mutant")
    for test in (test_fuzz_campaign_report_round_trip, test_fuzz_campaign_report):
        fails_on_mutant(test, monkeypatch, campaign, "load_report", mutant, tmp_path_factory=tmp_path_factory)
