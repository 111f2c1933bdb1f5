"""The glue to verl 0.9.1: options read once per value, one unknown-key message, the trainer's own estimator
object against verl's registry path, and a tripwire on the one verl method the trainer copies.

verl 0.9.1's v1 ``PPOTrainer._compute_advantage`` reads a fixed list of TransferQueue fields, so the actor's
``sum_pi_squared`` (verl's own Optimal Token Baseline) cannot reach the estimator through it:
:func:`ebpo_verl.trainer.ray_trainer.copied_compute_advantage` is a copy with that one field more, which also
runs the trainer's estimator object for our estimators (``adapter.advantage_step``). The copy is checked against
verl's method on the same rows in ``tests/test_otb_trainer.py``; the tripwire below also fails when verl's source
of the method changes, so the copy is re-read against it.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from ebpo_verl.algos.ebpo import EBPOOptions
from ebpo_verl.algos.registry import EstimatorSpec
from ebpo_verl.options.parsing import unknown_option_message

VERL_SOURCES = {
    # method: sha256 (first 16 hex digits) of inspect.getsource in verl 0.9.1
    "_compute_advantage": "2a4a2aa4a475b228",
}


@pytest.mark.parametrize("method", sorted(VERL_SOURCES))
def test_verl_methods_the_trainer_reimplements_are_unchanged(method):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    source = inspect.getsource(getattr(PPOTrainer, method))
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert digest == VERL_SOURCES[method], (
        f"verl's PPOTrainer.{method} changed (sha256 {digest}): compare it with "
        "copied_compute_advantage in "
        "ebpo_verl/trainer/ray_trainer.py, port the change, then record the new digest here"
    )


def test_the_registered_estimator_reads_its_options_once_per_value(monkeypatch):
    """Stock main_ppo: three steps on one ``algorithm`` node parse ``algorithm.ebpo`` once; an equal node built
    anew, or a plain dict with the same contents, reuses that parse (by value, not by object); changed contents
    are parsed again and take effect."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import ebpo_verl

    monkeypatch.setattr("ebpo_verl.trainer.run_options._LAST", {})
    ebpo_verl.get_state().reset()
    parses = []
    parse = EstimatorSpec.parse
    monkeypatch.setattr(EstimatorSpec, "parse", lambda entry, node: parses.append(entry.name) or parse(entry, node))
    fn = get_adv_estimator_fn("ebpo")
    rewards, mask = torch.tensor([[1.0], [0.0], [1.0], [1.0]]), torch.ones(4, 1)
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    node = {"algorithm": {"adv_estimator": "ebpo", "ebpo": {"shrinkage": 0.0, "norm": "none"}}}
    for _ in range(3):
        algorithm = OmegaConf.create(node).algorithm  # a new node object every step, equal contents
        adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=uids, config=algorithm)
    assert parses == ["ebpo"]
    np.testing.assert_allclose(adv[:, 0].numpy(), [0.5, -0.5, 0.0, 0.0])  # r - group mean (S = 0), unnormalised
    plain = {"shrinkage": 0.0, "norm": "none"}
    fn(token_level_rewards=rewards, response_mask=mask, index=uids, config={"ebpo": plain})
    assert parses == ["ebpo"]
    plain["shrinkage"] = 1.0  # baseline = the global running mean
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=uids, config={"ebpo": plain})
    assert parses == ["ebpo", "ebpo"] and not np.allclose(adv[:, 0].numpy(), [0.5, -0.5, 0.0, 0.0])
    from ebpo_verl.trainer.run_options import _LAST

    assert list(_LAST) == ["ebpo"] and _LAST["ebpo"][1].fixed_shrinkage == 1.0  # the last value only: bounded


def test_one_unknown_key_message_for_every_layer():
    """The options' own parse, the pre-flight and the composition give the same did-you-mean line."""
    from ebpo_verl.algos.baselines import SPOOptions
    from ebpo_verl.main import compose
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.run_options import RunOptions

    text = "unknown option algorithm.ebpo.shrinkge; did you mean algorithm.ebpo.shrinkage? valid keys: "
    assert unknown_option_message("shrinkge", "algorithm.ebpo", ("prior", "shrinkage")).startswith(text)
    message = re.escape(text)
    with pytest.raises(ValueError, match=message):
        EBPOOptions.from_mapping({"shrinkge": 0.5})
    with pytest.raises(EBPOConfigError, match=message):
        RunOptions.from_config(OmegaConf.create({"algorithm": {"adv_estimator": "ebpo", "ebpo": {"shrinkge": 0.5}}}))
    with pytest.raises(EBPOConfigError, match=message):
        compose(["algorithm.ebpo.shrinkge=0.5"])
    spo = "unknown option algorithm.spo.rhoo; did you mean algorithm.spo.rho? valid keys: " + ", ".join(
        SPOOptions.keys()
    )
    with pytest.raises(ValueError, match=re.escape(spo)):
        SPOOptions.from_mapping({"rhoo": 0.5})
    with pytest.raises(EBPOConfigError, match=re.escape(spo)):
        RunOptions.from_config(OmegaConf.create({"algorithm": {"adv_estimator": "spo", "spo": {"rhoo": 0.5}}}))


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("ebpo", ["algorithm.ebpo.cluster_key=topic", "algorithm.ebpo.min_cluster_prompts=2"]),
        ("spo", ["algorithm.spo.rho=0.8"]),
        ("dbb", ["algorithm.dbb.discount=0.5"]),
        ("bnpo", []),
    ],
)
def test_the_trainers_own_estimator_equals_verls_registry_path(name, overrides, stand_in_trainer):
    """Three steps through ``adapter.advantage_step`` with the trainer's object (as its copy of verl's step calls
    it) and through the function registered with verl (the default instance, per-row keys passed as the study
    passes them) give the same advantages, returns, diagnostics and state, bit for bit."""
    from hydra import compose, initialize_config_dir
    from verl import DataProto
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import ebpo_verl
    from ebpo_verl.trainer.adapter import DEFAULT_ESTIMATORS, advantage_step

    with initialize_config_dir(
        config_dir=str(Path(ebpo_verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        config = compose("ebpo_trainer", overrides=[f"algorithm.adv_estimator={name}", *overrides])
    trainer = stand_in_trainer(config)
    default = DEFAULT_ESTIMATORS[name]
    default.reset()
    rng = np.random.default_rng(5)
    for step in range(3):
        prompts = rng.choice(6, size=4, replace=False)
        uids = np.array([f"s{step}-{p}" for p in prompts for _ in range(3)] + ["pad0"], dtype=object)
        mask = torch.ones(len(uids), 2)
        mask[-1] = 0
        rewards = torch.zeros(len(uids), 2)
        rewards[:-1, 1] = torch.from_numpy(rng.integers(0, 2, len(uids) - 1)).float()
        by_uid = {f"s{step}-{p}": (f"t{p % 2}" if name == "ebpo" else p) for p in prompts}
        keys = np.array([by_uid.get(u) for u in uids], dtype=object)
        ours = DataProto.from_dict(
            tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uids}
        )
        row_values = keys if trainer.options.row_key else None
        ours.batch["advantages"], ours.batch["returns"], metrics = advantage_step(ours, trainer.estimator, row_values)
        verls = DataProto.from_dict(
            tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uids}
        )
        fn = get_adv_estimator_fn(name)
        extra = {"labels": keys} if name == "ebpo" else {"prompt_keys": keys} if name in ("spo", "dbb") else {}
        verls.batch["advantages"], verls.batch["returns"] = fn(rewards, mask, uids, config.algorithm, **extra)
        assert torch.equal(ours.batch["advantages"], verls.batch["advantages"])
        assert torch.equal(ours.batch["returns"], verls.batch["returns"])
        assert metrics == default.diagnostics and metrics
    if trainer.estimator.state is not None:
        assert trainer.estimator.state.state_dict() == default.state.state_dict()
    default.reset()
