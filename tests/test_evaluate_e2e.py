"""The whole evaluation path on CPU with a tiny local model: generate (--engine hf, two worker processes)
-> interrupted and resumed -> grade -> make_tables, and recipe/ebpo/eval.sh around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_prep.all import prepare_all
from ebpo_verl.evaluate.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
SETS = ["math500", "aime2024", "aime2025", "amc23", "olympiadbench"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, shared_data):
    from ebpo_verl.tiny import build_model, build_tokenizer

    work = tmp_path_factory.mktemp("e2e")
    prepare_all(work / "data", shared_data, "dapo", False, tuple(SETS))
    build_model(work / "tiny", build_tokenizer(work / "tiny"))
    return work


def test_generate_resume_grade_tables(setup, tmp_path):
    data, model = setup / "data", setup / "tiny"
    gen = tmp_path / "gen.jsonl"
    argv = ["generate", "--model", str(model), "--data-dir", str(data), "--protocol", "verl", "--out", str(gen),
            "--benchmarks", "aime2024", "amc23", "--limit", "2", "--runs", "2", "--engine", "hf",
            "--max-new-tokens", "6", "--workers", "2", "--chunk-size", "2"]  # fmt: skip
    assert main(argv) == 0
    lines = gen.read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert sorted((r["benchmark"], r["index"], r["sample"]) for r in recs) == [
        (b, i, s) for b in ("aime2024", "amc23") for i in range(2) for s in range(2)
    ]
    assert all(1 <= r["response_tokens"] <= 6 and r["finish_reason"] in ("stop", "length") for r in recs)
    assert all(r["finish_reason"] == "stop" or r["response_tokens"] == 6 for r in recs)

    gen.write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])  # a crash: 5 whole lines and a torn one
    assert main(argv[:-4]) == 0  # resume in this process (one worker)
    again = gen.read_text().splitlines()
    assert again[:5] == lines[:5] and len(again) == 8  # the first five kept, three generated anew
    assert main(argv) == 0 and gen.read_text().splitlines() == again  # complete: nothing to do

    results = tmp_path / "results.json"
    grade = ["grade", "--protocol", "verl", "--generations", str(gen), "--data-dir", str(data), "--out", str(results)]
    assert main(grade) == 0
    res = json.loads(results.read_text())
    assert res["protocol"] == "verl" and res["model"] == str(model.resolve())
    for b in ("aime2024", "amc23"):
        entry = res["benchmarks"][b]
        tokens = [json.loads(x)["response_tokens"] for x in again if json.loads(x)["benchmark"] == b]
        assert (entry["runs"], entry["problems"], entry["complete"]) == (2, 2, True)
        assert entry["mean_response_tokens"] == pytest.approx(sum(tokens) / 4)
        assert entry["pass@1"] == 0.0  # a random 100k-parameter model solves nothing
    assert main(["grade", *grade[1:3], "--generations", str(gen), "--data-dir", str(data), "--protocol", "paper",
                 "--out", str(tmp_path / "x.json")]) == 2  # fmt: skip

    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tables.py"), "--out", str(tmp_path / "t"), f"tiny/hf={results}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "protocol: verl" in out.stdout and "| tiny | hf | " in out.stdout


def test_eval_sh_both_protocols_and_idempotent(setup, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "WORK_DIR": str(tmp_path), "DATA_DIR": str(setup / "data"),
           "EVAL_PROTOCOL": "both"}  # fmt: skip
    cmd = ["bash", str(ROOT / "recipe" / "ebpo" / "eval.sh"), str(setup / "tiny"), "--engine", "hf",
           "--benchmarks", "amc23", "--limit", "1", "--runs", "1", "--max-new-tokens", "4"]  # fmt: skip
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    eval_dir = tmp_path / "eval" / "tiny"
    for protocol in ("paper", "verl"):
        res = json.loads((eval_dir / f"results-{protocol}.json").read_text())
        assert res["protocol"] == protocol and res["benchmarks"]["amc23"]["problems"] == 1
        assert len((eval_dir / protocol / "generations.jsonl").read_text().splitlines()) == 1
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 0 and "already in" in again.stderr
    bad = subprocess.run(cmd, env={**env, "EVAL_PROTOCOL": "mine"}, capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "unknown EVAL_PROTOCOL=mine" in bad.stderr


def test_pass_rate_estimation_with_hf_engine_resumes(setup, tmp_path):
    import pyarrow.parquet as pq

    from data_prep import estimate_pass_rate as epr

    small = tmp_path / "small.parquet"
    pq.write_table(pq.read_table(setup / "data" / "amc23.parquet").slice(0, 3), small)
    out = tmp_path / "rated.parquet"
    argv = ["--model", str(setup / "tiny"), "--in", str(small), "--out", str(out), "--n", "2",
            "--engine", "hf", "--max-new-tokens", "4"]  # fmt: skip
    epr.main(argv)
    gen = Path(f"{out}.generations.jsonl")
    lines = gen.read_text().splitlines()
    assert len(lines) == 6
    gen.write_text("\n".join(lines[:3]) + "\n" + lines[3][:10])  # crash after three samples
    out.unlink()
    epr.main(argv)
    again = gen.read_text().splitlines()
    assert again[:3] == lines[:3] and len(again) == 6
    rates = [e["pass_rate"] for e in pq.read_table(out).column("extra_info").to_pylist()]
    assert rates == [0.0, 0.0, 0.0]  # the random tiny model never answers right
