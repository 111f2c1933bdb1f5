"""A callable planted in a checkpoint file, and the two-node run's resumes from planted checkpoints (issue 38).

:func:`plant` re-saves a ``torch.save`` dict with one more entry, a :class:`Planted` (what a tampered or foreign
checkpoint could carry). ``tests/test_resume_trust.py`` plants it in a world-size-1 checkpoint (and resumes two: the
extra state and ``data.pt``), :func:`refused_plants` (``--nodes 2 --faults``) in the two-node run's step-2 one.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from tests.harness.runs import Run
from tests.harness.settings import NODES, SAVE_FREQ

REFUSAL = (
    "ebpo-train: error: {file} pickles posix.system, which is not a tensor or a type of this package's checkpoints, "
    "so resuming from it would run code from the file (docs/training.md#trust); only if you trust this checkpoint "
    "as you would trust code, set trainer.trust_checkpoint=true"
)
"""The one line ``ebpo-train`` prints for a planted file (written out here, not built from the trainer's text)."""
NODE_PLANTS = (f"actor/model_world_size_{NODES}_rank_{NODES - 1}.pt",)
"""Files of the two-node checkpoint planted, one resume each (minutes each on 2 cores shared with other sessions:
the workers and the rollout servers start before verl loads a checkpoint). Rank 1's model shard is the first
file the second node's worker unpickles: the refusal in a process the driver does not run. Its optimizer and
extra-state shards go through the same patched load in that process, ``data.pt`` through the trainer's (rank
independent), and every kind is planted in a real world-size-1 checkpoint by tests/test_resume_trust.py; a second
two-node plant would add minutes to CI's critical path for no new code path."""


class Planted:
    """Unpickling this runs ``touch MARKER``: what a tampered checkpoint file could carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def unsafe_globals(path: Path) -> set[str]:
    """The globals a torch.save file pickles beyond torch's allowlist, read without unpickling (this process's safe
    globals restored after)."""
    import torch

    from ebpo_verl.compat.unpickling import only_globals

    with only_globals(()):
        return set(torch.serialization.get_unsafe_globals_in_checkpoint(path))


def plant(path: Path, marker: Path) -> None:
    """``path`` (a torch.save dict) re-saved with one more entry that runs ``touch marker`` when unpickled."""
    import torch

    from ebpo_verl.compat.unpickling import ALLOWED, only_globals

    with only_globals(ALLOWED):
        state = torch.load(path, map_location="cpu", weights_only=True)
    state["planted"] = Planted(marker)
    torch.save(state, path)
    if "posix.system" not in unsafe_globals(path):
        raise AssertionError(f"[cpu_smoke] {path}: the planted callable is not in the file")


def copied(step: Path, folder: Path) -> Path:
    """Run folder ``folder`` holding a copy of checkpoint ``step`` (``global_step_N``) as its latest one."""
    from ebpo_verl.trainer.checkpoint.resume import TRACKER_FILE

    shutil.copytree(step, folder / step.name)
    (folder / TRACKER_FILE).write_text(step.name.removeprefix("global_step_"))
    return folder / step.name


def check_refused(log: Path, code: int, step: Path, file: Path, marker: Path) -> str:
    """A resume from ``step`` with ``file`` planted exits non-zero with exactly one error line (the :data:`REFUSAL`),
    no traceback, no marker, no step trained; returns that line."""
    text = log.read_text(errors="replace")
    errors = [line for line in text.splitlines() if "ebpo-train: error" in line or "Traceback" in line]
    problems = [] if code != 0 else ["the run exited 0"]
    problems += [] if f"resumes from {step}" in text else [f"the pre-flight did not resume from {step}"]
    problems += [] if errors == [REFUSAL.format(file=file)] else [f"expected the one refusal naming {file}: {errors}"]
    problems += [f"{marker} appeared: the planted callable ran"] if marker.exists() else []
    problems += [f"{trained} written"] if (trained := step.parent / f"global_step_{SAVE_FREQ + 1}").exists() else []
    if problems:
        tail = "".join(text.splitlines(keepends=True)[-60:])
        raise AssertionError(f"[cpu_smoke] planted {file}: {'; '.join(problems)}\n{tail}")
    return errors[0]


def refused_plants(work: Path, files: dict, timeout: float, extra: list[str], steps: int, cluster) -> None:
    """Each of :data:`NODE_PLANTS` planted in a copy of run ``nodes``' step-2 checkpoint and resumed on ``cluster``:
    refused (:func:`check_refused`), no process left. On the CPU backend's HF rollout servers, which start faster
    than vLLM's: the refusal comes from the worker's checkpoint load, which no rollout reaches."""
    source = work / "ckpt_nodes" / f"global_step_{SAVE_FREQ}"
    for name in NODE_PLANTS:
        run = "planted_" + Path(name).name.split("_")[0].removesuffix(".pt")
        step = copied(source, work / f"ckpt_{run}")
        marker = work / f"MARKER-{run}"
        plant(step / name, marker)
        print(f"[cpu_smoke] run {run}: {work / f'{run}.log'}", flush=True)
        start = time.monotonic()
        attempt = Run(work, files, run, extra, rollout="hf", steps=steps, cluster=cluster)
        code = attempt.wait(timeout)
        took = time.monotonic() - start
        cluster.wait_job_gone()
        line = check_refused(attempt.log, code, step, step / name, marker)
        print(
            f"[cpu_smoke] planted callable refused at world size {NODES} in {name} ({took:.0f} s, exit {code}): "
            f"{line}; the marker never appeared, no global_step_{SAVE_FREQ + 1}, no process of the attempt left",
            flush=True,
        )
