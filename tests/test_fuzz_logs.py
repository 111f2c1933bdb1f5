"""Fuzzing the files the package reads back: a generations JSONL and its ``.meta.json`` (resume and grading), a
RESULTS.json read by ``make_tables``, and ``metrics.jsonl`` with its provenance sidecar (read at resume). Each is
read as written, or refused with one line naming the file; never another exception or a number changed on the
way in, and a refused file is left as it was."""

from __future__ import annotations

import json
import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpo_verl.evaluate.generations import FIELDS, GenerationsFile, read_generations, read_meta
from ebpo_verl.evaluate.prompts import EvalInputError
from ebpo_verl.ops.metrics_log import MetricsLog, MetricsLogError, read_metrics_log, read_provenance
from ebpo_verl.recipes import make_tables
from tests.fuzzing import edges, long_texts, mutation, one_line

FUZZ = settings(
    max_examples=150, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
"""150 examples per property, derandomized (the same examples every run); every health check on but too_slow."""

scalars = st.none() | st.booleans() | st.integers(-3, 40) | st.floats() | st.text(max_size=6) | edges
keys = st.text(max_size=6) | long_texts
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=10,
)
DEEP = "[" * 100_000 + "]" * 100_000


# -------------------------------------------------------------------------------------- generations and its meta

LINE = {"benchmark": "math500", "index": 3, "sample": 0, "response": "2", "response_tokens": 1, "finish_reason": "stop"}
META = {
    "protocol": "verl",
    "model": "org/model",
    "temperature": 1.0,
    "top_p": 1.0,
    "max_new_tokens": 16,
    "seed": 0,
    "benchmarks": {"math500": {"runs": 2, "limit": None, "problems": 1, "digests": {"3": "0123456789abcdef"}}},
    "provenance": [{"command": "x"}],
}


def _valid_line(record) -> bool:
    """The oracle: an object whose six fields have their types (ints >= 0 and not bools)."""
    if not isinstance(record, dict):
        return False
    for key, kind in FIELDS.items():
        value = record.get(key)
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return False
        if not isinstance(value, kind):
            return False
    return True


@pytest.mark.parametrize("text", [DEEP, '{"a": ' + DEEP + "}"])
def test_fuzz_generations_deeply_nested_line(text, tmp_path):
    # today: RecursionError from json.loads
    path = tmp_path / "g.jsonl"
    path.write_text(text + "\n" + json.dumps(LINE) + "\n")
    with pytest.raises(EvalInputError) as err:
        read_generations(path)
    one_line(err.value, "line 1 is not valid JSON (nested too deeply)")


def test_fuzz_generations_bool_index_is_refused(tmp_path):
    # today: "index": true was read as problem 1
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({**LINE, "index": True}) + "\n")
    with pytest.raises(EvalInputError, match=r"line 1 lacks or mistypes \['index'\]"):
        read_generations(path)


@FUZZ
@given(lines=st.just([LINE]) | st.lists(mutation(json_values, LINE), min_size=1, max_size=3), torn=st.booleans())
def test_fuzz_generations_lines(lines, torn, tmp_path_factory):
    """Lines with any part replaced: read exactly as written, or one line naming the file and the line."""
    path = tmp_path_factory.mktemp("gen") / "g.jsonl"
    text = "".join(json.dumps(line) + "\n" for line in lines)
    path.write_text(text[:-1] if torn else text)
    try:
        records, intact = read_generations(path)
    except EvalInputError as err:
        one_line(err, str(path))
        assert not all(_valid_line(line) for line in lines) or len({json.dumps(line) for line in lines}) < len(lines)
        return
    kept = lines[:-1] if torn and not _valid_line(lines[-1]) else lines
    assert all(_valid_line(line) for line in kept)
    assert list(records.values()) == kept and intact <= len(text)


def _valid_meta(meta) -> bool:
    """The oracle: strings protocol and model, a provenance list (or none), and benchmarks an object of objects
    with runs an integer >= 1, limit null or one, and digests (or none) an object of strings keyed by problem
    indices (ASCII decimal digits)."""

    def positive(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    def spec(s) -> bool:
        digests = s.get("digests", {}) if isinstance(s, dict) else None
        return (
            isinstance(digests, dict)
            and all(k.isascii() and k.isdigit() and isinstance(d, str) for k, d in digests.items())
            and positive(s.get("runs"))
            and (s.get("limit") is None or positive(s["limit"]))
        )

    return (
        isinstance(meta, dict)
        and isinstance(meta.get("protocol"), str)
        and isinstance(meta.get("model"), str)
        and isinstance(meta.get("provenance", []), list)
        and isinstance(meta.get("benchmarks"), dict)
        and all(spec(s) for s in meta["benchmarks"].values())
    )


@FUZZ
@given(meta=st.just(META) | mutation(json_values, META) | json_values)
def test_fuzz_generations_meta(meta, tmp_path_factory):
    """Any ``.meta.json``: grading and a resume read it exactly when the oracle says valid, else refuse it in one
    line; a refused meta and its generations file are left untouched."""
    folder = tmp_path_factory.mktemp("meta")
    path = folder / "g.jsonl"
    path.write_text(json.dumps(LINE) + "\n")
    (folder / "g.jsonl.meta.json").write_text(json.dumps(meta))
    try:
        read = read_meta(path)
        assert _valid_meta(meta) and json.dumps(read) == json.dumps(meta)  # NaN compares equal as text
    except EvalInputError as err:
        assert not _valid_meta(meta), err
        one_line(err, "g.jsonl.meta.json")
    try:
        with GenerationsFile(path, META) as gen:
            assert set(gen.done) == {("math500", 3, 0)}
    except EvalInputError as err:
        one_line(err, "g.jsonl")
        assert path.read_text() == json.dumps(LINE) + "\n"
        assert (folder / "g.jsonl.meta.json").read_text() == json.dumps(meta)


def test_fuzz_generations_meta_that_is_not_an_object(tmp_path):
    # today: a meta that is a list passed read_meta and failed later with AttributeError/TypeError
    path = tmp_path / "g.jsonl"
    digest_key = {"protocol": "verl", "model": "m", "benchmarks": {"math500": {"runs": 1, "digests": {"": "ab"}}}}
    for meta in ([1, 2], {"protocol": "verl", "model": "m", "benchmarks": {"math500": {"runs": True}}}, digest_key):
        (tmp_path / "g.jsonl.meta.json").write_text(json.dumps(meta))
        with pytest.raises(EvalInputError) as err:
            read_meta(path)
        one_line(err.value, "is not the settings of a generations file")


# ------------------------------------------------------------------------------------ RESULTS.json of make_tables

BENCH = {"pass@1": 40.0, "runs": 16, "problems": 30, "samples": 480, "complete": True, "n": 16}
RESULTS = {
    "protocol": "paper",
    "model": "m",
    "step": 12,
    "benchmarks": {"aime2024": {**BENCH, "pass@k": {"1": 40.0, "2": 50.0}}, "math500": dict(BENCH)},
    "average": 40.0,
    "generation": {"provenance": [{"command": "generate"}]},
    "provenance": {"command": "grade"},
}


@pytest.mark.parametrize(
    "change",
    [
        {"benchmarks": {"aime2024": [40.0]}},
        {"benchmarks": {"aime2024": {**BENCH, "runs": "16"}}},
        {"benchmarks": {"aime2024": {**BENCH, "pass@1": 140.0}}},
        {"benchmarks": {"aime2024": {**BENCH, "pass@k": [1, 2]}}},
        {"generation": ["x"]},
    ],
)
def test_fuzz_results_json_structure(change, tmp_path):
    # today: AttributeError / ValueError tracebacks, or a Pass@1 of 140 % in the table
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**RESULTS, **change}))
    assert make_tables.main([f"A/x={path}", "--out", str(tmp_path / "o")]) == 1
    with pytest.raises(MetricsLogError) as err:
        make_tables.build_rows(None, [f"A/x={path}"], "final")
    one_line(err.value, "not a RESULTS.json")
    assert not (tmp_path / "o").exists()


def _valid_results(data) -> bool:
    """The oracle: protocol paper or verl, step null or an integer, generation null or an object whose provenance
    (or none) is a list, and benchmarks an object of objects whose counts are null or integers >= 0, whose scores
    (pass@1, avg@n, and each k of pass@k/maj@k, objects or null) are null or numbers in [0, 100], and whose
    complete (or none) is a boolean."""

    def integer(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def percent(value) -> bool:  # no float(): a 400-digit integer is simply > 100
        return value is None or (isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 100)

    def entry(e) -> bool:
        counts = ("runs", "problems", "problems_in_data", "samples", "n", "limit")
        by_k = [e.get(name) for name in ("pass@k", "maj@k")] if isinstance(e, dict) else [0]
        return (
            all(k is None or (isinstance(k, dict) and all(percent(v) for v in k.values())) for k in by_k)
            and all(e.get(c) is None or (integer(e[c]) and e[c] >= 0) for c in counts)
            and percent(e.get("pass@1"))
            and percent(e.get("avg@n"))
            and isinstance(e.get("complete", True), bool)
        )

    generation = data.get("generation") if isinstance(data, dict) else None
    return (
        isinstance(data, dict)
        and data.get("protocol") in ("paper", "verl")
        and (data.get("step") is None or integer(data["step"]))
        and (
            generation is None or (isinstance(generation, dict) and isinstance(generation.get("provenance", []), list))
        )
        and isinstance(data.get("benchmarks"), dict)
        and all(entry(e) for e in data["benchmarks"].values())
    )


def test_fuzz_results_json_refusals_found_by_the_oracle(tmp_path):
    # before: a 400-digit pass@1 escaped as OverflowError; a pass@k of 0, "", [] or false was read as none
    path = tmp_path / "r.json"
    for bad, found in [('"pass@1": ' + "9" * 400, "pass@1=999999999999999999...9999999999999999999 is not a"),
                       ('"pass@k": 0', "pass@k/maj@k is not an object"),
                       ('"maj@k": []', "pass@k/maj@k is not an object")]:  # fmt: skip
        path.write_text('{"protocol": "paper", "benchmarks": {"aime2024": {' + bad + "}}}")
        with pytest.raises(MetricsLogError) as err:
            make_tables.load_results(path)
        one_line(err.value, f"{path}: not a RESULTS.json")
        assert found in str(err.value)


@FUZZ
@given(results=st.just(RESULTS) | mutation(json_values, RESULTS) | json_values)
def test_fuzz_results_json(results, tmp_path_factory):
    """A RESULTS.json with any part replaced: read exactly when the oracle says valid, and then a row whose
    numbers are the file's; else one refusal line naming it."""
    path = tmp_path_factory.mktemp("res") / "r.json"
    path.write_text(json.dumps(results))
    try:
        data = make_tables.load_results(path)
        [row] = make_tables.build_rows(None, [f"A/x={path}"], "final")
    except MetricsLogError as err:
        assert not _valid_results(results), err
        return one_line(err, str(path))
    assert _valid_results(results) and json.dumps(data) == json.dumps(results)
    for bench, score in row.scores.items():
        given_score = results["benchmarks"][bench]["pass@1"]
        assert score == given_score and 0 <= score <= 100 and math.isfinite(score)
    assert row.protocol == results["protocol"] and row.step == results.get("step")


# --------------------------------------------------------------------------- metrics.jsonl and its sidecar (resume)

RECORD = {"step": 2, "data": {"val-core/aime2024/acc/mean@16": 0.25, "loss": 1.5}}


def test_fuzz_metrics_log_bad_lines_are_one_line(tmp_path):
    # today: a deeply nested line escaped as RecursionError, a non-UTF-8 byte as UnicodeDecodeError (whole file)
    log = tmp_path / "metrics.jsonl"
    for bad in (DEEP.encode(), b'{"step": 1, "data": {"x": "\xff"}}'):
        log.write_bytes(bad + b"\n" + json.dumps(RECORD).encode() + b"\n")
        with pytest.raises(MetricsLogError) as err:
            MetricsLog(log, resumed_step=2, provenance={})
        one_line(err.value, f"{log}:1: not a {{'step', 'data'}} metrics record")
        assert log.read_bytes().startswith(bad)  # left as it was


def test_fuzz_metrics_sidecar_resumed_step_is_an_integer(tmp_path):
    # today: "resumed_step": 1.9 was read as 1
    side = tmp_path / "metrics.jsonl.provenance.json"
    side.write_text(json.dumps({"attempts": [{"resumed_step": 1.9, "provenance": {}}]}))
    with pytest.raises(ValueError) as err:
        read_provenance(side)
    one_line(err.value, "resumed_step 1.9 is not an integer")


def _step(value) -> bool:
    """A training step: an integer (not a bool) from 0 to int64's largest."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 9_223_372_036_854_775_807


def _valid_record(record) -> bool:
    return isinstance(record, dict) and _step(record.get("step")) and isinstance(record.get("data"), dict)


@FUZZ
@given(records=st.lists(mutation(json_values, RECORD), min_size=1, max_size=4), resumed=st.integers(0, 3))
def test_fuzz_metrics_log_at_resume(records, resumed, tmp_path_factory):
    """A log whose lines have any part replaced, opened at a resume: read as written (NaN kept), or refused in one
    line naming the file and line with the log unchanged."""
    log = tmp_path_factory.mktemp("log") / "metrics.jsonl"
    text = "".join(json.dumps(record) + "\n" for record in records)
    log.write_text(text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an invalid last line is skipped as torn, with a warning
            merged = read_metrics_log(log)
    except MetricsLogError as err:
        one_line(err, str(log))
        assert not all(_valid_record(r) for r in records[:-1])
        with pytest.raises(MetricsLogError):
            MetricsLog(log, resumed_step=resumed, provenance={})
        assert log.read_text() == text
        return
    assert all(_valid_record(r) for r in records[:-1])
    records = records if _valid_record(records[-1]) else records[:-1]
    for step, data in merged.items():
        for key, value in data.items():
            last = [r["data"][key] for r in records if r["step"] == step and key in r["data"]][-1]
            assert value == last or (isinstance(value, float) and math.isnan(value) and math.isnan(last))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MetricsLog(log, resumed_step=resumed, provenance={})
    kept = read_metrics_log(log)
    assert all(step <= resumed for step in kept) and (resumed > 0 or not kept)  # later steps moved aside


def _valid_sidecar(sidecar) -> bool:
    """The oracle: an object whose attempts are a list of objects, each with a step resumed_step and a
    provenance object."""
    attempts = sidecar.get("attempts") if isinstance(sidecar, dict) else None
    return isinstance(attempts, list) and all(
        isinstance(a, dict) and _step(a.get("resumed_step")) and isinstance(a.get("provenance"), dict) for a in attempts
    )


SIDECAR = {"attempts": [{"resumed_step": 0, "provenance": {"command": "x"}}]}


@FUZZ
@given(sidecar=st.just(SIDECAR) | mutation(json_values, SIDECAR) | json_values)
def test_fuzz_metrics_sidecar(sidecar, tmp_path_factory):
    """Any sidecar: its attempts exactly when the oracle says valid, else one line naming it."""
    side = tmp_path_factory.mktemp("side") / "metrics.jsonl.provenance.json"
    side.write_text(json.dumps(sidecar))
    try:
        attempts = read_provenance(side)
    except ValueError as err:
        assert not _valid_sidecar(sidecar), err
        return one_line(err, str(side))
    assert _valid_sidecar(sidecar) and attempts == sidecar["attempts"]
    assert all(type(a["resumed_step"]) is int and isinstance(a["provenance"], dict) for a in attempts)


def test_fuzz_logs_properties_fail_on_a_refusing_reader(monkeypatch, tmp_path_factory):
    """The two-way properties fail when their reader refuses everything (with the refusal the real one gives)."""
    from tests.fuzzing import fails_on_mutant, refusing

    mutant = refusing(EvalInputError, lambda path: f"{path}: line 1 mutant")
    fails_on_mutant(test_fuzz_generations_lines, monkeypatch, globals(), "read_generations", mutant,
                    tmp_path_factory=tmp_path_factory)  # fmt: skip
    mutant = refusing(MetricsLogError, lambda path, *a, **k: f"{path}:1: mutant")
    fails_on_mutant(test_fuzz_metrics_log_at_resume, monkeypatch, globals(), "read_metrics_log", mutant,
                    tmp_path_factory=tmp_path_factory)  # fmt: skip
    mutant = refusing(ValueError, lambda path: f"{path}: mutant")
    fails_on_mutant(test_fuzz_metrics_sidecar, monkeypatch, globals(), "read_provenance", mutant,
                    tmp_path_factory=tmp_path_factory)  # fmt: skip
    mutant = refusing(EvalInputError, lambda path: f"{path}.meta.json: mutant")
    fails_on_mutant(test_fuzz_generations_meta, monkeypatch, globals(), "read_meta", mutant,
                    tmp_path_factory=tmp_path_factory)  # fmt: skip
    mutant = refusing(MetricsLogError, lambda path: f"{path}: not a RESULTS.json (mutant)")
    fails_on_mutant(test_fuzz_results_json, monkeypatch, make_tables, "load_results", mutant,
                    tmp_path_factory=tmp_path_factory)  # fmt: skip


# ------------------------------------------------------------------------------------- the bound on every refusal


def test_fuzz_the_one_line_check_holds_refusals_to_the_message_limit():
    from ebpo_verl.ops.errors import MESSAGE_LIMIT

    one_line(ValueError("x" * MESSAGE_LIMIT), "x")
    with pytest.raises(AssertionError, match=f"a refusal of {MESSAGE_LIMIT + 1} characters"):
        one_line(ValueError("x" * (MESSAGE_LIMIT + 1)), "x")


@FUZZ
@given(value=edges | json_values, where=st.sampled_from(["step", "resumed_step", "pass@1", "data"]))
def test_fuzz_edge_values_are_read_or_refused_within_the_limit(value, where, tmp_path_factory):
    """A value past every range (10**400, 2**63, 1e308, inf, NaN, 100k characters, or any JSON) in a metrics log's
    step or data, a sidecar's resumed_step or a RESULTS.json's pass@1: read as the oracles say, else refused in one
    line of at most MESSAGE_LIMIT characters naming the file (one_line)."""
    folder = tmp_path_factory.mktemp("edge")
    if where in ("step", "data"):
        record = {"step": value, "data": {}} if where == "step" else {"step": 1, "data": {"actor/grad_norm": value}}
        path, read, valid = folder / "m.jsonl", read_metrics_log, _valid_record(record)
        path.write_text(json.dumps(record) + "\n" + json.dumps(RECORD) + "\n")
    elif where == "resumed_step":
        sidecar = {"attempts": [{"resumed_step": value, "provenance": {}}]}
        path, read, valid = folder / "m.jsonl.provenance.json", read_provenance, _valid_sidecar(sidecar)
        path.write_text(json.dumps(sidecar))
    else:
        results = {**RESULTS, "benchmarks": {"math500": {**BENCH, "pass@1": value}}}
        path, read, valid = folder / "r.json", make_tables.load_results, _valid_results(results)
        path.write_text(json.dumps(results))
    try:
        read(path)
    except ValueError as err:
        assert not valid, err
        return one_line(err, str(path))
    assert valid
    if where == "data":
        assert make_tables.finite_number(value) is None or math.isfinite(make_tables.finite_number(value))


def test_fuzz_edge_property_fails_on_a_reader_that_refuses_everything(monkeypatch, tmp_path_factory):
    from tests.fuzzing import fails_on_mutant, refusing

    mutant = refusing(MetricsLogError, lambda path, *a, **k: f"{path}:1: mutant")
    fails_on_mutant(test_fuzz_edge_values_are_read_or_refused_within_the_limit, monkeypatch, globals(),
                    "read_metrics_log", mutant, tmp_path_factory=tmp_path_factory)  # fmt: skip


@pytest.mark.parametrize("name", ["m.jsonl.provenance.json", "r.json"])
def test_fuzz_a_sidecar_or_results_nested_past_the_recursion_limit_is_refused(name, tmp_path):
    path, sidecar = tmp_path / name, name.endswith("provenance.json")
    path.write_text(('{"attempts": ' if sidecar else '{"benchmarks": ') + DEEP + "}")
    with pytest.raises(MetricsLogError) as err:
        (read_provenance if sidecar else make_tables.load_results)(path)
    one_line(err.value, f"{path}: not a")
    assert "nested too deeply" in str(err.value)
