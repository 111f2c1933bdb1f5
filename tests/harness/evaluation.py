"""The evaluation at the end of the two-node run: merge the two-shard checkpoint, generate, grade, and check
the generations' count, the merged weights and the grade (with known-right responses planted)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

from ebpo_verl.cpu.tiny_runs import DATA
from tests.harness.runs import Run
from tests.harness.settings import NODES

BENCHMARKS, LIMIT, RUNS = ("amc23",), 2, 2
WRONG = "-99999"
"""A planted wrong answer (no AMC answer is negative)."""


def _command(name: str, cmd: list[str], work: Path, timeout: float) -> None:
    run = Run(work, None, name, [], command=cmd)
    if run.wait(timeout) != 0:
        raise SystemExit(f"[cpu_smoke] {' '.join(cmd[2:4])} failed:\n{run.tail(60)}")


def check_generations(gen: Path) -> list[dict]:
    """benchmarks x problems x runs lines, each (benchmark, index, sample) once."""
    records = [json.loads(line) for line in gen.read_text().splitlines()]
    keys = sorted((r["benchmark"], r["index"], r["sample"]) for r in records)
    indices = sorted({k[1] for k in keys})
    want = sorted((b, i, s) for b in BENCHMARKS for i in indices for s in range(RUNS))
    expected = len(BENCHMARKS) * LIMIT * RUNS
    assert len(records) == expected and keys == want and len(indices) == LIMIT, (
        f"{gen}: {len(records)} generations {keys}, expected {len(BENCHMARKS)} benchmarks x {LIMIT} problems x "
        f"{RUNS} runs = {expected}"
    )
    return records


def plant(gen: Path, out: Path, truths: dict[int, str]) -> None:
    """A copy of ``gen`` (and its meta) whose responses are known: ``\\boxed{<truth>}`` for every sample but the
    last, a wrong boxed answer for that one (a random tiny model scores 0, and 0 == 0 proves nothing)."""
    records = [json.loads(line) for line in gen.read_text().splitlines()]
    last = max((r["index"], r["sample"]) for r in records)
    for r in records:
        right = (r["index"], r["sample"]) != last
        assert truths[r["index"]] != WRONG, f"ground truth {WRONG} of problem {r['index']}"
        r["response"] = f"So the answer is \\boxed{{{truths[r['index']] if right else WRONG}}}."
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    shutil.copyfile(f"{gen}.meta.json", f"{out}.meta.json")


def pass_at_1(gen: Path, truths: dict[int, str]) -> float:
    """Pass@1 (%) recomputed from a generations file: a response is right when its last box is the ground truth."""
    runs: dict[int, list[bool]] = {}
    for line in gen.read_text().splitlines():
        r = json.loads(line)
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", r["response"])
        runs.setdefault(r["sample"], []).append(bool(boxed) and boxed[-1] == truths[r["index"]])
    return 100.0 * sum(sum(v) / len(v) for v in runs.values()) / len(runs)


def check_grade(results: Path, want: float) -> float:
    got = json.loads(results.read_text())["benchmarks"][BENCHMARKS[0]]["pass@1"]
    assert abs(got - want) < 1e-9, f"{results}: pass@1 {got} != {want} recomputed from the planted generations"
    return got


def check_merged(step: Path) -> int:
    """The merged weights are exactly the actor's full weights (``actor/huggingface``) in bfloat16; the tensor count."""
    import torch
    from safetensors.torch import load_file

    def load(folder: Path) -> dict:
        files = sorted(folder.glob("*.safetensors"))
        assert files, f"{folder}: no safetensors files"
        return {k: v for path in files for k, v in load_file(str(path)).items()}

    merged, trained = load(step / "huggingface_merged"), load(step / "actor" / "huggingface")
    assert sorted(merged) == sorted(trained), f"merged keys {sorted(set(merged) ^ set(trained))} differ"
    dtypes = {str(t.dtype) for t in merged.values()}
    assert dtypes == {"torch.bfloat16"}, f"merged dtypes {dtypes}"
    for name, tensor in trained.items():
        assert torch.equal(merged[name], tensor.to(merged[name].dtype)), f"{name} differs from the actor's"
    return len(trained)


def evaluate_checkpoint(work: Path, step: Path, timeout: float) -> None:
    """``evaluate generate --engine vllm`` on ``step``, then ``grade`` on its output and on a planted copy; checked."""
    from ebpo_verl.data.all import prepare_all
    from ebpo_verl.evaluate.prompts import load_problems

    data = work / "eval_data"
    prepare_all(data, DATA, "dapo", False, BENCHMARKS)
    gen, planted = work / "eval_gen.jsonl", work / "eval_gen_planted.jsonl"
    evaluate = [sys.executable, "-m", "ebpo_verl.evaluate"]
    start = time.monotonic()
    _command("eval_generate", [*evaluate, "generate", "--model", str(step), "--data-dir", str(data), "--protocol",
             "verl", "--out", str(gen), "--benchmarks", *BENCHMARKS, "--limit", str(LIMIT), "--runs", str(RUNS),
             "--engine", "vllm", "--gpus", "0", "--kv-cache-gib", "1", "--max-new-tokens", "8"],
             work, timeout)  # fmt: skip
    tensors = check_merged(step)
    check_generations(gen)
    truths = {p.index: str(p.ground_truth) for p in load_problems(data, BENCHMARKS[0], "verl", LIMIT)}
    plant(gen, planted, truths)
    for name, source in (("grade", gen), ("grade_planted", planted)):
        _command(f"eval_{name}", [*evaluate, "grade", "--protocol", "verl", "--generations", str(source),
                 "--data-dir", str(data), "--out", str(work / f"eval_{name}.json")], work, timeout)  # fmt: skip
    want = pass_at_1(planted, truths)
    got = check_grade(work / "eval_grade_planted.json", want)
    print(
        f"[cpu_smoke] OK (evaluation): {step.name} merged from {NODES} shards ({tensors} tensors equal to the "
        f"actor's own, in bfloat16), {len(BENCHMARKS)} x {LIMIT} x {RUNS} = {LIMIT * RUNS * len(BENCHMARKS)} "
        f"generations with vLLM; graded; with known answers planted, pass@1 {got:g} == {want:g} recomputed from "
        f"the file, in {time.monotonic() - start:.0f}s",
        flush=True,
    )
