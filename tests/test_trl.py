"""The TRL integration (ebpo_verl.integrations.trl): TRL's GRPOTrainer on the package's tiny model, on CPU.

The advantages TRL trains with are checked, for every estimator of the registry, against verl's registered function
(``get_adv_estimator_fn``) fed the same rewards and prompt keys (float32 scores, one uid per group); a resume of
every stateful estimator, and resumes from saves inside TRL's generation blocks (accumulation with an epoch's
shorter last update, epoch saves, a fractional ``save_steps``, the final save, ``num_iterations`` 2), against the
uninterrupted run, micro-step by micro-step; an all-fail group against TRL's own advantage (0); evaluate() against
the state it must keep; two processes on gloo, each rank's slice.
"""

from __future__ import annotations

import copy
import json
import shutil
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
    BLOCK_FILE,
    BUFFER_FILE,
    EstimatorMixin,
    block_settings,
    check_column,
    load_block,
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
        self.trl_advantages, self.steps, self.used, self.micro = [], [], [], []
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

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training:  # the slice of the block each training micro-step takes to the loss
            self.micro.append(inputs["advantages"].clone())
        return inputs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer(path)
    build_model(path, tokenizer)
    return path, tokenizer


def dataset(rows: int = ROWS) -> Dataset:
    return Dataset.from_list([{"prompt": f"What is {i} + 1?", "extra_info": {"index": i}} for i in range(rows)])


def trainer(tiny, out: Path, estimator: str, options=None, steps: int = 2, cls=Recorded, rows: int = ROWS, **config):
    path, tokenizer = tiny
    settings = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=6, max_steps=steps)
    settings.update(report_to=[], logging_steps=1, save_strategy="no", use_cpu=True, seed=0)
    settings.update(config)
    args = GRPOConfig(output_dir=str(out), **settings)
    kw = {} if cls is Spy else {"estimator": estimator, "estimator_options": options}
    data = dataset(rows)
    return cls(model=str(path), reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer, **kw)


VERL_OVERRIDES = {"krpo": {"order": "rows"}}
"""Stock verl passes no rollout sample index, so its ``krpo`` walks the rows as given; TRL's ``krpo`` runs with its
defaults (each completion's place in its group, the same walk): equal, as the test below checks."""


def options_of(name: str, verl: bool = False) -> dict | None:
    """The options a test runs ``name`` with: a prompt key where the estimator tracks prompts (``extra_info.index``),
    with ``verl`` the VERL_OVERRIDES; None (the defaults) otherwise."""
    spec = registry.get(name)
    options = {spec.row_key: "extra_info.index"} if spec.unique_row_key else {}
    options.update(VERL_OVERRIDES.get(name, {}) if verl else {})
    return options or None


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


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    """``runs(name)``: a 2-step run of ``name`` (checkpoints 1 and 2 for a stateful one), trained once per module."""
    done: dict[str, GRPOTrainer] = {}

    def run(name: str) -> GRPOTrainer:
        if name not in done:
            save = {"save_strategy": "steps", "save_steps": 1} if registry.get(name).stateful else {}
            done[name] = trainer(tiny, tmp_path_factory.mktemp(name), name, options_of(name), steps=2, **save)
            done[name].train()
        return done[name]

    return run


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


@pytest.mark.slow
@pytest.mark.parametrize("name", list(registry.stateful()))
def test_resume_from_step_1_equals_the_uninterrupted_run(tiny, tmp_path, runs, name):
    full = runs(name)
    checkpoint = Path(full.args.output_dir) / "checkpoint-1"
    saved = json.loads((checkpoint / registry.get(name).state.file).read_text())
    assert saved["global_step"] == 1 and saved["state"] != full.estimator.state.state_dict()
    resumed = trainer(tiny, tmp_path, name, options_of(name), steps=2)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert len(resumed.used) == 1
    torch.testing.assert_close(resumed.used[0], full.used[1], rtol=0, atol=0)
    assert resumed.estimator.state.state_dict() == full.estimator.state.state_dict()


@pytest.mark.slow
def test_a_missing_state_file_is_refused_or_starts_fresh_as_the_option_says(tiny, tmp_path, runs):
    full = runs("ebpo")
    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(Path(full.args.output_dir) / "checkpoint-1", checkpoint)
    (checkpoint / "ebpo_state.json").unlink()
    refused = trainer(tiny, tmp_path / "refused", "ebpo", steps=2)
    with pytest.raises(ValueError, match="has no ebpo_state.json") as err:
        refused.train(resume_from_checkpoint=str(checkpoint))
    assert "\n" not in str(err.value) and refused.used == []
    fresh = trainer(tiny, tmp_path / "fresh", "ebpo", {"on_resume_mismatch": "reset"}, steps=2)
    with pytest.warns(RuntimeWarning, match="no ebpo_state.json .* start FRESH at step 1"):
        fresh.train(resume_from_checkpoint=str(checkpoint))
    alone = registry.new_estimator("ebpo")  # step 2's rewards only
    (rewards, keys), used = fresh.steps[0], fresh.used[0]
    valid = torch.ones(len(rewards), dtype=torch.bool)
    index = np.asarray([f"uid{i // 2}" for i in range(len(rewards))], dtype=object)
    expected = alone(rewards[:, 0].to(torch.float32), index, valid, keys).values
    torch.testing.assert_close(used, expected.to(torch.float32), rtol=1e-6, atol=1e-6)
    assert fresh.estimator.state.state_dict() == alone.state.state_dict() != full.estimator.state.state_dict()
    changed = trainer(tiny, tmp_path / "changed", "ebpo", {"prior": "beta_binomial"}, steps=2)
    with pytest.raises(ValueError, match=r"differs from the checkpoint's options .*prior"):
        changed.train(resume_from_checkpoint=str(Path(full.args.output_dir) / "checkpoint-1"))


# Generation blocks: 3 prompts x 2 completions generated once per epoch (steps_per_generation 3, a block of 3
# micro-batches of 2), accumulation 2: each epoch is an update of 2 micro-batches and a shorter one of 1, so optimizer
# step s ends micro-step 3 * (s // 2) + 2 * (s % 2), not 2 * s. A constant learning rate, so that runs of different
# max_steps share their first steps; TRL's prompt order unshuffled, as its sampler draws one order per epoch from a
# generator that a resume does not advance past the skipped epochs (docs/trl.md, Limits).
BLOCKS = dict(rows=3, per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=3,
              lr_scheduler_type="constant", shuffle_dataset=False)  # fmt: skip


def micro_step(checkpoint: Path) -> int:
    return json.loads((checkpoint / BLOCK_FILE).read_text())["micro_step"]


def assert_resumes_exactly(full: GRPOTrainer, resumed: GRPOTrainer, micro: int) -> None:
    """``resumed`` (from ``full``'s micro-step ``micro``) took the same advantages to every later micro-step and
    ended with the same state."""
    assert len(resumed.micro) == len(full.micro) - micro > 0
    for i, (a, b) in enumerate(zip(full.micro[micro:], resumed.micro, strict=True)):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=f"micro-step {micro + i + 1}")
    assert resumed.estimator.state.state_dict() == full.estimator.state.state_dict()


@pytest.fixture(scope="module")
def blocks_full(tiny, tmp_path_factory):
    """6 steps (3 epochs, 9 micro-steps, 3 blocks) saved at a fractional save_steps=0.5: steps 3 and 6."""
    t = trainer(tiny, tmp_path_factory.mktemp("blocks"), "ebpo", steps=6, save_strategy="steps", save_steps=0.5,
                **BLOCKS)  # fmt: skip
    t.train()
    return t


@pytest.mark.slow
def test_a_save_inside_a_block_of_an_uneven_epoch_resumes_exactly(tiny, tmp_path, blocks_full):
    full, out = blocks_full, Path(blocks_full.args.output_dir)
    assert len(full.micro) == 9 and len(full.used) == 3
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]  # 0.5 x 6 steps
    assert (micro_step(out / "checkpoint-3"), micro_step(out / "checkpoint-6")) == (5, 9)  # not 2 x 3 = 6
    assert (out / "checkpoint-3" / BUFFER_FILE.format(0)).is_file()  # inside block 2: its completions are kept
    assert not (out / "checkpoint-6" / BUFFER_FILE.format(0)).exists()  # a block's end: TRL generates anew
    resumed = trainer(tiny, tmp_path, "ebpo", steps=6, **BLOCKS)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-3"))
    assert len(resumed.used) == 1  # block 3 only: block 2 is continued, not regenerated
    assert_resumes_exactly(full, resumed, 5)


@pytest.mark.slow
def test_epoch_saves_and_the_final_save_resume_exactly(tiny, tmp_path, blocks_full):
    short = trainer(tiny, tmp_path / "short", "ebpo", steps=5, save_strategy="epoch", **BLOCKS)
    short.train()
    out = tmp_path / "short"
    assert [micro_step(out / f"checkpoint-{s}") for s in (2, 4, 5)] == [3, 6, 8]  # epoch ends; the final save
    assert all(torch.equal(a, b) for a, b in zip(short.micro, blocks_full.micro[:8], strict=True))
    for step, micro in ((4, 6), (5, 8)):
        resumed = trainer(tiny, tmp_path / f"resumed{step}", "ebpo", steps=6, **BLOCKS)
        resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{step}"))
        assert_resumes_exactly(blocks_full, resumed, micro)


@pytest.mark.slow
def test_two_iterations_per_block_resume_exactly_from_inside_a_block(tiny, tmp_path):
    iterations = dict(num_iterations=2, save_strategy="steps", save_steps=1, lr_scheduler_type="constant")
    full = trainer(tiny, tmp_path / "full", "ebpo", steps=4, **iterations)
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-3"
    assert len(full.used) == 2 and micro_step(checkpoint) == 3
    resumed = trainer(tiny, tmp_path / "resumed", "ebpo", steps=4, **iterations)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.used == []  # the second pass over block 2, from the saved block
    assert_resumes_exactly(full, resumed, 3)
    changed = trainer(tiny, tmp_path / "changed", "ebpo", steps=4, **{**iterations, "num_iterations": 3})
    with pytest.raises(ValueError, match=r"trl_block.json: num_iterations 2 -> 3 since the save") as err:
        changed.train(resume_from_checkpoint=str(checkpoint))
    assert "\n" not in str(err.value)
    (checkpoint / BUFFER_FILE.format(0)).unlink()
    lost = trainer(tiny, tmp_path / "lost", "ebpo", steps=4, **iterations)
    with pytest.raises(ValueError, match=r"trl_block_rank0.pt is missing: the checkpoint lies inside a generation"):
        lost.train(resume_from_checkpoint=str(checkpoint))


class Planted:
    """Unpickling it would call ``Path.touch`` on ``<cwd>/planted``."""

    def __reduce__(self):
        return (Path.touch, (Path("planted"),))


def test_a_bad_block_file_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = {"gradient_accumulation_steps": 2, "steps_per_generation": 3, "num_iterations": 1, "processes": 1}
    with pytest.raises(ValueError, match="trl_block.json is missing: resume from a checkpoint written by"):
        load_block(str(tmp_path), settings, 0, "cpu")
    for text, expected in (
        ("{", "is not valid JSON"),
        ("[" * 100000, "is not valid JSON"),
        (json.dumps({**settings, "micro_step": 4.0}), "is malformed: expected non-negative integers"),
        (json.dumps({**settings, "micro_step": -1}), "is malformed"),
        (json.dumps({**settings, "micro_step": True}), "is malformed"),
        (json.dumps(settings), "is malformed"),
    ):
        (tmp_path / BLOCK_FILE).write_text(text)
        with pytest.raises(ValueError, match=expected) as err:
            load_block(str(tmp_path), settings, 0, "cpu")
        assert "\n" not in str(err.value)
    (tmp_path / BLOCK_FILE).write_text(json.dumps({**settings, "micro_step": 6}))
    assert load_block(str(tmp_path), settings, 0, "cpu") == (6, None)  # a block's end: nothing else is read
    (tmp_path / BLOCK_FILE).write_text(json.dumps({**settings, "micro_step": 7}))
    torch.save({"not": "a block"}, tmp_path / BUFFER_FILE.format(0))
    with pytest.raises(ValueError, match="is malformed: expected a list of steps_per_generation=3 batches"):
        load_block(str(tmp_path), settings, 0, "cpu")
    torch.save([Planted()] * 3, tmp_path / BUFFER_FILE.format(0))
    with pytest.raises(ValueError, match="is not a weights-only block of tensors") as err:
        load_block(str(tmp_path), settings, 0, "cpu")
    assert "\n" not in str(err.value) and not (tmp_path / "planted").exists()
    torch.save([{"x": torch.ones(1)}] * 3, tmp_path / BUFFER_FILE.format(0))
    micro, block = load_block(str(tmp_path), settings, 0, "cpu")
    assert micro == 7 and torch.equal(block[2]["x"], torch.ones(1))


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


def test_generation_boundaries_count_trls_micro_steps():
    args = GRPOConfig(output_dir="unused", gradient_accumulation_steps=2, num_iterations=3, report_to=[], use_cpu=True)
    assert args.steps_per_generation == 2  # TRL's default: one generation per optimizer step, reused 3 times
    settings = block_settings(args, 1)
    assert settings == {
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 2,
        "num_iterations": 3,
        "processes": 1,
    }
    assert [m for m in range(1, 19) if on_boundary(m, settings)] == [6, 12, 18]  # every 6 micro-batches


@pytest.mark.slow
def test_the_trainer_refuses_what_it_cannot_replace(tiny, tmp_path):
    with pytest.raises(ValueError, match="use multi_objective_aggregation='sum_then_normalize'"):
        trainer(tiny, tmp_path, "ebpo", multi_objective_aggregation="normalize_then_sum")
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
    t = trainer(tiny, tmp_path, "spo", options_of("spo"), per_device_eval_batch_size=4)
    with pytest.raises(ValueError, match=r"evaluation batch has no column 'extra_info.index' \(spo.prompt_key\)"):
        t.evaluate(eval_dataset=Dataset.from_list([{"prompt": f"What is {i} + 1?"} for i in range(4)]))
    assert t.estimator.state.state_dict()["keys"] == []
