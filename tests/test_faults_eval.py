"""Faults and bad input on the evaluation and data side (issue 22): each test reproduces one finding.

Finding 1: samples are never graded against (or resumed with) other problems than they were generated from.
Finding 4: one writer per generations file (a second `evaluate generate` on one --out is refused).
Finding 5: a ground truth that is empty, None or NaN never scores 1 and is refused where data enters.
Finding 6: `evaluate generate --workers 2` workers die with their parent, however it is killed.
Finding 8: a full disk (a write raising ENOSPC) is one line naming the file and the free space, in the study,
the evaluation and the data stages.
Finding 9 (evaluation and data messages): estimate_pass_rate --pass-rates errors, non-UTF-8 input, an empty
benchmark parquet (make_tables' marking of partial and --limit results: tests/test_tables.py).
Finding 11: the package's own torch.load calls pass weights_only=True; eval.sh's help and docs/evaluation.md say
that evaluating a verl checkpoint unpickles it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pyarrow as pa
import pytest

from ebpo_verl import paper_reward
from ebpo_verl import reward as verl_reward
from ebpo_verl.data import aime2024
from ebpo_verl.data.schema import DataPrepError, check_ground_truths
from ebpo_verl.evaluate.__main__ import main as evaluate_main
from ebpo_verl.evaluate.generations import GenerationsFile, problem_digest, read_generations
from ebpo_verl.evaluate.grading import grade_file
from ebpo_verl.evaluate.prompts import EvalInputError, load_problems


@pytest.fixture(scope="module")
def aime_twice(tmp_path_factory, hub_data) -> tuple[Path, Path]:
    """AIME 2024 prepared as shipped, and re-prepared from a copy with rows 3 and 7 swapped (as another hub
    revision may order them)."""
    work = tmp_path_factory.mktemp("aime")
    lines = (hub_data / "aime2024.jsonl").read_text().splitlines()
    lines[3], lines[7] = lines[7], lines[3]
    (work / "reordered.jsonl").write_text("\n".join(lines) + "\n")
    aime2024.prepare(work / "a", local_path=hub_data / "aime2024.jsonl")
    aime2024.prepare(work / "b", local_path=work / "reordered.jsonl")
    return work / "a", work / "b"


def _meta(data: Path, protocol: str = "paper") -> dict:
    problems = load_problems(data, "aime2024", protocol)
    return {
        "protocol": protocol,
        "model": "m",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": 100,
        "benchmarks": {
            "aime2024": {
                "runs": 1,
                "limit": None,
                "problems": len(problems),
                "digests": {str(p.index): problem_digest(p.prompt, p.ground_truth) for p in problems},
            }
        },
    }


def test_grade_refuses_reordered_data(aime_twice, tmp_path, capsys):
    a, b = aime_twice
    truths = [p.ground_truth for p in load_problems(a, "aime2024", "paper")]
    assert truths[3] != truths[7]  # the swap moves answers
    gen = tmp_path / "gen.jsonl"
    with GenerationsFile(gen, _meta(a)) as g:
        g.append(
            [
                {"benchmark": "aime2024", "index": i, "sample": 0, "response": f"Answer: {t}"}
                | {"response_tokens": 3, "finish_reason": "stop"}
                for i, t in enumerate(truths)
            ]
        )
    assert grade_file("paper", gen, a)["benchmarks"]["aime2024"]["pass@1"] == 100.0  # every answer right
    with pytest.raises(EvalInputError, match=r"other aime2024 problems than .*b/aime2024.parquet .*index 3 differs"):
        grade_file("paper", gen, b)
    out = tmp_path / "r.json"
    argv = ["grade", "--protocol", "paper", "--generations", str(gen), "--data-dir", str(b), "--out", str(out)]
    assert evaluate_main(argv) == 2 and not out.exists()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "aime2024" in err and "index 3" in err
    with pytest.raises(EvalInputError, match=r"index 3 differs"):  # a resume from the re-prepared data
        GenerationsFile(gen, _meta(b))
    assert json.loads(Path(f"{gen}.meta.json").read_text()) == _meta(a)  # nothing changed by the refusal


def test_grade_warns_on_a_meta_without_digests(aime_twice, tmp_path, capsys):
    a, _ = aime_twice
    m = _meta(a)
    del m["benchmarks"]["aime2024"]["digests"]
    gen = tmp_path / "gen.jsonl"
    GenerationsFile(gen, m).close()
    grade_file("paper", gen, a, allow_partial=True)
    assert "records no problem digests for aime2024" in capsys.readouterr().err
    with pytest.raises(EvalInputError, match="records no problem digests for aime2024"):  # no resume into it
        GenerationsFile(gen, _meta(a))


EMPTY_ANSWERS = ["Answer: ", "Answer: $$", "Answer: \\boxed{}", "\\boxed{}", "Answer: {}"]
NONE_ANSWERS = ["Answer: None", "Answer: nan", "Answer: NaN", "\\boxed{None}", "\\boxed{nan}"]


def _scores(response: str, truth: object) -> tuple[float, float, bool]:
    """(training reward of REWARD=paper, of REWARD=verl (math-verify), paper evaluation verdict)."""
    return (
        paper_reward.compute_score("aime2024", response, truth)["score"],
        verl_reward.compute_score("aime2024", response, truth)["score"],
        paper_reward.grade_eval(response, truth),
    )


@pytest.mark.parametrize("response", EMPTY_ANSWERS)
@pytest.mark.parametrize("truth", ["", "  ", "$$", "\\boxed{}"])
def test_empty_answer_never_matches_an_empty_ground_truth(response, truth):
    assert _scores(response, truth) == (-1.0, 0.0, False)


@pytest.mark.parametrize("response", NONE_ANSWERS + EMPTY_ANSWERS)
@pytest.mark.parametrize("truth", [None, float("nan"), math.nan])
def test_none_or_nan_ground_truth_scores_nothing(response, truth):
    assert _scores(response, truth) == (-1.0, 0.0, False)


def test_real_answers_still_score():
    assert _scores("so\nAnswer: 42", "42") == (1.0, 1.0, True)
    assert _scores("Answer: 0", "0") == (1.0, 1.0, True)  # "0" is an answer, not an empty one
    assert _scores("Answer: 0", 0) == (1.0, 1.0, True)


def test_missing_ground_truth_reasons():
    m = verl_reward.missing_ground_truth
    assert [m(v) for v in (None, float("nan"), "", " $ $ ", "\\boxed{ }", "{}")] == [
        "None",
        "NaN",
        "empty",
        "empty",
        "empty",
        "empty",
    ]
    assert [m(v) for v in ("0", 0, 0.0, "None of these", "\\boxed{3}", False)] == [None] * 6


def _rows(truths: list[object]) -> list[dict]:
    return [{"reward_model": {"ground_truth": t, "style": "rule"}} for t in truths]


def test_check_ground_truths_names_the_rows_of_a_table_and_a_frame():
    truths = ["1", "", "2", None, "3"]
    table = pa.Table.from_pylist(_rows(truths))
    with pytest.raises(DataPrepError, match=r"^train\.parquet: .* in 2 row\(s\), 0-based: 1 \(empty\), 3 \(None\);"):
        check_ground_truths(table, "train.parquet")
    frame = pd.DataFrame({"reward_model": [{"ground_truth": float("nan")}, {"ground_truth": "4"}, {"style": "x"}]})
    with pytest.raises(DataPrepError, match=r"0 \(NaN\), 2 \(no ground_truth key\)"):
        check_ground_truths(frame, "val.parquet")
    with pytest.raises(DataPrepError, match="no reward_model column"):
        check_ground_truths(pd.DataFrame({"x": [1]}), "val.parquet")
    check_ground_truths(pa.Table.from_pylist(_rows(["1", "0"])), "ok.parquet")  # no error


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

    out = tmp_path_factory.mktemp("tiny")
    build_model(out, build_tokenizer(out))
    return out


def _generate_argv(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["generate", "--model", str(model), "--data-dir", str(data), "--protocol", "verl", "--out", str(out),
            "--benchmarks", "aime2024", "--engine", "hf", *extra]  # fmt: skip


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_two_generates_on_one_out(aime_twice, tiny_model, tmp_path, capsys):
    """A long first generate holds GEN.jsonl.lock (frozen with SIGSTOP once it holds it, so the overlap is
    certain); a second generate on the same --out stops at once with one line naming the first's pid and writes
    nothing. The first, killed with SIGKILL (no cleanup), leaves its lock file but no stale lock."""
    from ebpo_verl.evaluate.generations import read_meta

    data, _ = aime_twice
    gen = tmp_path / "gen.jsonl"
    lock = Path(f"{gen}.lock")
    long = _generate_argv(tiny_model, data, gen, "--runs", "50", "--max-new-tokens", "200", "--chunk-size", "1")
    log = tmp_path / "first.log"
    with open(log, "w") as err:
        first = subprocess.Popen(
            [sys.executable, "-m", "ebpo_verl.evaluate", *long], stdout=subprocess.DEVNULL, stderr=err
        )
    try:

        def holds() -> bool:
            if first.poll() is not None:
                pytest.fail(f"the first generate exited ({first.returncode}) early: {log.read_text()[-2000:]}")
            return gen.exists() and f'"pid": {first.pid}' in lock.read_text()  # opened under its lock

        _wait_for(holds, 600, "the first's lock and file")  # its imports can take minutes on a loaded machine
        first.send_signal(signal.SIGSTOP)
        before = gen.read_bytes()
        assert evaluate_main(_generate_argv(tiny_model, data, gen, "--limit", "1", "--runs", "1")) == 2
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err
        assert err.splitlines()[-1].startswith(
            f"python -m ebpo_verl.evaluate generate: error: generations file {gen} is in use by pid {first.pid} on "
        )
        assert gen.read_bytes() == before  # the refused run wrote nothing
    finally:
        first.kill()  # SIGKILL, also to a stopped process
        first.wait()
    assert lock.is_file()  # no cleanup ran, but the lock died with the process
    read_generations(gen)  # (it refuses a sample written twice)
    with GenerationsFile(gen, read_meta(gen)):  # the next writer gets it at once
        pass
    assert not lock.exists()


def _workers(parent: psutil.Process) -> list[psutil.Process]:
    """The generation workers among ``parent``'s children (spawned, each leading its own process group)."""
    found = []
    for child in parent.children():
        try:
            if "spawn_main" in " ".join(child.cmdline()) and os.getpgid(child.pid) == child.pid:
                found.append(child)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return found


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
@pytest.mark.parametrize(
    "how",
    [("parent", signal.SIGKILL), ("parent", signal.SIGTERM), ("group", signal.SIGTERM), ("group", signal.SIGKILL)],
)
def test_workers_die_with_their_parent(aime_twice, tiny_model, tmp_path, how):
    data, _ = aime_twice
    argv = _generate_argv(tiny_model, data, tmp_path / "gen.jsonl", "--runs", "16", "--max-new-tokens", "2000")
    parent = subprocess.Popen(
        [sys.executable, "-m", "ebpo_verl.evaluate", *argv, "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a shell job
    )
    workers: list[psutil.Process] = []
    try:
        proc = psutil.Process(parent.pid)
        _wait_for(lambda: len(_workers(proc)) == 2, 600, "two workers")  # imports: minutes when loaded
        workers = _workers(proc)
        time.sleep(1.0)  # past the few instructions between a worker's setpgid and arming its death signal
        target, sig = how
        if target == "parent":
            os.kill(parent.pid, sig)
        else:
            os.killpg(parent.pid, sig)
        parent.wait(timeout=30)
        _wait_for(lambda: all(_gone(w) for w in workers), 5, f"workers {[w.pid for w in workers]} to end")
    finally:
        parent.kill()
        parent.wait()
        for w in workers:  # what a failure left behind (each worker leads its own process group)
            try:
                os.killpg(w.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _full(path: Path) -> str:
    """The full-disk message for ``path``, as a regex (the free space is whatever the machine has)."""
    return rf"no space left on the device writing {re.escape(str(path))} \(\d+(\.\d)? (bytes|KiB|MiB|GiB|TiB) free in "


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _one_error_line(err: str, prog: str) -> str:
    lines = [x for x in err.splitlines() if "error" in x]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


def test_full_disk_in_the_study(tmp_path, monkeypatch, capsys):
    import matplotlib.pyplot as plt

    from ebpo_verl.ops.atomic import DiskFullError
    from ebpo_verl.study.__main__ import main as study_main
    from ebpo_verl.study.report import _save

    out = tmp_path / "s"
    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", _no_space)
        assert study_main(["--preset", "tiny", "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err, "python -m ebpo_verl.study")
    assert re.search(_full(out / "study_config.json"), line)
    assert list(out.iterdir()) == []  # no temporary file left behind
    fig = plt.figure()
    monkeypatch.setattr(fig, "savefig", _no_space)
    with pytest.raises(DiskFullError, match=_full(tmp_path / "curves.png")):
        _save(fig, tmp_path / "curves.png")
    assert list(tmp_path.glob("curves*")) == []


def test_full_disk_in_the_evaluation(aime_twice, tmp_path, monkeypatch, capsys):
    """generate: the append of a chunk fails (fsync reports ENOSPC); grade: RESULTS.json cannot be written."""
    from ebpo_verl.evaluate import engines

    data, _ = aime_twice
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # never loaded: the engine is replaced below
    gen = tmp_path / "gen.jsonl"

    full = [True]

    def fake_generate_all(spec, requests, workers, on_chunk):
        with monkeypatch.context() as m:
            if full[0]:  # the disk fills up during the generation (fsync reports the lost write)
                m.setattr(os, "fsync", _no_space)
            on_chunk([(r, engines.Completion("Answer: 1", 3, "stop")) for r in requests])

    monkeypatch.setattr(engines, "generate_all", fake_generate_all)
    argv = _generate_argv(model, data, gen, "--limit", "1", "--runs", "2")
    assert evaluate_main(argv) == 2
    line = _one_error_line(capsys.readouterr().err, "python -m ebpo_verl.evaluate generate")
    assert re.search(_full(gen), line)
    assert not Path(f"{gen}.lock").exists()
    full[0] = False
    assert evaluate_main(argv) == 0  # space again: the rerun completes
    assert sorted(read_generations(gen)[0]) == [("aime2024", 0, 0), ("aime2024", 0, 1)]
    out = tmp_path / "results.json"
    grade = ["grade", "--protocol", "verl", "--generations", str(gen), "--data-dir", str(data), "--out", str(out)]
    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", _no_space)
        assert evaluate_main(grade) == 2
    line = _one_error_line(capsys.readouterr().err, "python -m ebpo_verl.evaluate grade")
    assert re.search(_full(out), line) and not out.exists()


def test_full_disk_in_data_prep(hub_data, tmp_path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    monkeypatch.setattr(pq, "write_table", _no_space)
    with pytest.raises(SystemExit) as exit_:
        aime2024.main(["--out-dir", str(tmp_path), "--local-path", str(hub_data / "aime2024.jsonl")])
    assert exit_.value.code == 2
    line = _one_error_line(capsys.readouterr().err, "python -m ebpo_verl.data.aime2024")
    assert re.search(_full(tmp_path / "aime2024.parquet"), line)
    assert list(tmp_path.iterdir()) == []


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow.parquet as pq

    from ebpo_verl.data.schema import SCHEMA

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    return path


def _aime_rows(data: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(data / "aime2024.parquet").to_pylist()


def test_evaluate_refuses_empty_ground_truths(aime_twice, tmp_path):
    """Finding 5 at the evaluate load: either protocol's ground truth (reward_model.ground_truth for verl,
    extra_info.raw_answer for paper) empty, None or NaN -> one line naming the file and row."""
    rows = _aime_rows(aime_twice[0])
    bad = tmp_path / "verl"
    rows_verl = [dict(r) for r in rows]
    rows_verl[2] = {**rows_verl[2], "reward_model": {"ground_truth": "", "style": "rule"}}
    _write_parquet(bad / "aime2024.parquet", rows_verl)
    with pytest.raises(EvalInputError, match=r"aime2024.parquet: reward_model.ground_truth .* 0-based: 2 \(empty\)"):
        load_problems(bad, "aime2024", "verl")
    rows_paper = [dict(r) for r in rows]
    rows_paper[1] = {**rows_paper[1], "extra_info": {**rows_paper[1]["extra_info"], "raw_answer": " $ $ "}}
    _write_parquet(tmp_path / "paper" / "aime2024.parquet", rows_paper)
    with pytest.raises(EvalInputError, match=r"aime2024.parquet: row 1 \(0-based\) has an empty extra_info.raw_answer"):
        load_problems(tmp_path / "paper", "aime2024", "paper")
    assert len(load_problems(tmp_path / "paper", "aime2024", "verl")) == len(rows)  # verl reads the other field


def test_empty_benchmark_parquet_is_an_error(aime_twice, tmp_path, capsys):
    """Not "all 0 samples already in ..." and a RESULTS.json saying complete: true."""
    data = tmp_path / "data"
    _write_parquet(data / "aime2024.parquet", [])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    gen = tmp_path / "gen.jsonl"
    assert evaluate_main(_generate_argv(model, data, gen)) == 2
    line = _one_error_line(capsys.readouterr().err, "python -m ebpo_verl.evaluate generate")
    assert f"{data / 'aime2024.parquet'} has no rows" in line
    assert not gen.exists()


def _pass_rates(parquet: Path, rates: Path, tmp_path: Path, capsys) -> str:
    from ebpo_verl.evaluate import pass_rate as estimate_pass_rate

    with pytest.raises(SystemExit) as exit_:
        estimate_pass_rate.main(["--pass-rates", str(rates), "--in", str(parquet), "--out", str(tmp_path / "o.pq")])
    assert exit_.value.code == 2 and not (tmp_path / "o.pq").exists()
    return _one_error_line(capsys.readouterr().err, "python -m ebpo_verl.evaluate.pass_rate")


def test_pass_rates_errors_are_one_line(aime_twice, tmp_path, capsys):
    parquet = aime_twice[0] / "aime2024.parquet"
    n = len(_aime_rows(aime_twice[0]))

    def rates(name: str, rows: list[dict]) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    good = [{"index": i, "pass_rate": 0.5} for i in range(n)]
    unknown = rates("unknown.jsonl", [*good, {"index": 999, "pass_rate": 0.5}])
    assert "unknown.jsonl: 1 index(s) not in the parquet, e.g. ['999']" in _pass_rates(
        parquet, unknown, tmp_path, capsys
    )
    quoted = rates("quoted.jsonl", [*good[:2], {"index": 2, "pass_rate": "0.5"}, *good[3:]])
    assert "quoted.jsonl, line 3: pass_rate is the string '0.5', not a number; write it without quotes" in _pass_rates(
        parquet, quoted, tmp_path, capsys
    )
    zero = rates("zero.jsonl", [{"index": i, "n_correct": 0, "n": 0 if i == 1 else 16} for i in range(n)])
    assert "zero.jsonl, line 2: n (samples per problem) is 0; it must be a whole number >= 1" in _pass_rates(
        parquet, zero, tmp_path, capsys
    )
    csv = tmp_path / "rates.csv"
    csv.write_text("index,pass_rate\n0,0.5\n1,half\n")
    assert "rates.csv, line 3: pass_rate 'half' is not a number" in _pass_rates(parquet, csv, tmp_path, capsys)
    twice = rates("twice.jsonl", [*good, good[4]])
    assert f"twice.jsonl, line {n + 1}: index 4 repeats line 5" in _pass_rates(parquet, twice, tmp_path, capsys)


def test_non_utf8_input_names_the_line(hub_data, tmp_path, capsys):
    lines = (hub_data / "aime2024.jsonl").read_bytes().splitlines(keepends=True)
    lines[4] = lines[4].replace(b'"', b'"\xff', 1)  # one Latin-1 byte in line 5, after its first quote (column 2)
    bad = tmp_path / "aime.jsonl"
    bad.write_bytes(b"".join(lines))
    with pytest.raises(SystemExit):
        aime2024.main(["--out-dir", str(tmp_path / "out"), "--local-path", str(bad)])
    line = _one_error_line(capsys.readouterr().err, "python -m ebpo_verl.data.aime2024")
    assert f"{bad}, line 5: not UTF-8 (byte 0xff at byte column 3); re-save the file as UTF-8" in line
    records = [json.loads(x) for x in (hub_data / "aime2024.jsonl").read_text().splitlines()]
    doc = tmp_path / "aime.json"
    doc.write_bytes(json.dumps(records, indent=1).encode().replace(b"[\n {", b"[\n \xfe{", 1))
    with pytest.raises(SystemExit):
        aime2024.main(["--out-dir", str(tmp_path / "out"), "--local-path", str(doc)])
    assert f"{doc}, line 2: not UTF-8 (byte 0xfe at byte column 2)" in capsys.readouterr().err


@pytest.mark.slow
def test_pass_rate_generations_refuse_other_input_rows(aime_twice, tiny_model, tmp_path, capsys):
    """Finding 1 for estimate_pass_rate: its generations are keyed by row position and file name, so a resume
    with a file of that name whose rows differ is refused, naming the first differing row."""
    from ebpo_verl.evaluate import pass_rate as estimate_pass_rate

    rows = _aime_rows(aime_twice[0])[:3]
    first = _write_parquet(tmp_path / "a" / "train.parquet", rows)
    other = _write_parquet(tmp_path / "b" / "train.parquet", [rows[0], rows[2], rows[1]])
    gen = tmp_path / "gen.jsonl"

    def argv(path: Path) -> list[str]:
        return ["--model", str(tiny_model), "--in", str(path), "--out", str(tmp_path / "o.parquet"), "--n", "1",
                "--engine", "hf", "--max-new-tokens", "2", "--generations", str(gen)]  # fmt: skip

    estimate_pass_rate.main(argv(first))
    assert len(read_generations(gen)[0]) == 3
    with pytest.raises(SystemExit):
        estimate_pass_rate.main(argv(other))
    line = _one_error_line(capsys.readouterr().err, "python -m ebpo_verl.evaluate.pass_rate")
    assert f"{gen} was generated from other train.parquet problems than the data holds now: problem index 1" in line


ROOT = Path(__file__).resolve().parents[1]


def test_every_torch_load_of_the_project_is_weights_only():
    import ast

    calls = []  # the code we ship and run; tests plant and load unsafe pickles on purpose (test_resume_trust)
    shipped = [p for folder in ("ebpo_verl", "benchmarks", "scripts") for p in (ROOT / folder).glob("**/*.py")]
    for path in sorted(shipped):
        if any(part.startswith(".") or part in ("build", "__pycache__") for part in path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = getattr(node, "func", None)
            if isinstance(func, ast.Attribute) and func.attr == "load" and getattr(func.value, "id", "") == "torch":
                safe = any(
                    k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords
                )
                calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", safe))
    assert calls, "no torch.load call found: the scan is broken"
    assert [where for where, safe in calls if not safe] == []


def test_eval_help_and_docs_say_what_trust_checkpoint_does():
    run = subprocess.run(
        ["bash", str(ROOT / "recipe" / "ebpo" / "eval.sh"), "--help"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    help_text = " ".join(run.stdout.split())
    assert "torch.load(weights_only=True) and only FSDP's tensor and placement types allowed" in help_text
    assert "--trust-checkpoint merges with verl's merger as it is, torch.load(weights_only=False)" in help_text
    assert "it runs code from the file" in help_text
    doc = " ".join((ROOT / "docs" / "evaluation.md").read_text().split())
    assert "## Trust" in (ROOT / "docs" / "evaluation.md").read_text()
    assert "`torch.load(..., weights_only=False)`" in doc and "can run arbitrary code" in doc
    assert "`--trust-checkpoint`" in doc and "**runs code from the file**" in doc
    from ebpo_verl.evaluate.__main__ import parser

    generate = parser()._subparsers._group_actions[0].choices["generate"]
    flag = " ".join(next(a.help for a in generate._actions if "--trust-checkpoint" in a.option_strings).split())
    assert "runs code from the file" in flag
