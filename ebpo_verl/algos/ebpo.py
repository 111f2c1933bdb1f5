"""The ``ebpo`` estimator's options (``algorithm.ebpo.<key>``) and which of them a mode ignores.

The math is in :mod:`ebpo_verl.algos.ebpo_math`, the running statistics in :mod:`ebpo_verl.algos.ebpo_state`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ebpo_verl.options.parsing import OptionSection, ints, nullable, one_of, option, reals, resume_option, text


@dataclass(frozen=True)
class EBPOOptions(OptionSection):
    """Options of the ``ebpo`` estimator (``algorithm.ebpo.<key>`` in verl); defaults = the arXiv algorithm box."""

    SECTION: ClassVar[str] = "algorithm.ebpo"

    prior: str = one_of(
        gaussian="",
        beta_binomial="EBPO-BB of the v2 draft; needs a two-level reward, 0/1 or -1/+1; with stats_scope=history "
        "always fitted on earlier batches only, Beta(1,1) warm-up; with stats_scope=batch fitted on the current batch",
    )
    stats_scope: str = one_of(
        history="Welford statistics persist across steps",
        batch="the authors' released code exactly: current batch only, mu_glob = mean of the group means, no eps in "
        "the shrinkage denominator and S = 1 where it is <= epsilon, norm=none still subtracts the batch mean",
    )
    sigma2: str = one_of(
        total="population variance of all rewards seen",
        within="running mean of per-prompt unbiased within-group variances; groups of one contribute nothing",
    )
    tau2: str = one_of(
        raw="population variance of the group means seen",
        debiased="raw minus the expected sampling noise sigma^2 * mean(1/G), floored at 0",
    )
    merge: str = one_of(
        before="merge the batch into the statistics, then compute its advantages",
        after="use only earlier batches; on the first step, with no history, the current batch",
    )
    norm: str = one_of(
        batch="(A - mean_batch A) / (std_batch A + eps), unbiased std",
        group="A / (sqrt((1-S) s_q^2 + S sigma^2) + eps); at S=0 this is verl's grpo for groups of two or more: a "
        "group of one gets 0, where grpo returns its raw reward",
        none="",
    )
    shrinkage: str | float = option(
        "auto",
        "auto (S from the formula) or a fixed float in [0, 1] (0: group-mean baseline, 1: global mean)",
        choices=("auto",),
        rule=reals(0.0, 1.0),
    )
    decay: float = option(
        1.0,
        "1.0 keeps all history; a value in (0, 1) down-weights the history by that factor every step",
        rule=reals(0.0, 1.0, open_low=True),
    )
    cluster_key: str | None = nullable(
        "name of a per-prompt label (e.g. topic); one set of statistics per label, blended toward the global prior "
        "with weight min(1, prompts_in_label / min_cluster_prompts)",
        text("a label name"),
    )
    min_cluster_prompts: int = option(
        64, "prompts a label needs before its own prior is used unblended", rule=ints(0, 2**53)
    )
    epsilon: float = option(
        1e-6,
        "the eps of the shrinkage and normalisation formulas (with stats_scope=batch: the threshold below which "
        "S = 1, and the normalisation eps, both 1e-6 in the released code)",
        rule=reals(0.0, open_low=True),
    )
    on_resume_mismatch: str = resume_option(
        "what a resume does when these options differ from the checkpoint's: error (stop before the first "
        "rollout), reset (fresh statistics, with a warning), keep (continue with the saved statistics); not "
        "itself compared"
    )

    @property
    def fixed_shrinkage(self) -> float | None:
        return None if self.shrinkage == "auto" else float(self.shrinkage)


def ignored_keys(options: EBPOOptions) -> set[str]:
    """The options the mode of ``options`` never reads (whatever their values)."""
    ignored: set[str] = set()
    if options.stats_scope == "batch":
        ignored |= {"merge", "decay"}
    if options.prior == "beta_binomial":
        ignored |= {"sigma2", "tau2", "merge"}
    elif options.fixed_shrinkage is not None:
        ignored |= {"tau2"} | ({"sigma2"} if options.norm != "group" else set())
    if options.cluster_key is None:
        ignored.add("min_cluster_prompts")
    return ignored


def ignored_options(options: EBPOOptions) -> list[str]:
    """``key=value`` of each option set away from its default that the chosen mode never reads."""
    ignored = ignored_keys(options)
    defaults = EBPOOptions()
    return [
        f"{k}={getattr(options, k)!r}"
        for k in EBPOOptions.keys()
        if k in ignored and getattr(options, k) != getattr(defaults, k)
    ]


def group_size_need(options: EBPOOptions) -> str | None:
    """Why these options need ``rollout.n >= 2`` (None: they do not: a fixed shrinkage above 0)."""
    if options.fixed_shrinkage == 0:
        return "shrinkage=0 makes the group mean the baseline, so one response gets advantage 0"
    if options.fixed_shrinkage is None:
        return (
            "shrinkage=auto estimates the within-group variance; or fix it, e.g. algorithm.ebpo.shrinkage=1.0 for "
            "a global-mean baseline"
        )
    return None


def ignored_options_warning(options: EBPOOptions) -> str | None:
    """One line naming the options set away from their defaults that the chosen mode ignores (None: none)."""
    ignored = ignored_options(options)
    if not ignored:
        return None
    mode = (
        f"stats_scope={options.stats_scope}, prior={options.prior}, shrinkage={options.shrinkage}, "
        f"norm={options.norm}, cluster_key={options.cluster_key or 'null'}"
    )
    return f"algorithm.ebpo option(s) {', '.join(ignored)} have no effect with {mode}"
