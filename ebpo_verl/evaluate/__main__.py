"""``python -m ebpo_verl.evaluate generate|grade``: the evaluation stage (both in order, per protocol:
``python -m ebpo_verl.recipes eval TARGET``).

generate --model M --data-dir DIR --protocol paper|verl --out GEN.jsonl [--benchmarks ...] [--limit N]
         [--runs N] [--engine vllm|hf] [engine options] [--trust-checkpoint]
    Appends one line per sample to GEN.jsonl; re-running resumes (finished samples are skipped). A global_step_N
    model is merged with its shards read weights-only; --trust-checkpoint unpickles them (runs code from the file).
grade --protocol paper|verl --generations GEN.jsonl --data-dir DIR --out RESULTS.json [--allow-partial]
    Writes {"protocol", "model", "step", "benchmarks": {name: {"pass@1", "runs", "problems", "limit",
    "problems_in_data", "complete", ...}}, "average", "complete"} ("step": the checkpoint's global step, null for a
    hub id or plain Hugging Face folder; "limit"/"problems_in_data": a --limit run evaluated "problems" of them; a
    benchmark's "complete": every sample of its problems is there; the top-level "complete": every benchmark is
    complete and covers all of its problems, so a --limit run is never complete). Each complete benchmark also has
    "n" and "pass@k", "maj@k" (k -> %, k = 1, 2, 4, ..., n), "avg@n", each with a "..._stderr" over problems, and
    the top level "average_pass@k" / "average_maj@k" for the k every benchmark has (docs/evaluation.md#coverage).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import ClassVar

from ebpo_verl.evaluate import engines
from ebpo_verl.evaluate.generations import benchmark_meta, generate_into, settings
from ebpo_verl.evaluate.grading import grade_file
from ebpo_verl.evaluate.merge import merge_checkpoint, resolve_model
from ebpo_verl.evaluate.prompts import (
    BENCHMARKS,
    PROTOCOLS,
    TEMPERATURE,
    TOP_P,
    EvalInputError,
    load_problems,
    runs_for,
)
from ebpo_verl.ops.atomic import DiskFullError, atomic_write_text, unwritable_reason
from ebpo_verl.ops.provenance import provenance
from ebpo_verl.options.cli import OneLineParser, add_options, parse_options
from ebpo_verl.options.parsing import PATH, OptionSection, ints, nullable, option, text

PROG = "python -m ebpo_verl.evaluate"
DESCRIPTIONS = {
    "paper": "raw prompt (DAPO instruction + problem, no chat template), Answer: grader with the second-to-last "
    "match (docs/paper_notes.md#evaluation), 16 runs (OlympiadBench 4) unless --runs",
    "verl": "chat template + ebpo_verl.reward (math-verify), 16 runs unless --runs",
}


@dataclass(frozen=True)
class GenerateOptions(OptionSection):
    """``generate``'s own options (the engine options: :class:`ebpo_verl.evaluate.engines.EngineOptions`)."""

    SECTION: ClassVar[str] = "generate"

    model: str = option(MISSING, "global_step_N folder, checkpoint root, HF folder or hub id", rule=text("a model"))
    data_dir: str = option(MISSING, "folder with <benchmark>.parquet (ebpo_verl.data)", rule=PATH)
    protocol: str = option("paper", "the evaluation protocol (see above)", choices=PROTOCOLS)
    out: str = option(MISSING, "generations .jsonl (appended to; resumes)", rule=PATH)
    benchmarks: tuple[str, ...] = option(BENCHMARKS, "benchmarks to sample", choices=BENCHMARKS, metavar="NAME")
    limit: int | None = nullable("first N problems of each benchmark (tests); null: all", ints(1))
    runs: int | None = nullable("runs per benchmark; null: the protocol's", ints(1))
    trust_checkpoint: bool = option(
        False,
        "merge a global_step_N checkpoint with verl's merger as it is, which unpickles its shards: runs code from the "
        "file (off: shards read weights-only, anything but FSDP's tensor types refused; docs/evaluation.md#trust)",
        choices=(True, False),
    )


@dataclass(frozen=True)
class GradeOptions(OptionSection):
    """``grade``'s options."""

    SECTION: ClassVar[str] = "grade"

    protocol: str = option(MISSING, "the protocol the generations were sampled under", choices=PROTOCOLS)
    generations: str = option(MISSING, "generations .jsonl (from generate)", rule=PATH)
    data_dir: str = option(MISSING, "folder with <benchmark>.parquet (ebpo_verl.data)", rule=PATH)
    out: str = option(MISSING, "RESULTS.json", rule=PATH)
    allow_partial: bool = option(False, "report incomplete benchmarks (complete: false)", choices=(True, False))


STAGES = {"generate": GenerateOptions, "grade": GradeOptions}
"""Each stage's declared options."""


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="stage", required=True)
    g = sub.add_parser(
        "generate",
        help="sample responses (GPU: vLLM, one engine per GPU; CPU: --engine hf)",
        description="Append one JSON line per sample to --out; a re-run resumes. "
        + " | ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items()),
    )
    add_options(g, GenerateOptions)
    add_options(g, engines.EngineOptions)
    add_options(sub.add_parser("grade", help="grade a generations file (CPU)"), GradeOptions)
    return p


def generate(options: GenerateOptions, engine: engines.EngineOptions) -> None:
    model, step_dir = resolve_model(options.model)
    protocol, limit = options.protocol, options.limit
    problems = {b: load_problems(options.data_dir, b, protocol, limit) for b in dict.fromkeys(options.benchmarks)}
    runs = {b: options.runs or runs_for(protocol, b) for b in problems}
    benchmarks = {b: benchmark_meta(ps, runs[b], limit) for b, ps in problems.items()}
    meta = settings(protocol, model, TEMPERATURE, TOP_P, engine, benchmarks)
    meta["provenance"] = [provenance(seed=engine.seed)]  # one record per invocation (merge_meta appends)
    try:
        spec, workers = engines.engine_setup(engine, model, TEMPERATURE, TOP_P)
    except ValueError as e:
        raise EvalInputError(str(e)) from None
    how = DESCRIPTIONS[protocol].split(", 16 runs")[0]
    counts = ", ".join(f"{b} {n}" for b, n in runs.items())
    print(f"evaluate: protocol {protocol} ({how}); runs per problem: {counts}; model {model}", file=sys.stderr)
    wanted = [
        engines.Request((b, p.index, s), p.prompt) for b, ps in problems.items() for p in ps for s in range(runs[b])
    ]
    merge = (lambda: merge_checkpoint(step_dir, trust=options.trust_checkpoint)) if step_dir else (lambda: None)
    _, new = generate_into(options.out, meta, wanted, spec, workers, merge)
    if not new:
        print(f"evaluate: all {len(wanted)} samples already in {options.out}", file=sys.stderr)
    else:
        print(f"evaluate: {new} new samples -> {options.out} (protocol {protocol})", file=sys.stderr)


def grade(options: GradeOptions) -> None:
    results = grade_file(options.protocol, options.generations, options.data_dir, options.allow_partial)
    atomic_write_text(options.out, json.dumps(results, indent=1) + "\n")
    step = "" if results["step"] is None else f"  (global step {results['step']})"
    print(f"protocol {results['protocol']}  model {results['model']}{step}")
    for name, b in results["benchmarks"].items():
        flag = "" if b["complete"] else f"  INCOMPLETE ({b['samples']} of {b['problems'] * b['runs']} samples)"
        if b["problems"] < b["problems_in_data"]:
            flag += f"  PARTIAL (--limit {b['limit']}: {b['problems']} of {b['problems_in_data']} problems)"
        score = "-" if b["pass@1"] is None else f"{b['pass@1']:.2f}"
        se = "" if b["pass@1_stderr"] is None else f" +- {b['pass@1_stderr']:.2f}"
        print(f"  {name:14s} pass@1 {score:>6s}{se:9s} ({b['problems']} problems x {b['runs']} runs){flag}")
        _print_at_k(b.get("pass@k"), b.get("maj@k"))
    if results["average"] is not None:
        print(f"  {'average':14s} pass@1 {results['average']:6.2f}")
        _print_at_k(results["average_pass@k"], results["average_maj@k"])
    print(f"-> {Path(options.out)}")


def _print_at_k(pass_at_k: dict[str, float] | None, maj_at_k: dict[str, float] | None) -> None:
    for metric, values in (("pass@k", pass_at_k), ("maj@k", maj_at_k)):
        if values:
            print(f"  {'':14s} {metric} " + "  ".join(f"{k}: {v:.2f}" for k, v in values.items()))


def main(argv: list[str] | None = None) -> int:
    top = parser()
    parsed = top.parse_args(argv)
    stage = parsed.stage
    options = parse_options(STAGES[stage], parsed, top)  # each declared option set, read once from the line
    engine = parse_options(engines.EngineOptions, parsed, top) if stage == "generate" else None
    try:
        if problem := unwritable_reason(Path(options.out)):  # before any model load or grading
            raise EvalInputError(f"--out {options.out}: {problem}")
        generate(options, engine) if engine is not None else grade(options)
    except (EvalInputError, DiskFullError) as e:  # a full disk: samples written so far stay, a re-run resumes
        print(f"{PROG} {stage}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
