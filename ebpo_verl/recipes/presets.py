"""The recipes' presets as data: the paper's shared setup, the rewards, the batch orders and one entry per
ALGO x BASELINES, every value with its source, cited by key:

- ``paper``: Han et al., "EBPO" (arXiv 2602.05165), "Setup" (batch 512 prompts, PPO mini-batch 128, lr 1e-6,
  weight decay 0.01, KL loss 0.001, token-mean, prompt 4096 / response 8192, clip 0.2, temperature 1.0).
- ``authors``: the authors' fork and run scripts as ``docs/paper_notes.md`` reports them (BASELINES=paper).
- the baselines' own papers and verl 0.9.1's docs (BASELINES=canonical, and ``otb``, ``kl_cov``).

A :class:`Setting` is one Hydra override; its ``key`` keeps the ``+``/``++`` prefix for undeclared keys.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"

MAX_RESPONSE = 8192
"""Response budget (paper, "Setup"); also Dr.GRPO's constant loss normaliser and DAPO's ``max_resp_len``."""
OVERLONG_BUFFER = 2048
"""DAPO's soft overlong punishment over the last quarter of the response budget (DAPO: 4096 of 20480)."""


@dataclass(frozen=True)
class Setting:
    """One Hydra override ``key=value`` and where its value comes from."""

    key: str
    value: str
    source: str

    @property
    def override(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def name(self) -> str:
        """The config key without Hydra's ``+``/``++``/``~`` prefix."""
        return self.key.lstrip("+~")


def _s(key: str, value: object, source: str) -> Setting:
    return Setting(key, str(value), source)


@dataclass(frozen=True)
class Preset:
    """An ALGO: its table label and its settings under BASELINES=paper and BASELINES=canonical."""

    name: str
    label: str
    summary: str
    paper: tuple[Setting, ...]
    canonical: tuple[Setting, ...] | None = None
    """None: the same as ``paper`` (presets the authors did not run differently from their definition)."""

    def settings(self, baselines: str) -> tuple[Setting, ...]:
        if baselines == "canonical" and self.canonical is not None:
            return self.canonical
        return self.paper


PAPER = "arXiv 2602.05165, Setup"
AUTHORS = "authors' fork as run (docs/paper_notes.md)"

SHARED: tuple[Setting, ...] = (
    _s("data.train_batch_size", 512, PAPER),
    _s("data.max_prompt_length", 4096, PAPER),
    _s("data.filter_overlong_prompts", True, "verl: drop prompts over the budget instead of failing"),
    _s("data.truncation", "error", "verl: a prompt over the budget is an error, never silently cut"),
    _s(f"{ACTOR}.optim.lr", "1e-6", PAPER),
    _s(f"{ACTOR}.optim.weight_decay", 0.01, PAPER),
    _s(f"{ACTOR}.ppo_mini_batch_size", 128, PAPER),
    _s(f"{ACTOR}.use_kl_loss", True, PAPER),
    _s(f"{ACTOR}.kl_loss_coef", 0.001, PAPER),
    _s(f"{ACTOR}.kl_loss_type", "low_var_kl", AUTHORS),
    _s(f"{ACTOR}.loss_agg_mode", "token-mean", PAPER),
    _s(f"{ACTOR}.clip_ratio_low", 0.2, PAPER),
    _s(f"{ACTOR}.clip_ratio_high", 0.2, PAPER),
    _s(f"{ACTOR}.entropy_coeff", 0, AUTHORS),
    _s(f"{ACTOR}.use_dynamic_bsz", True, "verl: token-budget micro-batches (throughput only)"),
    _s("algorithm.use_kl_in_reward", False, PAPER),
    _s("algorithm.kl_ctrl.kl_coef", 0.001, f"{AUTHORS}; inert without use_kl_in_reward"),
    _s(f"{ROLLOUT}.name", "vllm", AUTHORS),
    _s(f"{ROLLOUT}.temperature", 1.0, PAPER),
    _s(f"{ROLLOUT}.top_p", 1.0, PAPER),
    _s(f"{ROLLOUT}.val_kwargs.temperature", 1.0, PAPER),
    _s(f"{ROLLOUT}.val_kwargs.top_p", 1.0, PAPER),
    _s(f"{ROLLOUT}.val_kwargs.do_sample", True, PAPER),
)
"""The setup every run shares (a preset's settings come after these and win)."""

# ---- a dead or hung GPU rank ends the run (issue 28; docs/training.md#when-a-worker-dies-or-hangs) ----
_TORCH = "torch.distributed (ProcessGroupNCCL) environment variables"
_ENV = "+ray_kwargs.ray_init.runtime_env.env_vars"
GPU_FAULTS: tuple[Setting, ...] = (
    # the workers' process group timeout: verl's key, which its v1 workers do not read (they pass none, and
    # torch's default for their cpu:gloo,cuda:nccl group is 30 min); ebpo_verl.trainer.watchdog.dist_timeout_worker_cls
    # initialises the group with it before verl's worker does
    _s("actor_rollout_ref.nccl_timeout", 600, "ebpo_verl.trainer.watchdog (verl's key, read by EBPO's worker class)"),
    # a collective that does not complete within that timeout aborts its communicator and ends the rank's
    # process, so Ray reports the rank dead and ebpo-train stops the run, well within trainer.step_timeout_s
    _s(f"{_ENV}.TORCH_NCCL_ASYNC_ERROR_HANDLING", "'1'", _TORCH),
    # a rank whose NCCL watchdog thread itself is stuck (a wedged GPU) is ended after this many seconds
    _s(f"{_ENV}.TORCH_NCCL_ENABLE_MONITORING", "'1'", _TORCH),
    _s(f"{_ENV}.TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "'600'", _TORCH),
)
SHARED = (*SHARED, *GPU_FAULTS)

REWARDS: dict[str, tuple[Setting, ...]] = {
    # the authors' training reward: verl's DAPO/Minerva `Answer:` rule as their verl ran it, +1/-1
    "paper": (
        _s("reward.custom_reward_function.path", "pkg://ebpo_verl.paper_reward", AUTHORS),
        _s("reward.custom_reward_function.name", "compute_score", AUTHORS),
    ),
    # math-verify, 1/0 (ebpo_verl.reward)
    "math_verify": (
        _s("reward.custom_reward_function.path", "pkg://ebpo_verl.reward", "math-verify 0.9.0"),
        _s("reward.custom_reward_function.name", "compute_score", "math-verify 0.9.0"),
    ),
}

_CURRICULUM = "ebpo_verl.trainer.curriculum"
ORDER_BASE: tuple[Setting, ...] = (
    _s("data.custom_cls.path", "pkg://ebpo_verl.trainer.curriculum", _CURRICULUM),
    _s("data.custom_cls.name", "CurriculumDataset", _CURRICULUM),
    _s("data.shuffle", False, "the order is the curriculum's"),
    _s("data.seed", 42, AUTHORS),
    _s("data.dataloader_num_workers", 0, "one reader keeps the curriculum's position"),
)
ORDERS: dict[str, tuple[Setting, ...]] = {
    # topic-clustered batches (paper, "Topic-aware ordering")
    "topic": (
        _s("++data.curriculum.order", "topic", PAPER),
        _s("++data.curriculum.topic_key", "topic", _CURRICULUM),
        _s("++data.curriculum.align", True, _CURRICULUM),
    ),
    "naive": (_s("++data.curriculum.order", "native", "paper: EBPO-naive (file order)"),),
    "random": (_s("++data.curriculum.order", "random", f"{AUTHORS}: the baselines' shuffled stream"),),
    "difficulty": (
        _s("++data.curriculum.order", "difficulty", "paper: EBPO-diff (easy -> hard)"),
        _s("++data.curriculum.difficulty_key", "pass_rate", "ebpo_verl.evaluate.pass_rate"),
    ),
}
TOPICS = ("embed", "file")

_EST = "algorithm.adv_estimator"
_STD = "algorithm.norm_adv_by_std_in_grpo"
_DRGRPO = "Dr.GRPO, Liu et al. 2025 (arXiv 2503.20783)"
_DAPO = "DAPO, Yu et al. 2025 (arXiv 2503.14476)"
_ENTROPY = "Entropy Mechanism, Cui et al. 2025 (arXiv 2505.22617)"
_OTB = "Optimal Token Baseline (arXiv 2602.07078), verl 0.9.1 docs/algo/otb.md"
_V2 = "the v2 draft's baselines (ebpo_verl.algos.baselines)"
_DBB = "Discounted Beta-Bernoulli reward estimation (arXiv 2603.18444)"
_JSPO = "JSPO, Zeng et al. (arXiv 2511.03710)"
_JSPO_CODE = "JSPO authors' code (guanning03/JSPO-Official), math script"
_HADW = "HA-DW (arXiv 2601.08521)"


def _module_preset(name: str, label: str, summary: str, source: str, **options: tuple[object, str]) -> Preset:
    """The preset of an estimator of this package (module ``ebpo_verl.algos.<name>``): ``adv_estimator=<name>``,
    cited with ``source`` and the module, then ``algorithm.<name>.<key>=value`` for each ``key=(value, source)``."""
    estimator = _s(_EST, name, f"{source}; ebpo_verl.algos.{name}")
    return Preset(name, label, summary, (estimator, *(_s(f"algorithm.{name}.{k}", *v) for k, v in options.items())))


def _grpo_with_loss(mode: str, grpo_source: str, mode_source: str) -> tuple[Setting, Setting]:
    """GRPO's advantage with verl's policy loss ``mode`` (the Entropy Mechanism paper's presets), each cited."""
    return _s(_EST, "grpo", grpo_source), _s(f"{ACTOR}.policy_loss.loss_mode", mode, mode_source)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("ebpo", "EBPO", "EBPO, running statistics across steps", (_s(_EST, "ebpo", PAPER),)),
        Preset(
            "ebpo_bb",
            "EBPO-BB",
            "EBPO with the Beta-Binomial prior (v2 draft)",
            (_s(_EST, "ebpo", PAPER), _s("++algorithm.ebpo.prior", "beta_binomial", "v2 draft, EBPO-BB")),
        ),
        Preset(
            "ebpo_batch",
            "EBPO (batch)",
            "EBPO as released: statistics of the current batch only",
            (_s(_EST, "ebpo", PAPER), _s("++algorithm.ebpo.stats_scope", "batch", AUTHORS)),
        ),
        Preset(
            "grpo", "GRPO", "GRPO", (_s(_EST, "grpo", "GRPO, Shao et al. 2024"), _s(_STD, True, "GRPO: std division"))
        ),
        Preset(
            "grpo_bn",
            "GRPO+BN",
            "GRPO with batch-std normalisation: EBPO with the shrinkage off (isolates S)",
            (
                _s(_EST, "ebpo", PAPER),
                _s("++algorithm.ebpo.shrinkage", 0, "paper: GRPO+BN is S = 0"),
                _s("++algorithm.ebpo.norm", "batch", "paper: batch-std normalisation"),
            ),
        ),
        Preset(
            "drgrpo",
            "Dr.GRPO",
            "Dr.GRPO: no std division",
            # the authors kept token-mean and the KL loss
            (_s(_EST, "grpo", AUTHORS), _s(_STD, False, AUTHORS)),
            (
                _s(_EST, "grpo", _DRGRPO),
                _s(_STD, False, _DRGRPO),
                _s(f"{ACTOR}.loss_agg_mode", "seq-mean-token-sum-norm", f"{_DRGRPO}: constant normaliser"),
                _s(f"{ACTOR}.loss_scale_factor", MAX_RESPONSE, f"{_DRGRPO}: the response budget"),
                _s(f"{ACTOR}.use_kl_loss", False, f"{_DRGRPO}: no KL term"),
            ),
        ),
        Preset(
            "dapo",
            "DAPO",
            "DAPO: clip-higher (paper: as the authors ran it; canonical: + dynamic sampling, overlong penalty)",
            # the fork's script also set filter_groups and an overlong buffer its trainer did not read: off
            (
                _s(_EST, "grpo", AUTHORS),
                _s(_STD, False, AUTHORS),
                _s(f"{ACTOR}.clip_ratio_high", 0.28, f"{AUTHORS}; {_DAPO}"),
                _s("algorithm.filter_groups.enable", False, f"{AUTHORS}: inactive in the reported run"),
            ),
            (
                _s(_EST, "grpo", _DAPO),
                _s(f"{ACTOR}.clip_ratio_high", 0.28, _DAPO),
                _s(f"{ACTOR}.use_kl_loss", False, f"{_DAPO}: no KL term"),
                _s("algorithm.filter_groups.enable", True, f"{_DAPO}: dynamic sampling"),
                _s("algorithm.filter_groups.metric", "acc", f"{_DAPO}: groups of equal accuracy dropped"),
                _s("reward.reward_manager.name", "dapo", f"{_DAPO}: soft overlong punishment"),
                _s("++reward.reward_kwargs.max_resp_len", MAX_RESPONSE, _DAPO),
                _s("++reward.reward_kwargs.overlong_buffer_cfg.enable", True, _DAPO),
                _s("++reward.reward_kwargs.overlong_buffer_cfg.len", OVERLONG_BUFFER, f"{_DAPO}: last quarter"),
                _s("++reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", 1.0, _DAPO),
                _s("++reward.reward_kwargs.overlong_buffer_cfg.log", False, "verl: no per-sample log"),
            ),
        ),
        Preset(
            "entropy_mech",
            "EntropyMech",
            "Clip-Cov (Entropy Mechanism paper)",
            # the authors' script: PPO's clip opened to [0, 2], no KL; clip_ratio_c and kl_ctrl are copied but
            # inert in verl 0.9.1 (clip_cov has no dual clip; kl_ctrl is read only with use_kl_in_reward)
            (
                *_grpo_with_loss("clip_cov", AUTHORS, f"{AUTHORS}; {_ENTROPY}"),
                _s(f"{ACTOR}.policy_loss.clip_cov_ratio", 0.0002, _ENTROPY),
                _s(f"{ACTOR}.policy_loss.clip_cov_lb", 1.0, _ENTROPY),
                _s(f"{ACTOR}.policy_loss.clip_cov_ub", 5.0, _ENTROPY),
                _s(f"{ACTOR}.clip_ratio_low", 1.0, AUTHORS),
                _s(f"{ACTOR}.clip_ratio_high", 1.0, AUTHORS),
                _s(f"{ACTOR}.clip_ratio_c", 10.0, f"{AUTHORS} (inert in verl 0.9.1)"),
                _s(f"{ACTOR}.entropy_coeff", 0, AUTHORS),
                _s(f"{ACTOR}.use_kl_loss", False, AUTHORS),
                _s(f"{ACTOR}.kl_loss_coef", 0, AUTHORS),
                _s("algorithm.kl_ctrl.kl_coef", 0, f"{AUTHORS} (inert in verl 0.9.1)"),
            ),
            _grpo_with_loss("clip_cov", _ENTROPY, f"{_ENTROPY}; verl's defaults"),
        ),
        Preset(
            "kl_cov",
            "KL-Cov",
            "KL-Cov (Entropy Mechanism paper): a KL penalty on the highest-covariance tokens",
            (
                *_grpo_with_loss("kl_cov", _ENTROPY, f"{_ENTROPY}; verl policy_loss kl_cov"),
                _s(f"{ACTOR}.policy_loss.kl_cov_ratio", 0.002, f"{_ENTROPY}: k = 2e-3 for the 7B model"),
                _s(f"{ACTOR}.policy_loss.ppo_kl_coef", 1.0, f"{_ENTROPY}: beta = 1"),
                _s(f"{ACTOR}.use_kl_loss", False, f"{_ENTROPY}: no KL to the reference"),
                _s(f"{ACTOR}.entropy_coeff", 0, f"{_ENTROPY}: no entropy bonus"),
            ),
        ),
        Preset(
            "otb",
            "OTB",
            "verl's Optimal Token Baseline, with the sum of squared token probabilities it needs",
            (
                _s(_EST, "optimal_token_baseline", _OTB),
                _s(f"{ACTOR}.calculate_sum_pi_squared", True, f"{_OTB}: Sum pi^2 per token from the actor"),
            ),
        ),
        Preset("rloo", "RLOO", "RLOO (leave-one-out baseline)", (_s(_EST, "rloo", "RLOO, Ahmadian et al. 2024"),)),
        Preset(
            "reinforce_pp",
            "REINFORCE++",
            "REINFORCE++ (paper: as the authors ran it; canonical: the group-baseline variant)",
            (_s(_EST, "reinforce_plus_plus", AUTHORS),),
            (_s(_EST, "reinforce_plus_plus_baseline", "REINFORCE++, Hu 2025 (arXiv 2501.03262)"),),
        ),
        Preset("spo", "SPO", "SPO's per-prompt Beta tracker", (_s(_EST, "spo", f"{_V2}; arXiv 2509.13232"),)),
        _module_preset(
            "dbb",
            "DBB",
            "Discounted Beta-Bernoulli per-prompt reward estimation (GRPO-DBB)",
            _DBB,
            discount=(0.75, f"{_DBB}, Sec. 4.2: lambda = 0.75 for Qwen3-8B"),
        ),
        Preset("bnpo", "BNPO", "BNPO's Beta normalisation", (_s(_EST, "bnpo", f"{_V2}; arXiv 2506.02864"),)),
        Preset(
            "shrinkage_js",
            "JS",
            "James-Stein shrinkage baseline",
            (_s(_EST, "shrinkage_js", f"{_V2}; arXiv 2511.03710"),),
        ),
        # the 2025-2026 rivals (docs/rivals.md); their options' defaults are their sources' values
        _module_preset(
            "jspo",
            "JSPO",
            "JSPO: James-Stein shrinkage baseline, the paper's formula (= shrinkage_js)",
            _JSPO,
            form=("paper", _JSPO),
        ),
        _module_preset(
            "jspo_history",
            "JSPO-hist",
            "JSPO's history variant: weight and batch mean smoothed across steps (authors' code)",
            _JSPO_CODE,
            smoothing=(0.99, f"{_JSPO_CODE}: c = 0.99"),
        ),
        _module_preset(
            "ha_dw",
            "HA-DW",
            "HA-DW: GRPO's advantage weighted by difficulty against a success-rate anchor",
            _HADW,
            lam_scale=(1.3, f"{_HADW}: best of the lam_scale ablation"),
        ),
        _module_preset(
            "krpo",
            "KRPO",
            "KRPO: a Kalman filter over each group's rewards, in the rollout's sample order",
            "KRPO (arXiv 2505.07527), authors' train.py",
            order=("sample_index", "docs/rivals.md: verl reorders rows by length"),
        ),
        _module_preset(
            "running_norm",
            "RunNorm",
            "running reward normalisation: cumulative reward moments (one domain: DAPO-Math)",
            "ROLL's RunningMoments (alibaba/ROLL)",
        ),
    )
}
"""ALGO name -> preset (the ALGO switch of the recipes; the CPU study uses the same names). Each estimator of the
registry without a preset here gets one (:func:`registry_presets`)."""


def registry_presets(named: dict[str, Preset]) -> dict[str, Preset]:
    """An ALGO for every estimator of the registry (:mod:`ebpo_verl.algos.registry`) that ``named`` lacks: its
    ``algorithm.adv_estimator`` and nothing else changed, labelled by its name, described by its summary."""
    from ebpo_verl.algos import registry

    return {
        name: Preset(name, name, spec.summary, (_s(_EST, spec.registered_name, spec.source),))
        for name, spec in registry.estimators().items()
        if name not in named
    }


PRESETS.update(registry_presets(PRESETS))

ALIASES = {"js": "shrinkage_js"}
"""Earlier ALGO names, still accepted."""

SINGLE_STREAM = frozenset({"spo"})
"""ALGOs that train with one response per prompt (GROUP_SIZE=1); every other one compares a group."""

TOPIC_ORDERED = frozenset({"ebpo", "ebpo_bb", "ebpo_batch", "grpo_bn"})
"""ALGOs whose table rows always use topic order (EBPO's rows); the others follow :func:`row_order`."""


def row_order(algo: str, baselines: str) -> str:
    """ORDER of a table row: under BASELINES=paper the baselines train on a shuffled stream, as the authors'
    baseline runs did; EBPO's rows (and every row under canonical) use topic order."""
    return "topic" if algo in TOPIC_ORDERED or baselines == "canonical" else "random"
