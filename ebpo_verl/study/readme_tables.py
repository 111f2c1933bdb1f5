"""The README's CPU-study tables, rendered from a study's ``summary.json`` (committed as ``docs/study_<preset>.json``)
into the README's ``study-<preset>`` block by ``python -m ebpo_verl.docs_tables``. Bad input (a missing file, a
summary without the expected fields) is :class:`ReadmeTableError`, one line naming the fix."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

from ebpo_verl.ops.provenance import describe_hardware, short_commit
from ebpo_verl.study import report, rivals2


class ReadmeTableError(ValueError):
    """Bad input: the message names the problem and the fix."""


def _cell(summary: dict, estimator: str, g: int) -> dict:
    for c in summary["cells"]:
        if c["estimator"] == estimator and c["group_size"] == g and c["order"] == "random":
            return c
    raise ReadmeTableError(f"summary of preset {summary['preset']!r} has no cell ({estimator}, G={g}, random)")


def _ci(stat: list, sign: str = "") -> str:
    """[mean, half-width, n] -> "0.354 ± 0.006" (the half-width omitted when there is none; "n/a" without a mean)."""
    mean, half, _ = stat
    return "n/a" if mean is None else f"{mean:{sign}.3f}" + (f" ± {half:.3f}" if half is not None else "")


def _head(first: str, gs: list[int]) -> str:
    return f"| {first} | " + " | ".join(f"G={g}" for g in gs) + " |\n" + "|---" * (len(gs) + 1) + "|"


def _duration(seconds: float) -> str:
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes} min {sec} s" if minutes else f"{sec} s"


def provenance_line(summary: dict) -> str:
    """The line under the tables naming the code and machine ("" for a summary without provenance)."""
    record = summary.get("provenance")
    if not record:
        return ""
    return (
        f"\nProduced by ebpo-verl commit {short_commit(record)} on {describe_hardware(record)} "
        f"(verl {record.get('verl')}, torch {record.get('torch')}), started {record.get('started')}.\n"
    )


def _by_baseline(pairs: list[dict], gs: list[int], spread: bool) -> dict[str, list[str]]:
    """Per X, its EBPO - X records per G: "+0.012 ± 0.010 (4/5)" (mean, with ``spread`` ± the 95% half-width,
    seeds EBPO won / seeds); "n/a" where none."""
    at = {(p["baseline"], p["group_size"]): p for p in pairs}

    def cell(p: dict | None) -> str:
        if p is None or p["diff"][0] is None:
            return "n/a"
        return (_ci(p["diff"], "+") if spread else f"{p['diff'][0]:+.3f}") + f" ({p['wins']}/{p['diff'][2]})"

    return {x: [cell(at.get((x, g))) for g in gs] for x in dict.fromkeys(p["baseline"] for p in pairs)}


def _coverage(summary: dict, gs: list[int], k: str = "64") -> str:
    """One line: EBPO - X in final held-out pass@k per G, "+0.012 (4/4)" (mean, seeds EBPO won / seeds)."""
    parts = [f"{x} " + " / ".join(c) for x, c in _by_baseline(summary["paired_pass_at_k"][k], gs, False).items()]
    warm = summary["warm_start_heldout_pass_at_k"][k]
    line = (
        f"Coverage, EBPO - X in held-out pass@{k} (warm start {warm:.3f}), G = {' / '.join(map(str, gs))}: "
        + "; ".join(parts)
        + "."
    )
    return textwrap.fill(line, width=115, break_on_hyphens=False, break_long_words=False)


def render(summary: dict) -> str:
    """The README block for one study summary: final held-out accuracy (with learning rates), paired EBPO - X, a
    coverage line and a training-signal line by G (study.md)."""
    try:
        ests, gs = summary["estimators"], summary["group_sizes"]
        lr = {c["estimator"]: c["lr"] for c in summary["cells"]}
        accuracy = [
            f"| {e} ({lr[e]:g}) | " + " | ".join(_ci(_cell(summary, e, g)["final_accuracy"]) for g in gs) + " |"
            for e in ests
        ]

        zero = "; ".join(f"{e} " + " / ".join(f"{100 * _cell(summary, e, g)['zero_signal'][0]:.0f}%" for g in gs)
                         for e in ests)  # fmt: skip
        clipped = max(100 * _cell(summary, e, g)["clipped"][0] for e in ests for g in gs)
        signal = textwrap.fill(
            f"Training signal, mean over steps and seeds, G = {' / '.join(map(str, gs))}: groups with zero advantage "
            f"{zero}; updates clipped at norm {summary['grad_clip']:g}: at most {clipped:.1f}% in any cell "
            "(gradient norms: study.md).",
            width=115,
            break_on_hyphens=False,
        )
        paired = [f"| {x} | " + " | ".join(c) + " |" for x, c in _by_baseline(summary["paired"], gs, True).items()]
        resumed = summary["resumed_runs"]
        timing = (
            f"{_duration(summary['wall_seconds'])} wall time"
            + (f" (the last invocation; {resumed} runs reused from an earlier one)" if resumed else "")
            + f", {_duration(summary['cpu_seconds'])} of CPU time"
        )
        return f"""Preset `{summary["preset"]}`: {summary["n_runs"]} runs of {summary["steps"]} steps, {timing}
(torch {summary["torch"]}, one thread per run). Final held-out exact pass@1, mean ± 95% t-interval over
{summary["seeds"]} seeds (warm start {summary["warm_start_heldout_accuracy"]:.3f}; each estimator at the learning
rate chosen on the validation split):

{_head("estimator (lr)", gs)}
{chr(10).join(accuracy)}

Paired difference EBPO - X of the final held-out accuracy (same seeds), mean ± 95% t-interval, and the seeds
in which EBPO ends higher:

{_head("EBPO - X", gs)}
{chr(10).join(paired)}

{_coverage(summary, gs)}

{signal}
{provenance_line(summary)}"""
    except (KeyError, TypeError, IndexError) as err:
        raise ReadmeTableError(
            f"summary of preset {summary.get('preset', '?')!r} lacks field {err}: regenerate it with "
            "`python -m ebpo_verl.study` and copy its summary.json"
        ) from err


def load_summary(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as err:
        raise ReadmeTableError(f"no study summary at {path}: run `python -m ebpo_verl.study` first") from err
    except (OSError, ValueError) as err:
        raise ReadmeTableError(f"cannot read study summary {path}: {err}") from err
    if not isinstance(data, dict):
        raise ReadmeTableError(f"{path} is not a study summary (a JSON object from summary.json)")
    return data


def which_estimator_table(data: dict) -> str:
    """docs/rivals.md's "which estimator, when": per regime and G of a rivals2 ``summary.json``, the estimators no
    other is ahead of (Holm over the cell's pairs) and ebpo against grpo, running_norm and ebpo_batch (paired mean,
    plain 95% half-width, Holm verdict), with the conditions each cell holds under."""
    short = dict(zip(report.SIDES, ("ahead", "behind", "n.s."), strict=True))
    rows = []
    for name, reg in data["regimes"].items():
        for g, recs in reg["pairs"].items():
            said = []
            for other in ("grpo", "running_norm", "ebpo_batch"):
                r = rivals2._pair(recs, "ebpo", other)
                mean = (1 if r["a"] == "ebpo" else -1) * r["mean"]
                said.append(f"{report.pm(mean, r['half'], 4, '+')} ({short[report.side(mean, r['holm_half'])]})")
            prompts = data["responses_per_step"] // int(g)
            share = reg["frac_train_below_0.05"]
            rows.append([f"{name} ({share:.2f})", f"{g} ({prompts})", ", ".join(reg["winners"][g]), *said])
    pairs_n = len(list(itertools.combinations(data["top_group"], 2)))
    head = ["regime (share of RL prompts below 0.05)", "G (prompts a step)",
            f"no one ahead of them (Holm over the cell's {pairs_n} pairs)", "ebpo - grpo", "ebpo - running_norm",
            "ebpo - ebpo_batch"]  # fmt: skip
    seeds = len(data["test_seeds"]["top"])
    return (
        f"From [study_rivals2](study_rivals2/study.md): the 103k-parameter toy on arithmetic, {data['steps']} RL steps "
        f"of {data['responses_per_step']} responses, {seeds} seeds per cell, each estimator at the rate it chose. "
        "Cells: paired mean ± plain 95% half-width, and the verdict under Holm over the cell's pairs (ahead, behind, "
        "n.s.: not separated).\n\n" + report.md_table(head, rows) + "\n"
    )
