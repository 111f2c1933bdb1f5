"""The ``ebpo`` estimator's options (``algorithm.ebpo.<key>``) and which of them a mode ignores.

The math is in :mod:`ebpo_verl.algos.ebpo_math`, the running statistics in :mod:`ebpo_verl.algos.ebpo_state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ebpo_verl.options.parsing import is_real, option_keys, parse_section

_CHOICES: dict[str, tuple[str, ...]] = {
    "prior": ("gaussian", "beta_binomial"),
    "stats_scope": ("history", "batch"),
    "sigma2": ("total", "within"),
    "tau2": ("raw", "debiased"),
    "merge": ("before", "after"),
    "norm": ("batch", "group", "none"),
    "on_resume_mismatch": ("error", "reset", "keep"),
}


@dataclass(frozen=True)
class EBPOOptions:
    """Options of the ``ebpo`` estimator (``algorithm.ebpo.<key>`` in verl); defaults = the arXiv algorithm box.

    prior: ``gaussian`` | ``beta_binomial`` (v2 draft; needs a two-level reward, 0/1 or -1/+1; with
        ``stats_scope=history`` always fitted on earlier batches only, Beta(1,1) warm-up; with
        ``stats_scope=batch`` fitted on the current batch).
    stats_scope: ``history`` (Welford statistics persist across steps) | ``batch`` (the authors' released code
        exactly: current batch only, mu_glob = mean of the group means, no eps in the shrinkage denominator and
        S = 1 where it is <= epsilon, ``norm=none`` still subtracts the batch mean).
    sigma2: ``total`` (population variance of all rewards seen) | ``within`` (running mean of per-prompt
        unbiased within-group variances; groups of one contribute nothing).
    tau2: ``raw`` (population variance of the group means seen) | ``debiased`` (raw minus the expected sampling
        noise sigma^2 * mean(1/G), floored at 0).
    merge: ``before`` (merge the batch into the statistics, then compute its advantages) | ``after`` (use only
        earlier batches; on the first step, with no history, the current batch).
    norm: ``batch`` ((A - mean_batch A) / (std_batch A + eps), unbiased std) | ``group`` (A / (sqrt((1-S) s_q^2 +
        S sigma^2) + eps); at S=0 this is verl's ``grpo`` for groups of two or more: a group of one gets 0, where
        ``grpo`` returns its raw reward) | ``none``.
    shrinkage: ``auto`` (S from the formula) or a fixed float in [0, 1] (0: group-mean baseline, 1: global mean).
    decay: 1.0 keeps all history; a value in (0, 1) down-weights the history by that factor every step.
    cluster_key: name of a per-prompt label (e.g. ``topic``); one set of statistics per label, blended toward the
        global prior with weight min(1, prompts_in_label / min_cluster_prompts).
    min_cluster_prompts: prompts a label needs before its own prior is used unblended.
    epsilon: the eps of the shrinkage and normalisation formulas (with ``stats_scope=batch``: the threshold
        below which S = 1, and the normalisation eps, both 1e-6 in the released code).
    on_resume_mismatch: what a resume does when these options differ from the checkpoint's: ``error`` (stop
        before the first rollout), ``reset`` (fresh statistics, with a warning), ``keep`` (continue with the
        saved statistics). Not itself compared.
    """

    prior: str = "gaussian"
    stats_scope: str = "history"
    sigma2: str = "total"
    tau2: str = "raw"
    merge: str = "before"
    norm: str = "batch"
    shrinkage: str | float = "auto"
    decay: float = 1.0
    cluster_key: str | None = None
    min_cluster_prompts: int = 64
    epsilon: float = 1e-6
    on_resume_mismatch: str = "error"

    def __post_init__(self) -> None:
        for key, choices in _CHOICES.items():
            if getattr(self, key) not in choices:
                raise ValueError(f"algorithm.ebpo.{key}={getattr(self, key)!r} is invalid; valid values: {choices}")
        s = self.shrinkage
        if s != "auto" and not (is_real(s) and 0.0 <= float(s) <= 1.0):
            raise ValueError(f"algorithm.ebpo.shrinkage={s!r} is invalid; use 'auto' or a float in [0, 1]")
        if not (is_real(self.decay) and 0.0 < float(self.decay) <= 1.0):
            raise ValueError(f"algorithm.ebpo.decay={self.decay!r} is invalid; use a float in (0, 1]")
        if self.cluster_key is not None and not (isinstance(self.cluster_key, str) and self.cluster_key):
            raise ValueError(f"algorithm.ebpo.cluster_key={self.cluster_key!r} is invalid; use null or a label name")
        mcp = self.min_cluster_prompts
        if isinstance(mcp, bool) or not isinstance(mcp, int) or mcp < 0:
            raise ValueError(f"algorithm.ebpo.min_cluster_prompts={mcp!r} is invalid; use an integer >= 0")
        if not (is_real(self.epsilon) and float(self.epsilon) > 0.0):
            raise ValueError(f"algorithm.ebpo.epsilon={self.epsilon!r} is invalid; use a float > 0")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None) -> EBPOOptions:
        """Build options from ``config.ebpo`` (a dict or OmegaConf node; None -> defaults); unknown keys raise."""
        return parse_section(cls, mapping, "algorithm.ebpo")

    @property
    def fixed_shrinkage(self) -> float | None:
        return None if self.shrinkage == "auto" else float(self.shrinkage)


OPTION_KEYS: tuple[str, ...] = option_keys(EBPOOptions)


RESUME_KEYS: tuple[str, ...] = tuple(k for k in OPTION_KEYS if k != "on_resume_mismatch")
"""The options a resume compares with the checkpoint's (all but ``on_resume_mismatch`` itself)."""


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
        for k in OPTION_KEYS
        if k in ignored and getattr(options, k) != getattr(defaults, k)
    ]


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
