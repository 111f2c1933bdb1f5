"""Per-problem pass rate of a base model, the paper's difficulty signal for the easy-to-hard curriculum
(arXiv 2602.05165, Sec. 5.4: 16 rollouts per problem at temperature 1.0). Writes ``extra_info.pass_rate``.

Generate and grade (GPU machine with vLLM: one engine per GPU of the node, ``ebpo_verl.evaluate.engines``)::

    python -m data_prep.estimate_pass_rate --model PATH --in F.parquet --out F2.parquet --n 16 --temperature 1.0

Samples are appended to ``--generations`` (default ``F2.parquet.generations.jsonl``) as they finish, so a
re-run after a crash generates only what is missing. ``--engine hf`` generates with Hugging Face on CPU (tests).

Merge rates computed elsewhere (no GPU needed)::

    python -m data_prep.estimate_pass_rate --pass-rates rates.jsonl --in F.parquet --out F2.parquet

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
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow as pa
from tqdm import tqdm

from data_prep.schema import read_prepared, with_extra_info, write_parquet_atomic
from ebpo_verl.evaluate import engines
from ebpo_verl.evaluate.generations import GenerationsFile, problem_digest, sample_records
from ebpo_verl.evaluate.prompts import EvalInputError
from ebpo_verl.reward import compute_score


def bucket(pass_rate: float, k: int) -> int:
    """Equal-width pass-rate bucket, 1 (easiest) .. k (hardest): bucket b holds 1 - b/k < p <= 1 - (b-1)/k,
    i.e. b = floor((1 - p) k) + 1, with p = 0 put in bucket k."""
    if not 0.0 <= pass_rate <= 1.0:
        raise ValueError(f"pass rate {pass_rate} outside [0, 1]")
    return min(k, math.floor(round((1.0 - pass_rate) * k, 9)) + 1)


def grade(
    responses: list[list[str]], ground_truths: list[str], data_sources: list[str], workers: int = 8
) -> list[float]:
    """Pass rate per problem: the mean ``compute_score`` of its responses."""

    def one(i: int) -> float:
        scores = [compute_score(data_sources[i], r, ground_truths[i])["score"] for r in responses[i]]
        return sum(scores) / len(scores) if scores else float("nan")

    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(one, range(len(responses))))


def generate(a: argparse.Namespace, table: pa.Table, gen_path: str | Path) -> list[list[str]]:
    """``a.n`` sampled completions per row (chat prompt through the chat template), resumed from ``gen_path``."""
    prompts = [[dict(m) for m in p] for p in table.column("prompt").to_pylist()]
    truths = [rm["ground_truth"] for rm in table.column("reward_model").to_pylist()]
    digests = {str(i): problem_digest(p, t) for i, (p, t) in enumerate(zip(prompts, truths, strict=True))}
    meta = {
        "protocol": "pass_rate",
        "model": a.model,
        "temperature": a.temperature,
        "top_p": a.top_p,
        "max_new_tokens": a.max_new_tokens,
        "benchmarks": {
            Path(a.in_path).name: {"runs": a.n, "limit": None, "problems": len(prompts), "digests": digests}
        },
    }
    name = Path(a.in_path).name
    spec, workers = engines.engine_setup(a, a.model, a.temperature, a.top_p)
    with GenerationsFile(gen_path, meta) as gen:
        todo = [
            engines.Request((name, i, s), prompts[i])
            for i in range(len(prompts))
            for s in range(a.n)
            if (name, i, s) not in gen.done
        ]
        if todo:
            bar = tqdm(total=len(prompts) * a.n, initial=len(prompts) * a.n - len(todo), desc=name, unit="sample")

            def on_chunk(pairs: list[tuple[engines.Request, engines.Completion]]) -> None:
                gen.append(sample_records(pairs))
                bar.update(len(pairs))

            try:
                engines.generate_all(spec, todo, workers, on_chunk)
            finally:
                bar.close()
        done = gen.done
    return [[done[(name, i, s)]["response"] for s in range(a.n)] for i in range(len(prompts))]


def read_rates(path: str | Path) -> pd.DataFrame:
    """The rates file as a frame with columns (key column, pass_rate); validates values and duplicates."""
    path = Path(path)
    if path.suffix == ".jsonl":
        df = pd.read_json(path, lines=True, dtype=False)
    elif path.suffix == ".csv":
        df = pd.read_csv(path, dtype={"source_id": str})
    else:
        raise ValueError(f"{path}: rates file must be .jsonl or .csv")
    key = "source_id" if "source_id" in df.columns else "index" if "index" in df.columns else None
    if key is None:
        raise ValueError(f"{path}: needs a 'source_id' or 'index' column (found {list(df.columns)})")
    if "pass_rate" not in df.columns:
        if not {"n_correct", "n"} <= set(df.columns):
            raise ValueError(f"{path}: needs 'pass_rate' (or 'n_correct' and 'n') columns")
        df["pass_rate"] = df["n_correct"] / df["n"]
    df[key] = df[key].astype(str)
    bad = df[~df["pass_rate"].between(0.0, 1.0)]
    if len(bad):
        raise ValueError(f"{path}: pass_rate outside [0, 1] for {key} {bad[key].tolist()[:10]}")
    dup = df[key][df[key].duplicated()].tolist()
    if dup:
        raise ValueError(f"{path}: duplicate {key} {dup[:10]}")
    return df[[key, "pass_rate"]]


def merge_rates(table: pa.Table, rates: pd.DataFrame, source: str) -> list[float]:
    """The rate of each row of ``table``; errors name ids missing on either side."""
    key = rates.columns[0]
    ids = [str(e[key]) for e in table.column("extra_info").to_pylist()]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{key} is not unique in the parquet; use the other key column in {source}")
    by_id = dict(zip(rates[key], rates["pass_rate"], strict=True))
    unknown = sorted(set(by_id) - set(ids))
    if unknown:
        raise ValueError(f"{source}: {len(unknown)} {key}(s) not in the parquet, e.g. {unknown[:10]}")
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ValueError(f"{source}: no pass_rate for {len(missing)} row(s), {key} e.g. {missing[:10]}")
    return [float(by_id[i]) for i in ids]


def write_with_rates(table: pa.Table, rates: list[float], out_path: str | Path, buckets: int | None) -> Path:
    """Write ``extra_info.pass_rate`` (and optionally the bucketed difficulty); prints a histogram."""
    updates = [{"pass_rate": r} | ({"difficulty": bucket(r, buckets)} if buckets else {}) for r in rates]
    out = write_parquet_atomic(with_extra_info(table, updates, {"pass_rate": pa.float64()}), out_path)
    k = buckets or 4
    hist = Counter(bucket(r, k) for r in rates)
    mean = sum(rates) / len(rates)
    print(
        f"estimate_pass_rate: {len(rates)} rows, mean pass rate {mean:.4f}, "
        f"all-fail {sum(r == 0 for r in rates)}, all-pass {sum(r == 1 for r in rates)} -> {out}"
    )
    print("  buckets (1 = easiest): " + ", ".join(f"{b}={hist.get(b, 0)}" for b in range(1, k + 1)))
    return out


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(
        prog="python -m data_prep.estimate_pass_rate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--in", dest="in_path", required=True)
    p.add_argument("--out", dest="out_path", required=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model path for vLLM generation")
    src.add_argument("--pass-rates", help="merge rates from this .jsonl/.csv instead of generating")
    p.add_argument("--n", type=int, default=16, help="rollouts per problem (paper: 16)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--generations", help="samples file (.jsonl, resumable); default: OUT.generations.jsonl")
    engines.add_engine_args(p, max_new_tokens=8192)
    p.add_argument("--save-rates", help="also write the computed rates (source_id, pass_rate) as .jsonl")
    p.add_argument("--difficulty-buckets", type=int, default=None, help="set extra_info.difficulty to 1..K")
    a = p.parse_args(argv)
    table = read_prepared(a.in_path)
    if a.pass_rates:
        rates = merge_rates(table, read_rates(a.pass_rates), a.pass_rates)
    else:
        if a.n < 1:
            p.error("--n must be at least 1")
        try:
            responses = generate(a, table, a.generations or f"{a.out_path}.generations.jsonl")
        except (EvalInputError, ValueError) as e:
            print(f"{p.prog}: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        gts = [rm["ground_truth"] for rm in table.column("reward_model").to_pylist()]
        rates = grade(responses, gts, table.column("data_source").to_pylist())
        if a.save_rates:
            ids = [e["source_id"] for e in table.column("extra_info").to_pylist()]
            Path(a.save_rates).write_text(
                "".join(json.dumps({"source_id": i, "pass_rate": r}) + "\n" for i, r in zip(ids, rates, strict=True))
            )
    return write_with_rates(table, rates, a.out_path, a.difficulty_buckets)


if __name__ == "__main__":
    main()
