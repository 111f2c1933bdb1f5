"""A resume under ``ebpo-train`` unpickles data only (``ebpo_verl/trainer/checkpoint/trusted_load.py``, issue 38).

One real run (the CPU trainer, world size 1: the smoke runs' tiny model and data, two steps, a checkpoint after
each, with the toy estimator of docs/architecture.md shipped to Ray's workers: tests/test_registry.py's plugin, so
this run is also its end-to-end run) writes the checkpoints; each case copies its ``global_step_1`` into a run
folder of its own and resumes from it with ``resume_mode=auto`` (the default), as a rerun in a shared or copied run
folder would:

- a callable planted in the extra-state shard (read in the worker, by its patched ``load_checkpoint``, after the
  model and optimizer shards) and in ``data.pt`` (read in the trainer's process) is refused in one line naming
  the file, and its marker file never appears; every kind of file (model, optimizer and extra-state shards,
  ``data.pt``) of the real checkpoint, planted, is refused in this process by the same patched load
  (``weights_only_resume``, each file's list chosen by its name), which the workers' and the trainer's resume run
  (``test_worker_classes_load_weights_only_unless_trusted``; the two-node smoke plants rank 1's model shard and
  resumes it on the cluster);
- with ``trainer.trust_checkpoint=true`` the planted file is unpickled as verl does (the marker appears) and the
  run resumes (positive control), exactly as before: the resumed step-2 ``toy/*`` metrics and saved toy state
  equal the uninterrupted run's (verl reads the extra state by key: the planted entry changes nothing else). That
  one run is also the exact-resume run: each file of the real checkpoint loads under the default resume's patch
  to the very objects verl's own load gives (``test_every_kind...``), so a default resume feeds verl the same
  state (end to end: EBPO's ``ebpo/*`` metrics and EB state after default resumes, the one-node smoke's run K,
  tests/test_cpu_smoke.py, and the campaign's reruns, tests/test_campaign.py).

World size 2: verl's checkpoint manager writes model, optimizer and extra-state shards at world size 2 (FSDP2,
FSDP1, HSDP; gloo on CPU), whose globals must be allowed for their kind and which must load under the resume's
patch (below); and the two-node smoke (``cpu_smoke.sh --nodes 2 --faults``, tests/test_cluster.py) resumes its
world-size-2 checkpoint on the cluster with a callable planted in rank 1's model shard (loaded by the worker on
the second node): refused in the one line below, its marker never made (``tests/harness/planting.py``, which
plants for both).

The heavy tests are in the xdist group ``own_ray`` (tests/conftest.py): each run starts a Ray instance of its
own (its own temp folder, ``RAY_ADDRESS`` dropped: ``tests/harness/runs.py``), so they run beside the cluster
test's group; the smoke runs' leak checks leave what these runs' processes were seen holding to them
(``tests/harness/scan.py``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ebpo_verl.compat.unpickling import ALLOWED, DATALOADER, EXTRA_STATE, MODEL, OPTIMIZER, allowed
from tests.harness.planting import REFUSAL, Planted, copied, plant, unsafe_globals
from tests.test_registry import REPO_ROOT, toy_env, write_toy_site

ROOT = Path(__file__).resolve().parents[1]
FILES = {
    MODEL: "actor/model_world_size_1_rank_0.pt",
    OPTIMIZER: "actor/optim_world_size_1_rank_0.pt",
    EXTRA_STATE: "actor/extra_state_world_size_1_rank_0.pt",
    DATALOADER: "data.pt",
}
RUN_TIMEOUT_S = 600
HEAVY = pytest.mark.heavy("own_ray")  # an xdist group beside "heavy": its runs use their own Ray instance


# ------------------------------------------------------------------------ the allowlist against real files
@HEAVY
@pytest.mark.slow
def test_the_allowlist_is_what_real_checkpoints_hold(trained):
    """Every global a real checkpoint file holds is allowed for its kind, and every name of the allowlist is held
    by one (world size 1: the CPU trainer's files; Replicate: an HSDP run's, world size 2 below)."""
    step = trained[0] / "ckpt_a" / "global_step_1"
    held = {kind: unsafe_globals(step / name) for kind, name in FILES.items()}
    for kind, names in held.items():
        assert names <= set(allowed((kind,))), (kind, names - set(allowed((kind,))))
    assert held[DATALOADER] == set()  # the dataloader's position: numbers, strings and containers
    assert "numpy.ndarray" in held[EXTRA_STATE]  # numpy's RNG state
    seen = set().union(*held.values())
    built = {"numpy.dtypes.UInt32DType"}  # the RNG array's dtype class: built, named by no global of the file
    assert set(ALLOWED) - seen == {"torch.distributed.tensor.placement_types.Replicate", *built}  # + HSDP's


# -------------------------------------------------------------------------------------- the trainer runs
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    """(work folder, its prepared files) of a two-step CPU run ``a`` saving after each step (in ``ckpt_a``), with
    the toy estimator (``site/``: its module and entry point) on the driver's and the workers' PYTHONPATH."""
    from tests.harness import settings

    work = tmp_path_factory.mktemp("resume_trust")
    write_toy_site(work / "site")
    files = settings.prepare(work)
    code, log = _run(work, files, "a")
    assert code == 0, log[-3000:]
    return work, files


def _run(work: Path, files: dict, name: str, *extra: str) -> tuple[int, str]:
    """One ``python -m ebpo_verl.main`` run ``name`` (two steps, a checkpoint each; folder ``ckpt_<name>``) of the
    toy estimator, which reaches the TaskRunner (the Ray actor that calls it) through ``runtime_env``, as a user
    ships a plugin to a cluster."""
    from tests.harness.runs import Run

    site = work / "site"
    toy = [
        "algorithm.adv_estimator=toy",
        "++algorithm.toy.decay=0.25",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH={site}{os.pathsep}{REPO_ROOT}",
    ]
    overrides = [*toy, "trainer.save_freq=1", "trainer.test_freq=-1", *extra]
    run = Run(work, files, name, overrides, steps=2, env={"PYTHONPATH": toy_env(site)["PYTHONPATH"]})
    code = run.wait(RUN_TIMEOUT_S)
    return code, run.log.read_text(errors="replace")


def _toy_states(work: Path, name: str) -> dict[int, dict]:
    """Step -> the toy state run ``name`` saved (``toy_state.json``) in each checkpoint of its folder."""
    folder = work / f"ckpt_{name}"
    return {int(p.parent.name.removeprefix("global_step_")): json.loads(p.read_text())
            for p in folder.glob("global_step_*/toy_state.json")}  # fmt: skip


def _copied(trained, name: str) -> Path:
    """Run ``name``'s folder holding a copy of the trained run's ``global_step_1`` as its latest checkpoint."""
    work, _ = trained
    return copied(work / "ckpt_a" / "global_step_1", work / f"ckpt_{name}")


def _same(a, b) -> bool:
    """Equal loaded checkpoint contents: the same types and keys, tensors (a DTensor's local shard) and arrays
    equal bit for bit in the same dtype."""
    import numpy as np
    import torch

    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        a, b = (t.to_local() if hasattr(t, "to_local") else t for t in (a, b))
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@HEAVY
@pytest.mark.slow
@pytest.mark.parametrize("kind", [EXTRA_STATE, DATALOADER])  # the worker's last file, the trainer process's
def test_a_planted_callable_is_refused_in_one_line_and_never_runs(trained, kind):
    work, _ = trained
    name = "p" + kind.split()[0]
    step = _copied(trained, name)
    marker = work / f"MARKER-{name}"
    plant(step / FILES[kind], marker)
    code, log = _run(*trained, name)
    errors = [line for line in log.splitlines() if "ebpo-train: error" in line or "Traceback" in line]
    assert code == 1 and errors == [REFUSAL.format(file=step / FILES[kind])], log[-4000:]
    assert not marker.exists()  # the callable never ran
    assert not (step.parent / "global_step_2").exists()  # nothing trained


@HEAVY
@pytest.mark.slow
def test_every_kind_of_a_real_checkpoint_planted_is_refused_by_the_resumes_load(trained, tmp_path):
    """Each file of the real ``global_step_1`` loads under the resume's patch as verl's loaders call torch.load
    (``weights_only=False``), to objects equal (exactly, every tensor and array) to those of torch's unrestricted
    load, the one a trusted resume runs; and a copy of it with a callable planted is refused in the one line naming
    it, the callable never run (the kinds whose run is not above: the workers load every shard in one patched
    call)."""
    import torch

    from ebpo_verl.trainer.checkpoint.trusted_load import UntrustedCheckpointError, weights_only_resume

    work, _ = trained
    real = work / "ckpt_a" / "global_step_1"
    step = shutil.copytree(real, tmp_path / "global_step_1")
    for kind, name in FILES.items():
        with weights_only_resume():
            patched = torch.load(real / name, weights_only=False)
        assert isinstance(patched, dict) and _same(patched, torch.load(real / name, weights_only=False)), kind
        marker = tmp_path / f"MARKER-{kind.split()[0]}"
        plant(step / name, marker)
        with pytest.raises(UntrustedCheckpointError) as err, weights_only_resume():
            torch.load(step / name, weights_only=False)
        assert str(err.value) == REFUSAL.format(file=step / name).removeprefix("ebpo-train: error: "), kind
        assert not marker.exists(), kind


@pytest.fixture(scope="module")
def resumed_trusted(trained) -> Path:
    """The work folder, after run ``trusted`` resumed with ``trainer.trust_checkpoint=true`` from a copy of run
    ``a``'s ``global_step_1`` with a callable planted in its extra state (verl reads that file by key)."""
    work, _ = trained
    step = _copied(trained, "trusted")
    plant(step / FILES[EXTRA_STATE], work / "MARKER-trusted")
    code, log = _run(*trained, "trusted", "trainer.trust_checkpoint=true")
    assert code == 0, log[-4000:]
    return work


@HEAVY
@pytest.mark.slow
def test_trust_checkpoint_unpickles_as_verl_does_and_resumes(resumed_trusted):
    """The switch's warning is literal: the planted callable (in the extra state, which verl reads by key) runs,
    and the run resumes to its step 2."""
    work = resumed_trusted
    assert (work / "MARKER-trusted").exists()
    assert (work / "ckpt_trusted" / "global_step_2" / "toy_state.json").is_file()  # the estimator's state of step 2


@HEAVY
@pytest.mark.slow
def test_a_resumed_checkpoint_continues_exactly_as_the_uninterrupted_run(resumed_trusted):
    """Resumed from the uninterrupted run's step 1 (the trusted run: verl reads no key of its planted entry),
    step 2's ``toy/*`` metrics and saved toy state equal it."""
    from ebpo_verl.ops.metrics_log import read_metrics_log

    work = resumed_trusted
    a = read_metrics_log(work / "ckpt_a" / "metrics.jsonl")
    r = read_metrics_log(work / "ckpt_trusted" / "metrics.jsonl")
    assert sorted(r) == [1, 2]  # step 1 logged from the checkpoint's saved metrics, step 2 trained
    keys = sorted(k for k in a[2] if k.startswith("toy/"))
    assert "toy/baseline" in keys  # step 2's: the average of the state resumed from step 1
    for key in keys:  # equal up to the order of a float sum over the batch's groups
        assert math.isclose(a[2][key], r[2][key], rel_tol=1e-12, abs_tol=1e-15), (key, a[2][key], r[2][key])
    assert _toy_states(work, "trusted")[2] == _toy_states(work, "a")[2]


@HEAVY
@pytest.mark.slow
def test_the_toy_trains_and_resumes_exactly_through_ebpo_train_on_rays_workers(resumed_trusted):
    """tests/test_registry.py's toy, in a real ``ebpo-train`` run (the CPU trainer, the smoke runs' tiny model):
    it reaches the TaskRunner, the Ray actor that calls the estimator, through ``runtime_env`` (its folder on the
    workers' PYTHONPATH, as a user ships a plugin to a cluster); its state is saved in every checkpoint, and a
    resume from step 1 saves at step 2 the state of the uninterrupted run, exactly."""
    work = resumed_trusted
    uninterrupted, resumed = _toy_states(work, "a"), _toy_states(work, "trusted")
    assert sorted(uninterrupted) == [1, 2] and uninterrupted[2]["state"]["steps"] == 2
    assert uninterrupted[1]["options"]["decay"] == 0.25 and uninterrupted[1]["state"] != uninterrupted[2]["state"]
    assert sorted(resumed) == [1, 2] and resumed[2] == uninterrupted[2]


def test_the_refusal_names_the_switch_of_the_options():
    """The switch the refusal names is the option the trainer reads."""
    from ebpo_verl.trainer.checkpoint.trusted_load import SWITCH
    from ebpo_verl.trainer.run_options import TrainerOptions

    key, value = SWITCH.split("=")
    assert key == "trainer.trust_checkpoint" and value == "true"
    assert TrainerOptions().trust_checkpoint is False
    assert TrainerOptions.from_mapping({"trust_checkpoint": True}).trust_checkpoint is True
    with pytest.raises(ValueError, match="trust_checkpoint"):
        TrainerOptions.from_mapping({"trust_checkpoint": "yes"})


def test_ebpo_train_help_lists_the_switch():
    out = subprocess.run([sys.executable, "-m", "ebpo_verl.main", "--help"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)  # fmt: skip
    assert "trainer.trust_checkpoint" in out.stdout


# ------------------------------------------------------------------- the loader patch, without a trainer
def _saved(path: Path, value) -> Path:
    import torch

    path.parent.mkdir(exist_ok=True)
    torch.save(value, path)
    return path


def test_the_resume_load_allows_the_list_and_refuses_a_callable_before_it_runs(tmp_path):
    """In the block, torch.load is weights-only with the resume's list (numpy's RNG state loads from an extra state
    file (``tests/test_allowlists.py``: each kind's own list); verl's own
    ``weights_only=False`` is overridden); a planted callable is refused in one line; after it, torch's load and
    its safe globals are what they were."""
    import numpy as np
    import torch

    from ebpo_verl.trainer.checkpoint.trusted_load import UntrustedCheckpointError, weights_only_resume

    extra = FILES[EXTRA_STATE].removeprefix("actor/")
    rng = _saved(tmp_path / extra, {"rng": {"numpy": np.random.get_state()}, "lr_scheduler": None})
    marker = tmp_path / "MARKER"
    planted = _saved(tmp_path / "planted" / extra, {"rng": {}, "planted": Planted(marker)})
    import torch.distributed.tensor  # noqa: F401 (its import registers DTensor's types: before the snapshot)

    load, before = torch.load, torch.serialization.get_safe_globals()
    with weights_only_resume():
        state = torch.load(rng, weights_only=False)
    assert np.array_equal(state["rng"]["numpy"][1], np.random.get_state()[1])
    with pytest.raises(UntrustedCheckpointError) as err, weights_only_resume():
        torch.load(planted, weights_only=False)
    assert str(err.value) == REFUSAL.format(file=planted).removeprefix("ebpo-train: error: ")
    assert not marker.exists()
    assert torch.load is load and set(torch.serialization.get_safe_globals()) == set(before)
    assert torch.load(planted, weights_only=False) is not None and marker.exists()  # the plant is real


def test_the_resume_refuses_transfer_queue_state_in_its_block(tmp_path):
    import transfer_queue

    from ebpo_verl.trainer.checkpoint.trusted_load import UntrustedCheckpointError, weights_only_resume

    stock = transfer_queue.load_checkpoint
    with weights_only_resume(), pytest.raises(UntrustedCheckpointError, match="TransferQueue state.*pickle.load"):
        transfer_queue.load_checkpoint(tmp_path / "transfer_queue")
    assert transfer_queue.load_checkpoint is stock


def test_worker_classes_load_weights_only_unless_trusted():
    """Without the switch each worker class that loads checkpoints is replaced by a subclass whose registered
    ``load_checkpoint`` dispatches as verl's (one to all); with it, verl's classes stay."""
    import ray
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

    from ebpo_verl.trainer.checkpoint.trusted_load import TrustedLoadMixin
    from ebpo_verl.trainer.run_options import RunOptions, TrainerOptions

    class Base:
        def _init_resource_pool_mgr(self):
            mapping = {"actor": ActorRolloutRefWorker, "critic": TrainingWorker}
            self.role_worker_mapping = {role: ray.remote(cls) for role, cls in mapping.items()}

    class Trainer(TrustedLoadMixin, Base):
        def __init__(self, trust: bool):
            self.options = RunOptions("grpo", trainer=TrainerOptions(trust_checkpoint=trust))

    for trust in (False, True):
        trainer = Trainer(trust)
        trainer._init_resource_pool_mgr()
        mapping = trainer.role_worker_mapping
        for stock, actor_cls in zip((ActorRolloutRefWorker, TrainingWorker), mapping.values(), strict=True):
            cls = actor_cls.__ray_actor_class__
            assert (cls is stock) == trust and issubclass(cls, stock)
            assert getattr(cls.load_checkpoint, MAGIC_ATTR) == getattr(stock.load_checkpoint, MAGIC_ATTR)


WRITER = """
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, model_dir, out, port, versions):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    for version in versions.split(","):  # one process group, a fresh model per version
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        shape, names = ((2, 1), ("ddp", "fsdp")) if version == "hsdp" else ((2,), ("fsdp",))
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        if version == "fsdp1":  # as verl's FSDP1 workers wrap it: with the device mesh
            model = FullyShardedDataParallel(model, device_mesh=mesh, device_id=torch.device("cpu"),
                                             use_orig_params=True)
        else:
            fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        ids = torch.tensor([[1, 2, 3]])
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        scheduler.step()
        contents = ["model", "optimizer", "extra"]
        manager = FSDPCheckpointManager(model, optimizer, lr_scheduler=scheduler,
                                        processing_class=AutoTokenizer.from_pretrained(model_dir),
                                        checkpoint_config={"save_contents": contents, "load_contents": contents})
        manager.save_checkpoint(os.path.join(out, version, "actor"), global_step=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    model_dir, out, port, versions = sys.argv[1:]
    mp.spawn(rank_main, args=(model_dir, out, port, versions), nprocs=2)
"""


@pytest.mark.slow
def test_world_size_2_shards_hold_only_listed_types_and_load_weights_only(tmp_path):
    """verl's checkpoint manager at world size 2 (gloo on CPU; one pair of ranks saves all three) with FSDP2, FSDP1
    and HSDP: every global of every model, optimizer and extra-state shard is allowed for its kind, and each loads
    under the resume's patch."""
    import socket

    import torch

    from ebpo_verl.cpu.tiny import build_model, build_tokenizer
    from ebpo_verl.trainer.checkpoint.trusted_load import weights_only_resume

    build_model(tmp_path / "tiny", build_tokenizer(tmp_path / "tiny"))
    (tmp_path / "writer.py").write_text(WRITER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    versions = ("fsdp2", "fsdp1", "hsdp")
    cmd = [sys.executable, str(tmp_path / "writer.py"), str(tmp_path / "tiny"), str(tmp_path), port, ",".join(versions)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    seen: set[str] = set()
    for version in versions:
        actor = tmp_path / version / "actor"
        for kind, prefix in ((MODEL, "model"), (OPTIMIZER, "optim"), (EXTRA_STATE, "extra_state")):
            shards = sorted(actor.glob(f"{prefix}_world_size_2_rank_*.pt"))
            assert len(shards) == 2, (version, kind)
            for shard in shards:
                held = unsafe_globals(shard)
                assert held <= set(allowed((kind,))), (version, shard.name, held - set(allowed((kind,))))
                seen |= held
                with weights_only_resume():
                    assert isinstance(torch.load(shard, weights_only=False), dict)
    assert "torch.distributed.tensor.placement_types.Replicate" in seen  # HSDP's placement
