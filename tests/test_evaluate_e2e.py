"""The whole evaluation path on CPU with a tiny local model: generate (--engine hf, two worker processes)
-> interrupted and resumed -> grade -> make_tables, recipe/ebpo/eval.sh around it (on a checkpoint root too),
verl's real model merger on an FSDP checkpoint, and pass-rate estimation with resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ebpo_verl.data.all import prepare_all
from ebpo_verl.evaluate.__main__ import main
from ebpo_verl.evaluate.merge import MERGED, merge_checkpoint
from ebpo_verl.evaluate.prompts import EvalInputError

ROOT = Path(__file__).resolve().parents[1]
SETS = ["math500", "aime2024", "aime2025", "amc23", "olympiadbench"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, hub_data):
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

    work = tmp_path_factory.mktemp("e2e")
    prepare_all(work / "data", hub_data, "dapo", False, tuple(SETS))
    build_model(work / "tiny", build_tokenizer(work / "tiny"))
    return work


@pytest.mark.slow
def test_generate_resume_grade_tables(setup, tmp_path, capsys):
    data, model = setup / "data", setup / "tiny"
    gen = tmp_path / "gen.jsonl"
    argv = ["generate", "--model", str(model), "--data-dir", str(data), "--protocol", "verl", "--out", str(gen),
            "--benchmarks", "aime2024", "amc23", "--limit", "2", "--runs", "2", "--engine", "hf",
            "--max-new-tokens", "6", "--workers", "2", "--chunk-size", "2"]  # fmt: skip
    assert main(argv) == 0
    assert "; runs per problem: aime2024 2, amc23 2; model " in capsys.readouterr().err  # the banner says --runs
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
    assert res["complete"] is False  # every sample there, but --limit 2 covers 2 problems of each benchmark
    for b in ("aime2024", "amc23"):
        entry = res["benchmarks"][b]
        tokens = [json.loads(x)["response_tokens"] for x in again if json.loads(x)["benchmark"] == b]
        assert (entry["runs"], entry["problems"], entry["complete"]) == (2, 2, True)
        assert entry["mean_response_tokens"] == pytest.approx(sum(tokens) / 4)
        assert entry["pass@1"] == 0.0  # a random 100k-parameter model solves nothing
    assert main(["grade", *grade[1:3], "--generations", str(gen), "--data-dir", str(data), "--protocol", "paper",
                 "--out", str(tmp_path / "x.json")]) == 2  # fmt: skip

    out = subprocess.run(
        [sys.executable, "-m", "ebpo_verl.recipes.make_tables", "--out", str(tmp_path / "t"), f"tiny/hf={results}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "protocol: verl" in out.stdout and "| tiny | hf | " in out.stdout


@pytest.mark.slow
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
    assert bad.returncode == 2 and "EVAL_PROTOCOL='mine' is invalid" in bad.stderr


def test_pass_rate_estimation_with_hf_engine_resumes(setup, tmp_path):
    import pyarrow.parquet as pq

    from ebpo_verl.evaluate import pass_rate as epr

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


def fsdp_checkpoint(tiny: Path, step_dir: Path) -> dict:
    """verl's FSDP checkpoint layout at world size 1 (model_world_size_1_rank_0.pt, fsdp_config.json,
    huggingface/), written by hand from the tiny model; returns its state dict."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny)
    actor = step_dir / "actor"
    (actor / "huggingface").mkdir(parents=True)
    torch.save(model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    model.config.save_pretrained(actor / "huggingface")
    AutoTokenizer.from_pretrained(tiny).save_pretrained(actor / "huggingface")
    return model.state_dict()


@pytest.mark.slow
def test_real_verl_merge_once_atomically(setup, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    tiny = setup / "tiny"
    step = tmp_path / "run" / "global_step_3"
    weights = fsdp_checkpoint(tiny, step)
    out = merge_checkpoint(step)
    assert out == step / MERGED and not [p for p in step.iterdir() if p.name.startswith(".")]
    merged = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for k, w in weights.items():  # verl's merger saves bfloat16
        assert torch.equal(merged[k], w.to(torch.bfloat16)), k
    stamp = os.stat(out / "config.json").st_mtime_ns
    (step / "actor" / "model_world_size_1_rank_0.pt").unlink()  # a second call must not merge again
    assert merge_checkpoint(step) == out and os.stat(out / "config.json").st_mtime_ns == stamp

    broken = tmp_path / "run" / "global_step_4"
    fsdp_checkpoint(tiny, broken)
    (broken / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(EvalInputError, match="model merger failed"):
        merge_checkpoint(broken)
    assert sorted(p.name for p in broken.iterdir()) == ["actor"]  # nothing half-merged left behind


@pytest.mark.slow
def test_eval_sh_on_a_checkpoint_root_merges_once(setup, tmp_path):
    root = tmp_path / "ckpt" / "qwen3_8b-ebpo-g4-topic"
    fsdp_checkpoint(setup / "tiny", root / "global_step_3")
    (root / "latest_checkpointed_iteration.txt").write_text("3")
    env = {**os.environ, "PYTHON": sys.executable, "WORK_DIR": str(tmp_path), "DATA_DIR": str(setup / "data")}
    cmd = ["bash", str(ROOT / "recipe" / "ebpo" / "eval.sh"), str(root), "--engine", "hf", "--benchmarks", "amc23",
           "--limit", "1", "--runs", "1", "--max-new-tokens", "4"]  # fmt: skip
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (root / "global_step_3" / MERGED / "config.json").is_file()
    res = json.loads((tmp_path / "eval" / "qwen3_8b-ebpo-g4-topic-step3" / "results-paper.json").read_text())
    assert res["model"] == str((root / "global_step_3" / MERGED).resolve()) and res["protocol"] == "paper"


@pytest.mark.slow
def test_injected_answers_grade_and_tabulate_by_hand(setup, tmp_path):
    """generate (tiny model) -> responses replaced by known-right / known-wrong answers -> grade -> make_tables:
    hand-computed pass@1 per benchmark under both protocols, the evaluated step in the Step column, and the
    paper's numbers only beside the paper-protocol row."""
    from ebpo_verl.evaluate.prompts import load_problems

    data, model = setup / "data", setup / "tiny"
    # right answers per benchmark over 2 runs of its first problem -> pass@1 100, 50, 0, 100, 50 (avg 60)
    right = {"math500": 2, "aime2024": 1, "aime2025": 0, "amc23": 2, "olympiadbench": 1}
    specs = []
    for protocol, method, fmt in (("paper", "EBPO", "work\nAnswer: {}"), ("verl", "GRPO", "so \\boxed{{{}}}")):
        gen = tmp_path / protocol / "generations.jsonl"
        argv = ["generate", "--model", str(model), "--data-dir", str(data), "--protocol", protocol, "--out", str(gen),
                "--limit", "1", "--runs", "2", "--engine", "hf", "--max-new-tokens", "4"]  # fmt: skip
        assert main(argv) == 0
        truth = {b: load_problems(data, b, protocol, 1)[0].ground_truth for b in SETS}
        records = [json.loads(x) for x in gen.read_text().splitlines()]
        assert len(records) == 10
        for r in records:
            good = r["sample"] < right[r["benchmark"]]
            r["response"] = fmt.format(truth[r["benchmark"]] if good else "-987654")
        gen.write_text("".join(json.dumps(r) + "\n" for r in records))
        meta_file = Path(f"{gen}.meta.json")  # as if a checkpoint at global step 7 had been evaluated
        m = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**m, "model": f"/ckpt/run/global_step_7/{MERGED}"}))
        out = tmp_path / f"results-{protocol}.json"
        grade = ["grade", "--protocol", protocol, "--generations", str(gen), "--data-dir", str(data), "--out", str(out)]
        assert main(grade) == 0
        res = json.loads(out.read_text())
        assert {b: res["benchmarks"][b]["pass@1"] for b in SETS} == {b: 50.0 * n for b, n in right.items()}
        assert (res["average"], res["step"]) == (60.0, 7)
        in_data = {b: len(load_problems(data, b, protocol)) for b in SETS}  # --limit 1: one of these evaluated
        assert {b: res["benchmarks"][b]["problems_in_data"] for b in SETS} == in_data
        specs.append(f"Qwen3-8B/{method}={out}")
    run = subprocess.run(
        [sys.executable, "-m", "ebpo_verl.recipes.make_tables", "--table", "main", "--out", str(tmp_path / "t"),
         *specs], capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    md = run.stdout
    cells = [f"{50.0 * right[b]:.2f} (1/{in_data[b]} problems)" for b in SETS]  # marked as --limit results
    row = "| " + " | ".join(cells) + " | 60.00 (partial) |"
    assert f"| Qwen3-8B | EBPO {row} 64.39 | -4.39 | 7 | paper | ours, partial |" in md  # paper EBPO avg 64.39
    assert f"| Qwen3-8B | GRPO {row}  |  | 7 | verl | ours, partial |" in md  # verl protocol: no paper numbers
    assert "|  | EBPO (paper) | 76.80 | 56.04 | 47.92 | 86.25 | 54.93 |" in md
