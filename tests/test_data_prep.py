"""Every preparer on hub-schema source files (``hub_data``: the real ones in ../shared/data when present, else the
made-up rows of tests/fixtures/hub), checked against counts computed here from the raw files, plus schema (verl's
RLHFDataset), templates, atomic writes and invalid rows. Facts of the real files (row counts, answers of given rows,
the variants, the 675-row release) are checked with ``shared_data`` and skip on a clone without ../shared."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from ebpo_verl.data import DATASETS, aime2024, aime2025, amc23, dapo_math, math500, math_train, olympiadbench, schema
from ebpo_verl.data.all import LOCAL_FILES, prepare_all


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)


EMPTY_BOX = re.compile(r"\\boxed\s*\{\s*\}")  # a MATH solution whose box is empty has no answer
RELAY = re.compile(r"T\s*=\s*T\s*N\s*Y\s*W\s*R")  # an OlympiadBench relay problem ("T = TNYWR")


def _no_answer(rows: list[dict]) -> list[int]:
    return [i for i, r in enumerate(rows) if EMPTY_BOX.search(r["solution"])]


def _number(text: str) -> str:
    """AMC23's float strings as integers: "27.0" -> "27"."""
    return str(int(float(text))) if float(text).is_integer() else text


@pytest.fixture(scope="module")
def prepared(hub_data, tmp_path_factory) -> dict[str, Path]:
    """All seven datasets from the local files (MATH train needs --skip-invalid: rows with an empty box)."""
    return prepare_all(tmp_path_factory.mktemp("prepared"), local_dir=hub_data, skip_invalid=True)


def test_row_counts_and_schema(prepared, hub_data):
    raw = {name: _jsonl(hub_data / file) for name, file in LOCAL_FILES.items()}
    expected = {name: len(rows) for name, rows in raw.items()}
    expected["math_train"] -= len(_no_answer(raw["math_train"]))
    expected["olympiadbench"] -= sum(bool(RELAY.search(r["question"])) for r in raw["olympiadbench"])
    expected["dapo_math"] = len({r["prompt"][0]["content"] for r in raw["dapo_math"]})
    assert expected["math_train"] < len(raw["math_train"])  # the invalid rows are there, and dropped
    for name, n in expected.items():
        df = _read(prepared[name])
        assert len(df) == n, name
        assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert (df.data_source == name).all() and (df.ability == "math").all()
        assert all(len(p) == 1 and p[0]["role"] == "user" for p in df.prompt)
        assert all(rm["style"] == "rule" and rm["ground_truth"].strip() for rm in df.reward_model)
        info = pd.DataFrame(df.extra_info.tolist())
        assert list(info.columns) == ["index", "split", "source_id", "topic", "difficulty", "raw_problem", "raw_answer"]
        assert info["index"].tolist() == list(range(n))
        assert set(info.split) == {"train" if name in ("dapo_math", "math_train") else "test"}


def test_real_row_counts(shared_data, prepared):
    """The real files' sizes (with ../shared, ``prepared`` is made from them)."""
    counts = {name: len(_read(path)) for name, path in prepared.items()}
    assert counts == {
        "dapo_math": 44,
        "math_train": 7500 - 2,
        "math500": 500,
        "aime2024": 30,
        "aime2025": 30,
        "amc23": 40,
        "olympiadbench": 674,
    }


def test_math_train_topics_levels_and_answers(prepared, hub_data):
    raw = _jsonl(hub_data / "math_train.jsonl")
    dropped = _no_answer(raw)
    kept = [r for i, r in enumerate(raw) if i not in dropped]
    info = pd.DataFrame(_read(prepared["math_train"]).extra_info.tolist())
    assert info.source_id.tolist() == [str(i) for i in range(len(raw)) if i not in dropped]
    assert Counter(info.topic) == Counter(r["type"] for r in kept)
    want_levels = Counter(int(r["level"][-1]) if r["level"][-1].isdigit() else None for r in kept)
    got_levels = Counter(None if pd.isna(d) else int(d) for d in info.difficulty)
    assert got_levels == want_levels  # "Level ?" rows: no invented level
    assert got_levels[None] == sum(r["level"] == "Level ?" for r in kept) > 0
    gts = [rm["ground_truth"] for rm in _read(prepared["math_train"]).reward_model]
    for gt, row in zip(gts, kept, strict=True):  # the answer is what follows the solution's last \boxed
        assert gt and gt in row["solution"].rsplit("\\boxed", 1)[1]
    assert any(re.search(r"\\boxed [^{]", r["solution"]) for r in kept)  # the unbraced form is in the data


def test_real_math_train_facts(shared_data, prepared):
    assert _no_answer(_jsonl(shared_data / "math_train.jsonl")) == [5529, 5531]
    info = pd.DataFrame(_read(prepared["math_train"]).extra_info.tolist())
    assert info.difficulty.isna().sum() == 2  # the two "Level ?" rows
    gts = [rm["ground_truth"] for rm in _read(prepared["math_train"]).reward_model]
    assert gts[0] == "0"  # solution ends "$a+b=-3+3=\boxed{0}$"
    assert gts[1655] == "2"  # the unbraced "$\boxed 2$" form


def test_math_train_without_skip_invalid_names_row_and_field(hub_data, tmp_path):
    first = _no_answer(_jsonl(hub_data / "math_train.jsonl"))[0]
    with pytest.raises(ValueError, match=rf"invalid row {first} \(0-based\).*field solution.*--skip-invalid"):
        math_train.prepare(tmp_path, local_path=hub_data / "math_train.jsonl")
    assert not list(tmp_path.iterdir())  # nothing written, not even a temp file


def test_eval_sets_answers_topics(prepared, hub_data):
    m5 = _read(prepared["math500"])
    raw = _jsonl(hub_data / "math500.jsonl")
    assert [rm["ground_truth"] for rm in m5.reward_model] == [r["answer"] for r in raw]
    assert [e["difficulty"] for e in m5.extra_info] == [r["level"] for r in raw]
    assert [e["topic"] for e in m5.extra_info] == [r["subject"] for r in raw]

    a24 = _read(prepared["aime2024"])
    assert [rm["ground_truth"] for rm in a24.reward_model] == [
        str(r["Answer"]) for r in _jsonl(hub_data / "aime2024.jsonl")
    ]
    amc = _read(prepared["amc23"])
    raw_amc = _jsonl(hub_data / "amc23.jsonl")
    assert all(r["answer"].endswith(".0") for r in raw_amc)  # the hub writes integers as floats
    assert [rm["ground_truth"] for rm in amc.reward_model] == [_number(r["answer"]) for r in raw_amc]

    ob = _read(prepared["olympiadbench"])
    raw_ob = _jsonl(hub_data / "olympiadbench_math_en.jsonl")
    assert Counter(e["topic"] for e in ob.extra_info) == Counter(r["subfield"] for r in raw_ob)
    gt = {e["source_id"]: rm["ground_truth"] for e, rm in zip(ob.extra_info, ob.reward_model, strict=True)}
    multi = [r for r in raw_ob if len(r["final_answer"]) == 1 and "$,$" in r["final_answer"][0]]
    assert multi and all(gt[str(r["id"])] == r["final_answer"][0].replace("$", "") for r in multi)
    assert "$" not in "".join(gt.values()).replace("\\$", "")
    prompts = {e["source_id"]: p[0]["content"] for e, p in zip(ob.extra_info, ob.prompt, strict=True)}
    with_unit = [r for r in raw_ob if r["unit"]]
    assert with_unit and all(f"The unit of the answer is {r['unit']}." in prompts[str(r["id"])] for r in with_unit)


def test_real_eval_set_facts(shared_data, prepared):
    amc = [rm["ground_truth"] for rm in _read(prepared["amc23"]).reward_model]
    assert amc[:4] == ["27", "36", "45", "3159"] and "-1" in amc
    ob = _read(prepared["olympiadbench"])
    gt = {e["source_id"]: rm["ground_truth"] for e, rm in zip(ob.extra_info, ob.reward_model, strict=True)}
    raw_ob = _jsonl(shared_data / "olympiadbench_math_en.jsonl")
    multi = next(r for r in raw_ob if r["final_answer"] == ["$69$,$84$"])
    assert gt[str(multi["id"])] == "69,84"
    with_unit = next(r for r in raw_ob if r["unit"] == "km/h")
    prompt = next(p for e, p in zip(ob.extra_info, ob.prompt, strict=True) if e["source_id"] == str(with_unit["id"]))
    assert "The unit of the answer is km/h." in prompt[0]["content"]


@pytest.mark.parametrize(
    ("module", "file", "n_out", "answer_check"),
    [
        (
            aime2024,
            "aime2024_h4style_qwen.jsonl",
            30,
            lambda gts: "25" in gts and not any(g.startswith("0") for g in gts),
        ),
        (aime2024, "aime2024_maxwelljia.parquet", 30, lambda gts: "33" in gts),
        (aime2025, "aime2025_aops_text.jsonl", 30, lambda gts: gts[0] == "70"),
        (dapo_math, "dapo_math_svs_variant_500.jsonl", None, lambda gts: all(gts)),
    ],
)
def test_variant_files(shared_data, tmp_path, module, file, n_out, answer_check):
    path = shared_data / "variants" / file
    df = _read(module.prepare(tmp_path, local_path=path))
    if n_out is None:  # de-duplicated: count distinct problems here
        n_out = len({r["prompt"][0]["content"].strip() for r in _jsonl(path)})
    assert len(df) == n_out
    assert answer_check([rm["ground_truth"] for rm in df.reward_model])
    assert "__index_level_0__" not in json.dumps(df.extra_info.tolist())


def test_olympiadbench_675_release(shared_data, tmp_path):
    path = shared_data / "variants" / "olympiadbench_math_en_qwen675.jsonl"
    raw = _jsonl(path)
    n_relay = sum(bool(re.search(r"T\s*=\s*T\s*N\s*Y\s*W\s*R", r["question"])) for r in raw)
    assert n_relay == 15
    first = next(i for i, r in enumerate(raw) if re.search(r"T\s*=\s*T\s*N\s*Y\s*W\s*R", r["question"]))
    with pytest.raises(ValueError, match=rf"invalid row {first} .*field question.*TNYWR"):
        olympiadbench.prepare(tmp_path, local_path=path)
    df = _read(olympiadbench.prepare(tmp_path, local_path=path, skip_invalid=True))
    assert len(df) == 675 - n_relay


def test_dapo_templates_no_double_wrap(hub_data, tmp_path):
    src, seen = [], set()  # the first row of each problem (the preparer drops repeats)
    for row in _jsonl(hub_data / "dapo_math_sample.jsonl"):
        if row["prompt"][0]["content"] not in seen:
            seen.add(row["prompt"][0]["content"])
            src.append(row)
    dapo = _read(dapo_math.prepare(tmp_path / "d", local_path=hub_data / "dapo_math_sample.jsonl"))
    # the sample already uses DAPO's instruction: re-templating must reproduce it exactly, once
    assert [p[0]["content"] for p in dapo.prompt] == [r["prompt"][0]["content"] for r in src]
    assert [e["source_id"] for e in dapo.extra_info] == [r["extra_info"]["index"] for r in src]
    boxed = _read(dapo_math.prepare(tmp_path / "b", local_path=hub_data / "dapo_math_sample.jsonl", template="boxed"))
    for p in boxed.prompt:
        text = p[0]["content"]
        assert "Answer:" not in text and "Solve the following" not in text
        assert text.endswith("put your final answer within \\boxed{}.")
    # bare-problem variant: wrapped exactly once
    var = _read(dapo_math.prepare(tmp_path / "v", local_path=hub_data / "variants/dapo_math_svs_variant_500.jsonl"))
    for p in var.prompt:
        assert p[0]["content"].count("The last line of your response") == 1


def test_eval_prompts_use_dapo_template_by_default(prepared):
    for name in ("math500", "aime2024", "amc23", "olympiadbench"):
        for p in _read(prepared[name]).prompt:
            assert p[0]["content"].startswith(schema.DAPO_PREFIX) and p[0]["content"].endswith(schema.DAPO_SUFFIX)


def test_rlhf_dataset_loads_all_files_together(prepared, tiny_tokenizer):
    """verl concatenates train/val file lists: all our files must share one schema."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    files = [str(p) for p in prepared.values()]
    cfg = OmegaConf.create({"max_prompt_length": 100_000, "filter_overlong_prompts": False, "cache_dir": "/tmp"})
    ds = RLHFDataset(files, tiny_tokenizer, cfg)
    assert len(ds) == sum(len(_read(p)) for p in prepared.values())
    item = ds[len(_read(prepared["dapo_math"]))]  # first row of the second file
    assert item["data_source"] == list(prepared)[1]
    assert item["raw_prompt"][0]["role"] == "user"
    assert item["reward_model"]["style"] == "rule" and isinstance(item["reward_model"]["ground_truth"], str)
    assert item["index"] == 0 and set(item["extra_info"]) >= {"index", "split", "source_id", "topic", "difficulty"}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_invalid_rows_and_skip_invalid(tmp_path, capsys):
    rows = [
        {"problem": "1+1?", "answer": "2"},
        {"problem": "2+2?", "answer": "4"},
        {"problem": "   ", "answer": "5"},
        {"problem": "3+3?", "answer": None},
        {"problem": "4+4?", "answer": "8"},
    ]
    src = _write_jsonl(tmp_path / "amc.jsonl", rows)
    with pytest.raises(ValueError, match=r"invalid row 2 \(0-based\) of .*amc\.jsonl: field problem: empty"):
        amc23.prepare(tmp_path / "out", local_path=src)
    out = amc23.prepare(tmp_path / "out", local_path=src, skip_invalid=True)
    assert "dropped 2 invalid row(s)" in capsys.readouterr().out
    assert [rm["ground_truth"] for rm in _read(out).reward_model] == ["2", "4", "8"]

    bad_aime = _write_jsonl(
        tmp_path / "aime.jsonl", [{"problem": "p", "answer": "12"}, {"problem": "q", "answer": "1/2"}]
    )
    with pytest.raises(ValueError, match=r"invalid row 1 .*field answer: '1/2' is not an integer"):
        aime2025.prepare(tmp_path / "out", local_path=bad_aime)


def test_atomic_write_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch, hub_data):
    out = math500.prepare(tmp_path, local_path=hub_data / "math500.jsonl")
    before = out.read_bytes()

    def broken_write(table, where, **kw):
        Path(where).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(schema.pq, "write_table", broken_write)
    with pytest.raises(OSError, match="disk full"):
        math500.prepare(tmp_path, local_path=hub_data / "math500.jsonl", template="boxed")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["math500.parquet"]


def test_hub_loading_uses_pinned_ids(monkeypatch, tmp_path):
    import datasets

    calls = []

    def fake_load(repo, config=None, split=None, revision=None):
        calls.append((repo, config, split, revision))
        return datasets.Dataset.from_list([{"problem": "p", "answer": "27.0"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    out = amc23.main(["--out-dir", str(tmp_path), "--revision", "abc123"])
    assert calls == [("math-ai/amc23", None, "test", "abc123")]
    assert _read(out).reward_model[0]["ground_truth"] == "27"


def test_cli_reads_a_file_or_a_dataset_folder(hub_data, tmp_path):
    out = aime2025.main(
        ["--out-dir", str(tmp_path), "--local-path", str(hub_data / "aime2025.jsonl"), "--template", "boxed"]
    )
    assert out == tmp_path / "aime2025.parquet" and len(_read(out)) == len(_jsonl(hub_data / "aime2025.jsonl"))
    from_file = _read(out)

    # a folder with one data file (any name): its rows
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "aime.jsonl").write_text((hub_data / "aime2025.jsonl").read_text())
    out = aime2025.main(
        ["--out-dir", str(tmp_path / "b"), "--local-path", str(tmp_path / "one"), "--template", "boxed"]
    )
    pd.testing.assert_frame_equal(_read(out), from_file)

    # a folder as `huggingface-cli download --local-dir` leaves it: the split is told by file names, as `datasets`
    # does; amc23's hub split is "test"
    folder = tmp_path / "snapshot" / "data"
    folder.mkdir(parents=True)
    (folder / "test-00000.jsonl").write_text((hub_data / "amc23.jsonl").read_text())
    (folder / "train.jsonl").write_text((hub_data / "math500.jsonl").read_text())  # another split: not read
    out = amc23.main(["--out-dir", str(tmp_path / "c"), "--local-path", str(folder.parent)])
    pd.testing.assert_frame_equal(_read(out), _read(amc23.prepare(tmp_path / "d", hub_data / "amc23.jsonl")))
    assert len(_read(out)) == len(_jsonl(hub_data / "amc23.jsonl"))


def _cli(module, capsys, *args: str) -> tuple[int, list[str]]:
    """``python -m ebpo_verl.data.<module> ARGS`` in this process: (exit status, stderr lines)."""
    with pytest.raises(SystemExit) as exit_:
        module.main(list(args))
    return exit_.value.code, capsys.readouterr().err.splitlines()


def _bad_inputs(tmp_path: Path, hub_data: Path) -> dict[str, tuple[Path, str]]:
    """name -> (--local-path for math500, the exact error after ``python -m ebpo_verl.data.math500: error: ``)."""
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"problem": "1+1", "answer": "2"}\n\n{"problem": "x", answer}\n')
    not_object = tmp_path / "list.jsonl"
    not_object.write_text('{"problem": "1+1", "answer": "2"}\n[1, 2]\n')
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('[{"problem": "1+1",\n "answer": 2,}]')
    wrong = _write_jsonl(tmp_path / "wrong.jsonl", [{"question": "1+1", "solution": "2"}] * 3)
    parquet = tmp_path / "m.parquet"
    pd.read_json(hub_data / "math500.jsonl", lines=True, dtype=False).to_parquet(parquet)
    truncated = tmp_path / "cut.parquet"
    truncated.write_bytes(parquet.read_bytes()[: parquet.stat().st_size // 2])
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n")
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    return {
        "missing": (tmp_path / "missing.jsonl", f"local copy {tmp_path / 'missing.jsonl'} does not exist"),
        "csv": (csv, f"{csv}: unsupported file type '.csv'; use .jsonl, .json or .parquet (or a dataset folder)"),
        "jsonl-line": (
            bad_line,
            f"{bad_line}, line 3: not valid JSON (Expecting property name enclosed in double quotes, column 18)",
        ),
        "jsonl-not-object": (not_object, f"{not_object}, line 2: expected a JSON object, got list"),
        "json": (
            bad_json,
            f"{bad_json}, line 2: not valid JSON (Expecting property name enclosed in double quotes, column 14)",
        ),
        "schema": (
            wrong,
            f"math500: the columns of {wrong} do not match the expected schema: answer is read from column "
            "'answer', found columns ['question', 'solution']",
        ),
        "truncated": (
            truncated,
            f"{truncated} is not a readable parquet file (truncated or corrupt?): Could not open Parquet input source "
            f"'{truncated}': Parquet magic bytes not found in footer. Either the file is corrupted or this is not a "
            "parquet file.",
        ),
        "empty-folder": (
            empty,
            f"{empty} is a folder without a dataset (The directory at {empty} doesn't contain any data files); pass "
            "a .jsonl, .json or .parquet file, or a folder of such files",
        ),
    }


BAD_INPUTS = ["missing", "csv", "jsonl-line", "jsonl-not-object", "json", "schema", "truncated", "empty-folder"]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_cli_bad_input_is_one_line_exit_2(hub_data, tmp_path, capsys, case):
    path, message = _bad_inputs(tmp_path, hub_data)[case]
    for extra in ([], ["--skip-invalid"]):  # a whole-file problem is not a row problem: no --skip-invalid advice
        code, err = _cli(math500, capsys, "--out-dir", str(tmp_path / "out"), "--local-path", str(path), *extra)
        assert (code, err) == (2, [f"python -m ebpo_verl.data.math500: error: {message}"])
    assert not (tmp_path / "out").exists()


def test_cli_invalid_row_suggests_skip_invalid(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "amc.jsonl", [{"problem": "1+1?", "answer": "2"}, {"problem": " ", "answer": "3"}])
    code, err = _cli(amc23, capsys, "--out-dir", str(tmp_path), "--local-path", str(src))
    assert (code, err) == (
        2,
        [
            f"python -m ebpo_verl.data.amc23: error: amc23: invalid row 1 (0-based) of {src}: field problem: empty. "
            "Fix the source row or pass --skip-invalid to drop such rows."
        ],
    )


def test_cli_error_through_python_m_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    run = subprocess.run(
        [sys.executable, "-m", "ebpo_verl.data.math500", "--out-dir", str(tmp_path), "--local-path", str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"python -m ebpo_verl.data.math500: error: {bad}, line 1: not valid JSON (Expecting property name enclosed in "
        "double quotes, column 2)"
    ]


def test_all_local_dir_errors_name_local_dir(hub_data, tmp_path, capsys):
    from ebpo_verl.data import all as prep_all

    missing = tmp_path / "nowhere"
    code, err = _cli(prep_all, capsys, "--out-dir", str(tmp_path / "out"), "--local-dir", str(missing))
    assert (code, err) == (
        2,
        [f"python -m ebpo_verl.data.all: error: --local-dir {missing} does not exist or is not a folder"],
    )

    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "amc23.jsonl").write_text((hub_data / "amc23.jsonl").read_text())
    (partial / "aime2025.jsonl").write_text("{bad\n")
    args = ["--out-dir", str(tmp_path / "out"), "--local-dir", str(partial), "--only", "amc23", "aime2024", "aime2025"]
    code, err = _cli(prep_all, capsys, *args)
    assert (code, err) == (
        2,
        [
            f"python -m ebpo_verl.data.all: error: aime2024: --local-dir {partial} has no aime2024.jsonl",
            f"python -m ebpo_verl.data.all: error: aime2025: {partial / 'aime2025.jsonl'}, line 1: not valid JSON "
            "(Expecting property name enclosed in double quotes, column 2)",
        ],
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["amc23.parquet"]  # the others still ran


UMASK_WRITE = """
import os, sys
os.umask(int(sys.argv[1], 8))
from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.data import math500
math500.prepare(sys.argv[2], local_path=sys.argv[3])
atomic_write_text(os.path.join(sys.argv[2], "note.txt"), "x")
"""


@pytest.mark.parametrize(("umask", "mode"), [("022", 0o644), ("077", 0o600), ("002", 0o664)])
def test_outputs_follow_the_umask(hub_data, tmp_path, umask, mode):
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-c", UMASK_WRITE, umask, str(out), str(hub_data / "math500.jsonl")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {"math500.parquet": mode, "note.txt": mode}


def _kinds(rows: list[dict]) -> dict[str, set[str]]:
    """column -> the JSON types its values take (nested dicts by their keys)."""
    kinds: dict[str, set[str]] = {}
    for row in rows:
        for key, value in row.items():
            kind = f"dict{sorted(value)}" if isinstance(value, dict) else type(value).__name__
            if isinstance(value, list) and value and isinstance(value[0], dict):
                kind = f"list[dict{sorted(value[0])}]"
            kinds.setdefault(key, set()).add(kind)
    return kinds


def test_fixture_rows_mirror_the_real_files(shared_data):
    """tests/fixtures/hub (what a clone tests with) has the real files' names, columns and value types."""
    fixtures = Path(__file__).parent / "fixtures" / "hub"
    names = sorted(str(p.relative_to(fixtures)) for p in fixtures.rglob("*") if p.suffix in (".jsonl", ".parquet"))
    real = sorted(str(p.relative_to(shared_data)) for p in shared_data.rglob("*") if p.suffix in (".jsonl", ".parquet"))
    assert names == real
    for name in names:
        if name.endswith(".parquet"):
            ours, theirs = pd.read_parquet(fixtures / name), pd.read_parquet(shared_data / name)
            assert ours.dtypes.to_dict() == theirs.dtypes.to_dict(), name
            continue
        ours, theirs = _kinds(_jsonl(fixtures / name)), _kinds(_jsonl(shared_data / name))
        assert list(ours) == list(theirs), name  # same columns, same order
        for column, kinds in ours.items():  # no value type the real file lacks (a column null there: any)
            if theirs[column] != {"NoneType"}:
                assert kinds - {"NoneType"} <= theirs[column], (name, column, kinds, theirs[column])


REPO = Path(__file__).resolve().parents[1]


def _data_prep(name: str, *args: str) -> subprocess.CompletedProcess:
    """``python data_prep/<name>.py ARGS`` as a user runs it in a checkout (this checkout's package first)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, f"data_prep/{name}.py", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_data_prep_is_one_thin_script_per_command_shipped_in_the_wheel():
    """data_prep/ holds a script per dataset, ``all`` and ``label_topics``, each calling its ebpo_verl.data
    command line (nothing more: the logic stays in the package, which never imports data_prep); the wheel installs
    them as documentation (pyproject's data-files)."""
    scripts = sorted((REPO / "data_prep").glob("*.py"))
    assert sorted(p.stem for p in scripts) == sorted([*DATASETS, "all", "label_topics"])
    for path in scripts:
        code = " ".join(path.read_text().split('"""')[2].split())  # what follows the docstring
        run = f'if __name__ == "__main__": main(prog="python data_prep/{path.name}")'
        want = f"from ebpo_verl.data.{path.stem} import main {run}"
        assert code == want, path
    package = [
        p for p in (REPO / "ebpo_verl").rglob("*.py") if re.search(r"^\s*(from|import) data_prep", p.read_text(), re.M)
    ]
    assert package == []
    assert '\n"share/doc/ebpo-verl/data_prep" = ["data_prep/*.py"]\n' in (REPO / "pyproject.toml").read_text()


@pytest.mark.parametrize("name", DATASETS)
def test_data_prep_script_writes_what_the_package_writes(name, shared_data, prepared, tmp_path):
    """``python data_prep/<name>.py`` on the dataset's file in ../shared/data writes the same table as
    ebpo_verl.data (``prepared``, made from those files)."""
    run = _data_prep(
        name, "--out-dir", str(tmp_path), "--local-path", str(shared_data / LOCAL_FILES[name]), "--skip-invalid"
    )
    assert run.returncode == 0, run.stderr
    pd.testing.assert_frame_equal(_read(tmp_path / f"{name}.parquet"), _read(prepared[name]))


def test_data_prep_all_writes_the_sets_and_names_itself_in_errors(shared_data, prepared, tmp_path):
    run = _data_prep("all", "--out-dir", str(tmp_path), "--local-dir", str(shared_data), "--only", "amc23", "aime2024")
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aime2024.parquet", "amc23.parquet"]
    for name in ("amc23", "aime2024"):
        pd.testing.assert_frame_equal(_read(tmp_path / f"{name}.parquet"), _read(prepared[name]))
    run = _data_prep("all", "--out-dir", str(tmp_path), "--local-dir", str(tmp_path / "nowhere"))
    assert (run.returncode, run.stderr.splitlines()) == (
        2,
        [f"python data_prep/all.py: error: --local-dir {tmp_path / 'nowhere'} does not exist or is not a folder"],
    )
