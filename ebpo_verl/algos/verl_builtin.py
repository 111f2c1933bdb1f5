"""verl's own advantage estimators that the study, the recipes and the benchmark name: declared here so that every
list reads one registry; verl computes them (``builtin``: no options, no object of ours)."""

from __future__ import annotations

from ebpo_verl.algos.registry import EstimatorSpec

SPECS = (
    EstimatorSpec("grpo", "GRPO: the group's mean as baseline, divided by its std", "arXiv 2402.03300; verl's grpo",
                  builtin=True),
    EstimatorSpec("rloo", "RLOO: the leave-one-out mean of the group as baseline", "arXiv 2402.14740; verl's rloo",
                  builtin=True),
    EstimatorSpec("reinforce_pp", "REINFORCE++ with the group mean as baseline, batch-standardised",
                  "arXiv 2501.03262; verl's reinforce_plus_plus_baseline", builtin=True,
                  verl_name="reinforce_plus_plus_baseline"),
    EstimatorSpec("otb", "Optimal Token Baseline: a per-token baseline weighted by the path variance",
                  "arXiv 2602.07078; verl's optimal_token_baseline", builtin=True, verl_name="optimal_token_baseline",
                  verl_variants=("tir_optimal_token_baseline",), sum_pi_squared=True),
)  # fmt: skip
