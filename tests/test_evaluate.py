"""ebpo_verl.evaluate without a model: the paper's exact prompts, the generations file (resume, torn and corrupt
lines), grading and aggregation by hand, missing samples, model resolution and the real verl merge."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ebpo_verl.data.all import prepare_all
from ebpo_verl.evaluate import engines
from ebpo_verl.evaluate.__main__ import main
from ebpo_verl.evaluate.generations import GenerationsFile, read_generations
from ebpo_verl.evaluate.grading import grade_file
from ebpo_verl.evaluate.merge import MERGED, checkpoint_step, merge_checkpoint, resolve_model
from ebpo_verl.evaluate.prompts import EvalInputError, load_problems

INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
SETS = ["math500", "aime2024", "aime2025", "amc23", "olympiadbench"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, hub_data):
    out = tmp_path_factory.mktemp("data")
    prepare_all(out, hub_data, "dapo", False, tuple(SETS))
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_paper_prompt_is_raw_instruction_plus_problem(data_dir, hub_data):
    for bench, key, answer in [
        ("math500", "problem", "answer"),
        ("aime2024", "Problem", "Answer"),
        ("aime2025", "problem", "answer"),
        ("amc23", "problem", "answer"),
    ]:
        src = _jsonl(hub_data / f"{bench}.jsonl")
        problems = load_problems(data_dir, bench, "paper")
        assert len(problems) == len(src)
        for p, row in zip(problems, src, strict=True):
            assert p.prompt == INSTRUCTION + row[key]  # a string: no chat template, no suffix
            assert p.ground_truth == str(row[answer])
    amc = load_problems(data_dir, "amc23", "paper")[0].ground_truth
    assert amc == _jsonl(hub_data / "amc23.jsonl")[0]["answer"] and amc.endswith(".0")  # as stored; graded w/o .0


def test_paper_olympiad_prompt_is_question_only_and_first_final_answer(data_dir, hub_data):
    src = _jsonl(hub_data / "olympiadbench_math_en.jsonl")
    problems = load_problems(data_dir, "olympiadbench", "paper")
    verl = {p.index: p for p in load_problems(data_dir, "olympiadbench", "verl")}
    with_unit = with_context = multi = 0
    for p in problems:
        row = src[p.index]  # every row is valid: index = source row
        assert p.prompt == INSTRUCTION + row["question"]
        assert p.ground_truth == row["final_answer"][0]
        if row["unit"]:
            with_unit += 1
            unit = f"The unit of the answer is {row['unit'].strip()}."
            assert unit in verl[p.index].prompt[0]["content"] and unit not in p.prompt
        with_context += bool(row["context"])
        multi += len(row["final_answer"]) > 1 or "$,$" in row["final_answer"][0]
    assert with_unit > 0 and multi > 0 and len(problems) == len(src)


def test_verl_prompt_is_the_parquet_chat_prompt(data_dir):
    import pandas as pd

    df = pd.read_parquet(data_dir / "aime2025.parquet")
    problems = load_problems(data_dir, "aime2025", "verl", limit=3)
    assert [p.prompt for p in problems] == [[dict(m) for m in df.prompt[i]] for i in range(3)]
    assert [p.ground_truth for p in problems] == [df.reward_model[i]["ground_truth"] for i in range(3)]


def test_bad_inputs(data_dir, tmp_path, capsys):
    with pytest.raises(EvalInputError, match="unknown benchmark"):
        load_problems(data_dir, "gsm8k", "paper")
    with pytest.raises(EvalInputError, match="does not exist; prepare it"):
        load_problems(tmp_path, "math500", "paper")
    args = ["generate", "--model", str(tmp_path), "--data-dir", str(data_dir), "--out", str(tmp_path / "g.jsonl")]
    with pytest.raises(SystemExit) as exit_:  # refused by the option's declaration, before any work
        main(args + ["--benchmarks", "gsm8k"])
    assert exit_.value.code == 2
    assert "argument --benchmarks: 'gsm8k' is invalid; use math500, aime2024" in capsys.readouterr().err
    assert main(args) == 2  # an empty folder is no model
    assert "neither a Hugging Face model folder" in capsys.readouterr().err
    assert (
        main(
            [
                "grade",
                "--protocol",
                "paper",
                "--generations",
                str(tmp_path / "none.jsonl"),
                "--data-dir",
                str(data_dir),
                "--out",
                str(tmp_path / "r.json"),
            ]
        )
        == 2
    )
    assert "run the generate stage first" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def meta(protocol: str = "paper", **benches: tuple[int, int]) -> dict:
    return {
        "protocol": protocol,
        "model": "m",
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": 100,
        "benchmarks": {b: {"runs": r, "limit": n, "problems": n} for b, (n, r) in benches.items()},
    }


def rec(bench: str, index: int, sample: int, response: str, tokens: int = 10, finish: str = "stop") -> dict:
    return {
        "benchmark": bench,
        "index": index,
        "sample": sample,
        "response": response,
        "response_tokens": tokens,
        "finish_reason": finish,
    }


def test_generations_file_resumes_drops_torn_line_and_rejects_corruption(tmp_path):
    path = tmp_path / "g.jsonl"
    m = meta(aime2024=(2, 2))
    with GenerationsFile(path, m) as g:
        g.append([rec("aime2024", 0, 0, "a"), rec("aime2024", 0, 1, "b")])
    torn = '{"benchmark": "aime2024", "index": 1, "sam'
    with open(path, "a") as f:
        f.write(torn)  # a crash mid-write
    records, intact = read_generations(path)
    assert sorted(records) == [("aime2024", 0, 0), ("aime2024", 0, 1)]
    assert intact == len(path.read_bytes()) - len(torn)
    with GenerationsFile(path, m) as g:
        assert set(g.done) == {("aime2024", 0, 0), ("aime2024", 0, 1)}
        g.append([rec("aime2024", 1, 0, "c")])
    lines = path.read_text().splitlines()
    assert [json.loads(x)["response"] for x in lines] == ["a", "b", "c"]  # the torn line is gone
    with pytest.raises(EvalInputError, match="max_new_tokens differ"):
        GenerationsFile(path, {**m, "max_new_tokens": 5})
    path.write_text(lines[0] + "\n{not json\n" + lines[2] + "\n")
    with pytest.raises(EvalInputError, match="line 2 is not valid JSON"):
        read_generations(path)
    path.write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(EvalInputError, match="line 2 repeats sample"):
        read_generations(path)
    path.write_text(lines[0])  # a complete last line without its newline is kept, and ended on append
    with GenerationsFile(path, m) as g:
        assert set(g.done) == {("aime2024", 0, 0)}
        g.append([rec("aime2024", 1, 1, "d")])
    assert len(read_generations(path)[0]) == 2


def test_generations_file_adds_benchmarks_of_a_rerun(tmp_path):
    """aime2024 first, then aime2024 + math500 into the same file: resumes aime2024, adds math500 to the
    stored settings; other protocol/model/sampling, or other rows/runs of a shared benchmark, are refused."""
    from ebpo_verl.evaluate.generations import read_meta

    path = tmp_path / "g.jsonl"
    write_gen(path, meta(aime2024=(2, 2)), [rec("aime2024", 0, 0, "a")])
    with GenerationsFile(path, meta(aime2024=(2, 2), math500=(3, 1))) as g:
        assert set(g.done) == {("aime2024", 0, 0)}
        g.append([rec("math500", 0, 0, "m")])
    assert read_meta(path) == meta(aime2024=(2, 2), math500=(3, 1))
    with GenerationsFile(path, meta(math500=(3, 1))) as g:  # a subset: nothing changes
        assert len(g.done) == 2
    assert read_meta(path) == meta(aime2024=(2, 2), math500=(3, 1))
    with pytest.raises(EvalInputError, match=r"\(benchmarks.aime2024 differ\)"):
        GenerationsFile(path, meta(aime2024=(2, 4), amc23=(1, 1)))
    with pytest.raises(EvalInputError, match=r"\(model differ\)"):
        GenerationsFile(path, {**meta(amc23=(1, 1)), "model": "other"})
    assert read_meta(path) == meta(aime2024=(2, 2), math500=(3, 1))  # refused runs change nothing


def write_gen(path: Path, m: dict, records: list[dict]) -> None:
    with GenerationsFile(path, m) as g:
        g.append(records)


def test_grading_and_aggregation_by_hand(data_dir, tmp_path):
    truth = [p.ground_truth for p in load_problems(data_dir, "aime2024", "paper", limit=2)]
    amc = load_problems(data_dir, "amc23", "paper", limit=1)[0].ground_truth
    assert amc.endswith(".0")  # the hub stores AMC23's integers as floats
    path = tmp_path / "paper.jsonl"
    records = [
        rec("aime2024", 0, 0, f"work\nAnswer: {truth[0]}", 100),  # right
        rec("aime2024", 1, 0, "Answer: 1000", 200),  # wrong
        rec("aime2024", 0, 1, f"Answer: {truth[0]}\nAnswer: 3", 300),  # second-to-last graded: right
        rec("aime2024", 1, 1, f"\\boxed{{{truth[1]}}}", 400, "length"),  # boxed only: wrong under paper
        rec("amc23", 0, 0, f"Answer: {amc[:-2]}"),  # 27 == 27.0 after the .0 drop
    ]
    write_gen(path, meta(aime2024=(2, 2), amc23=(1, 1)), records)
    res = grade_file("paper", path, data_dir)
    a = res["benchmarks"]["aime2024"]
    # run 0: 1/2, run 1: 1/2 -> 50 %; tokens (100+200+300+400)/4; one of four truncated
    assert (a["pass@1"], a["runs"], a["problems"], a["mean_response_tokens"], a["truncated_fraction"]) == (
        50.0,
        2,
        2,
        250.0,
        0.25,
    )
    assert res["benchmarks"]["amc23"]["pass@1"] == 100.0
    assert res["average"] == 75.0 and res["protocol"] == "paper" and res["model"] == "m"
    # every sample is there, but of 2 and 1 of the fixture's problems (--limit): each benchmark is complete, the
    # result is not
    assert a["complete"] and a["problems"] < a["problems_in_data"] and res["complete"] is False
    assert res["step"] is None  # not a checkpoint

    vpath = tmp_path / "verl.jsonl"
    write_gen(vpath, meta("verl", aime2024=(2, 2)), [{**r, "benchmark": "aime2024"} for r in records[:4]])
    v = grade_file("verl", vpath, data_dir)["benchmarks"]["aime2024"]
    # math-verify: last Answer: line in run 1 is "3" (wrong), the boxed answer is right -> run 0: 1/2, run 1: 1/2
    assert v["pass@1"] == 50.0
    with pytest.raises(EvalInputError, match="protocol verl, not paper"):
        grade_file("paper", vpath, data_dir)


def test_stderr_over_runs_by_hand():
    from ebpo_verl.evaluate.grading import summarize

    # 2 problems x 3 runs; run accuracies 1.0, 0.5, 0.0 -> mean 50 %, stdev 0.5, stderr 0.5 / sqrt(3)
    verdicts = {(0, 0): True, (1, 0): True, (0, 1): True, (1, 1): False, (0, 2): False, (1, 2): False}
    records = {k: {"response_tokens": 10 * (k[0] + 1), "finish_reason": "stop"} for k in verdicts}
    entry = summarize(records, verdicts, problems=2, runs=3)
    assert entry["pass@1"] == pytest.approx(50.0)
    assert entry["pass@1_stderr"] == pytest.approx(100 * 0.5 / 3**0.5)
    assert (entry["mean_response_tokens"], entry["truncated_fraction"], entry["complete"]) == (15.0, 0.0, True)


def test_unequal_runs_mean_of_run_means(data_dir, tmp_path):
    truth = [p.ground_truth for p in load_problems(data_dir, "aime2025", "paper", limit=3)]
    right = [rec("aime2025", i, 0, f"Answer: {truth[i]}") for i in range(3)]  # run 0: 3/3
    run1 = [rec("aime2025", 0, 1, f"Answer: {truth[0]}")]  # run 1 partial: 1/1 present
    path = tmp_path / "g.jsonl"
    write_gen(path, meta(aime2025=(3, 2)), right + run1)
    with pytest.raises(EvalInputError, match=r"aime2025: 2 of 6 samples missing, \(index, sample\) e.g. \[\(1, 1\), "):
        grade_file("paper", path, data_dir)
    res = grade_file("paper", path, data_dir, allow_partial=True)
    b = res["benchmarks"]["aime2025"]
    assert (b["complete"], b["samples"], b["pass@1"], res["complete"]) == (False, 4, 100.0, False)
    out = tmp_path / "r.json"
    argv = ["grade", "--protocol", "paper", "--generations", str(path), "--data-dir", str(data_dir), "--out", str(out)]
    assert main(argv) == 2 and not out.exists()
    assert main([*argv, "--allow-partial"]) == 0 and json.loads(out.read_text())["complete"] is False


def test_samples_outside_the_data_are_an_error(data_dir, tmp_path):
    path = tmp_path / "g.jsonl"
    write_gen(path, meta(aime2024=(1, 1)), [rec("aime2024", 0, 0, "x"), rec("aime2024", 5, 0, "y")])
    with pytest.raises(EvalInputError, match=r"\(5, 0\)"):
        grade_file("paper", path, data_dir)


def test_engine_helpers_without_vllm():
    reqs = [engines.Request((b, i, s), "p") for b in ("a", "b") for i in range(3) for s in range(2)]
    shards = engines.shard(reqs, 4)
    assert sum(map(len, shards)) == 12 and len(shards) == 4
    for sh in shards:  # all samples of a problem in one shard
        assert all(len([r for r in sh if r.key[:2] == k]) == 2 for k in {r.key[:2] for r in sh})
    assert engines.device_groups(2, 2, "3,4,5,6") == ["3,4", "5,6"]
    assert engines.device_groups(8, 1, None) == [str(i) for i in range(8)]
    with pytest.raises(ValueError, match="need more GPUs"):
        engines.device_groups(3, 2, "0,1,2,3")
    spec = engines.EngineSpec("vllm", "m", 1.0, 1.0, 20480)
    assert engines.sampling_kwargs(spec) == {"n": 1, "temperature": 1.0, "top_p": 1.0, "max_tokens": 20480}
    out = [
        SimpleNamespace(outputs=[SimpleNamespace(text="hi", token_ids=[1, 2, 3], finish_reason=f)])
        for f in ("stop", "length", "abort")
    ]
    assert engines.collect_vllm(out) == [
        engines.Completion("hi", 3, "stop"),
        engines.Completion("hi", 3, "length"),
        engines.Completion("hi", 3, "abort"),  # an aborted request is not a finished one
    ]

    class Tok:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "<chat>" + messages[0]["content"]

    assert engines.render(Tok(), "raw text") == "raw text"
    assert engines.render(Tok(), [{"role": "user", "content": "q"}]) == "<chat>q"


def llama_like_tokenizer(tmp_path: Path):
    """The tiny BPE tokenizer made LLaMA-like: its encoder adds <|begin_of_text|> and its chat template starts
    with that BOS too (as LLaMA-3.1-Instruct's does)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from ebpo_verl.cpu.tiny import build_tokenizer

    base = build_tokenizer(tmp_path / "tok")
    backend = base.backend_tokenizer
    backend.add_special_tokens(["<|begin_of_text|>"])
    bos = backend.token_to_id("<|begin_of_text|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|im_end|>")
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok, bos


def test_vllm_inputs_chat_prompts_as_token_ids_with_one_bos(tmp_path):
    """verl protocol: chat messages go to vLLM as the template's token ids (one BOS); a rendered string would be
    tokenized again by vLLM with a second BOS. paper protocol: the raw string as is."""
    tok, bos = llama_like_tokenizer(tmp_path)
    messages = [{"role": "user", "content": "What is 1+1?"}]
    assert engines.vllm_input(tok, "raw text") == "raw text"
    got = engines.vllm_input(tok, messages)
    ids = got["prompt_token_ids"]
    assert list(got) == ["prompt_token_ids"] and ids[0] == bos and ids.count(bos) == 1
    rendered = engines.render(tok, messages)
    assert ids == tok(rendered, add_special_tokens=False)["input_ids"]  # the same text, BOS once
    assert tok(rendered)["input_ids"][:2] == [bos, bos]  # what sending the string did: a double BOS


def test_kill_group_stops_a_workers_grandchildren(tmp_path):
    """A worker leads its own process group; kill_group takes its children (vLLM's engine core) with it."""
    import os
    import subprocess
    import time

    pidfile = tmp_path / "grandchild.pid"
    worker = subprocess.Popen(
        ["bash", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], start_new_session=True
    )  # stands in for a worker after os.setpgid(0, 0)
    for _ in range(100):
        if pidfile.is_file() and pidfile.read_text().strip():
            break
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    engines.kill_group(worker.pid)
    worker.wait(timeout=10)
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z":  # a zombie awaiting its reaper
            break
        time.sleep(0.05)
    else:
        os.kill(grandchild, 9)
        pytest.fail("the worker's child survived kill_group")
    engines.kill_group(worker.pid)  # a group that is gone: no error


def test_engine_setup_and_the_vllm_error_on_cpu(monkeypatch):
    """Without vLLM, --engine vllm stops with one line pointing at the install and --engine hf; with vLLM's CPU
    build and no GPU, --workers engines run, each bound to its own cores, eager, with a fixed KV cache; on GPUs, one
    engine per group of tensor_parallel_size visible GPUs."""
    import importlib.util

    options = engines.EngineOptions
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ValueError, match="vLLM is not installed.*--engine hf"):
            engines.engine_setup(options(), "m", 1.0, 1.0)
    else:
        monkeypatch.setattr(engines, "visible_gpus", lambda: 0)
        monkeypatch.setattr(engines.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
        spec, workers = engines.engine_setup(options(workers=2, kv_cache_gib=1), "m", 1.0, 1.0)
        assert workers == 2 and spec.enforce_eager
        assert spec.worker_env == (
            {"VLLM_CPU_OMP_THREADS_BIND": "0,1,2", "VLLM_CPU_KVCACHE_SPACE": "1"},
            {"VLLM_CPU_OMP_THREADS_BIND": "3,4", "VLLM_CPU_KVCACHE_SPACE": "1"},
        )
        with pytest.raises(ValueError, match="--workers 6 needs a core per engine.*5 core"):
            engines.engine_setup(options(workers=6), "m", 1.0, 1.0)
        monkeypatch.setattr(engines, "visible_gpus", lambda: 5)  # GPUs: one engine per tensor-parallel group
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4,5,6,7")
        spec, workers = engines.engine_setup(options(tensor_parallel_size=2), "m", 1.0, 1.0)
        assert workers == 2 and not spec.enforce_eager
        assert spec.worker_env == ({"CUDA_VISIBLE_DEVICES": "3,4"}, {"CUDA_VISIBLE_DEVICES": "5,6"})
        with pytest.raises(ValueError, match=r"--engine vllm needs at least 8 GPU\(s\), found 5"):
            engines.engine_setup(options(tensor_parallel_size=8), "m", 1.0, 1.0)
    spec, workers = engines.engine_setup(options(engine="hf", workers=3), "m", 0.7, 0.9)
    assert (spec.engine, spec.temperature, spec.top_p, spec.max_new_tokens, workers) == ("hf", 0.7, 0.9, 20480, 3)


def test_engine_options_refuse_a_bad_value_in_one_line(capsys):
    """Each engine option is checked when parsed, by its declaration: a bad value is one line, exit 2."""
    from ebpo_verl.evaluate.pass_rate import main as pass_rate

    for argv, words in [
        (["--chunk-size", "0"], "argument --chunk-size: '0' is invalid; use a positive integer"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: '1.5' is invalid; use a float in (0, 1]"),
        (["--model", "m", "--pass-rates", "r"], "give exactly one of --model"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            pass_rate(["--in", "i.parquet", "--out", "o.parquet", *argv])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and words in err, err


def test_model_resolution(tmp_path):
    assert resolve_model("Qwen/Qwen3-8B") == ("Qwen/Qwen3-8B", None)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert resolve_model(str(hf)) == (str(hf.resolve()), None)
    root = tmp_path / "run"
    (root / "global_step_20").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("20\n")
    step = (root / "global_step_20").resolve()
    assert resolve_model(str(root)) == (str(step / MERGED), step)
    assert resolve_model(str(root / "global_step_20")) == (str(step / MERGED), step)
    for bad in [str(tmp_path / "nothing-here"), str(root / "global_step_7")]:
        with pytest.raises(EvalInputError):
            resolve_model(bad)
    with pytest.raises(EvalInputError, match="not a verl FSDP checkpoint"):
        merge_checkpoint(step)
    assert checkpoint_step(str(step / MERGED)) == 20 and checkpoint_step(str(step)) == 20
    assert checkpoint_step("Qwen/Qwen3-8B") is None and checkpoint_step(str(hf)) is None
