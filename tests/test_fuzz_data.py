"""Fuzzing the data a run reads from outside: training rows at the pre-flight (prompt in verl's chat format, ground
truth), data-prep source rows, and the prepared parquets ``evaluate generate --protocol verl`` reads. Each input is
accepted as it is, or refused with one line naming the file and the row (exit 2 on a command line): never a
traceback, text made of a list, or a half-written file."""

from __future__ import annotations

import json
import math
import re
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebpo_verl.data import aime2024, amc23, dapo_math, math500, math_train, olympiadbench
from ebpo_verl.data.schema import MAX_PROBLEM_CHARS, DataPrepError, build_rows
from ebpo_verl.evaluate.__main__ import main as evaluate_main
from ebpo_verl.evaluate.prompts import EvalInputError, load_problems
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.trainer.preflight.data import check_data
from ebpo_verl.trainer.run_options import RunOptions

FUZZ = settings(
    max_examples=120, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
"""120 examples per property, derandomized (the same examples every run); every health check on but too_slow."""

USER = [{"role": "user", "content": "What is 1 + 1?"}]
scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats() | st.text(max_size=6)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=7), inner, max_size=3),
    max_leaves=8,
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(max_size=12)}
)
prompts = st.lists(messages, min_size=1, max_size=3) | json_values | st.lists(json_values, max_size=3)
ground_truths = st.sampled_from(["2", "nan", "NaN", " ", "", "\\boxed{}", "$$", "None"]) | scalars | json_values


def _is_chat(prompt) -> bool:
    """The oracle: a non-empty list of {role: non-empty str, content: str} objects."""
    return (
        isinstance(prompt, list)
        and len(prompt) > 0
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"] for m in prompt)
        and all(isinstance(m.get("content"), str) for m in prompt)
    )


def _is_answer(truth) -> bool:
    """The oracle: text with something in it that is not 'nan', or a finite number."""
    if isinstance(truth, bool) or truth is None:
        return False
    if isinstance(truth, int | float):
        return math.isfinite(truth)
    return isinstance(truth, str) and truth.strip().lower() not in ("", "nan", "$$", "\\boxed{}")


def _one_line(message: str, *names: str) -> None:
    assert "\n" not in message and "Traceback" not in message, message
    assert all(name in message for name in names), (names, message)


# ---------------------------------------------------------------------------------------- the pre-flight's rows


def _jsonl(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture(scope="module")
def job(compose_config):
    """(config, options) of a run training on one file with one row per batch (composed once: Hydra is slow)."""
    config = compose_config("data.train_files=train.jsonl", "data.val_files=[]", "data.train_batch_size=1")
    return config, RunOptions.from_config(config)


def _check(job, train: str):
    config, options = job
    config.data.train_files = train
    return check_data(config, options, dry_run=True)


def _row(prompt=USER, truth="2") -> dict:
    return {"prompt": prompt, "reward_model": {"ground_truth": truth}, "extra_info": {"index": 0}}


@pytest.mark.parametrize(
    "rows, found",
    [
        ([{"question": "1 + 1?", "reward_model": {"ground_truth": "2"}}], "has no 'prompt' column"),
        ([_row(), _row("What is 1 + 1?")], "row 1 (0-based; 1 of 2 rows alike): prompt is a str ('What is 1 + 1?')"),
        ([_row([{"content": "hi"}])], "row 0 (0-based; 1 of 1 rows alike): prompt is message 0 has no role"),
        ([_row(), _row(truth="nan")], "0-based: 1 (NaN)"),
        ([_row(truth=["2"])], "0-based: 0 (not text: list)"),
    ],
)
def test_fuzz_preflight_refuses_prompts_verl_cannot_read(rows, found, tmp_path, job):
    # today: `pre-flight: ok` for each (the prompt was never read; "nan" and a list passed as ground truths)
    train = _jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(EBPOConfigError) as err:
        _check(job, train)
    _one_line(str(err.value), f"data.train_files: {train}", found)


def test_fuzz_preflight_cli_string_prompts_exit_2(tmp_path, monkeypatch, capsys):
    """The same through ``ebpo-train --cfg job``: exit 2, one error line naming the file, the row and the fix."""
    from ebpo_verl import main as entry

    train = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([_row("What is 1 + 1?")] * 8), train)
    sizes = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    argv = ["ebpo-train", "--cfg", "job", f"data.train_files={train}", "data.val_files=[]", *sizes]
    monkeypatch.setattr(sys, "argv", [*argv, "actor_rollout_ref.model.path=org/model"])
    with pytest.raises(SystemExit) as exit_:
        entry.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "pre-flight: ok" not in err and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("ebpo-train: error:")]
    _one_line(line, str(train), "row 0 (0-based; 8 of 8 rows alike): prompt is a str", "prepare the file with")


@FUZZ
@given(rows=st.lists(st.tuples(prompts, ground_truths), min_size=1, max_size=4))
def test_fuzz_preflight_rows(rows, tmp_path_factory, job):
    """Any prompt and ground truth: accepted exactly when every row is verl's chat format with an answer."""
    train = _jsonl(tmp_path_factory.mktemp("rows") / "train.jsonl", [_row(p, t) for p, t in rows])
    try:
        line = _check(job, train)
    except EBPOConfigError as err:
        _one_line(str(err), train)
        assert not all(_is_chat(p) and _is_answer(t) for p, t in rows)
        return
    assert "steps per epoch" in line
    assert all(_is_chat(p) and _is_answer(t) for p, t in rows)


# ------------------------------------------------------------------------------------------- data-prep source rows


def _prepare(dataset, tmp_path, rows, **kwargs):
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return dataset.prepare(tmp_path / "out", local_path=source, **kwargs)


@pytest.mark.parametrize("problem", [["a", "b"], {"text": "a"}, 7, 2.5, True])
def test_fuzz_data_prep_refuses_a_problem_that_is_not_text(problem, tmp_path):
    # today: accepted and written into the prompt as "['a', 'b']", "{'text': 'a'}", "7"
    with pytest.raises(DataPrepError) as err:
        _prepare(math500.DATASET, tmp_path, [{"problem": problem, "answer": "1"}])
    _one_line(
        str(err.value), "invalid row 0", f"field problem/question: expected a string, got {type(problem).__name__}"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written


def test_fuzz_data_prep_problem_size_limit(tmp_path, capsys):
    # today: a 20 MB problem was accepted
    huge = "x" * 20_000_000
    with pytest.raises(DataPrepError) as err:
        _prepare(math500.DATASET, tmp_path, [{"problem": huge, "answer": "1"}])
    _one_line(str(err.value), f"field problem: 20000000 characters, more than --max-problem-chars={MAX_PROBLEM_CHARS}")
    out = _prepare(math500.DATASET, tmp_path, [{"problem": "y" * 40, "answer": "1"}] * 2, max_problem_chars=40)
    assert pq.read_table(out).num_rows == 2  # the limit is inclusive, and an option
    source = tmp_path / "long.jsonl"
    source.write_text(json.dumps({"problem": "y" * 41, "answer": "1"}) + "\n")
    argv = ["--out-dir", str(tmp_path / "cli"), "--local-path", str(source), "--max-problem-chars", "40"]
    with pytest.raises(SystemExit) as exit_:
        math500.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "41 characters, more than --max-problem-chars=40" in err and not (tmp_path / "cli").exists()


CONVERTERS = {
    "math500": (math500.convert, ("problem", "answer", "subject", "level", "unique_id")),
    "aime2024": (aime2024.aime_example, ("Problem", "Answer", "ID")),
    "amc23": (amc23.convert, ("question", "answer", "id")),
    "olympiadbench": (olympiadbench.convert, ("question", "final_answer", "context", "unit", "subfield", "id")),
    "math_train": (math_train.convert, ("problem", "solution", "type", "level")),
    "dapo_math": (dapo_math.convert, ("prompt", "reward_model", "extra_info")),
}
field_values = (
    st.text(max_size=10)
    | st.sampled_from(["Level 3", "\\boxed{4}", "$5$", "25", "27.0", "  "])
    | st.lists(st.text(max_size=4) | st.integers(0, 9), max_size=2)
    | scalars
    | json_values
)


def _strings_in(value) -> list[str]:
    """Every string inside a source value (the only text a prepared row may contain)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings_in(v)]
    return []


words = st.text(alphabet="abcdefghijklmnopqrs0123456789 +", min_size=1, max_size=10).filter(str.strip)


def _valid_record(name: str) -> st.SearchStrategy:
    """A source row the dataset's converter takes: text in every column, in each dataset's shape."""
    shapes = {
        "math500": {"problem": words, "answer": words, "subject": words, "level": st.just("Level 3"),
                    "unique_id": words},
        "aime2024": {"Problem": words, "Answer": st.integers(0, 999).map(str), "ID": words},
        "amc23": {"question": words, "answer": words, "id": words},
        "olympiadbench": {"question": words, "final_answer": st.lists(words, min_size=1, max_size=2),
                          "context": words, "unit": words, "subfield": words, "id": words},
        "math_train": {"problem": words, "solution": words.map(lambda w: f"so \\boxed{{{w}}}"), "type": words,
                       "level": st.just("Level 2")},
        "dapo_math": {"prompt": words.map(lambda w: [{"role": "user", "content": w}]),
                      "reward_model": words.map(lambda w: {"ground_truth": w}), "extra_info": st.just({"index": 0})},
    }  # fmt: skip
    return st.fixed_dictionaries(shapes[name])


@pytest.mark.parametrize("name", list(CONVERTERS))
@FUZZ
@given(data=st.data())
def test_fuzz_data_prep_rows(name, data):
    """Valid source rows with any values put into some of their columns: the rows left as they were are always
    converted, and a refusal is one line naming a row that was changed; an accepted problem is made of the source's
    strings (never the repr of a list, a dict or None)."""
    import pandas as pd

    convert, columns = CONVERTERS[name]
    valid = data.draw(st.lists(_valid_record(name), min_size=1, max_size=3), label="valid rows")
    changes = data.draw(
        st.lists(st.dictionaries(st.sampled_from(columns), field_values, max_size=2), min_size=len(valid),
                 max_size=len(valid)), label="changes",
    )  # fmt: skip
    records = [{**row, **change} for row, change in zip(valid, changes, strict=True)]
    changed = {i for i, change in enumerate(changes) if change}
    df = pd.DataFrame.from_records(records, columns=list(columns))
    df = df.astype(object).where(df.notna(), None)
    try:
        rows, skipped, _ = build_rows(name, df, convert, "test", "boxed", False, "source.jsonl")
    except DataPrepError as err:
        _one_line(str(err), name, "source.jsonl")
        refused = re.search(r"invalid row (\d+) \(0-based\)", str(err))
        assert refused and int(refused.group(1)) in changed, (err, changed)
        return
    assert skipped == 0 and len(rows) == len(records)
    for record, row in zip(records, rows, strict=True):
        [message] = row["prompt"]
        assert isinstance(message["content"], str) and isinstance(row["reward_model"]["ground_truth"], str)
        texts = _strings_in(record)
        assert any(t.strip() and t.strip() in message["content"] for t in texts), (record, message)
        assert not any(marker in message["content"] for marker in ("['", "{'", "None\n")) or any(
            marker in t for t in texts for marker in ("['", "{'", "None")
        )


# ------------------------------------------------------------------------ evaluate generate --protocol verl input


def _prepared(folder, rows: list[dict]):
    pq.write_table(pa.Table.from_pylist(rows), folder / "math500.parquet")
    return folder


@pytest.mark.parametrize(
    "row, found",
    [
        ({"prompt": "What is 1 + 1?"}, "row 0 (0-based): prompt is a str ('What is 1 + 1?')"),
        ({"extra_info": {"split": "test"}}, "row 0 (0-based) has no extra_info.index (an integer >= 0)"),
        ({"extra_info": {"index": -1}}, "row 0 (0-based) has no extra_info.index"),
    ],
)
def test_fuzz_evaluate_verl_input_is_one_line_exit_2(row, found, tmp_path, capsys):
    # today: TypeError (string prompt) and KeyError: 'index' tracebacks
    base = {"data_source": "math500", "prompt": USER, "ability": "math", "reward_model": {"ground_truth": "2"}}
    data_dir = _prepared(tmp_path, [{**base, "extra_info": {"index": 0}, **row}])
    out = tmp_path / "g.jsonl"
    argv = ["generate", "--protocol", "verl", "--benchmarks", "math500", "--model", "org/model"]
    assert evaluate_main([*argv, "--data-dir", str(data_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    _one_line(err.strip(), "math500.parquet", found, "re-create it with python -m ebpo_verl.data.all")
    assert not out.exists() and not (tmp_path / "g.jsonl.meta.json").exists()


def test_fuzz_evaluate_repeated_index_is_refused(tmp_path):
    row = {"data_source": "math500", "prompt": USER, "ability": "math", "reward_model": {"ground_truth": "2"}}
    data_dir = _prepared(tmp_path, [{**row, "extra_info": {"index": 3}}, {**row, "extra_info": {"index": 3}}])
    with pytest.raises(EvalInputError, match=r"rows 0 and 1 \(0-based\) share extra_info.index 3"):
        load_problems(data_dir, "math500", "verl")


@FUZZ
@given(prompt=prompts, index=st.integers(0, 50) | json_values, truth=st.just("2") | ground_truths)
def test_fuzz_evaluate_verl_rows(prompt, index, truth, tmp_path_factory):
    """Any prompt, index and ground truth in a prepared parquet: read as they are, or one EvalInputError line."""
    row = {"data_source": "math500", "prompt": prompt, "ability": "math", "reward_model": {"ground_truth": truth}}
    try:
        data_dir = _prepared(tmp_path_factory.mktemp("eval"), [{**row, "extra_info": {"index": index}}])
    except (pa.ArrowException, OverflowError):
        return  # a row pyarrow cannot write is not a parquet anyone can hand us
    valid = _is_chat(prompt) and _is_answer(truth) and isinstance(index, int) and not isinstance(index, bool)
    valid = valid and index >= 0
    try:
        [problem] = load_problems(data_dir, "math500", "verl")
    except EvalInputError as err:
        assert not valid, err
        return _one_line(str(err), "math500.parquet")
    assert valid
    assert problem.prompt == [{"role": m["role"], "content": m["content"]} for m in prompt]
    assert problem.index == index and type(index) is int and problem.ground_truth == truth


def test_fuzz_label_topics_refuses_a_string_prompt(tmp_path):
    # today: TypeError (string indices must be integers) from p[0]["content"]
    from ebpo_verl.data.label_topics import label_topics

    row = {"data_source": "x", "prompt": "What is 1 + 1?", "ability": "math", "reward_model": {"ground_truth": "2"}}
    pq.write_table(pa.Table.from_pylist([{**row, "extra_info": {"index": 0}}]), tmp_path / "in.parquet")
    with pytest.raises(DataPrepError) as err:
        label_topics(tmp_path / "in.parquet", tmp_path / "out.parquet")
    _one_line(str(err.value), "in.parquet: row 0 (0-based; 1 of 1 rows alike): prompt is a str")
    assert not (tmp_path / "out.parquet").exists()


def test_fuzz_data_properties_fail_on_a_refusing_loader(monkeypatch, tmp_path_factory, job):
    """Each property fails when its loader refuses everything (with the refusal the real one gives)."""
    from tests.fuzzing import fails_on_mutant, refusing

    mutant = refusing(EBPOConfigError, lambda config, *a, **k: f"data.train_files: {config.data.train_files}: mutant")
    fails_on_mutant(test_fuzz_preflight_rows, monkeypatch, globals(), "check_data", mutant,
                    tmp_path_factory=tmp_path_factory, job=job)  # fmt: skip
    mutant = refusing(DataPrepError, lambda name, df, convert, split, template, skip, source, *a: (
        f"{name}: invalid row 0 (0-based) of {source}: field problem: mutant"))  # fmt: skip
    fails_on_mutant(test_fuzz_data_prep_rows, monkeypatch, globals(), "build_rows", mutant, name="math500")
    mutant = refusing(EvalInputError, lambda data_dir, *a: f"{data_dir}/math500.parquet: mutant")
    fails_on_mutant(test_fuzz_evaluate_verl_rows, monkeypatch, globals(), "load_problems", mutant,
                    tmp_path_factory=tmp_path_factory)  # fmt: skip
