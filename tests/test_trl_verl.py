"""The TRL integration against verl (both extras, as in [test]): the advantages TRL trains with equal verl's
registered function (``get_adv_estimator_fn``) fed the same rewards and prompt keys (float32 scores, one uid per
group), for every estimator of the registry; two processes on gloo, each rank's slice against verl's function.

Skipped without verl: in a ``[trl]``-only install tests/test_trl.py is the part that runs (CI runs it there once, in
the wheel's ``[trl]`` venv, and this file in the main venv: .ci/run).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("trl", reason="the [trl] extra (in [test]) is not installed")
pytest.importorskip("verl", reason="the comparisons with verl need the [verl] extra (pip install -e '.[test]')")

from ebpo_verl.algos import registry  # noqa: E402
from ebpo_verl.integrations.trl import lookup  # noqa: E402
from tests import trl_support  # noqa: E402
from tests.trl_support import options_of  # noqa: E402

tiny, runs = trl_support.tiny, trl_support.runs  # the shared fixtures


def verl_advantages(name: str, rewards: torch.Tensor, keys: np.ndarray | None) -> torch.Tensor:
    """verl's registered function of ``name`` on one step: float32 scores as the last token's reward, a uid per
    group of 2, ``name``'s options in ``algorithm.<name>``, the prompt keys as the per-row field."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    spec = registry.get(name)
    rows = len(rewards)
    token_rewards = torch.zeros(rows, 3)
    token_rewards[:, -1] = rewards.to(torch.float32)
    index = np.asarray([f"uid{i // 2}" for i in range(rows)], dtype=object)
    node = {"adv_estimator": spec.registered_name}
    if spec.options_cls is not None:
        node[name] = options_of(name, verl=True) or {}
    row = {spec.row_kwarg: keys} if keys is not None else {}
    fn = get_adv_estimator_fn(spec.registered_name)
    advantages, _ = fn(token_rewards, torch.ones(rows, 3), index, config=OmegaConf.create(node), **row)
    return advantages[:, 0]


def reset_verls_estimators() -> None:
    """verl's per-process estimator objects (behind its registered functions) back to a fresh state."""
    import ebpo_verl
    from ebpo_verl.trainer.adapter import DEFAULT_ESTIMATORS

    ebpo_verl.register()
    for default in DEFAULT_ESTIMATORS.values():
        default.reset()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(registry.ours()))
def test_advantages_equal_verls_registered_function(runs, name):
    from ebpo_verl.trainer.adapter import DEFAULT_ESTIMATORS

    t = runs(name)
    reset_verls_estimators()
    assert len(t.steps) == len(t.used) == 2
    for step, ((rewards, keys), used) in enumerate(zip(t.steps, t.used, strict=True)):
        expected = verl_advantages(name, rewards[:, 0], keys)  # one reward function, weight 1
        torch.testing.assert_close(used, expected, rtol=1e-6, atol=1e-6, msg=f"step {step + 1}")
    assert sum(used.abs().sum() for used in t.used) > 0  # the check sees non-trivial advantages
    if registry.get(name).stateful:
        assert t.estimator.state.state_dict() == DEFAULT_ESTIMATORS[name].state.state_dict()
    rewards, keys = t.steps[0]  # the diagnostics TRL logged are the package estimator's, by name
    index = np.asarray([f"uid{i // 2}" for i in range(len(rewards))], dtype=object)
    fresh = registry.new_estimator(lookup(name), options_of(name, verl=True))
    diagnostics = fresh(rewards[:, 0], index, torch.ones(len(rewards), dtype=torch.bool), keys).diagnostics
    logged = [k for k in t.state.log_history[0] if k.split("/")[0] == name]
    assert sorted(logged) == sorted(diagnostics), t.state.log_history[0]


TWO_RANKS = """
import json, sys
from pathlib import Path
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig
from ebpo_verl.integrations.trl import EstimatorGRPOTrainer

class Recorded(EstimatorGRPOTrainer):
    def estimate(self, rewards_per_func, keys, train):
        values = super().estimate(rewards_per_func, keys, train)
        self.steps.append({"rewards": rewards_per_func[:, 0].tolist(), "keys": keys.tolist()})
        return values

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.steps[-1]["local"] = output["advantages"].tolist()
        return output

out, model = Path(sys.argv[1]), sys.argv[2]
def reward(completions, extra_info, **kw):
    return [0.0 if e["index"] < 2 else float(sum(map(ord, c)) % 2) for c, e in zip(completions, extra_info)]
rows = [{"prompt": f"What is {i} + 1?", "extra_info": {"index": i}} for i in range(8)]
args = GRPOConfig(output_dir=str(out / "run"), per_device_train_batch_size=2, num_generations=2, max_steps=2,
                  max_completion_length=6, save_strategy="steps", save_steps=2, report_to=[], use_cpu=True, seed=0)
t = Recorded(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
             processing_class=AutoTokenizer.from_pretrained(model), estimator="spo",
             estimator_options={"prompt_key": "extra_info.index"})
t.steps = []
t.train()
state = {"world": t.accelerator.num_processes, "state": t.estimator.state.state_dict(), "steps": t.steps}
(out / f"state{t.accelerator.process_index}.json").write_text(json.dumps(state))
"""


@pytest.mark.slow
@pytest.mark.heavy
def test_two_processes_on_gloo_each_take_their_slice_and_end_with_the_same_state(tiny, tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run([*command, str(script), str(tmp_path), str(tiny[0])], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"state{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    assert ranks[0]["state"] == ranks[1]["state"]
    assert len(ranks[0]["state"]["keys"]) == 4  # 2 steps x 2 prompts, one from each rank: both were gathered
    saved = json.loads((tmp_path / "run" / "checkpoint-2" / "spo_state.json").read_text())
    assert saved["state"] == ranks[0]["state"]
    reset_verls_estimators()
    distinct = 0  # steps where the two ranks' slices differ: a rank taking the other's rows would be seen
    for step, (a, b) in enumerate(zip(ranks[0]["steps"], ranks[1]["steps"], strict=True)):
        assert (a["rewards"], a["keys"]) == (b["rewards"], b["keys"]), step  # the same gathered rewards and keys
        keys = np.asarray(a["keys"], dtype=object)
        expected = verl_advantages("spo", torch.tensor(a["rewards"], dtype=torch.float64), keys)
        assert len(a["local"]) == len(b["local"]) == len(expected) // 2 == 2
        for rank, slice_ in ((0, a["local"]), (1, b["local"])):  # each rank trains on its own rows' advantages
            want = expected[2 * rank : 2 * rank + 2]
            torch.testing.assert_close(torch.tensor(slice_), want, rtol=1e-6, atol=1e-6, msg=f"{step} rank {rank}")
        distinct += not torch.equal(expected[:2], expected[2:])
    assert distinct > 0
