"""Faults on the training side (issue 22): no step's training metrics lost to a crash between the checkpoint and the
log call, one writer per run folder, the pre-flight's registry/data/checkpoint checks, one-line override errors.

The tests drive the trainer mixin with a stand-in for the GPU workers (as tests/test_checkpoint.py does) and
the pre-flight on composed configs. The same faults with the real trainer on CPU are part of the one-node smoke
run (scripts/cpu_smoke.py, run K, started from run A's step 2: a second run on its folder is refused, then it is
SIGKILLed once verl has written ``latest_checkpointed_iteration.txt`` for step 3 and resumed), asserted in
tests/test_cpu_smoke.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ebpo_verl.algos.ebpo import EBPOOptions
from ebpo_verl.algos.ebpo_state import EBPOState
from ebpo_verl.algos.registry import get
from ebpo_verl.ops.errors import EBPOConfigError
from ebpo_verl.ops.locking import LockHeldError
from ebpo_verl.ops.metrics_log import read_metrics_log
from ebpo_verl.trainer.checkpoint.resume import TRACKER_FILE
from ebpo_verl.trainer.checkpoint.run_lock import RUN_LOCK_FILE, hold_run_outputs
from ebpo_verl.trainer.checkpoint.state import save_state
from ebpo_verl.trainer.checkpoint.step_metrics import load_step_metrics
from ebpo_verl.trainer.preflight import preflight
from ebpo_verl.trainer.ray_trainer import STEP_TIME_KEYS
from tests.in_process import ebpo_train

EBPO = get("ebpo")


@pytest.fixture
def _config(compose_config):
    """``_config(tmp_path, *overrides)``: a run's config with its checkpoints under tmp_path (tests/conftest.py) and
    a hub-id model (the pre-flight does not look it up; verl's default ~/models path is refused)."""

    def composed(tmp_path: Path, *overrides: str):
        return compose_config(
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.model.path=Qwen/Qwen3-8B",
            *overrides,
        )

    return composed


def _write_parquet(path: Path, ground_truths: list, extra_infos: list[dict] | None = None) -> Path:
    rows = len(ground_truths)
    infos = extra_infos if extra_infos is not None else [{"index": i} for i in range(rows)]
    table = pa.table(
        {
            "data_source": ["math"] * rows,
            "prompt": [[{"role": "user", "content": f"problem {i}"}] for i in range(rows)],
            "reward_model": [{"style": "rule", "ground_truth": gt} for gt in ground_truths],
            "extra_info": infos,
        }
    )
    pq.write_table(table, path)
    return path


def _data(tmp_path: Path, *, train=None, val=None) -> list[str]:
    train = train or _write_parquet(tmp_path / "train.parquet", [str(i) for i in range(16)])
    val = val or _write_parquet(tmp_path / "val.parquet", ["1", "2"])
    return [
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    ]


# ------------------------------------ the step's metrics ride with the checkpoint
@pytest.fixture
def faults_trainer(stand_in_trainer):
    """The conftest trainer stand-in over 32 prompts, 8 per step, 4 steps per epoch."""

    def build(config):
        trainer = stand_in_trainer(config)
        trainer.steps_per_epoch = 4
        return trainer

    return build


def test_step_metrics_saved_before_the_tracker_and_logged_once_on_resume(tmp_path, faults_trainer, _config):
    """A kill after verl's tracker file and before its log call: the resume logs the step's training metrics once."""
    from verl.utils.tracking import Tracking

    config = _config(tmp_path, f"trainer.metrics_log_path={tmp_path}/metrics.jsonl")
    first = faults_trainer(config)
    first.logger = Tracking("p", "e", default_backend=[])
    first.logger.log(data={"actor/grad_norm": 0.5, "critic/score/mean": 0.25}, step=1)  # step 1: logged in full

    step_metrics = {"actor/grad_norm": np.float32(0.75), "ebpo/prompts_seen": 16, "actor/entropy": 1.5}
    computed = []

    def compute_metrics(batch, metrics, timing_raw, global_steps, epoch):
        """verl's _compute_metrics on the step's batch: data + timing metrics (here: from the arguments)."""
        computed.append((batch, global_steps, epoch, dict(timing_raw)))
        metrics.update({"critic/score/mean": 0.375, "timing_s/gen": timing_raw["gen"]})
        metrics.update({"timing_s/step": timing_raw["step"], "perf/time_per_step": timing_raw["step"]})
        metrics.update({"perf/throughput": 10.0 / timing_raw["step"], "training/global_step": global_steps})

    first._compute_metrics = compute_metrics
    first.global_steps, first.timing_raw = 2, {"gen": 3.0}
    first._step_output = ("batch-2", step_metrics)
    first._save_checkpoint()
    # ... killed here, in the validation that verl runs before logging step 2
    assert (tmp_path / "ckpt" / TRACKER_FILE).read_text() == "2"
    assert computed[0][:3] == ("batch-2", 2, 0) and np.isnan(computed[0][3]["step"])
    saved = load_step_metrics(tmp_path / "ckpt" / "global_step_2", 2)
    expected = {
        "actor/grad_norm": 0.75,
        "ebpo/prompts_seen": 16,
        "actor/entropy": 1.5,
        "critic/score/mean": 0.375,
        "timing_s/gen": 3.0,
        "training/global_step": 2,
    }
    assert saved == expected  # the unfinished step timer's metrics are left out
    assert not STEP_TIME_KEYS & set(saved) and step_metrics["actor/grad_norm"] == np.float32(0.75)
    assert sorted(read_metrics_log(tmp_path / "metrics.jsonl")) == [1]

    for _attempt in range(2):  # a second resume from the same checkpoint logs nothing again
        resumed = faults_trainer(config)
        resumed._load_checkpoint()
        assert resumed.global_steps == 2
        resumed.logger = Tracking("p", "e", default_backend=[])
        resumed.logger.log(data={"val-core/x/acc/mean@1": 0.5}, step=2)  # val_before_train of the resumed run
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 2, 2]
    # another run started from this checkpoint (resume_path, its own folder and log): another timeline, no step 2
    resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path / 'ckpt' / 'global_step_2'}"]
    branch = faults_trainer(_config(tmp_path / "branch", f"trainer.metrics_log_path={tmp_path}/c.jsonl", *resume))
    branch._load_checkpoint()
    branch.logger = Tracking("p", "e", default_backend=[])
    assert branch.global_steps == 2 and not (tmp_path / "c.jsonl").exists()
    assert lines[1]["data"] == expected and lines[2]["data"] == lines[3]["data"] == {"val-core/x/acc/mean@1": 0.5}

    # a completed step (its log line written before the crash) is never logged twice
    config3 = _config(tmp_path / "b", f"trainer.metrics_log_path={tmp_path}/b.jsonl")
    done = faults_trainer(config3)
    done.logger = Tracking("p", "e", default_backend=[])
    done._compute_metrics = compute_metrics
    done.global_steps, done.timing_raw, done._step_output = 1, {"gen": 1.0}, ("b", {"actor/grad_norm": 0.1})
    done._save_checkpoint()
    logged = {**load_step_metrics(tmp_path / "b" / "ckpt" / "global_step_1", 1), "timing_s/step": 2.0}
    done.logger.log(data=logged, step=1)  # verl's log call: the saved keys and more
    again = faults_trainer(config3)
    again._load_checkpoint()
    again.logger = Tracking("p", "e", default_backend=[])
    assert len((tmp_path / "b.jsonl").read_text().splitlines()) == 1


# ------------------------------------ one writer per run folder
def test_a_second_run_on_a_locked_run_folder_is_refused_in_one_line(tmp_path, _config):
    config = _config(tmp_path, f"trainer.metrics_log_path={tmp_path}/logs/metrics.jsonl")
    with hold_run_outputs(config.trainer):
        holder = json.loads((tmp_path / "ckpt" / RUN_LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(LockHeldError, match=rf"trainer.default_local_dir {tmp_path / 'ckpt'} is in use by pid"):
            hold_run_outputs(config.trainer)
        # another checkpoint folder, the same metrics log: refused as well
        other = _config(tmp_path / "other", f"trainer.metrics_log_path={tmp_path}/logs/metrics.jsonl")
        with pytest.raises(LockHeldError, match=r"trainer.metrics_log_path .*/logs/metrics.jsonl is in use by pid"):
            hold_run_outputs(other.trainer)
        assert not (tmp_path / "other").exists()  # the refused run left no empty folder
        # the entry point: one line naming the holder, exit status 2, before any pre-flight or Ray
        proc = subprocess.run(
            [sys.executable, "-m", "ebpo_verl.main", f"trainer.default_local_dir={tmp_path / 'ckpt'}"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "HOME": "/nonexistent-home"},
        )
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ebpo-train: error:")]
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
        assert f"is in use by pid {os.getpid()} on " in errors[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "ckpt" / RUN_LOCK_FILE).exists()  # released on exit
    with hold_run_outputs(config.trainer):
        pass


def test_a_crashed_holder_leaves_no_lock_behind(tmp_path, _config):
    config = _config(tmp_path)
    script = (
        "import os, signal, sys; from omegaconf import OmegaConf; "
        "from ebpo_verl.trainer.checkpoint.run_lock import hold_run_outputs; "
        f"held = hold_run_outputs(OmegaConf.create({{'default_local_dir': {str(tmp_path / 'ckpt')!r}}})); "
        "print('held', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "held\n", proc.stderr
    assert (tmp_path / "ckpt" / RUN_LOCK_FILE).is_file()  # the stale file of the dead holder
    with hold_run_outputs(config.trainer):  # ... does not block
        pass


# ------------------------------------ the pre-flight
def test_preflight_refuses_an_unknown_estimator_with_the_known_names(tmp_path, _config):
    config = _config(tmp_path, "algorithm.adv_estimator=nonexistent", *_data(tmp_path))
    with pytest.raises(EBPOConfigError) as err:
        preflight(config, dry_run=True)
    message = str(err.value)
    assert message.startswith("algorithm.adv_estimator='nonexistent' is not an advantage estimator")
    known = message.split("known: ")[1].split(", ")
    assert {"ebpo", "grpo", "gae", "rloo", "spo", "bnpo", "shrinkage_js"} <= set(known) and known == sorted(known)
    assert preflight(_config(tmp_path, "algorithm.adv_estimator=grpo", *_data(tmp_path)), dry_run=True).lines


CURRICULUM = ["data.custom_cls.path=pkg://ebpo_verl.trainer.curriculum", "data.custom_cls.name=CurriculumDataset"]
CURRICULUM += ["data.shuffle=False", "data.dataloader_num_workers=0"]


def test_preflight_refuses_a_curriculum_whose_label_is_missing(tmp_path, _config):
    gts = [str(i) for i in range(16)]
    no_topics = _write_parquet(tmp_path / "none.parquet", gts, [{"index": i, "topic": None} for i in range(16)])
    config = _config(tmp_path, *_data(tmp_path, train=no_topics), *CURRICULUM, "+data.curriculum.order=topic")
    with pytest.raises(EBPOConfigError, match=r"order=topic sorts by extra_info\['topic'\], but none of the 16 "):
        preflight(config, dry_run=False)

    some = [{"index": i, "topic": None if i in (5, 9) else "algebra"} for i in range(16)]
    partial = _write_parquet(tmp_path / "partial.parquet", gts, some)
    config = _config(tmp_path, *_data(tmp_path, train=partial), *CURRICULUM, "+data.curriculum.order=topic")
    with pytest.raises(
        EBPOConfigError, match=rf"row 5 \(0-based\) of {partial} has no extra_info\['topic'\] \(2 of 16"
    ):
        preflight(config, dry_run=False)
    topic_last = ["+data.curriculum.order=topic", "+data.curriculum.missing=last"]
    preflight(_config(tmp_path, *_data(tmp_path, train=partial), *CURRICULUM, *topic_last), dry_run=False)

    # difficulty: pass_rate when any row has it (all NaN here -> none has it), else the level field `difficulty`
    nan_rates = [{"index": i, "pass_rate": float("nan"), "level": 3} for i in range(16)]
    rates = _write_parquet(tmp_path / "rates.parquet", gts, nan_rates)
    config = _config(tmp_path, *_data(tmp_path, train=rates), *CURRICULUM, "+data.curriculum.order=difficulty")
    with pytest.raises(EBPOConfigError, match=r"extra_info\['difficulty'\], but none of the 16 .*'index', 'level'"):
        preflight(config, dry_run=False)
    level = ["+data.curriculum.order=difficulty", "+data.curriculum.difficulty_key=level"]
    preflight(_config(tmp_path, *_data(tmp_path, train=rates), *CURRICULUM, *level), dry_run=False)


@pytest.mark.parametrize(("where", "bad"), [("train", ""), ("train", None), ("val", float("nan")), ("val", "  ")])
def test_preflight_refuses_empty_ground_truths_naming_file_and_row(tmp_path, where, bad, _config):
    gts = [str(i) for i in range(16)]
    if where == "train":
        gts[3] = bad
        path = _write_parquet(tmp_path / "train.parquet", gts)
        data = _data(tmp_path, train=path)
    else:
        first = 1.0 if isinstance(bad, float) else "1"  # a NaN comes from a float column (pandas)
        path = _write_parquet(tmp_path / "val.parquet", [first, bad])
        data = _data(tmp_path, val=path)
    row = 3 if where == "train" else 1
    with pytest.raises(EBPOConfigError, match=rf"data.{where}_files: {path}: reward_model.ground_truth .* {row} \("):
        preflight(_config(tmp_path, *data), dry_run=True)


def test_preflight_checks_the_tracker_file(tmp_path, _config):
    data = _data(tmp_path)
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step_2").mkdir(parents=True)
    save_state(EBPO, ckpt / "global_step_2", EBPOState(), EBPOOptions(), 2)
    for text, message in [
        ("", rf"checkpoint tracker {ckpt / TRACKER_FILE} is empty .*checkpoints here: global_step_2\. Write"),
        ("two", r"holds 'two', not a step number"),
        ("4", r"names step 4 but its folder global_step_4 does not exist .*checkpoints here: global_step_2"),
    ]:
        (ckpt / TRACKER_FILE).write_text(text)
        with pytest.raises(EBPOConfigError, match=message):
            preflight(_config(tmp_path, *data), dry_run=True)
    (ckpt / TRACKER_FILE).write_text("2\n")
    assert preflight(_config(tmp_path, *data), dry_run=True).lines[-1] == f"resumes from {ckpt / 'global_step_2'}"


def test_preflight_reports_a_checkpoint_without_ebpo_state(tmp_path, _config):
    data = _data(tmp_path)
    step_dir = tmp_path / "ckpt" / "global_step_2"
    step_dir.mkdir(parents=True)
    (tmp_path / "ckpt" / TRACKER_FILE).write_text("2")  # a plain verl (e.g. GRPO) checkpoint
    with pytest.raises(EBPOConfigError) as err:
        preflight(_config(tmp_path, *data), dry_run=True)
    assert str(err.value).startswith(f"checkpoint {step_dir} has no {EBPO.state.file} ")
    assert "algorithm.ebpo.on_resume_mismatch=reset to continue from step 2 with fresh" in str(err.value)
    lines = preflight(_config(tmp_path, *data, "algorithm.ebpo.on_resume_mismatch=reset"), dry_run=True).lines
    assert lines[-1] == (
        f"resumes from {step_dir} (no {EBPO.state.file}: fresh empirical-Bayes statistics from step 2, "
        "algorithm.ebpo.on_resume_mismatch=reset)"
    )


# ------------------------------------ messages
def _main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of :func:`tests.in_process.ebpo_train`."""
    code, _, err = ebpo_train(monkeypatch, capsys, *args)
    return code, err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("=5", "ebpo-train: error: override '=5' has no key: write key=value with no space around '='"),
        ("algorithm.ebpo=5", "ebpo-train: error: algorithm.ebpo=5 is not a mapping of options: set each option"),
        ("algorithm.spo=x", "ebpo-train: error: algorithm.spo='x' is not a mapping of options: set each option"),
    ],
)
def test_malformed_overrides_are_one_line_errors(monkeypatch, capsys, override, message):
    extra = ["algorithm.adv_estimator=spo"] if override.startswith("algorithm.spo") else []
    code, err = _main(monkeypatch, capsys, override, *extra, "--cfg", "job")
    assert code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("ebpo-train: error:")]
    assert line.startswith(message), line


def test_integer_switch_message_reads_right(tmp_path):
    """``GROUP_SIZE=1 ...: set GROUP_SIZE to one`` read as "set it to 1": the fix names what to set it to."""
    spec = pytest.importorskip("ebpo_verl.recipes.spec")
    with pytest.raises(spec.RecipeError) as err:
        spec.RunSpec.from_env("qwen3_8b", {"WORK_DIR": str(tmp_path), "GROUP_SIZE": "1"})
    message = str(err.value)
    assert message.startswith("GROUP_SIZE=1 is not an integer >= 2 (") and "to one" not in message
    assert message.endswith(": set GROUP_SIZE to such an integer")
