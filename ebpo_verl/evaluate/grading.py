"""Grading a generations file into RESULTS.json, for either protocol (docs/evaluation.md).

``paper`` grades with :func:`ebpo_verl.paper_reward.grade_eval`, ``verl`` with :func:`ebpo_verl.reward.compute_score`.
Pass@1 of a benchmark is the mean over its runs of the run's accuracy; missing samples are an error, or with
``allow_partial`` reported over the samples present with ``"complete": false``. A benchmark whose problem digests
differ from the ground truths in ``--data-dir`` is refused. pass@k, maj@k and avg@n: :mod:`.coverage`.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ebpo_verl.evaluate.answers import answer_classes
from ebpo_verl.evaluate.coverage import benchmark_coverage, common_average, mean_and_stderr
from ebpo_verl.evaluate.generations import problem_digest, problems_differ, read_generations, read_meta
from ebpo_verl.evaluate.merge import checkpoint_step
from ebpo_verl.evaluate.prompts import BENCHMARKS, EvalInputError, check_names, load_problems
from ebpo_verl.ops.provenance import provenance


def grade_records(protocol: str, items: list[tuple[str, str, str]], workers: int = 8) -> list[bool]:
    """Verdicts of ``protocol``'s grader for (benchmark, response, ground truth) triples; ``verl``: in threads, which
    overlap math-verify's child processes."""
    if protocol == "paper":
        from ebpo_verl.paper_reward import grade_eval

        return [grade_eval(response, truth) for _, response, truth in items]
    from ebpo_verl.reward import compute_score

    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(lambda it: compute_score(*it)["score"] > 0, items))


def summarize(
    records: dict[tuple[int, int], dict[str, Any]], verdicts: dict[tuple[int, int], bool], problems: int, runs: int
) -> dict[str, Any]:
    """One benchmark's entry: pass@1 (%) = mean over runs of the run's accuracy, its stderr over runs, stats."""
    per_run = [sum(got) / len(got) for s in range(runs) if (got := [v for k, v in verdicts.items() if k[1] == s])]
    n = len(records)
    return {
        "pass@1": 100.0 * sum(per_run) / len(per_run) if per_run else None,
        # standard error of that mean over the runs (the problems fixed): sampling noise of a re-evaluation
        "pass@1_stderr": mean_and_stderr(per_run)[1],
        "runs": runs,
        "problems": problems,
        "samples": n,
        "mean_response_tokens": sum(r["response_tokens"] for r in records.values()) / n if n else None,
        "truncated_fraction": sum(r["finish_reason"] == "length" for r in records.values()) / n if n else None,
        "complete": n == problems * runs,
    }


COVERAGE_KEYS = ("pass@k", "pass@k_stderr", "maj@k", "maj@k_stderr", "avg@n", "avg@n_stderr")


def coverage(
    protocol: str, records: dict[tuple[int, int], dict[str, Any]], verdicts: dict[tuple[int, int], bool], runs: int
) -> dict[str, Any]:
    """pass@k, maj@k and avg@n entries of a benchmark whose ``runs`` samples of every problem are all there."""
    indices = sorted({i for i, _ in records})
    responses = [[records[(i, s)]["response"] for s in range(runs)] for i in indices]
    classes = answer_classes(protocol, responses)
    problems = [[(c, verdicts[(i, s)]) for s, c in enumerate(cls)] for i, cls in zip(indices, classes, strict=True)]
    return benchmark_coverage(problems)


def grade_file(
    protocol: str, generations: str | Path, data_dir: str | Path, allow_partial: bool = False
) -> dict[str, Any]:
    """RESULTS.json content for ``generations`` (settings read from its ``.meta.json``)."""
    check_names(protocol, [])
    meta = read_meta(generations)
    if meta is None or not Path(generations).is_file():
        raise EvalInputError(f"{generations} (or its .meta.json) does not exist; run the generate stage first")
    if meta["protocol"] != protocol:
        raise EvalInputError(f"{generations} was generated with protocol {meta['protocol']}, not {protocol}")
    records, _ = read_generations(generations)
    results: dict[str, Any] = {}
    problems_missing = []
    for bench in sorted(meta["benchmarks"], key=lambda n: (BENCHMARKS + (n,)).index(n)):
        spec = meta["benchmarks"][bench]
        problems = load_problems(data_dir, bench, protocol, spec["limit"])
        if "digests" not in spec:
            print(
                f"evaluate grade: warning: {generations} records no problem digests for {bench} (an older version "
                f"wrote it): cannot check that {data_dir} holds the problems it was generated from",
                file=sys.stderr,
            )
        else:
            digests = {str(p.index): problem_digest(p.prompt, p.ground_truth) for p in problems}
            why = problems_differ(generations, bench, spec, digests, str(Path(data_dir) / f"{bench}.parquet"))
            if why:
                raise EvalInputError(why)
        truth = {p.index: p.ground_truth for p in problems}
        runs = spec["runs"]
        mine = {(k[1], k[2]): r for k, r in records.items() if k[0] == bench}
        unknown = [k for k in mine if k[0] not in truth or not 0 <= k[1] < runs]
        if unknown:
            raise EvalInputError(
                f"{generations}: {len(unknown)} {bench} sample(s) (index, sample) such as {sorted(unknown)[:5]} "
                f"are not rows x runs of {data_dir}/{bench}.parquet; grade with the --data-dir used to generate"
            )
        missing = sorted((i, s) for i in truth for s in range(runs) if (i, s) not in mine)
        if missing:
            problems_missing.append(
                f"{bench}: {len(missing)} of {len(truth) * runs} samples missing, (index, sample) e.g. {missing[:5]}"
            )
        keys = sorted(mine)
        verdicts = grade_records(protocol, [(bench, mine[k]["response"], truth[k[0]]) for k in keys])
        by_key = dict(zip(keys, verdicts, strict=True))
        results[bench] = summarize(mine, by_key, len(truth), runs)
        if results[bench]["complete"]:
            results[bench] |= coverage(protocol, mine, by_key, runs)
        else:  # samples missing: no per-problem n, no estimate
            results[bench] |= {"n": runs, **dict.fromkeys(COVERAGE_KEYS)}
        # --limit: how many of the benchmark's problems were evaluated (make_tables marks a partial benchmark)
        in_data = len(truth) if spec["limit"] is None else len(load_problems(data_dir, bench, protocol))
        results[bench] |= {"limit": spec["limit"], "problems_in_data": in_data}
    if problems_missing and not allow_partial:
        raise EvalInputError(
            "incomplete generations: "
            + "; ".join(problems_missing)
            + ". Re-run generate (it resumes) or pass --allow-partial"
        )
    scores = [b["pass@1"] for b in results.values() if b["pass@1"] is not None]
    seeds = list(dict.fromkeys(r.get("seed") for r in meta.get("provenance", [])))
    return {
        "protocol": protocol,
        "model": meta["model"],
        "step": checkpoint_step(meta["model"]),
        "benchmarks": results,
        "average": sum(scores) / len(scores) if scores else None,
        # over the benchmarks, for the k that every one of them has (OlympiadBench: n = 4 under the paper protocol)
        "average_pass@k": common_average(list(results.values()), "pass@k"),
        "average_maj@k": common_average(list(results.values()), "maj@k"),
        # a --limit run covers only some problems: never complete, whatever its samples
        "complete": all(b["complete"] and b["problems"] == b["problems_in_data"] for b in results.values()),
        "generation": {k: meta[k] for k in ("max_new_tokens", "temperature", "top_p", "provenance") if k in meta},
        # this grading run's provenance, with the generate runs' seed: one value when they agree, else the list
        "provenance": provenance(seed=seeds[0] if len(seeds) == 1 else (seeds or None)),  # None: unrecorded
    }
