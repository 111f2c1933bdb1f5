"""The study's report: ``study.md`` (written in named steps: figures, introduction, accuracy, coverage, the
other results, dynamics and limits), ``summary.json`` and the figures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ebpo_verl.ops.atomic import atomic_write_text
from ebpo_verl.study import ranking, report
from ebpo_verl.study.rl import ESTIMATORS


@dataclass
class _Study:
    """What every step of the report reads: preset, warm-start facts, runs and cells, source line, estimators, G."""

    preset: object
    base_info: dict
    runs: list[dict]
    by_cell: dict
    source: str
    ests: list[str]
    gs: list[int]
    ws: float
    og: int
    clip: float


def write_report(
    out: Path,
    preset,
    base_info: dict,
    runs: list[dict],
    seconds: float,
    command: str,
    resumed: int = 0,
    lr_grid: dict | None = None,
    tuning_runs: int = 0,
    record: dict | None = None,
    origin: str = "",
) -> str:
    """Write ``study.md``, ``summary.json`` and the figures into ``out``; returns the headline table. ``record``: the
    provenance (default: this process's); ``origin``: where the runs and wall time come from."""
    seconds = round(seconds, 1)
    record = record or report.study_provenance(preset, seconds, command)
    ws = base_info["heldout_accuracy"]
    study = _Study(preset, base_info, runs, report.cells(runs, ws + preset.target_gain),
                   report.source_line(preset.name, record), list(preset.estimators), list(preset.group_sizes), ws,
                   preset.order_group_size, runs[0]["config"]["grad_clip"])  # fmt: skip
    equal, views = ranking.section(runs, study.ests, study.gs, preset.rl["responses_per_step"])
    captions = _draw_figures(out, study, views)
    headline = report.table(study.by_cell, study.ests, study.gs, "final_accuracy", "G", seeds=preset.seeds)
    text = (
        _introduction(study, command, seconds, resumed, origin)
        + _accuracy_sections(study, headline)
        + equal
        + coverage_section(runs, study.by_cell, study.ests, study.gs, base_info, preset.seeds)
        + _other_results(study, lr_grid)
        + _dynamics_and_limits(study, captions)
    )
    ests, gs, by_cell = study.ests, study.gs, study.by_cell
    lrs = {(r["config"]["estimator"], r["config"]["group_size"], r["config"]["order"]): r["config"]["lr"] for r in runs}
    data = {  # the machine-readable summary (NaN as null); readme_tables reads it
        "preset": preset.name,
        "command": command,
        "n_runs": len(runs),
        "tuning_runs": tuning_runs,
        "resumed_runs": resumed,
        "wall_seconds": seconds,
        "cpu_seconds": round(base_info["sft_cpu_seconds"] + sum(r["cpu_seconds"] for r in runs), 1),
        "torch": torch.__version__,
        "torch_threads_per_run": 1,
        "seeds": preset.seeds,
        "steps": preset.rl["steps"],
        "responses_per_step": preset.rl["responses_per_step"],
        "grad_clip": preset.rl["grad_clip"],
        "estimators": ests,
        "group_sizes": gs,
        "warm_start_heldout_accuracy": round(ws, 6),
        "target_gain": preset.target_gain,
        "provenance": record,
        "lr_grid": lr_grid or {},
        "paired": report.paired(runs, ests, gs),
        "warm_start_heldout_pass_at_k": report.warm_start_pass_at_k(base_info),
        "paired_pass_at_k": {str(k): report.paired(runs, ests, gs, k=k) for k in report.COVERAGE_K},
        "cells": [{"estimator": e, "group_size": g, "order": o, "lr": lrs[e, g, o],
                   **{k: report.ci_record([s[k] for s in sums]) for k in sums[0]}}
                  for (e, g, o), sums in sorted(by_cell.items())],
        "gain_over_grpo_pass_at_k": {str(k): report.paired(runs, ests, gs, "grpo", k, True) for k in report.COVERAGE_K},
        "equal_samples": views,
    }  # fmt: skip
    atomic_write_text(out / "study.md", report._with_source_lines(text, study.source))
    atomic_write_text(out / "summary.json", json.dumps(data, indent=1) + "\n")
    return headline


def _draw_figures(out: Path, study: _Study, views: dict) -> dict[str, str]:
    """Every figure of the report; returns {file name: caption}."""
    runs, ests, gs, ws, og, clip = study.runs, study.ests, study.gs, study.ws, study.og, study.clip
    warm = (ws, f"warm start {ws:.3f}")
    lines = {"accuracy": warm, "grad_norm": (clip, f"clip = {clip:g}")}
    for metric, (fname, _, _) in report.CURVES.items():
        report.curve_figure(runs, metric, gs, ests, out / fname, "group_size", {"order": "random"}, lines.get(metric),
                     study.source)  # fmt: skip
    report.curve_figure(runs, "accuracy", list(study.preset.orders), list(study.preset.order_estimators),
                 out / "ordering_curves.png", "order", {"group_size": og}, warm, study.source)  # fmt: skip
    captions = {fname: caption.format(clip=clip) for fname, _, caption in report.CURVES.values()}
    captions["ordering_curves.png"] = f"held-out exact pass@1 at G={og} by stream order; dotted: the warm start"
    captions[report.PASS_AT_K_FIGURE] = report.pass_at_k_figure(out, runs, ests, gs, study.base_info, study.source)
    if views:
        ranking.ranking_figure(list(views.values()), runs, gs, out / ranking.FIGURE, study.source)
        ks = " and ".join(f"pass@{k}" for k in ranking.RANK_K)
        captions[ranking.FIGURE] = f"each estimator's cross-fitted best G ranked, by held-out {ks}, with 95% intervals"
    return captions


def _introduction(study: _Study, command: str, seconds: float, resumed: int, origin: str = "") -> str:
    """Title, command and cost, scope, and the Setup section."""
    preset, base_info, runs, ests, gs, og = study.preset, study.base_info, study.runs, study.ests, study.gs, study.og
    rl, orders, o_ests, clip = preset.rl, list(preset.orders), list(preset.order_estimators), study.clip
    lr = {r["config"]["estimator"]: r["config"]["lr"] for r in runs}  # one rate per estimator
    lr_text = ", ".join(f"{e} {lr[e]:g}" if e in lr else f"{e} (no run yet)" for e in ests)
    hist = base_info["pass_rate_histogram"]
    left_out = [e for e in ESTIMATORS if e not in ests]
    scope = f"Estimators: {', '.join(ests)}; G in {gs}; " + (
        f"orders {orders} (ordering table at G={og} for {', '.join(o_ests)})." if o_ests else "random stream order."
    )
    if left_out:
        scope += f" Not in this preset (`--estimators` runs any of them): {', '.join(left_out)}."
    cpu = base_info["sft_cpu_seconds"] + sum(r["cpu_seconds"] for r in runs)
    resumed_note = f" ({resumed} of them reused from an earlier invocation of the same command)" if resumed else ""
    want = len(preset.cells()) * preset.seeds
    partial = f" **Partial: {len(runs)} of the grid's {want} runs are saved.**" if len(runs) < want else ""
    return f"""# EBPO small-scale RLVR study (preset `{preset.name}`)

Command: `{command}` — {len(runs)} RL runs{resumed_note}, {seconds:.0f} s wall time on this machine
({cpu:.0f} CPU-seconds for the warm start and the runs). {scope}{partial}
{origin}
## Setup
- Policy: a {base_info["params"]:,}-parameter causal transformer ({preset.policy.n_layer} layers,
  d={preset.policy.d_model}) that writes its answer token by token (least-significant digit first, then EOS).
- Tasks: topics {", ".join(preset.topics)} x levels {", ".join(map(str, preset.levels))} (operand digits); reward 1
  iff the answer is exactly right. Four disjoint iid draws from the same generator, the same number per
  (topic, level) cell: {base_info["n_train"]} RL training prompts, {base_info["n_heldout"]} held-out test prompts
  (every accuracy below), {base_info["n_val"]} validation prompts (the learning-rate choice only) and the
  warm-start data.
- Warm start: {preset.sft_steps} supervised steps on a separate split in which a fraction {preset.misconception} of the
  answers follow a carry-free misconception, so the base model holds a right and a wrong strategy.
  Held-out exact pass@1 of the warm start: {study.ws:.3f}; pass rates on the RL prompts
  (histogram over ten bins 0..1): {hist}; {100 * base_info["frac_train_below_0.05"]:.0f}% of them below 0.05.
- RL: {rl["steps"]} steps of {rl["responses_per_step"]} sampled responses (temperature 1), so a step holds
  {rl["responses_per_step"]}/G prompts (equal samples per step at every G); PPO-clip 0.2 with token-mean aggregation
  (`compute_policy_loss_vanilla`), k3 KL loss to the warm start (coefficient 0.001), two mini-batches per step,
  AdamW at each estimator's own learning rate ({lr_text}), gradient clip {clip:g} (a safety net: see the share of
  clipped updates below). Advantages from verl's registry (`get_adv_estimator_fn`).
- Accuracy = exact pass@1 at temperature 1 (the product of the answer tokens' probabilities), averaged over
  the held-out prompts: no sampling noise in the evaluation. Every cell: seeds 0..{preset.seeds - 1} (the same seeds
  for every estimator; a cell with fewer saved runs shows (n/{preset.seeds})); mean ± half-width of the 95%
  t-interval over seeds.
- Reproducibility: every run uses one torch thread and seeded generators, so rerunning the command on the same
  machine and torch build gives the same numbers. Another machine moves them by more than the printed digits:
  {CROSS_MACHINE}

"""


CROSS_MACHINE = """the quick preset on two 2-core AMD EPYC machines with the same torch 2.13.0+cpu and the same
  code gave warm starts of 0.36154 and 0.36201, GRPO held-out gains at G=8 of +0.107 and +0.093, and EBPO - GRPO
  at G=2 of +0.025 ± 0.012 and +0.018 ± 0.009 (4 of 4 seeds on both): read a difference below about 0.015 as
  within what another machine gives (docs/study.md, Precision)."""
"""The measured cross-machine variation, as the report states it."""


def _accuracy_sections(study: _Study, headline: str) -> str:
    """Final held-out accuracy and its paired differences EBPO - X."""
    pairs = report.paired(study.runs, study.ests, study.gs)
    return f"""## Final held-out accuracy (rows = estimator, columns = G; random order)
Warm start: {study.ws:.3f}. Each cell: mean ± 95% t-interval over {study.preset.seeds} seeds
((n/{study.preset.seeds}) where fewer ran).

{headline}

## Paired differences: EBPO - X in final held-out accuracy
Per G, the difference between EBPO's run and X's run of the same seed (same warm start, data stream and sampling
seed), mean ± 95% t-interval over the seeds, and in brackets the seeds in which EBPO ends higher.

{report.paired_table(pairs, study.gs)}

{report.paired_verdict(pairs)}

{_against_grpo(study)}"""


def _against_grpo(study: _Study) -> str:
    """Each estimator's paired gain over GRPO, X - GRPO, in final held-out pass@1 and pass@64 (none without GRPO)."""
    if "grpo" not in study.ests:
        return ""
    parts = [
        """## Paired differences against GRPO: X - GRPO
Per G, X's run minus GRPO's run of the same seed, mean ± 95% t-interval over the seeds both ran, in brackets the
seeds in which X ends higher / the seeds paired (pass@64 as in the coverage section below)."""
    ]
    for k in (1, 64):
        gains = report.paired(study.runs, study.ests, study.gs, "grpo", k, gains=True)
        parts.append(f"### pass@{k}\n\n{report.paired_table(gains, study.gs, 'X - GRPO', row='estimator')}\n\n"
                     f"{report.gains_verdict(gains)}")  # fmt: skip
    return "\n\n".join(parts) + "\n\n"


def _other_results(study: _Study, lr_grid: dict | None) -> str:
    """Learning rates, steps to target, zero-signal groups, probe, gains, SPO's tracker, stream order."""
    preset, by_cell, ests, gs, og = study.preset, study.by_cell, study.ests, study.gs, study.og
    rl, orders, o_ests = preset.rl, list(preset.orders), list(preset.order_estimators)
    probe = study.base_info["probe_accuracy"]
    order_section = (
        f"## Stream order (G = {og}): final held-out accuracy\n\n"
        f"{report.table(by_cell, o_ests, orders, 'final_accuracy', 'order', key=lambda r, c: (r, og, c))}\n"
        if o_ests
        else ""
    )
    return f"""## Learning rates
{lr_section(lr_grid or {})}

## Steps to reach held-out accuracy {study.ws + preset.target_gain:.3f} (warm start + {preset.target_gain})
Mean over the seeds that reached it (count in brackets when not all did);
sampled responses = steps x {rl["responses_per_step"]}.

{report.table(by_cell, ests, gs, "steps_to_target", "G", 1, censored=True)}

## Fraction of groups with zero advantage signal (mean over training)

{report.table(by_cell, ests, gs, "zero_signal", "G")}

## Final accuracy on a fixed sample of the RL training prompts
Warm start: {probe:.3f}. These prompts belong to the RL stream, so a run may have trained on them.

{report.table(by_cell, ests, gs, "probe_final_accuracy", "G")}

{_below_warm_start(by_cell, ests, gs, study.ws, rl)}
{spo_note(by_cell, ests, gs)}
{order_section}
"""


def _dynamics_and_limits(study: _Study, captions: dict[str, str]) -> str:
    """Training dynamics at G = order_group_size, the list of figures and what the toy does and does not show."""
    preset, by_cell, ests, og = study.preset, study.by_cell, study.ests, study.og
    return f"""## Training dynamics at G = {og} (random order)

{report.dynamics_table(by_cell, ests, og)}

{_gradient_note(by_cell, ests, study.gs, og, study.clip)}

## Figures
Lines are means over the {preset.seeds} seeds; error bars are 95% t-intervals over seeds (stopped at 0), shifted
apart along x so that the estimators' intervals stay distinguishable; each figure names its preset and provenance.

{chr(10).join(f"- [{f}]({f}): {c}" for f, c in captions.items())}

## What this toy does and does not show
- It runs the real code paths: verl's advantage registry (GRPO, RLOO, REINFORCE++-baseline and the package's
  `ebpo`), verl's PPO-clip loss, `agg_loss` and `kl_penalty`, on sampled token-by-token answers with verifiable
  rewards, so group statistics, zero-signal groups, shrinkage and the stream order behave as in training.
- It is not LLM-scale evidence: a ~10^5-parameter model, {preset.rl["steps"]} steps, one warm start, arithmetic only.
  What RL learns here is a rule shared by the prompts (carrying, which the warm start mostly skips), so it
  transfers to held-out prompts; read the tables as "what the estimators do to sample efficiency at small
  scale", not as a replication of the paper's benchmark numbers.
- The difficulty order ends on the hardest prompts, so its final accuracy measures the end of a curriculum,
  not its average.
"""


def lr_section(lr_grid: dict) -> str:
    """The learning-rate grid: per estimator the rates tried, the validation score of each, the choice."""
    if not lr_grid:
        return "Fixed learning rates (no grid recorded for this preset)."
    rows = []
    for e, g in lr_grid.items():
        scores = ", ".join(f"{v:g}: " + ("n/a" if s[0] is None else report.pm(s[0], s[1]))
                           for v, s in zip(g["values"], g["validation"], strict=True))  # fmt: skip
        rows.append([e, scores, f"{g['chosen']:g}"])
    head = ["estimator", "rates tried: mean validation accuracy over the run", "chosen"]
    sources = "; ".join(sorted({g.get("source", "") for g in lr_grid.values()}))
    return report.md_table(head, rows) + f"\n\nWhere the rates come from (never from the test split): {sources}."


def _below_warm_start(by_cell: dict, ests: list[str], gs: list[int], ws: float, rl: dict) -> str:
    """Where the final model gained, for the G at which every estimator ends below the warm start."""
    below = [g for g in gs if all(report._mean(by_cell, (e, g, "random"), "final_accuracy") < ws for e in ests)]
    if not below:
        return ""

    def cell(e: str, g: int) -> str:
        parts = [report._mean(by_cell, (e, g, "random"), k) for k in ("train_seen_gain", "train_unseen_gain")]
        held = report._mean(by_cell, (e, g, "random"), "final_accuracy") - ws
        return " / ".join("n/a" if not np.isfinite(x) else f"{x:+.3f}" for x in (*parts, held))

    seen = {g: report._mean(by_cell, (ests[0], g, "random"), "train_seen_fraction") for g in gs}
    rows = report.md_table(["estimator", *(f"G={g}" for g in gs)], [[e, *(cell(e, g) for g in gs)] for e in ests])
    return f"""## Why every estimator ends below the warm start at G = {", ".join(map(str, below))}
Change of exact pass@1 from the warm start to the final model, mean over seeds: on the RL prompts the run
trained on / on the RL prompts it never saw / on the held-out prompts.

{rows}

A step holds {rl["responses_per_step"]}/G prompts, so in {rl["steps"]} steps a run sees
{", ".join(f"{100 * seen[g]:.0f}% (G={g})" for g in gs)} of the RL prompts. What the runs show: they raise the
accuracy of the prompts they trained on at every G, and change little or lose on the RL prompts they never saw;
at large G they see few prompts, so their held-out change follows the unseen prompts, not the trained ones. The
held-out set also weighs the 1-digit cells, which the RL stream rarely visits, more than the stream does (see
Setup). The pattern appears for every estimator, so it is a property of a tiny model that transfers little
between prompts, not a difference between the estimators.
"""


def spo_note(by_cell: dict, ests: list[str], gs: list[int]) -> str:
    """How often SPO's tracker had seen a step's prompts before: where never, its baseline stays 0.5."""
    if "spo" not in ests:
        return ""
    seen = {g: report._mean(by_cell, ("spo", g, "random"), "spo_frac_seen") for g in gs}
    never = [g for g in gs if seen[g] == 0.0]
    text = (
        "## SPO's tracker: how often a prompt recurs\nShare of a step's prompts that the tracker had seen at an "
        "earlier step (mean over steps and seeds): "
        + ", ".join(f"G={g} {'n/a' if not np.isfinite(seen[g]) else f'{100 * seen[g]:.0f}%'}" for g in gs)
        + ". SPO's baseline for a prompt it has not seen is 0.5, so where this share is low the spo row is close to "
        "A = r - 0.5 with batch standardisation, not SPO's tracker."
    )
    if never:
        text += (
            f" At G = {', '.join(map(str, never))} a run covers less than one epoch of the RL prompts, so no prompt "
            "recurs and EVERY SPO baseline stays 0.5 (the authors' fork's uid-keyed tracker in another form): these "
            "spo cells do not measure SPO."
        )
    return text + "\n"


def _gradient_note(by_cell: dict, ests: list[str], gs: list[int], og: int, clip: float) -> str:
    """How often updates were clipped, and where GRPO+BN's gradient norm is above EBPO's."""
    clipped = ", ".join(f"{e} {100 * report._mean(by_cell, (e, og, 'random'), 'clipped'):.0f}%" for e in ests)
    text = (
        f"Share of mini-batch updates whose pre-clip gradient norm exceeded the clip value {clip:g} at G={og}: "
        f"{clipped}. A clipped update is scaled down to norm {clip:g}, so a higher pre-clip gradient norm "
        "overstates the size of the applied update."
    )
    if {"grpo", "grpo_bn", "ebpo"} <= set(ests):
        three = ("grpo", "grpo_bn", "ebpo")
        norm = {(e, g): report._mean(by_cell, (e, g, "random"), "grad_norm") for e in three for g in gs}
        higher = [g for g in gs if norm["grpo_bn", g] > norm["ebpo", g] > norm["grpo", g]]
        if higher:
            text += (
                f" At G = {', '.join(map(str, higher))} the mean pre-clip norm of GRPO+BN is higher than EBPO's, and "
                "EBPO's higher than GRPO's. GRPO+BN differs from GRPO only in standardising the advantages over the "
                "batch instead of per group, and from EBPO only in having no shrinkage, so in this toy the higher "
                "norm comes with the batch standardisation, not with the shrinkage."
            )
    return text


def coverage_section(
    runs: list[dict], by_cell: dict, ests: list[str], gs: list[int], base_info: dict, seeds: int | None = None
) -> str:
    """The coverage section: pass@k per cell at the k > 1 of :data:`COVERAGE_K` and paired EBPO - X at each k."""
    warm = report.warm_start_pass_at_k(base_info)
    warm_text = ", ".join(f"pass@{k} {warm[k]:.3f}" if warm[k] is not None else f"pass@{k} n/a" for k in warm)
    parts = [
        f"""## Coverage: held-out pass@k (k = {", ".join(map(str, report.COVERAGE_K))})
pass@k is the mean over the held-out prompts of 1 - (1 - p)^k, p the prompt's exact success probability at
temperature 1: the chance that at least one of k independent samples is right, exact as pass@1 is (pass@1 is the
accuracy above). Warm start: {warm_text}. Figure: [{report.PASS_AT_K_FIGURE}]({report.PASS_AT_K_FIGURE})."""
    ]
    for k in (k for k in report.COVERAGE_K if k > 1):
        pairs = report.paired(runs, ests, gs, k=k)
        parts.append(f"""### pass@{k} (rows = estimator, columns = G; random order)

{report.table(by_cell, ests, gs, f"pass_at_{k}", "G", seeds=seeds)}

EBPO - X in pass@{k}, paired by seed as above:

{report.paired_table(pairs, gs)}

{report.paired_verdict(pairs)}""")
    parts.append(
        "What this measures: whether a final policy still puts probability on the right answer of prompts it\n"
        "rarely solves (pass@64 counts a prompt with p = 0.05 as 96% solved). It compares the estimators' coverage\n"
        "on this testbed only: one warm start, a ~10^5-parameter model, answers of a few tokens."
    )
    return "\n\n".join(parts) + "\n\n"
