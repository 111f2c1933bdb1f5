"""Untrusted checkpoints at evaluation: a checkpoint that verl's own FSDP checkpoint manager wrote (FSDP2, as the
CPU runs use, and FSDP1, verl's default strategy; world size 2, gloo on CPU) merges with no flag, weights only; a
shard with a planted callable is refused in one line and the callable never runs; ``--trust-checkpoint``
unpickles it as before (and so runs it)."""

from __future__ import annotations

import os
import pickletools
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ebpo_verl.data.all import prepare_all
from ebpo_verl.evaluate.merge import MERGED, REFUSAL_MARK, merge_checkpoint
from ebpo_verl.evaluate.prompts import EvalInputError

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

WRITER = """
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, model_dir, out, port, version):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    if version == "2":
        fully_shard(model, mesh=mesh)
    else:  # as verl's FSDP1 workers wrap it: with the device mesh, so the sharded state dict holds DTensors
        model = FullyShardedDataParallel(model, device_mesh=mesh, device_id=torch.device("cpu"), use_orig_params=True)
    contents = {"save_contents": ["model"], "load_contents": ["model"]}
    manager = FSDPCheckpointManager(model, None, processing_class=AutoTokenizer.from_pretrained(model_dir),
                                    checkpoint_config=contents)
    manager.save_checkpoint(out, global_step=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    model_dir, out, port, version = sys.argv[1:]
    mp.spawn(rank_main, args=(2, model_dir, out, port, version), nprocs=2)
"""


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def write_checkpoint(work: Path, version: str) -> Path:
    """A global_step_1 folder written by verl's FSDPCheckpointManager from the tiny model in ``work/tiny``."""
    script = work / "write_checkpoint.py"
    script.write_text(WRITER)
    step = work / f"run-fsdp{version}" / "global_step_1"
    cmd = [sys.executable, str(script), str(work / "tiny"), str(step / "actor"), _free_port(), version]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return step


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, hub_data):
    """(tiny model folder, a global_step_1 folder of verl's FSDP2 checkpoint, data dir)."""
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

    work = tmp_path_factory.mktemp("trust")
    build_model(work / "tiny", build_tokenizer(work / "tiny"))
    prepare_all(work / "data", hub_data, "dapo", False, ("aime2024",))
    return work / "tiny", write_checkpoint(work, "2"), work / "data"


def _globals(shard: Path) -> set[str]:
    """The GLOBAL names a torch.save file pickles, read without unpickling it."""
    with zipfile.ZipFile(shard) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    return {str(arg) for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


@pytest.mark.parametrize("version", ["2", "1"])
def test_a_checkpoint_fsdp_wrote_merges_with_no_flag(fsdp_run, tmp_path, version):
    import json
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    tiny, written, _ = fsdp_run
    if version == "1":
        shutil.copytree(tiny, tmp_path / "tiny")
        written = write_checkpoint(tmp_path, "1")
    step = tmp_path / "global_step_1"
    shutil.copytree(written, step)
    assert json.loads((step / "actor" / "fsdp_config.json").read_text()) == {"FSDP_version": int(version),
                                                                             "world_size": 2}  # fmt: skip
    shards = sorted((step / "actor").glob("model_world_size_2_rank_*.pt"))
    assert len(shards) == 2
    found = _globals(shards[0])  # the types the allowlist must hold: what FSDP really wrote
    assert {"torch.distributed.tensor DTensor", "torch.distributed.tensor.placement_types Shard"} <= found
    assert "torch.distributed.device_mesh DeviceMesh" in found
    out = merge_checkpoint(step)
    assert out == step / MERGED
    merged = AutoModelForCausalLM.from_pretrained(out).state_dict()
    original = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    assert set(merged) == set(original)
    for key, weight in original.items():  # the two shards concatenated back, saved in bfloat16 by verl
        assert torch.equal(merged[key], weight.to(torch.bfloat16)), key


class Planted:
    """Unpickling this runs ``touch MARKER``: what a malicious shard could carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _planted(written: Path, tmp_path: Path, rank: int) -> tuple[Path, Path, Path]:
    """A copy of the FSDP run's checkpoint whose rank ``rank`` shard also pickles a :class:`Planted` callable:
    (the copy's global_step folder, the marker file the callable would write, the shard)."""
    import shutil

    import torch
    import torch.distributed.tensor  # noqa: F401 (DTensor's types, to read the genuine shard weights-only)

    step, marker = tmp_path / "global_step_1", tmp_path / "MARKER"
    shutil.copytree(written, step)
    shard = step / "actor" / f"model_world_size_2_rank_{rank}.pt"
    state = torch.load(shard, map_location="cpu", weights_only=True)
    state["lm_head.bias"] = Planted(marker)
    torch.save(state, shard)
    assert not marker.exists()
    return step, marker, shard


def _generate(step: Path, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = ["generate", "--model", str(step), "--data-dir", str(data), "--benchmarks", "aime2024", "--limit", "1",
            "--runs", "1", "--engine", "hf", "--max-new-tokens", "2", "--out", str(out), *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "ebpo_verl.evaluate", *argv], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip


def test_a_planted_callable_is_refused_in_one_line_and_never_runs(fsdp_run, tmp_path):
    """Rank 1's shard (verl reads ranks > 0 in worker threads) through the command line."""
    _, written, data = fsdp_run
    step, marker, shard = _planted(written, tmp_path, 1)
    run = _generate(step, data, tmp_path / "gen.jsonl")
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert len(errors) == 1, run.stderr
    assert errors[0] == (
        f"python -m ebpo_verl.evaluate generate: error: {shard}{REFUSAL_MARK}posix.system, which is not a tensor or "
        "an FSDP/DTensor type, so merging it would run code from the file (docs/evaluation.md#trust); only if you "
        "trust this checkpoint as you would trust code, pass --trust-checkpoint"
    )
    assert not marker.exists()  # the callable never ran
    assert sorted(p.name for p in step.iterdir()) == ["actor"]  # nothing half-merged left behind


def test_a_planted_callable_in_rank_0_is_refused_by_the_merge(fsdp_run, tmp_path):
    """Rank 0's shard (verl reads it first, on the main thread) through the function the command calls."""
    _, written, _ = fsdp_run
    step, marker, shard = _planted(written, tmp_path, 0)
    with pytest.raises(EvalInputError) as err:
        merge_checkpoint(step)
    assert str(err.value).startswith(f"{shard}{REFUSAL_MARK}posix.system,") and "\n" not in str(err.value)
    assert not marker.exists()
    assert sorted(p.name for p in step.iterdir()) == ["actor"]


def test_trust_checkpoint_unpickles_as_before(fsdp_run, tmp_path):
    """The flag's warning is literal: verl's merger unpickles the shard and the planted callable runs."""
    _, written, data = fsdp_run
    step, marker, _ = _planted(written, tmp_path, 1)
    _generate(step, data, tmp_path / "gen.jsonl", "--trust-checkpoint")
    assert marker.exists()
