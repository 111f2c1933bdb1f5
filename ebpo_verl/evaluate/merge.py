"""What ``--model`` may name, and the one-time merge of a verl FSDP checkpoint into a Hugging Face folder.

A ``global_step_N`` folder is merged by verl's model merger into ``global_step_N/huggingface_merged`` (through a
temporary folder renamed into place) and reused afterwards. By default the merge runs through
:mod:`ebpo_verl.evaluate.safe_merge` (shards read weights-only); ``trust=True`` (``--trust-checkpoint``) runs verl's
merger as it is (docs/evaluation.md#trust).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ebpo_verl.evaluate.prompts import EvalInputError
from ebpo_verl.ops.model_ref import HUB_ID

MERGED = "huggingface_merged"
SAFE_MERGER = "ebpo_verl.evaluate.safe_merge"
REFUSED = 3
"""Exit status of :data:`SAFE_MERGER` for a refused shard; its one line contains :data:`REFUSAL_MARK`."""
REFUSAL_MARK = ": refused: the shard pickles "


def merge_checkpoint(step_dir: Path, trust: bool = False) -> Path:
    """``step_dir/huggingface_merged``, merged from ``step_dir/actor`` unless it is already there; shards read
    weights-only unless ``trust`` (EvalInputError naming the shard when one carries more than FSDP's types)."""
    out = step_dir / MERGED
    if (out / "config.json").is_file():
        print(f"evaluate: using the merged model {out}", file=sys.stderr)
        return out
    actor = step_dir / "actor"
    if not (actor / "fsdp_config.json").is_file():
        raise EvalInputError(f"{step_dir} has no actor/fsdp_config.json: not a verl FSDP checkpoint folder")
    tmp = step_dir / f".{MERGED}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    merger = ["verl.model_merger", "merge", "--backend", "fsdp"] if trust else [SAFE_MERGER]
    cmd = [sys.executable, "-m", *merger, "--local_dir", str(actor), "--target_dir", str(tmp)]
    how = "trusted: unpickled by verl's merger" if trust else "weights only"
    print(f"evaluate: merging {actor} -> {out} ({how})", file=sys.stderr)
    try:
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        refusal = [line for line in result.stdout.splitlines() if REFUSAL_MARK in line]
        if result.returncode == REFUSED and refusal:
            raise EvalInputError(refusal[-1])
        if result.returncode != 0:
            raise EvalInputError(f"verl's model merger failed on {actor}:\n{result.stdout[-3000:]}")
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "config.json").is_file():  # not a concurrent merge that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def checkpoint_step(model: str) -> int | None:
    """N for a ``.../global_step_N`` folder or its ``huggingface_merged``, else None (hub id, other folder)."""
    path = Path(model)
    if path.name == MERGED:
        path = path.parent
    match = re.fullmatch(r"global_step_(\d+)", path.name)
    return int(match[1]) if match else None


def resolve_model(target: str) -> tuple[str, Path | None]:
    """(what to load, checkpoint step folder to merge or None) for ``--model``: a ``global_step_N`` folder, a
    checkpoint root (its latest step), a local HF folder or a hub id; the merge is left to :func:`merge_checkpoint`."""
    path = Path(target)
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file():
        path = path / f"global_step_{latest.read_text().strip()}"
    if path.name.startswith("global_step_"):
        if not path.is_dir():
            raise EvalInputError(f"checkpoint folder {path} does not exist")
        return str(path.resolve() / MERGED), path.resolve()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EvalInputError(
                f"{path} is neither a Hugging Face model folder (config.json), a verl checkpoint "
                "(global_step_N) nor a checkpoint root (latest_checkpointed_iteration.txt)"
            )
        return str(path.resolve()), None
    if path.exists() or not HUB_ID.fullmatch(target):
        raise EvalInputError(f"--model {target}: no such folder, and not a hub id of the form org/name")
    return target, None
