"""The ``ebpo/*`` curves reach TensorBoard (and W&B offline) at every step, across a resume, each step once.

The checker reads event files with TensorBoard's own reader (``EventAccumulator``, which applies TensorBoard's
purge rules) and compares them with the package's metrics log. The tests here run it on crafted event folders (one
tag dropped, a retrained step without and with the purge the trainer writes); on verl's real trainer it reads the
two-node smoke run's loggers (tests/test_cluster.py: a checkpoint at step 2, an attempt ended in step 4 once step 3
is logged, the rerun from step 2: step 3 is retrained and must show once, with the rerun's values).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

PREFIX = "ebpo/"


def tensorboard_scalars(event_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value), ...] as TensorBoard shows them (its reader, every event kept, purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tracking_problems(curves: dict[str, list[tuple[int, float]]], logged: dict[int, dict]) -> list[str]:
    """Every ``ebpo/*`` metric of every step of the metrics log ``logged`` is in ``curves`` once, equal within
    float32 rounding; no ``ebpo/*`` curve has a step the log lacks. The problems found, one line each."""
    problems = []
    for step, data in sorted(logged.items()):
        for key in sorted(k for k in data if k.startswith(PREFIX)):
            values = [v for s, v in curves.get(key, []) if s == step]
            if len(values) != 1:
                problems.append(f"{key} at step {step}: {len(values)} values in the curves")
            elif not np.isclose(values[0], np.float32(data[key]), rtol=1e-6, atol=1e-30, equal_nan=True):
                problems.append(f"{key} at step {step}: curve {values[0]!r}, metrics log {data[key]!r}")
    for key, points in curves.items():
        extra = sorted({s for s, _ in points} - {s for s, d in logged.items() if key in d})
        if key.startswith(PREFIX) and extra:
            problems.append(f"{key}: steps {extra} are not in the metrics log")
    return problems


def write_events(folder: Path, steps: dict[int, dict], purge_step: int | None = None) -> None:
    """One event file of ``steps`` written with torch's SummaryWriter (verl's TensorBoard adapter uses it)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder), purge_step=purge_step)
    for step, data in steps.items():
        for key, value in data.items():
            writer.add_scalar(key, value, step)
    writer.close()


LOG = {s: {"ebpo/shrinkage_mean": 0.1 * s, "ebpo/mu_glob": 0.5 + s / 7, "actor/lr": 1e-3} for s in (1, 2, 3)}


def test_checker_passes_on_the_log_itself(tmp_path: Path) -> None:
    write_events(tmp_path, LOG)
    assert tracking_problems(tensorboard_scalars(tmp_path), LOG) == []


def test_checker_fails_when_one_metric_is_dropped(tmp_path: Path) -> None:
    dropped = {s: {k: v for k, v in d.items() if k != "ebpo/mu_glob"} for s, d in LOG.items()}
    write_events(tmp_path, dropped)
    assert tracking_problems(tensorboard_scalars(tmp_path), LOG) == [
        f"ebpo/mu_glob at step {s}: 0 values in the curves" for s in (1, 2, 3)
    ]


def test_checker_fails_on_a_wrong_value(tmp_path: Path) -> None:
    write_events(tmp_path, {**LOG, 2: {**LOG[2], "ebpo/shrinkage_mean": 0.2001}})
    assert tracking_problems(tensorboard_scalars(tmp_path), LOG) == [
        "ebpo/shrinkage_mean at step 2: curve 0.20010000467300415, metrics log 0.2"
    ]


@pytest.mark.parametrize("resumed_step", [0, 2])
def test_a_retrained_step_shows_once_after_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resumed_step: int
) -> None:
    """verl's own ``Tracking`` (TensorBoard backend) handed to the trainer's ``logger`` setter: attempt 1 logged
    steps 1-3; the attempt resumed from the step-2 checkpoint retrains step 3 with other values. Without a resume
    (``resumed_step`` 0, nothing purged) TensorBoard shows step 3 twice; after one, once, with the rerun's values."""
    import time

    from omegaconf import OmegaConf
    from verl.utils.tracking import Tracking

    from ebpo_verl.trainer.ray_trainer import EBPOTrainerMixin

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path))
    first = Tracking(project_name="p", experiment_name="e", default_backend=["tensorboard"])
    for step, data in LOG.items():
        first.log(data=data, step=step)
    first.logger["tensorboard"].finish()
    time.sleep(1.1)  # event file names carry the second: the resumed attempt's file sorts after
    trainer = EBPOTrainerMixin.__new__(EBPOTrainerMixin)
    trainer.config = OmegaConf.create({"trainer": {"metrics_log_path": None}})
    trainer._resumed_step = resumed_step
    trainer.logger = Tracking(project_name="p", experiment_name="e", default_backend=["tensorboard"])
    rerun = {**LOG[3], "ebpo/mu_glob": 9.0}
    trainer.logger.log(data=rerun, step=3)
    trainer.logger.logger["tensorboard"].finish()
    problems = tracking_problems(tensorboard_scalars(tmp_path), {**LOG, 3: rerun})
    assert problems == ([] if resumed_step else ["ebpo/mu_glob at step 3: 2 values in the curves",
                                                 "ebpo/shrinkage_mean at step 3: 2 values in the curves"])  # fmt: skip


# ------------------------------------------------------------------------------------------------- W&B offline
def wandb_history(run_file: Path) -> dict[int, list[dict[str, float]]]:
    """step -> [{key: value} per history record] of a W&B ``.wandb`` file (LevelDB log format: 32 KiB blocks of
    chunks with a 7-byte header -- crc32, length, type FULL/FIRST/MIDDLE/LAST -- after the 7-byte W&B header; a
    torn last chunk, from a killed run, is ignored)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, pieces, out = run_file.read_bytes(), 7, 32768, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pieces = chunk if kind in (1, 2) else pieces + chunk
        if kind not in (1, 4):
            continue
        record = wandb_internal_pb2.Record.FromString(pieces)
        if record.HasField("history"):
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            out.setdefault(int(items.get("_step", record.history.step.num)), []).append(items)
    return out


def wandb_problems(history: dict[int, list[dict]], logged: dict[int, dict]) -> list[str]:
    """Each step of ``history`` is one record whose ``ebpo/*`` metrics equal the metrics log's (float32 rounding)."""
    problems = []
    for step, records in sorted(history.items()):
        if len(records) != 1:
            problems.append(f"W&B step {step}: {len(records)} history records")
            continue
        data = records[0]
        for key in sorted(k for k in logged.get(step, {}) if k.startswith(PREFIX)):
            got = data.get(key)
            if got is None or not np.isclose(got, logged[step][key], rtol=1e-6, equal_nan=True):
                problems.append(f"W&B {key} at step {step}: {got!r}, metrics log {logged[step][key]!r}")
    return problems


@pytest.mark.parametrize("drop", [None, "ebpo/mu_glob"])
def test_wandb_offline_reader_and_checker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drop: str | None) -> None:
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="p", name="n", mode="offline", dir=str(tmp_path))  # the process keeps its first env
    for step, data in LOG.items():
        run.log({k: v for k, v in data.items() if k != drop}, step=step)
    run.finish()
    wandb.teardown()  # the W&B service process writes the file: stopping it flushes it
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    history = wandb_history(run_file)
    assert sorted(history) == [1, 2, 3] and history[2][0]["ebpo/shrinkage_mean"] == LOG[2]["ebpo/shrinkage_mean"]
    want = [] if drop is None else [f"W&B {drop} at step {s}: None, metrics log {LOG[s][drop]!r}" for s in (1, 2, 3)]
    assert wandb_problems(history, LOG) == want
