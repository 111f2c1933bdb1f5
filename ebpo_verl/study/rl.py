"""Warm-start SFT and the RL loop: verl's advantage estimators and PPO-clip loss on a tiny policy.

One RL step, as verl's trainer does it with ``actor.use_kl_loss=True``:
  1. sample G responses (temperature 1) for each of the next P = responses_per_step / G prompts of the stream;
  2. reward 1/0 by exact match on the last response token (``token_level_rewards``);
  3. advantages: verl's estimators by ``get_adv_estimator_fn(name)``; ours from the run's estimator object, called
     as ``trainer.adapter.outcome_advantages`` calls it (the spec's ``row_source``, a fresh uid per prompt per step);
     ``otb`` also gets ``old_log_probs`` and verl's ``calculate_sum_pi_squared_from_logits`` of the pre-update logits;
  4. ``ppo_mini_batches`` AdamW steps on ``compute_policy_loss_vanilla`` (PPO-clip, token-mean) + ``kl_coef`` *
     ``kl_penalty(..., "low_var_kl")`` to the frozen warm start, gradients clipped at ``grad_clip``.

Token log-probabilities: verl's ``logprobs_from_logits_naive`` (``logprobs_from_logits`` without its CPU loop).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import agg_loss, get_adv_estimator_fn, get_policy_loss_fn, kl_penalty
from verl.utils.torch_functional import (
    calculate_sum_pi_squared_from_logits,
    entropy_from_logits,
    logprobs_from_logits_naive,
    masked_mean,
)
from verl.workers.config.actor import ActorConfig

from ebpo_verl.algos import registry
from ebpo_verl.algos.estimator import Estimator
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.study.policy import TinyPolicy, exact_pass_at_1, sample
from ebpo_verl.study.tasks import TOPICS, ProblemSet, verify

ORDERS = ("random", "topic", "difficulty")
KL_PROBE = 32


@dataclass(frozen=True)
class Variant:
    """A study name: a registry estimator with option overrides (:data:`VARIANTS`)."""

    spec: EstimatorSpec
    overrides: dict = field(default_factory=dict)

    @property
    def verl_name(self) -> str:
        return self.spec.registered_name


VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo_bn": ("ebpo", {"shrinkage": 0.0}),
    "ebpo_s025": ("ebpo", {"shrinkage": 0.25}),
    "ebpo_s05": ("ebpo", {"shrinkage": 0.5}),
    "ebpo_s075": ("ebpo", {"shrinkage": 0.75}),
    "ebpo_s1": ("ebpo", {"shrinkage": 1.0}),  # batch-whitened reward, close to verl's reinforce_plus_plus
    "ebpo_glob": ("ebpo", {"shrinkage": 1.0, "norm": "group"}),  # A = (r - mu_glob) / sigma_glob
    "ebpo_debiased": ("ebpo", {"tau2": "debiased"}),
    "ebpo_decay095": ("ebpo", {"decay": 0.95}),
    "ebpo_batch": ("ebpo", {"stats_scope": "batch"}),
    "ebpo_bb": ("ebpo", {"prior": "beta_binomial"}),
    "ebpo_topic": ("ebpo", {"cluster_key": "topic"}),
    "ha_dw_authors": ("ha_dw", {"form": "authors_code"}),
}
"""The study's extra names: study name -> (registered estimator, option overrides), listed after that estimator."""


ESTIMATORS: dict[str, Variant] = {
    name: Variant(spec, dict(VARIANTS[name][1]) if name in VARIANTS else {})
    for base, spec in registry.estimators().items()
    for name in (base, *(v for v, (b, _) in VARIANTS.items() if b == base))
}
"""The study's names in the registry's order, each followed by its variants: verl's own (``otb`` is verl's Optimal
Token Baseline, arXiv 2602.07078), ours and their variants (``grpo_bn``: EBPO with S = 0, ...)."""
ROW_FIELDS = ("topic", "index")
"""The ``extra_info`` fields a study row carries: its topic and its problem's index (``spo``'s and ``dbb``'s key)."""
SPLITS = ("test", "validation")


@dataclass(frozen=True)
class RLConfig:
    """One RL run. The sample budget per step is fixed (``responses_per_step``), so G trades prompts for
    responses per prompt at equal compute."""

    estimator: str
    group_size: int
    order: str = "random"
    seed: int = 0
    steps: int = 40
    responses_per_step: int = 128
    ppo_mini_batches: int = 2
    lr: float = 3e-4
    clip_ratio: float = 0.2
    kl_coef: float = 0.001
    grad_clip: float = 1.0
    eval_every: int = 5
    split: str = "test"  # the held-out split the accuracy is measured on: test, or validation (lr tuning)

    def __post_init__(self):
        for what, allowed in (("estimator", sorted(ESTIMATORS)), ("split", SPLITS), ("order", ORDERS)):
            if getattr(self, what) not in allowed:
                raise ValueError(f"unknown {what} {getattr(self, what)!r}; choose from {allowed}")
        if self.group_size < 2 or self.responses_per_step % self.group_size:
            raise ValueError(
                f"group_size {self.group_size} must be >= 2 and divide responses_per_step {self.responses_per_step}"
            )

    @property
    def prompts_per_step(self) -> int:
        return self.responses_per_step // self.group_size


def warm_start(model: TinyPolicy, data: ProblemSet, steps: int, seed: int, misconception: float = 0.0) -> None:
    """Supervised warm start: ``steps`` AdamW steps (lr 3e-3, cosine) of cross-entropy on answer + EOS, 128 prompts
    each, a ``misconception`` share misconceived. Short: pass rates spread over 0..1 (like a base model)."""
    g, batch_size = torch.Generator().manual_seed(seed), 128
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    tmask = data.target_mask.float()
    for _ in range(steps):
        idx = torch.randint(len(data), (batch_size,), generator=g)
        targets = data.targets[idx]
        if misconception > 0:
            wrong = torch.rand(batch_size, generator=g) < misconception
            targets = torch.where(wrong[:, None], data.misconception[idx], targets)
        logits = model.response_logits(data.prompts[idx], targets)
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        loss = agg_loss(nll, tmask[idx], "token-mean")
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def order_stream(train: ProblemSet, cfg: RLConfig, base_pass: np.ndarray) -> np.ndarray:
    """Indices of the ``steps * prompts_per_step`` training prompts in order: random (seeded shuffle), topic (the same
    draw by seeded topic order) or difficulty (easy -> hard by warm-start pass rate: the paper.s curriculum)."""
    rng = np.random.default_rng(cfg.seed)
    n = cfg.steps * cfg.prompts_per_step
    draw = np.concatenate([rng.permutation(len(train)) for _ in range(-(-n // len(train)))])[:n]
    if cfg.order == "topic":
        rank = {t: i for i, t in enumerate(rng.permutation(TOPICS))}
        draw = draw[np.argsort([rank[t] for t in train.topic[draw]], kind="stable")]
    elif cfg.order == "difficulty":
        draw = draw[np.argsort(-base_pass[draw], kind="stable")]
    return draw


OTB = "optimal_token_baseline"


@torch.no_grad()
def sum_pi_squared(model: TinyPolicy, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """(bs, L) sum of squared next-token probabilities per response position, by verl's own function."""
    return calculate_sum_pi_squared_from_logits(model.response_logits(prompts, responses))


def _row_values(spec: EstimatorSpec, options: Any, index: np.ndarray, fields: dict[str, np.ndarray]) -> Any:
    """What ``spec`` with ``options`` reads per row (its ``row_source``): each row's place in its group (rows in
    sampling order, G per prompt), its field of ``fields`` (the study's ``extra_info``), or None."""
    source = spec.row_source(options)
    if source is None:
        return None
    if source.sample_index:
        return np.arange(len(index)) % (len(index) // len(set(index.tolist())))
    if source.field not in fields:
        raise ValueError(f"{spec.section}.{spec.row_key}={source.field!r}: the study's rows carry only {ROW_FIELDS}")
    return fields[source.field]


def _advantages(
    est: Variant,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: np.ndarray,
    topics: np.ndarray,
    problem_ids: np.ndarray,
    otb_inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
    estimate: Estimator | None = None,
) -> torch.Tensor:
    """(bs, L) advantages, outcome reward on the last response token: ours via ``estimate`` with the per-row values
    its options name; verl's by its registered function (``otb`` with ``otb_inputs``)."""
    maskf = mask.float()
    tlr = torch.zeros_like(maskf)
    tlr[torch.arange(len(rewards)), mask.sum(dim=1) - 1] = rewards
    if not est.spec.builtin:
        from ebpo_verl.trainer.adapter import outcome_advantages

        values = _row_values(est.spec, estimate.options, index, {"topic": topics, "index": problem_ids})
        return outcome_advantages(estimate, tlr, maskf, index, values)[0]
    inputs: dict[str, Any] = {"token_level_rewards": tlr, "response_mask": maskf, "index": index}
    if est.verl_name == "grpo":  # verl's grpo takes norm_adv_by_std_in_grpo, not config
        inputs["norm_adv_by_std_in_grpo"] = True
    else:
        inputs["config"] = OmegaConf.create({"adv_estimator": est.verl_name})
    if est.verl_name == OTB:
        if otb_inputs is None:
            raise ValueError("otb needs (old_log_probs, sum_pi_squared) of the sampled responses")
        inputs.update(old_log_probs=otb_inputs[0], sum_pi_squared=otb_inputs[1], rollout_is_weights=None)
    adv, _ = get_adv_estimator_fn(est.verl_name)(**inputs)
    return adv


@dataclass
class _Learner:
    """One run's state: estimator, trained model, frozen reference, optimizer, PPO-clip actor config, generator."""

    est: Variant
    estimate: Estimator | None
    model: TinyPolicy
    ref: TinyPolicy
    opt: torch.optim.Optimizer
    actor_cfg: ActorConfig
    gen: torch.Generator

    @classmethod
    def start(cls, base: TinyPolicy, cfg: RLConfig) -> _Learner:
        """``cfg``'s estimator (a new object), a trainable copy of ``base`` (itself the frozen reference) with AdamW at
        ``cfg.lr``, generators seeded by ``cfg.seed``."""
        est = ESTIMATORS[cfg.estimator]
        estimate = None if est.spec.builtin else registry.new_estimator(est.spec, est.overrides)
        torch.manual_seed(cfg.seed)
        gen = torch.Generator().manual_seed(cfg.seed)
        model = copy.deepcopy(base)
        actor_cfg = ActorConfig(
            strategy="fsdp",
            rollout_n=cfg.group_size,
            clip_ratio=cfg.clip_ratio,
            ppo_micro_batch_size_per_gpu=cfg.responses_per_step,
            use_torch_compile=False,
        )
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, foreach=True)
        return cls(est, estimate, model, base.eval(), opt, actor_cfg, gen)


POLICY_LOSS = get_policy_loss_fn("vanilla")
"""verl's PPO-clip loss (``compute_policy_loss_vanilla``)."""
UPDATE_KEYS = ("grad_norm", "clipped", "entropy", "kl_ref", "clipfrac")
"""What each mini-batch update logs (the step logs their means)."""
STEP_KEYS = ("reward", "zero_signal", "uniform_groups", *UPDATE_KEYS, "step_kl")
"""What every RL step logs."""


def _rl_step(learner: _Learner, cfg: RLConfig, train: ProblemSet, batch_ids: np.ndarray, step: int, log: dict) -> None:
    """One RL step on ``batch_ids``: sample, reward, advantages, ``ppo_mini_batches`` updates. Logs :data:`STEP_KEYS`,
    ``<name>/shrinkage_mean`` and ``<name>/frac_seen`` from the estimator's diagnostics."""
    p, g = len(batch_ids), cfg.group_size
    est, estimate, gen = learner.est, learner.estimate, learner.gen
    batch = train.subset(batch_ids)
    prompts = batch.prompts.repeat_interleave(g, dim=0)
    responses, mask, old_logp = sample(learner.model, batch.prompts, g, gen)
    rewards = verify(responses, batch.targets.repeat_interleave(g, dim=0))
    index = np.array([f"{step}-{i}" for i in range(p) for _ in range(g)], dtype=object)
    otb_inputs = (old_logp, sum_pi_squared(learner.model, prompts, responses)) if est.verl_name == OTB else None
    topics, problem_ids = np.repeat(batch.topic, g), np.repeat(batch_ids, g)
    adv = _advantages(est, rewards, mask, index, topics, problem_ids, otb_inputs, estimate)
    # a group gives no signal when every advantage of every response token is zero (OTB's vary by token)
    silent = ((adv.abs() < 1e-6) | ~mask).all(dim=1).view(p, g)
    log["zero_signal"].append(silent.all(dim=1).float().mean().item())
    log["uniform_groups"].append((rewards.view(p, g).std(dim=1) == 0).float().mean().item())
    log["reward"].append(rewards.mean().item())
    diagnostics, name = getattr(estimate, "diagnostics", {}), est.spec.name
    if f"{name}/shrinkage_mean" in diagnostics:
        log["shrinkage"].append(diagnostics[f"{name}/shrinkage_mean"])
    if f"{name}/frac_seen" in diagnostics:
        log.setdefault(f"{name}_frac_seen", []).append(diagnostics[f"{name}/frac_seen"])
    # cfg.ppo_mini_batches PPO-clip + KL updates; the step logs the means of the UPDATE_KEYS over them
    maskf = mask.float()
    with torch.no_grad():
        ref_logp = logprobs_from_logits_naive(learner.ref.response_logits(prompts, responses), responses)
    stats: dict[str, list[float]] = {k: [] for k in UPDATE_KEYS}
    for mb in torch.randperm(len(responses), generator=gen).chunk(cfg.ppo_mini_batches):
        logits = learner.model.response_logits(prompts[mb], responses[mb])
        logp = logprobs_from_logits_naive(logits, responses[mb])
        pg_loss, pg_metrics = POLICY_LOSS(
            old_logp[mb], logp, adv[mb], maskf[mb], loss_agg_mode="token-mean", config=learner.actor_cfg
        )
        kl_loss = agg_loss(kl_penalty(logp, ref_logp[mb], "low_var_kl"), maskf[mb], "token-mean")
        learner.opt.zero_grad()
        (pg_loss + cfg.kl_coef * kl_loss).backward()
        stats["grad_norm"].append(torch.nn.utils.clip_grad_norm_(learner.model.parameters(), cfg.grad_clip).item())
        stats["clipped"].append(float(stats["grad_norm"][-1] > cfg.grad_clip))  # the update was scaled down
        stats["entropy"].append(agg_loss(entropy_from_logits(logits.detach()), maskf[mb], "token-mean").item())
        stats["kl_ref"].append(kl_loss.item())
        stats["clipfrac"].append(pg_metrics["actor/pg_clipfrac"])
        learner.opt.step()
    with torch.no_grad():  # k3 estimate of KL(old || new) on the step's first KL_PROBE responses (sampled from old)
        rows = slice(0, KL_PROBE)
        new_logp = logprobs_from_logits_naive(
            learner.model.response_logits(prompts[rows], responses[rows]), responses[rows]
        )
    for k, v in stats.items():
        log[k].append(float(np.mean(v)))
    log["step_kl"].append(masked_mean(kl_penalty(old_logp[rows], new_logp, "low_var_kl"), maskf[rows]).item())


def run_rl(
    base: TinyPolicy,
    train: ProblemSet,
    heldout: ProblemSet,
    base_pass: np.ndarray,
    cfg: RLConfig,
    probe: ProblemSet | None = None,
) -> dict[str, np.ndarray]:
    """Train a copy of ``base`` with RL: per-step metrics, held-out accuracy curve, the final probe accuracy, the
    final per-prompt success probabilities (``heldout_pass_final``, ``train_pass_final``), which RL prompts the run
    saw (``train_seen``, 0/1) and the pass@1 gain on seen and unseen prompts."""
    learner = _Learner.start(base, cfg)
    stream = order_stream(train, cfg, base_pass)
    log: dict[str, list[float]] = {
        k: [] for k in (*STEP_KEYS, "eval_step", "accuracy", "probe_accuracy", "shrinkage", "heldout_pass_final")
    }

    def evaluate(step: int) -> None:
        log["eval_step"].append(step)
        p_heldout = exact_pass_at_1(learner.model, heldout)
        log["accuracy"].append(p_heldout.mean().item())
        if step == cfg.steps:  # only the final values are reported
            log["heldout_pass_final"] = p_heldout.tolist()
            if probe is not None:
                acc = exact_pass_at_1(learner.model, probe).mean().item()
                log["probe_accuracy"].append(acc)

    evaluate(0)
    p = cfg.prompts_per_step
    for step in range(1, cfg.steps + 1):
        _rl_step(learner, cfg, train, stream[(step - 1) * p : step * p], step, log)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            evaluate(step)
    train_pass = exact_pass_at_1(learner.model, train).numpy()
    gain = train_pass - base_pass  # on the RL prompts it saw / never saw
    seen = np.isin(np.arange(len(train)), stream)
    log["train_pass_final"], log["train_seen"] = train_pass.tolist(), seen.astype(float).tolist()
    log["train_seen_gain"] = [float(gain[seen].mean())]
    log["train_unseen_gain"] = [float(gain[~seen].mean()) if (~seen).any() else float("nan")]
    log["train_seen_fraction"] = [float(seen.mean())]
    return {k: np.asarray(v, dtype=float) for k, v in log.items()}
