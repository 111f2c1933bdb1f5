"""The TRL integration (ebpo_verl.integrations.trl): TRL's GRPOTrainer on the package's tiny model, on CPU.

The advantages TRL trains with are checked against a fresh package estimator fed the same rewards and prompt keys
(the verl path's call: float32 scores, one uid per group); a resume from a mid-run checkpoint against the
uninterrupted run; an all-fail group against TRL's own advantage (0); evaluate() against the state it must keep.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("trl", reason="the [trl] extra (in [test]) is not installed")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from ebpo_verl.algos import registry  # noqa: E402
from ebpo_verl.cpu.tiny import build_model, build_tokenizer  # noqa: E402
from ebpo_verl.integrations.trl import (  # noqa: E402
    EstimatorMixin,
    check_column,
    lookup,
    on_boundary,
    parse_options,
    row_field,
)

ROWS = 8
FAILING = {0, 1}  # prompts whose every completion scores 0: the all-fail groups of step 1


def reward(completions: list[str], extra_info: list[dict] | None = None, **kwargs: object) -> list[float]:
    """0 for the FAILING prompts, else a parity of the completion's characters (varied, deterministic)."""
    pairs = zip(completions, extra_info or [{"index": 0}] * len(completions), strict=True)
    return [0.0 if e["index"] in FAILING else float(sum(map(ord, c)) % 2) for c, e in pairs]


class Spy(GRPOTrainer):
    """Records TRL's own advantages of each generation (before the mixin replaces them)."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.trl_advantages.append(output["advantages"].clone())
        return output


class Recorded(EstimatorMixin, Spy):
    """The integration, recording each step's gathered rewards, keys and the advantages that reach the loss."""

    def __init__(self, *args, **kwargs):
        self.trl_advantages, self.steps, self.used = [], [], []
        super().__init__(*args, **kwargs)

    def estimate(self, rewards_per_func, keys, train):
        values = super().estimate(rewards_per_func, keys, train)
        if train:
            self.steps.append((rewards_per_func.clone(), None if keys is None else keys.copy()))
        return values

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.used.append(output["advantages"].clone())
        return output


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer(path)
    build_model(path, tokenizer)
    return path, tokenizer


def dataset(rows: int = ROWS) -> Dataset:
    return Dataset.from_list([{"prompt": f"What is {i} + 1?", "extra_info": {"index": i}} for i in range(rows)])


def trainer(tiny, out: Path, estimator: str, options=None, steps: int = 2, cls=Recorded, **config) -> GRPOTrainer:
    path, tokenizer = tiny
    settings = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=6, max_steps=steps)
    settings.update(report_to=[], logging_steps=1, save_strategy="no", use_cpu=True, seed=0)
    settings.update(config)
    args = GRPOConfig(output_dir=str(out), **settings)
    kw = {} if cls is Spy else {"estimator": estimator, "estimator_options": options}
    data = dataset()
    return cls(model=str(path), reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer, **kw)


KEYED = {"ebpo": None, "spo": {"prompt_key": "extra_info.index"}, "dbb": {"prompt_key": "extra_info.index"}}
OURS = {
    **KEYED,
    "bnpo": None,
    "shrinkage_js": None,
    "jspo": None,
    "jspo_history": None,
    "ha_dw": None,
    "krpo": None,  # the sample index: each completion's place in its group (TRL's are in sample order)
    "running_norm": None,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OURS))
def test_advantages_equal_the_package_estimator_on_the_same_rewards(tiny, tmp_path, name):
    assert set(OURS) == set(registry.ours())  # every estimator of the package's own is covered
    t = trainer(tiny, tmp_path, name, OURS[name], steps=2)
    t.train()
    fresh = registry.new_estimator(lookup(name), parse_options(lookup(name), OURS[name]))
    assert len(t.steps) == len(t.used) == 2
    for step, ((rewards, keys), used) in enumerate(zip(t.steps, t.used, strict=True)):
        scores = rewards[:, 0].to(torch.float32)  # one reward function, weight 1: verl's summed token rewards
        index = np.asarray([f"uid{i // 2}" for i in range(len(scores))], dtype=object)
        expected = fresh(scores, index, torch.ones(len(scores), dtype=torch.bool), keys).values
        torch.testing.assert_close(used, expected.to(torch.float32), rtol=1e-6, atol=1e-6, msg=f"step {step + 1}")
        if name == "krpo":  # with its defaults krpo walks each group in TRL's order: the hand-ordered reference
            rows = registry.new_estimator("krpo", {"order": "rows"})(scores, index, torch.ones(len(scores)).bool())
            torch.testing.assert_close(used, rows.values.to(torch.float32), rtol=1e-6, atol=1e-6)
    assert sum(used.abs().sum() for used in t.used) > 0  # the check sees non-trivial advantages
    if fresh.state is not None:
        assert t.estimator.state.state_dict() == fresh.state.state_dict()
    logged = [k for k in t.state.log_history[1] if k.split("/")[0] == name]
    assert sorted(logged) == sorted(fresh.diagnostics), t.state.log_history[1]


@pytest.mark.slow
def test_all_fail_group_gets_an_ebpo_advantage_where_trl_gives_zero(tiny, tmp_path):
    t = trainer(tiny, tmp_path, "ebpo", steps=1)
    t.train()
    (rewards, _), used, trl = t.steps[0], t.used[0], t.trl_advantages[0]
    failed = rewards[:, 0].view(-1, 2).sum(dim=1) == 0
    assert failed.any() and not failed.all(), rewards  # step 1 draws prompts 0..3 in some order: both kinds
    rows = failed.repeat_interleave(2)
    assert torch.all(trl[rows] == 0)
    assert torch.all(used[rows] < 0)  # shrunk towards the batch's success rate: below the group's 0 reward


@pytest.mark.slow
def test_resume_from_step_2_equals_the_uninterrupted_run(tiny, tmp_path):
    full = trainer(tiny, tmp_path / "full", "ebpo", steps=4, save_strategy="steps", save_steps=2)
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-2"
    saved = json.loads((checkpoint / "ebpo_state.json").read_text())
    assert saved["global_step"] == 2 and saved["state"] != full.estimator.state.state_dict()
    resumed = trainer(tiny, tmp_path / "resumed", "ebpo", steps=4, save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert len(resumed.used) == 2
    for a, b in zip(full.used[2:], resumed.used, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert resumed.estimator.state.state_dict() == full.estimator.state.state_dict()
    changed = trainer(tiny, tmp_path / "changed", "ebpo", {"prior": "beta_binomial"}, steps=4)
    with pytest.raises(ValueError, match=r"differs from the checkpoint's options .*prior"):
        changed.train(resume_from_checkpoint=str(checkpoint))


@pytest.mark.slow
def test_evaluate_changes_no_state(tiny, tmp_path):
    t = trainer(tiny, tmp_path, "ebpo", steps=1, per_device_eval_batch_size=4)
    t.train()
    before = copy.deepcopy(t.estimator.state.state_dict())
    metrics = t.evaluate(eval_dataset=dataset(4))
    assert t.estimator.state.state_dict() == before
    assert "eval_ebpo/mu_glob" in metrics, metrics


def test_options_are_checked_in_one_line():
    spec = lookup("ebpo")
    assert parse_options(spec, None) == spec.options_cls()
    assert parse_options(spec, {"decay": 0.5}).decay == 0.5
    with pytest.raises(ValueError, match="decay") as err:
        parse_options(spec, {"decay": -1})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="unknown estimator 'ebp'"):
        lookup("ebp")
    with pytest.raises(TypeError, match="EBPOOptions, a mapping or None"):
        parse_options(spec, 3)
    with pytest.raises(ValueError, match="grpo is verl's own estimator"):
        lookup("grpo")
    with pytest.raises(ValueError, match="estimator bnpo has no options"):
        parse_options(lookup("bnpo"), {"x": 1})
    with pytest.warns(RuntimeWarning, match="EBPO: "):  # options the mode ignores are named, as under verl
        parse_options(spec, {"stats_scope": "batch", "decay": 0.5})


def test_row_columns_top_level_or_dotted_and_unique():
    row = {"id": 7, "extra_info": {"index": 3}, "a.b": 1}
    assert (row_field(row, "id"), row_field(row, "extra_info.index"), row_field(row, "a.b")) == (7, 3, 1)
    with pytest.raises(KeyError):
        row_field(row, "extra_info.missing")
    check_column(dataset(), "extra_info.index", True, "spo.prompt_key")
    with pytest.raises(ValueError, match="rows 0 and 1 share the value 'What is 0"):
        check_column([{"p": "What is 0"}, {"p": "What is 0"}], "p", True, "spo.prompt_key")
    check_column([{"p": "x"}, {"p": "x"}], "p", False, "ebpo.cluster_key")  # a label may repeat
    with pytest.raises(ValueError, match="spo.prompt_key='index': row 0 of the training set has no such column"):
        check_column(dataset(), "index", True, "spo.prompt_key")


def test_generation_boundaries():
    args = GRPOConfig(output_dir="unused", gradient_accumulation_steps=2, num_iterations=3, report_to=[], use_cpu=True)
    assert args.steps_per_generation == 2  # TRL's default: one generation per optimizer step, reused 3 times
    assert [on_boundary(s, args) for s in range(1, 7)] == [False, False, True, False, False, True]


@pytest.mark.slow
def test_the_trainer_refuses_what_it_cannot_replace(tiny, tmp_path):
    with pytest.raises(ValueError, match="use multi_objective_aggregation='sum_then_normalize'"):
        trainer(tiny, tmp_path, "ebpo", multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match="save_steps=1 is not a multiple of the generation block"):
        trainer(tiny, tmp_path, "ebpo", save_strategy="steps", save_steps=1, num_iterations=2)
    with pytest.raises(ValueError, match="spo.prompt_key='index': row 0"):
        trainer(tiny, tmp_path, "spo")


def test_the_example_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    from ebpo_verl.integrations.trl_example import main

    (tmp_path / "x").write_text("")
    for argv, expected in (
        (["--out", str(tmp_path / "new"), "--steps", "3"], "--steps must be an even number >= 4, not 3"),
        (["--out", str(tmp_path)], "is not empty: name a new folder"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and expected in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.slow
def test_the_example_trains_saves_and_resumes(tmp_path, capsys):
    from ebpo_verl.integrations.trl_example import main

    assert main(["--out", str(tmp_path / "ex")]) == 0
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if "ebpo/mu_glob=" in line] == [
        f"step {i}" for i in range(1, 5)
    ]
    assert "EBPO state equals the uninterrupted run's" in out
    assert (tmp_path / "ex" / "run" / "checkpoint-2" / "ebpo_state.json").is_file()


TWO_RANKS = """
import json, sys
from pathlib import Path
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig
from ebpo_verl.integrations.trl import EstimatorGRPOTrainer

out, model = Path(sys.argv[1]), sys.argv[2]
def reward(completions, extra_info, **kw):
    return [0.0 if e["index"] < 2 else float(sum(map(ord, c)) % 2) for c, e in zip(completions, extra_info)]
rows = [{"prompt": f"What is {i} + 1?", "extra_info": {"index": i}} for i in range(8)]
args = GRPOConfig(output_dir=str(out / "run"), per_device_train_batch_size=2, num_generations=2, max_steps=2,
                  max_completion_length=6, save_strategy="steps", save_steps=2, report_to=[], use_cpu=True, seed=0)
t = EstimatorGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=AutoTokenizer.from_pretrained(model), estimator="spo",
                         estimator_options={"prompt_key": "extra_info.index"})
t.train()
state = {"world": t.accelerator.num_processes, "state": t.estimator.state.state_dict()}
(out / f"state{t.accelerator.process_index}.json").write_text(json.dumps(state))
"""


@pytest.mark.slow
@pytest.mark.heavy
def test_two_processes_on_gloo_end_with_the_same_state(tiny, tmp_path):
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


def test_without_the_verl_extra_ebpo_train_and_register_name_it_in_one_line():
    import subprocess
    import sys

    hide = (
        "import importlib.util as u, sys\n"
        "real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name in ('verl', 'ray', 'hydra', 'omegaconf') else real(name, *a)\n"
    )
    train = subprocess.run([sys.executable, "-c", hide + "import ebpo_verl.main"], capture_output=True, text=True)
    assert train.returncode == 2 and train.stderr.splitlines() == [
        "ebpo-train: error: ebpo-train needs the 'verl' extra (verl, ray, hydra, omegaconf not installed): "
        "pip install 'ebpo-verl[verl]'"
    ]
    plugin = subprocess.run([sys.executable, "-c", hide + "import ebpo_verl; ebpo_verl.register()"], text=True,
                            capture_output=True)  # fmt: skip
    assert plugin.returncode == 1 and plugin.stderr.splitlines()[-1].endswith(
        "the verl plugin (ebpo_verl.register) needs the 'verl' extra (verl, ray, omegaconf not installed): "
        "pip install 'ebpo-verl[verl]'"
    )


@pytest.mark.slow
def test_an_evaluation_set_without_the_prompt_key_is_refused_in_one_line(tiny, tmp_path):
    t = trainer(tiny, tmp_path, "spo", KEYED["spo"], per_device_eval_batch_size=4)
    with pytest.raises(ValueError, match=r"evaluation batch has no column 'extra_info.index' \(spo.prompt_key\)"):
        t.evaluate(eval_dataset=Dataset.from_list([{"prompt": f"What is {i} + 1?"} for i in range(4)]))
    assert t.estimator.state.state_dict()["keys"] == []
