"""EB state in verl checkpoints: atomic save, load, missing file, and exact resume of the advantages; metrics log."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from verl.protocol import DataProto

from ebpo_verl.algos import registry
from ebpo_verl.algos.ebpo import EBPOOptions
from ebpo_verl.algos.ebpo_math import compute_ebpo_advantages
from ebpo_verl.algos.ebpo_state import EBPOState
from ebpo_verl.algos.estimator import Batch
from ebpo_verl.algos.registry import get
from ebpo_verl.ops.metrics_log import MetricsLog, read_metrics_log
from ebpo_verl.trainer.adapter import advantage_step
from ebpo_verl.trainer.checkpoint.resume import loaded_folder, step_folder
from ebpo_verl.trainer.checkpoint.state import load_state, save_state
from ebpo_verl.trainer.ray_trainer import extra_info_values

EBPO, SPO, DBB = get("ebpo"), get("spo"), get("dbb")

PROMPTS, GROUP, TOPICS = 4, 4, ("algebra", "geometry", "number_theory")


@pytest.fixture
def _config(compose_config):
    """``_config(tmp_path, *overrides)``: a run's config with its checkpoints under tmp_path (tests/conftest.py)."""

    def composed(tmp_path: Path, *overrides: str):
        return compose_config(
            f"trainer.default_local_dir={tmp_path / 'ckpt'}", "actor_rollout_ref.rollout.n=4", *overrides
        )

    return composed


@pytest.fixture
def trainer_on(stand_in_trainer):
    """``trainer_on(config)``: the conftest trainer stand-in over prompts 0..6*PROMPTS-1, PROMPTS per step."""
    return lambda config: stand_in_trainer(config, range(6 * PROMPTS), PROMPTS)


def _batch(prompt_ids: list[int], step: int) -> tuple[DataProto, list]:
    """Binary rewards of GROUP responses per prompt (a pure function of prompt and step) plus one padding row."""
    rows, uids, infos, lengths = [], [], [], []
    for pid in prompt_ids:
        gen = torch.Generator().manual_seed(1000 * step + pid)
        p = (pid % 5 + 1) / 6
        rows += (torch.rand(GROUP, generator=gen) < p).float().tolist()
        lengths += torch.randint(1, 6, (GROUP,), generator=gen).tolist()
        uids += [f"s{step}-p{pid}"] * GROUP
        infos += [{"topic": TOPICS[pid % 3], "index": pid}] * GROUP
    rows.append(0.0)
    lengths.append(0)
    uids.append("pad0")
    infos.append(infos[0])  # verl's padding rows copy a real row's fields
    width = 6
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    rewards = torch.zeros(len(rows), width)
    ends = (torch.tensor(lengths) - 1).clamp(min=0)
    rewards[torch.arange(len(rows)), ends] = torch.tensor(rows) * (torch.tensor(lengths) > 0)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )
    padding = [uid.startswith("pad") for uid in uids]
    return data, extra_info_values(infos, uids, padding, "topic", "algorithm.ebpo.cluster_key")


def _step(trainer, step: int) -> torch.Tensor:
    prompt_ids = next(trainer._data_iter).tolist()
    data, labels = _batch(prompt_ids, step)
    labels = labels if trainer.options.row_key else None
    data.batch["advantages"], data.batch["returns"], _ = advantage_step(data, trainer.estimator, labels)
    return data.batch["advantages"].clone()


def _run(trainer, steps: range) -> list[torch.Tensor]:
    trainer._data_iter = iter(trainer.train_dataloader)
    out = []
    for step in steps:
        trainer.global_steps = step
        out.append(_step(trainer, step))
    return out


RESUME_CASES = [
    ["algorithm.ebpo.cluster_key=topic", "algorithm.ebpo.min_cluster_prompts=3", "algorithm.ebpo.decay=0.9"],
    ["algorithm.ebpo.prior=beta_binomial", "algorithm.ebpo.tau2=debiased", "algorithm.ebpo.sigma2=within"],
]


@pytest.mark.parametrize("options", RESUME_CASES, ids=["clusters-decay", "beta-binomial"])
def test_checkpoint_resume_reproduces_uninterrupted_advantages(tmp_path, options, trainer_on, _config):
    config = _config(tmp_path, *options)
    uninterrupted = _run(trainer_on(config), range(1, 7))

    first = trainer_on(config)
    before = _run(first, range(1, 4))
    first.global_steps = 3
    first._save_checkpoint()
    for a, b in zip(before, uninterrupted[:3], strict=True):
        assert torch.equal(a, b)

    step_dir = tmp_path / "ckpt" / "global_step_3"
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert {p.name for p in step_dir.iterdir()} == {"actor", "data.pt", EBPO.state.file}
    saved = json.loads((step_dir / EBPO.state.file).read_text())
    assert saved["global_step"] == 3 and saved["state"]["prompts_seen"] == 3 * PROMPTS

    resumed = trainer_on(config)
    _run(resumed, range(90, 92))  # unrelated statistics before the load
    resumed._load_checkpoint()
    assert resumed.global_steps == 3 and resumed.actor_rollout_wg.loaded == [str(step_dir / "actor")]
    after = _run(resumed, range(4, 7))  # the dataloader continues at prompts 12.. from data.pt
    for a, b in zip(after, uninterrupted[3:], strict=True):
        assert torch.equal(a, b)

    fresh = trainer_on(config)
    fresh.train_dataloader.load_state_dict(torch.load(step_dir / "data.pt", weights_only=True))
    fresh._data_iter = iter(fresh.train_dataloader)
    assert not torch.allclose(_step(fresh, 4), uninterrupted[3]), "the EB state must matter for this test"


def test_checkpoint_without_state_file_follows_on_resume_mismatch(tmp_path, trainer_on, _config):
    """No ebpo_state.json (a plain verl checkpoint): refused by default, fresh statistics only when asked for."""
    config = _config(tmp_path)
    trainer = trainer_on(config)
    _run(trainer, range(1, 3))
    trainer.global_steps = 2
    trainer._save_checkpoint()
    (tmp_path / "ckpt" / "global_step_2" / EBPO.state.file).unlink()  # as a plain verl checkpoint
    with pytest.raises(ValueError, match=r"has no ebpo_state.json .*on_resume_mismatch=reset to continue from step 2"):
        trainer_on(config)._load_checkpoint()
    for mode in ("reset", "keep"):
        resumed = trainer_on(_config(tmp_path, f"algorithm.ebpo.on_resume_mismatch={mode}"))
        resumed.estimator.state.prompts_seen = 5
        with pytest.warns(
            RuntimeWarning, match=f"no ebpo_state.json .*on_resume_mismatch={mode}: .*start FRESH at step 2"
        ):
            resumed._load_checkpoint()
        assert resumed.global_steps == 2 and resumed.estimator.state.prompts_seen == 0


def test_checkpoint_disabled_resume_resets_state(tmp_path, trainer_on, _config):
    trainer = trainer_on(_config(tmp_path, "trainer.resume_mode=disable"))
    trainer.estimator.state.prompts_seen = 7
    trainer._load_checkpoint()
    assert trainer.global_steps == 0 and trainer.estimator.state.prompts_seen == 0


def test_checkpoint_folder_for_both_resume_modes(tmp_path, _config):
    auto = _config(tmp_path).trainer
    assert loaded_folder(auto, 5) == step_folder(auto, 5) == str(tmp_path / "ckpt" / "global_step_5")
    explicit = _config(
        tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path}/x/global_step_2"
    )
    assert loaded_folder(explicit.trainer, 2) == str(tmp_path / "x" / "global_step_2")
    assert step_folder(explicit.trainer, 2) == str(tmp_path / "ckpt" / "global_step_2")


def _filled_state() -> EBPOState:
    state = EBPOState()
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    compute_ebpo_advantages(
        Batch(scores, ["a", "a", "b", "b", "c", "c"], torch.ones(6, dtype=torch.bool)), EBPOOptions(), state
    )
    return state


def test_checkpoint_state_file_round_trip_atomic_and_checked(tmp_path):
    state, options = _filled_state(), EBPOOptions()
    path = save_state(EBPO, tmp_path, state, options, global_step=4)
    save_state(EBPO, tmp_path, state, options, global_step=4)  # replaces in place
    assert [p.name for p in tmp_path.iterdir()] == [EBPO.state.file]  # no temp file left behind
    restored = EBPOState()
    assert load_state(EBPO, tmp_path, restored, options, global_step=4)
    assert restored.state_dict() == state.state_dict()
    assert restored.prompts_seen == 3 and restored.responses_seen == 6

    with pytest.raises(ValueError, match="written at global step 4, not 5"):
        load_state(EBPO, tmp_path, EBPOState(), options, global_step=5)
    path.write_text(path.read_text()[:40])
    with pytest.raises(ValueError, match="unreadable"):
        load_state(EBPO, tmp_path, EBPOState(), options, global_step=4)


def _corrupt_state(payload: dict, how: str) -> str:
    if how == "truncated":
        return json.dumps(payload)[:-30]
    if how == "list":
        return "[1, 2]"
    if how == "negative-count":
        payload["state"]["global"]["rewards"][0] = -6.0
    if how == "short-entry":
        payload["state"]["global"]["group_means"] = [3.0, 0.5]
    if how == "non-finite":
        payload["state"]["global"]["rewards"][2] = float("inf")  # json writes Infinity
    if how == "bad-options":
        payload["options"] = ["decay"]
    return json.dumps(payload)


@pytest.mark.parametrize("how", ["truncated", "list", "negative-count", "short-entry", "non-finite", "bad-options"])
def test_checkpoint_corrupt_state_file_stops_the_resume_with_its_path(tmp_path, how):
    path = save_state(EBPO, tmp_path, _filled_state(), EBPOOptions(), global_step=4)
    path.write_text(_corrupt_state(json.loads(path.read_text()), how))
    state = _filled_state()
    with pytest.raises(ValueError, match=rf"EBPO state file {path} is unreadable"):
        load_state(EBPO, tmp_path, state, EBPOOptions(), global_step=4)
    assert state.prompts_seen == 0  # nothing half-loaded


def test_checkpoint_option_mismatch_error_lists_each_change_and_the_ways_out(tmp_path):
    saved = EBPOOptions(decay=0.9, cluster_key="topic", stats_scope="history")
    path = save_state(EBPO, tmp_path, _filled_state(), saved, global_step=4)
    now = EBPOOptions(decay=0.5, cluster_key="source", stats_scope="batch", prior="beta_binomial")
    with pytest.raises(ValueError) as err:
        load_state(EBPO, tmp_path, EBPOState(), now, global_step=4)
    msg = str(err.value)
    for change in (
        "decay: 0.9 -> 0.5",
        "cluster_key: 'topic' -> 'source'",
        "stats_scope: 'history' -> 'batch'",
        "prior: 'gaussian' -> 'beta_binomial'",
    ):
        assert change in msg
    assert str(path) in msg and "sigma2" not in msg
    for way in (
        "algorithm.ebpo.decay=0.9 algorithm.ebpo.cluster_key=topic",
        "on_resume_mismatch=reset",
        "on_resume_mismatch=keep",
    ):
        assert way in msg


def test_checkpoint_option_mismatch_reset_and_keep(tmp_path):
    filled = _filled_state()
    save_state(EBPO, tmp_path, filled, EBPOOptions(sigma2="total"), global_step=4)
    state = EBPOState()
    with pytest.warns(RuntimeWarning, match=r"sigma2: 'total' -> 'within'.*start FRESH"):
        assert not load_state(EBPO, tmp_path, state, EBPOOptions(sigma2="within", on_resume_mismatch="reset"), 4)
    assert state.state_dict() == EBPOState().state_dict()
    with pytest.warns(RuntimeWarning, match=r"sigma2: 'total' -> 'within'.*on_resume_mismatch=keep"):
        assert load_state(EBPO, tmp_path, state, EBPOOptions(sigma2="within", on_resume_mismatch="keep"), 4)
    assert state.state_dict() == filled.state_dict()


def test_checkpoint_on_resume_mismatch_itself_and_missing_keys_are_no_mismatch(tmp_path, recwarn):
    path = save_state(EBPO, tmp_path, _filled_state(), EBPOOptions(on_resume_mismatch="keep"), global_step=4)
    assert load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(on_resume_mismatch="error"), global_step=4)
    payload = json.loads(path.read_text())
    for key in ("on_resume_mismatch", "epsilon", "min_cluster_prompts"):  # an older checkpoint: defaults
        del payload["options"][key]
    path.write_text(json.dumps(payload))
    assert load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(), global_step=4)
    assert not [w for w in recwarn if "EBPO" in str(w.message)]
    with pytest.raises(ValueError, match=r"epsilon: 1e-06 -> 0.001"):
        load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(epsilon=1e-3), global_step=4)


def test_checkpoint_options_the_mode_ignores_do_not_block_a_resume(tmp_path, recwarn):
    batch = EBPOOptions(stats_scope="batch")
    save_state(EBPO, tmp_path, EBPOState(), batch, global_step=4)
    # stats_scope=batch never reads decay/merge (its saved statistics are empty): no mismatch, no warning
    assert load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(stats_scope="batch", decay=0.5, merge="after"), 4)
    assert not [w for w in recwarn if "EBPO" in str(w.message)]
    # no cluster_key: min_cluster_prompts is ignored too; a changed mode still counts, with every changed key
    assert load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(stats_scope="batch", min_cluster_prompts=8), 4)
    with pytest.raises(ValueError, match=r"stats_scope: 'batch' -> 'history', decay: 1.0 -> 0.5"):
        load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(decay=0.5), 4)


def test_checkpoint_saved_option_unknown_to_this_version_gets_no_refused_advice(tmp_path):
    path = save_state(EBPO, tmp_path, _filled_state(), EBPOOptions(decay=0.9), global_step=4)
    payload = json.loads(path.read_text())
    payload["options"]["future_knob"] = 3
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError) as err:
        load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(decay=0.8), global_step=4)
    msg = str(err.value)
    assert "unknown to this version of ebpo-verl: future_knob=3" in msg and "decay: 0.9 -> 0.8" in msg
    assert "algorithm.ebpo.decay=0.9" in msg and "algorithm.ebpo.future_knob" not in msg  # advice the CLI accepts
    with pytest.raises(ValueError) as err:
        load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(decay=0.9), global_step=4)
    assert "resume with the checkpoint's values" not in str(err.value) and "on_resume_mismatch=keep" in str(err.value)
    with pytest.warns(RuntimeWarning, match="future_knob=3.*on_resume_mismatch=keep"):
        assert load_state(EBPO, tmp_path, EBPOState(), EBPOOptions(decay=0.9, on_resume_mismatch="keep"), 4)


def test_checkpoint_resume_with_other_options_stops_in_the_trainer(tmp_path, trainer_on, _config):
    first = trainer_on(_config(tmp_path, "algorithm.ebpo.decay=0.9"))
    _run(first, range(1, 3))
    first.global_steps = 2
    first._save_checkpoint()
    resumed = trainer_on(_config(tmp_path, "algorithm.ebpo.decay=0.8"))
    with pytest.raises(ValueError, match=r"decay: 0.9 -> 0.8.*on_resume_mismatch=reset"):
        resumed._load_checkpoint()
    assert resumed.estimator.state.prompts_seen == 0
    kept = trainer_on(_config(tmp_path, "algorithm.ebpo.decay=0.8", "algorithm.ebpo.on_resume_mismatch=keep"))
    with pytest.warns(RuntimeWarning, match="on_resume_mismatch=keep"):
        kept._load_checkpoint()
    assert kept.estimator.state.prompts_seen == 2 * PROMPTS


def test_checkpoint_metrics_log_survives_resume(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    first = MetricsLog(path, resumed_step=0)
    for step in range(6):
        first.log({"critic/score/mean": step / 10, "ebpo/mu_glob": np.float32(0.5)}, step=step)
    with open(path, "a") as f:
        f.write('{"step": 6, "da')  # killed mid-write

    MetricsLog(path, resumed_step=3).log({"val-core/math500/acc/mean@1": 0.25}, step=3)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 3, 3]
    (aside,) = tmp_path.glob("logs/metrics.superseded-*.jsonl")
    assert [json.loads(line)["step"] for line in aside.read_text().splitlines()] == [4, 5]
    merged = read_metrics_log(path)
    assert merged[3] == {"critic/score/mean": 0.3, "ebpo/mu_glob": 0.5, "val-core/math500/acc/mean@1": 0.25}

    with open(path, "a") as f:
        f.write('{"step": 4, "da')
    MetricsLog(path, resumed_step=4).log({"y": 1}, step=5)  # nothing to move aside, the torn line goes
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3, 3, 5]

    MetricsLog(path, resumed_step=0).log({"x": float("nan")}, step=0)  # a new run from scratch, same path
    merged = read_metrics_log(path)
    assert list(merged) == [0] and math.isnan(merged[0]["x"])
    assert len(list(tmp_path.glob("logs/metrics.superseded-*.jsonl"))) == 2


def test_checkpoint_metrics_log_rides_on_verl_tracking(tmp_path, monkeypatch, trainer_on, _config):
    from verl.utils.tracking import Tracking

    verl_file = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(verl_file))
    config = _config(tmp_path, f"trainer.metrics_log_path={tmp_path}/m.jsonl")
    trainer = trainer_on(config)
    trainer.logger = Tracking("p", "e", default_backend=["file"])
    trainer.logger.log(data={"ebpo/shrinkage_mean": 0.4}, step=1)
    trainer.logger.finish()
    restarted = trainer_on(config)
    restarted._resumed_step = 1
    restarted.logger = Tracking("p", "e", default_backend=["file"])  # verl's file logger truncates here
    restarted.logger.log(data={"ebpo/shrinkage_mean": 0.5}, step=2)
    restarted.logger.finish()
    assert [json.loads(line)["step"] for line in verl_file.read_text().splitlines()] == [2]
    assert read_metrics_log(tmp_path / "m.jsonl") == {1: {"ebpo/shrinkage_mean": 0.4}, 2: {"ebpo/shrinkage_mean": 0.5}}


def test_checkpoint_curriculum_position_round_trips(tmp_path, hub_data, tiny_tokenizer, stand_in_trainer, _config):
    """The curriculum dataset's position goes through the trainer's data.pt like verl's sampler position."""
    from ebpo_verl.data import math500

    train = math500.prepare(tmp_path / "data", local_path=hub_data / "math500.jsonl")
    val = shutil.copy(train, tmp_path / "val.parquet")
    config = _config(
        tmp_path,
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=8",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        "data.custom_cls.path=pkg://ebpo_verl.trainer.curriculum",
        "data.custom_cls.name=CurriculumDataset",
        "+data.curriculum.order=topic",
        "+data.curriculum.seed=3",
    )

    def trainer():
        made = stand_in_trainer(config)
        made.tokenizer, made.processor = tiny_tokenizer, None
        made._init_dataloader()  # the curriculum dataset's loader in place of the stand-in's
        return made

    def batches(made, count: int) -> list[list[int]]:
        stream = iter(made.train_dataloader)
        return [[info["index"] for info in next(stream)["extra_info"]] for _ in range(count)]

    uninterrupted = batches(trainer(), 6)
    assert uninterrupted[0] != list(range(8))  # topic order, not file order
    first = trainer()
    assert batches(first, 3) == uninterrupted[:3]
    first.global_steps = 3
    first._save_checkpoint()
    resumed = trainer()
    resumed._load_checkpoint()
    assert batches(resumed, 3) == uninterrupted[3:]


# ------------------------------------------------- state files written before the estimators owned their state

LEGACY = Path(__file__).parent / "fixtures" / "legacy_state"
LEGACY_STEPS = [
    ([0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], ["p0"] * 3 + ["p1"] * 3 + ["p2"] * 3),
    ([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0], ["p1"] * 3 + ["p3"] * 3 + ["p0"] * 3),
]
"""The two steps after which the code at be1abca wrote tests/fixtures/legacy_state (see its README)."""


def _legacy_estimator(entry):
    options = EBPOOptions(cluster_key="topic", min_cluster_prompts=2, decay=0.9) if entry is EBPO else None
    return registry.new_estimator(entry, options)


def _legacy_step(estimator, entry, step: int, rewards: list[float], keys: list[str]):
    uids = np.array([f"u{step}-{k}" for k in keys], dtype=object)
    labels = np.array(["a" if k in ("p0", "p1") else "b" for k in keys], dtype=object)
    values = labels if entry is EBPO else np.array(keys, dtype=object)
    return estimator(torch.tensor(rewards, dtype=torch.float64), uids, torch.ones(len(keys), dtype=torch.bool), values)


@pytest.mark.parametrize("entry", [EBPO, SPO, DBB], ids=lambda entry: entry.name)
def test_state_files_of_the_code_before_the_estimator_objects_load_and_resume_bit_identically(tmp_path, entry):
    """The same two steps give today the state the old code saved, and a resume from the old file continues
    exactly as the uninterrupted run (advantages, diagnostics and state)."""
    uninterrupted = _legacy_estimator(entry)
    for step, (rewards, keys) in enumerate(LEGACY_STEPS):
        _legacy_step(uninterrupted, entry, step, rewards, keys)
    saved = json.loads((LEGACY / entry.state.file).read_text())
    assert saved["global_step"] == 2 and uninterrupted.state.state_dict() == saved["state"]
    resumed = _legacy_estimator(entry)
    assert load_state(entry, LEGACY, resumed.state, resumed.options, 2)
    rewards, keys = LEGACY_STEPS[0][0][::-1], LEGACY_STEPS[1][1]
    want = _legacy_step(uninterrupted, entry, 2, rewards, keys)
    got = _legacy_step(resumed, entry, 2, rewards, keys)
    assert torch.equal(got.values, want.values) and got.diagnostics == want.diagnostics
    assert resumed.state.state_dict() == uninterrupted.state.state_dict()
    assert not torch.equal(got.values, _legacy_step(_legacy_estimator(entry), entry, 2, rewards, keys).values)
