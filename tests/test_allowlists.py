"""Each checkpoint file loads with its own kind's allowlist (``ebpo_verl/compat/unpickling.py``, issue 46 item 4).

One real save (verl's ``FSDPCheckpointManager``, FSDP2 at world size 1 on gloo, and ``data.pt`` as verl's trainer
writes it: a ``StatefulDataLoader``'s state) gives a file of each kind. Each loads under the resume's patch; a
class that only another kind may hold, planted in it, is refused in one line naming the file and the class, and
the same object in a file of its own kind loads; a planted callable is refused in each kind and never runs.
Megatron's resume (torch distributed checkpointing, metadata read with plain pickle) is refused unless trusted,
by the pre-flight of ``ebpo-train --cfg job`` and by the trainer itself.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.tensor.placement_types import Shard

from ebpo_verl.compat.unpickling import (
    ALLOWED,
    DATALOADER,
    EXTRA_STATE,
    MODEL,
    OPTIMIZER,
    RESUME_FILES,
    file_kind,
    weights_only_loads,
)
from ebpo_verl.trainer.checkpoint.trusted_load import UntrustedCheckpointError, weights_only_resume
from tests.harness.planting import REFUSAL, Planted, unsafe_globals
from tests.in_process import ebpo_train

NAMES = {
    MODEL: "model_world_size_1_rank_0.pt",
    OPTIMIZER: "optim_world_size_1_rank_0.pt",
    EXTRA_STATE: "extra_state_world_size_1_rank_0.pt",
    DATALOADER: "data.pt",
}
NUMPY = "numpy._core.multiarray._reconstruct, numpy.dtype, numpy.ndarray"
"""What a numpy array pickles (the extra state's RNG state): the extra state's alone."""
SHARD = "torch.distributed.tensor.placement_types.Shard"
"""A placement of a DTensor: the model and optimizer shards' alone."""
PLANTS = {NUMPY: (EXTRA_STATE, lambda: np.arange(3, dtype=np.uint32)), SHARD: (MODEL, lambda: Shard(0))}
"""Each planted class's names (as the refusal lists them): a kind that may hold it and the object."""

WRITER = """
import os, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

model_dir, out, port = sys.argv[1:]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=0, world_size=1)
model = AutoModelForCausalLM.from_pretrained(model_dir)
fully_shard(model, mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",)))
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
manager.save_checkpoint(os.path.join(out, "actor"), global_step=1)
loader = StatefulDataLoader(list(range(8)), batch_size=2)
next(iter(loader))
torch.save(loader.state_dict(), os.path.join(out, "data.pt"))  # as verl's trainer saves its dataloader
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Each kind's file of one real world-size-1 save (``global_step_1/actor/...``, ``global_step_1/data.pt``)."""
    import socket

    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

    work = tmp_path_factory.mktemp("allowlists")
    build_model(work / "tiny", build_tokenizer(work / "tiny"))
    (work / "writer.py").write_text(WRITER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    step = work / "global_step_1"
    run = subprocess.run([sys.executable, str(work / "writer.py"), str(work / "tiny"), str(step), port],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return {kind: step / ("" if kind == DATALOADER else "actor") / name for kind, name in NAMES.items()}


def _copy(saved: dict[str, Path], kind: str, folder: Path) -> Path:
    """A copy of the real ``kind`` file in ``folder`` (same name), read with the whole allowlist."""
    from ebpo_verl.compat.unpickling import only_globals

    with only_globals(ALLOWED):
        state = torch.load(saved[kind], map_location="cpu", weights_only=True)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / saved[kind].name)
    return folder / saved[kind].name


def _refusal(path: Path, carried: str) -> str:
    return REFUSAL.format(file=path).removeprefix("ebpo-train: error: ").replace("posix.system", carried)


@pytest.mark.parametrize("kind", RESUME_FILES)
def test_each_kind_of_a_real_save_loads_with_its_own_list(saved, kind):
    """verl names the file as :data:`KIND_FILES` says; it holds only its kind's names and loads under the patch;
    the model shard needs DTensor's types and the extra state numpy's, so neither list could be the other's."""
    path = saved[kind]
    assert file_kind(path) == kind
    held = unsafe_globals(path)
    assert all(kind in ALLOWED[name] for name in held), held
    needs = {MODEL: SHARD, OPTIMIZER: SHARD, EXTRA_STATE: "numpy.ndarray", DATALOADER: None}[kind]
    assert needs is None and held == set() or needs in held
    with weights_only_resume():
        state = torch.load(path, weights_only=False)
    assert isinstance(state, dict) and state


@pytest.mark.parametrize(
    ("kind", "plant"),
    [(MODEL, NUMPY), (OPTIMIZER, NUMPY), (EXTRA_STATE, SHARD), (DATALOADER, NUMPY), (DATALOADER, SHARD)],
)
def test_a_class_only_another_kind_may_hold_is_refused(saved, tmp_path, kind, plant):
    """Planted in a real file of ``kind``: refused in one line naming the file and the class; the same object in
    a file of a kind that may hold it loads (the refusal is the kind's, not the class's)."""
    owner, make = PLANTS[plant]
    assert kind not in ALLOWED[plant.split(", ")[-1]] and owner in ALLOWED[plant.split(", ")[-1]]
    path = _copy(saved, kind, tmp_path / "planted")
    state = torch.load(path, weights_only=False)
    state["planted"] = make()
    torch.save(state, path)
    with pytest.raises(UntrustedCheckpointError) as err, weights_only_resume():
        torch.load(path, weights_only=False)
    assert str(err.value) == _refusal(path, plant)
    own = tmp_path / "own" / NAMES[owner]
    own.parent.mkdir()
    torch.save({"planted": make()}, own)
    with weights_only_resume():
        loaded = torch.load(own, weights_only=False)["planted"]
    assert loaded == make() if plant == SHARD else np.array_equal(loaded, make())


@pytest.mark.parametrize("kind", RESUME_FILES)
def test_a_planted_callable_is_refused_in_each_kind_and_never_runs(saved, tmp_path, kind):
    path = _copy(saved, kind, tmp_path / "step")
    marker = tmp_path / "MARKER"
    state = torch.load(path, weights_only=False)
    state["planted"] = Planted(marker)
    torch.save(state, path)
    with pytest.raises(UntrustedCheckpointError) as err, weights_only_resume():
        torch.load(path, weights_only=False)
    assert str(err.value) == _refusal(path, "posix.system")
    assert not marker.exists()


def test_a_file_of_no_kind_of_the_reader_holds_nothing_listed(tmp_path):
    """Another name, a stream, or a kind the reader does not read (the merge reads model shards only): none of
    the list; plain tensors still load."""
    from ebpo_verl.compat.unpickling import UntrustedPickle

    other, extra = tmp_path / "other.pt", tmp_path / NAMES[EXTRA_STATE]
    torch.save({"rng": np.arange(3, dtype=np.uint32)}, other)
    torch.save({"rng": np.arange(3, dtype=np.uint32)}, extra)
    stream = io.BytesIO()
    torch.save({"p": Shard(0)}, stream)
    stream.seek(0)
    with weights_only_loads(RESUME_FILES):
        for source, carried in ((other, NUMPY), (stream, SHARD)):
            with pytest.raises(UntrustedPickle) as err:
                torch.load(source)
            assert ", ".join(err.value.carried) == carried and err.value.path is source
        assert stream.tell() == 0  # read from where it stood, put back
        torch.save({"w": torch.ones(2)}, other)
        assert torch.equal(torch.load(other)["w"], torch.ones(2))
        assert np.array_equal(torch.load(extra)["rng"], np.arange(3, dtype=np.uint32))  # the resume reads extra states
    with weights_only_loads((MODEL,)), pytest.raises(UntrustedPickle) as err:  # the merge does not
        torch.load(extra)
    assert ", ".join(err.value.carried) == NUMPY


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("model_world_size_16_rank_15.pt", MODEL),
        ("optim_world_size_2_rank_1.pt", OPTIMIZER),
        ("extra_state_world_size_2_rank_0.pt", EXTRA_STATE),
        ("data.pt", DATALOADER),
        ("model_world_size_2_rank_0.pt.bak", None),
        ("data_0.pt", None),
        ("my_model_world_size_2_rank_0.pt", None),
        ("model_world_size_x_rank_0.pt", None),
    ],
)
def test_file_kind_reads_the_base_name(name, kind):
    assert file_kind(f"/ckpt/global_step_3/actor/{name}") == kind == file_kind(Path("/ckpt", name))


# ------------------------------------------------------------------------------- Megatron: refused unless trusted
def _ebpo_train(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of :func:`tests.in_process.ebpo_train`."""
    code, _, err = ebpo_train(monkeypatch, capsys, *args)
    return code, err


def _checkpointed(folder: Path, step: int = 2) -> Path:
    """``folder`` as a run folder whose latest checkpoint is ``global_step_<step>`` (empty: the pre-flight reads
    no file of a GRPO checkpoint)."""
    (folder / f"global_step_{step}").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder / f"global_step_{step}"


MEGATRON = (
    "ebpo-train: error: actor_rollout_ref.actor.strategy=megatron resumes from {step} with a loader that this "
    "package cannot restrict to data (Megatron's is torch distributed checkpointing, whose metadata is read with "
    "plain pickle.load; only fsdp and fsdp2 checkpoints load weights-only), so resuming would run any code the "
    "checkpoint carries (docs/training.md#trust); only if you trust this checkpoint as you would trust code, set "
    "trainer.trust_checkpoint=true"
)


def test_ebpo_train_refuses_a_megatron_resume_unless_trusted(monkeypatch, capsys, tmp_path):
    """``--cfg job``: refused in one line before Ray starts; trusted, the pre-flight goes on to verl's own check
    (which refuses this FSDP config's missing Megatron section: the one refusal it has)."""
    step = _checkpointed(tmp_path / "run")
    args = ["--cfg", "job", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.strategy=megatron",
            f"trainer.default_local_dir={tmp_path / 'run'}"]  # fmt: skip
    code, err = _ebpo_train(monkeypatch, capsys, *args)
    errors = [line for line in err.splitlines() if "error" in line or "Traceback" in line]
    assert code == 2 and errors == [MEGATRON.format(step=step)], err
    code, err = _ebpo_train(monkeypatch, capsys, *args, "trainer.trust_checkpoint=true")
    errors = [line for line in err.splitlines() if "error" in line or "Traceback" in line]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("ebpo-train: error: verl's validate_config"), err


def _config(strategy: str, folder: Path, *, estimator: str = "grpo", critic: str = "fsdp"):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "algorithm": {"adv_estimator": estimator},
            "actor_rollout_ref": {"actor": {"strategy": strategy}},
            "critic": {"enable": None, "strategy": critic},
            "trainer": {"resume_mode": "auto", "default_local_dir": str(folder)},
        }
    )


def test_the_trainer_refuses_a_megatron_resume_before_verl_loads(tmp_path):
    """The trainer's own check (a run started without the pre-flight): refused before verl's load runs; a fresh
    start, an FSDP resume, a critic's Megatron and the switch pass as the config says."""
    from ebpo_verl.trainer.checkpoint.trusted_load import TrustedLoadMixin, check_strategies
    from ebpo_verl.trainer.run_options import RunOptions, TrainerOptions

    loads = []

    class Base:
        def _load_checkpoint(self):
            loads.append(self.config.actor_rollout_ref.actor.strategy)

    class Trainer(TrustedLoadMixin, Base):
        def __init__(self, config, trust: bool):
            self.config, self.options = config, RunOptions("grpo", trainer=TrainerOptions(trust_checkpoint=trust))

    step = _checkpointed(tmp_path / "run")
    with pytest.raises(UntrustedCheckpointError) as err:
        Trainer(_config("megatron", tmp_path / "run"), False)._load_checkpoint()
    assert str(err.value) == MEGATRON.format(step=step).removeprefix("ebpo-train: error: ") and loads == []
    for strategy in ("fsdp", "fsdp2"):
        Trainer(_config(strategy, tmp_path / "run"), False)._load_checkpoint()
    Trainer(_config("megatron", tmp_path / "fresh"), False)._load_checkpoint()  # nothing to resume
    Trainer(_config("megatron", tmp_path / "run"), True)._load_checkpoint()
    assert loads == ["fsdp", "fsdp2", "megatron", "megatron"]
    check_strategies(_config("fsdp", tmp_path / "run", critic="megatron"))  # GRPO runs no critic
    with pytest.raises(UntrustedCheckpointError, match=r"^critic.strategy=megatron resumes from "):
        check_strategies(_config("fsdp", tmp_path / "run", estimator="gae", critic="megatron"))
