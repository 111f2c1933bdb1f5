"""The TRL integration (ebpo_verl.integrations.trl): TRL's GRPOTrainer on the package's tiny model, on CPU, with the
``[trl]`` extra only (no verl, Ray or Hydra: CI runs this file in the wheel's ``[trl]`` venv, .ci/run; the comparisons
with verl are tests/test_trl_verl.py).

A resume of every stateful estimator, and resumes from saves inside TRL's generation blocks (accumulation with an
epoch's shorter last update, epoch saves, a fractional ``save_steps``, the final save, ``num_iterations`` 2), against
the uninterrupted run, micro-step by micro-step; the checkpoint's block files checked for what TRL will read; an
all-fail group against TRL's own advantage (0); evaluate() against the state it must keep.
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
from ebpo_verl.integrations.trl import (  # noqa: E402
    check_column,
    lookup,
    parse_options,
    row_field,
)
from ebpo_verl.integrations.trl_block import (  # noqa: E402
    BLOCK_FILE,
    BUFFER_FILE,
    KNOWN_TRL,
    BlockLayout,
    block_settings,
    check_block,
    load_block,
    on_boundary,
)
from ebpo_verl.ops.errors import MESSAGE_LIMIT  # noqa: E402
from tests import trl_support  # noqa: E402
from tests.trl_support import dataset, options_of, trainer  # noqa: E402

tiny, runs = trl_support.tiny, trl_support.runs  # the shared fixtures


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
    saved = torch.load(checkpoint / BUFFER_FILE.format(0), weights_only=True)
    vocab = full.model.get_input_embeddings().num_embeddings
    assert check_block(saved, BlockLayout.of(full.args, vocab), len(saved)) is None  # what TRL buffered passes
    torch.save(list(range(len(saved))), checkpoint / BUFFER_FILE.format(0))  # the right length, nothing TRL reads
    wrong = trainer(tiny, tmp_path / "wrong", "ebpo", steps=4, **iterations)
    with pytest.raises(ValueError, match=r"trl_block_rank0.pt is not a block TRL 1.16.0 can continue: micro-batch 0"):
        wrong.train(resume_from_checkpoint=str(checkpoint))
    assert wrong.micro == [] and wrong.used == []  # refused before any micro-step
    (checkpoint / BUFFER_FILE.format(0)).unlink()
    lost = trainer(tiny, tmp_path / "lost", "ebpo", steps=4, **iterations)
    with pytest.raises(ValueError, match=r"trl_block_rank0.pt is missing: the checkpoint lies inside a generation"):
        lost.train(resume_from_checkpoint=str(checkpoint))


class Planted:
    """Unpickling it would call ``Path.touch`` on ``<cwd>/planted``."""

    def __reduce__(self):
        return (Path.touch, (Path("planted"),))


SETTINGS = {"gradient_accumulation_steps": 2, "steps_per_generation": 3, "num_iterations": 1, "processes": 1}
LAYOUT = BlockLayout(rows=2, vocab=50, implied={"old_per_token_logps": True, "ref_per_token_logps": False,
                                                 "importance_sampling_ratio": False})  # fmt: skip


def good_block(rows: int = 2, prompt: int = 3, completion: int = 4) -> list[dict]:
    """A block as TRL 1.16.0 buffers it under SETTINGS (accumulation 2 is no multiple of 3: the old log-probs kept)."""
    ids = torch.arange(rows * (prompt + completion)).view(rows, -1) % 50
    return [
        {"prompt_ids": ids[:, :prompt], "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
         "completion_ids": ids[:, prompt:], "completion_mask": torch.tensor([[1] * completion, [1, 1, 0, 0]]),
         "advantages": torch.tensor([0.5, -0.5]), "num_items_in_batch": torch.tensor(30),
         "old_per_token_logps": torch.full((rows, completion), -1.0)}
        for _ in range(SETTINGS["steps_per_generation"])
    ]  # fmt: skip


def changed(key: str, value) -> list[dict]:
    block = good_block()
    block[1] = {**block[1], key: value}
    return block


BAD_BLOCKS = [
    ([1, 2, 3], "micro-batch 0 is int, not a dict of tensors"),  # right length, nothing TRL can read
    (good_block()[:2], "expected a list of steps_per_generation=3 micro-batches, got a list of 2$"),
    ([{k: v for k, v in b.items() if k != "advantages"} for b in good_block()], "micro-batch 0 lacks advantages"),
    (changed("extra", torch.ones(2)), r"micro-batch 1 has \['extra'\], which TRL 1.16.0 with these settings"),
    (changed("ref_per_token_logps", torch.ones(2, 4)), r"micro-batch 1 has \['ref_per_token_logps'\]"),  # beta 0
    ([{k: v for k, v in b.items() if k != "old_per_token_logps"} for b in good_block()], "lacks old_per_token_logps"),
    (changed("advantages", [0.5, -0.5]), "micro-batch 1 advantages is list, not a tensor"),
    (changed("advantages", torch.ones(3)), r"advantages has shape \(3,\), not \(B\) or \(B, C\) \(B = per_device"),
    (changed("advantages", torch.tensor([0.5, float("nan")])), "micro-batch 1 advantages holds NaN or inf"),
    (changed("completion_ids", torch.ones(2, 4)), "completion_ids has dtype torch.float32, not an integer dtype"),
    (changed("completion_ids", torch.full((2, 4), 50)), r"completion_ids holds token ids outside \[0, 50\)"),
    (changed("completion_mask", torch.ones(2, 5, dtype=torch.long)), r"completion_mask has shape \(2, 5\)"),
    (changed("prompt_mask", torch.full((2, 3), 2)), "prompt_mask holds values other than 0 and 1"),
    (changed("old_per_token_logps", torch.zeros(2, 4, dtype=torch.long)), "dtype torch.int64, not a floating"),
    (changed("num_items_in_batch", torch.tensor(-1)), "num_items_in_batch is tensor\\(-1\\), not a count >= 0"),
    (changed("num_items_in_batch", torch.tensor(31)), r"num_items_in_batch differs between micro-batches \(\[30.0, 31"),
]


@pytest.mark.parametrize(("block", "expected"), BAD_BLOCKS)
def test_a_block_trl_could_not_read_is_refused_in_one_line(tmp_path, block, expected):
    (tmp_path / BLOCK_FILE).write_text(json.dumps({**SETTINGS, "micro_step": 7}))
    assert check_block(good_block(), LAYOUT, 3) is None  # the well-formed block these cases break
    torch.save(block, tmp_path / BUFFER_FILE.format(0))
    with pytest.raises(ValueError, match=expected) as err:
        load_block(str(tmp_path), SETTINGS, 0, "cpu", 4, LAYOUT, KNOWN_TRL)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / BUFFER_FILE.format(0)} is not a block TRL 1.16.0 can continue: ")
    assert "\n" not in message and len(message) - len(str(tmp_path)) < MESSAGE_LIMIT


def test_a_bad_counter_file_or_trl_version_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings, folder = SETTINGS, str(tmp_path)
    with pytest.raises(ValueError, match="trl_block.json is missing: resume from a checkpoint written by"):
        load_block(folder, settings, 0, "cpu", 4, LAYOUT, KNOWN_TRL)
    for text, expected in (
        ("{", "is not valid JSON"),
        ("[" * 100000, "is not valid JSON"),
        (json.dumps({**settings, "micro_step": 4.0}), "is malformed: expected non-negative integers"),
        (json.dumps({**settings, "micro_step": -1}), "is malformed"),
        (json.dumps({**settings, "micro_step": True}), "is malformed"),
        (json.dumps(settings), "is malformed"),
        (json.dumps({**settings, "micro_step": 10**400}), r"micro_step 1000000000000.*\.\.\.0+ does not fit the chec"),
        (json.dumps({**settings, "micro_step": 9}), "micro_step 9 does not fit the checkpoint's global_step 4 .TRL "
                                                    "counts 4 to 8 micro-batches for it."),
        (json.dumps({**settings, "micro_step": 3}), "micro_step 3 does not fit"),
        (json.dumps({**settings, "processes": 10**400, "micro_step": 6}), r"processes 1000000.*\.\.\.0+ -> 1 since"),
    ):  # fmt: skip
        (tmp_path / BLOCK_FILE).write_text(text)
        with pytest.raises(ValueError, match=expected) as err:
            load_block(folder, settings, 0, "cpu", 4, LAYOUT, KNOWN_TRL)
        assert "\n" not in str(err.value) and len(str(err.value)) - len(folder) < MESSAGE_LIMIT
    (tmp_path / BLOCK_FILE).write_text(json.dumps({**settings, "micro_step": 6}))
    assert load_block(folder, settings, 0, "cpu", 4, LAYOUT, KNOWN_TRL) == (6, None)  # a block's end: nothing more read
    with pytest.raises(ValueError, match=r"^TRL '1.17.0' is installed, but .* pip install trl==1.16.0 to resume"):
        load_block(folder, settings, 0, "cpu", 4, LAYOUT, "1.17.0")
    (tmp_path / BLOCK_FILE).write_text(json.dumps({**settings, "micro_step": 7}))
    torch.save([Planted()] * 3, tmp_path / BUFFER_FILE.format(0))
    with pytest.raises(ValueError, match="is not a weights-only block of tensors") as err:
        load_block(folder, settings, 0, "cpu", 4, LAYOUT, KNOWN_TRL)
    assert "\n" not in str(err.value) and not (tmp_path / "planted").exists()
    torch.save(good_block(), tmp_path / BUFFER_FILE.format(0))
    micro, block = load_block(folder, settings, 0, "cpu", 4, LAYOUT, KNOWN_TRL)
    assert micro == 7 and torch.equal(block[2]["advantages"], torch.tensor([0.5, -0.5]))


def test_the_layout_follows_trls_settings():
    def layout(**kw):
        args = GRPOConfig(output_dir="unused", report_to=[], use_cpu=True, per_device_train_batch_size=2,
                          num_generations=2, **kw)  # fmt: skip
        return BlockLayout.of(args, 50)

    assert layout().implied == {"old_per_token_logps": False, "ref_per_token_logps": False,
                                "importance_sampling_ratio": False}  # fmt: skip
    assert layout(num_iterations=2).implied["old_per_token_logps"]  # a block is trained on twice
    assert layout(gradient_accumulation_steps=2, steps_per_generation=3).implied["old_per_token_logps"]
    assert not layout(gradient_accumulation_steps=4, steps_per_generation=2).implied["old_per_token_logps"]
    assert layout(beta=0.04).implied["ref_per_token_logps"] and layout().rows == 2


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
