"""The harness's flows beside the one-node one (:func:`ebpo_verl.smoke.flows.one_node`): the two-node run with its
faults and evaluation, and ``--hold`` (start, then wait to be stopped: the SIGTERM test's subject)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from ebpo_verl.smoke import checks, scan
from ebpo_verl.smoke.runs import Run, train
from ebpo_verl.smoke.settings import SAVE_FREQ
from tests.harness import planting
from tests.harness.cluster import LocalCluster
from tests.harness.evaluation import evaluate_checkpoint
from tests.harness.faults import Fault

NODE_STEPS = 4  # --nodes 2: steps 1-2 (checkpoint at 2), then resumed from step 2: steps 3-4
NODE_EXTRA = [
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    "algorithm.ebpo.cluster_key=topic",
]
"""The two-node runs also save the actor's full weights as FSDP gathers them (``actor/huggingface``: the
reference the merged shards are compared with), and keep one EB prior per topic (clusters to check)."""
NODE_LOGGERS = "trainer.logger=[console,tensorboard,wandb]"
"""The attempts of run ``nodes`` also log to TensorBoard and W&B offline: the curves across the resumes."""


def two_nodes(work: Path, files: dict, timeout: float, faults: bool, step_timeout: float) -> None:
    """``--nodes 2``: steps 1-2 (``faults``: each fault ends an attempt: SIGKILL and SIGSTOP of a rank's worker at
    step 3, SIGKILL of vLLM at step 4, after step 3 is logged: the next rerun retrains a logged step), a resume to
    step 4, the checks, refused planted resumes (``faults``), the evaluation, the cluster's stop and leak checks."""
    cluster = LocalCluster(need_shm=True).start()
    options, step = {"rollout": "vllm", "cluster": cluster}, SAVE_FREQ + 1
    kinds = [
        (signal.SIGKILL, step, "rank"),
        (signal.SIGSTOP, step, "rank", step_timeout),
        (signal.SIGKILL, step + 1, "rollout"),
    ]
    injected = [Fault(*kind) for kind in kinds] if faults else []
    attempts = [(fault, NODE_STEPS) for fault in injected] or [(None, SAVE_FREQ)]
    for fault, steps in [*attempts, (None, NODE_STEPS)]:  # the last one resumes (resume_mode=auto) to the end
        train(work, files, "nodes", [*NODE_EXTRA, NODE_LOGGERS], timeout, fault=fault, steps=steps, **options)
        cluster.wait_job_gone()
    checks.check_nodes_run(work, files, len(attempts) + 1, NODE_STEPS)
    if faults:  # a copy of the step-2 checkpoint with a callable planted, resumed: refused where it is loaded
        planting.refused_plants(work, files, timeout, NODE_EXTRA, NODE_STEPS, cluster)
    evaluate_checkpoint(work, work / "ckpt_nodes" / f"global_step_{NODE_STEPS}", timeout)
    cluster.stop()
    for fault in injected:
        print(f"[cpu_smoke] fault {fault.name}: ended {fault.ended_after:.0f} s after it (bound {fault.bound:g} s)")


def hold(work: Path, stand_in: bool, timeout: float) -> None:
    """Start the cluster (``stand_in``: none) and a stand-in run, print ``[cpu_smoke] holding`` with the tag
    its processes carry, and wait (at most ``timeout``) to be stopped: SIGTERM/SIGINT must leave nothing."""
    cluster = None if stand_in else LocalCluster(need_shm=False).start()
    run = Run(work, None, "hold", [], command=[sys.executable, "-c", "import time; time.sleep(3600)"])
    print(f"[cpu_smoke] holding: tag {scan.TAG_ENV}={scan.TAG}, run pid {run.proc.pid}", flush=True)
    run.wait(timeout)
    if cluster is not None:
        cluster.stop()
