"""The harness's flows: the one-node runs (A, K killed, K', C with ``--vllm``), the two-node run with its faults and
evaluation, and ``--hold`` (start, then wait to be stopped: the SIGTERM test's subject)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from tests.harness import checks, planting, scan
from tests.harness.cluster import LocalCluster
from tests.harness.evaluation import evaluate_checkpoint
from tests.harness.faults import Fault
from tests.harness.runs import Run, k_overrides, run_killed, train
from tests.harness.settings import K_STEPS, SAVE_FREQ, VLLM_STEPS

NODE_STEPS = 4  # --nodes 2: steps 1-2 (checkpoint at 2), then resumed from step 2: steps 3-4
NODE_EXTRA = [
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    "algorithm.ebpo.cluster_key=topic",
]
"""The two-node runs also save the actor's full weights as FSDP gathers them (``actor/huggingface``: the
reference the merged shards are compared with), and keep one EB prior per topic (clusters to check)."""
NODE_LOGGERS = "trainer.logger=[console,tensorboard,wandb]"
"""The attempts of run ``nodes`` also log to TensorBoard and W&B offline: the curves across the resumes."""


def one_node(work: Path, files: dict, timeout: float, vllm: bool, device: str) -> None:
    """Runs A, K (killed) and K' with the HF server, then run C with ``vllm``; every check, then the leak checks."""
    watch = scan.Watch("the one-node runs", need_shm=vllm).start()
    train(work, files, "a", [], timeout, watch=watch, device=device)
    run, killed, _ = run_killed(work, files, timeout, device, watch)
    if left := watch.wait_gone(30):
        raise AssertionError(f"[cpu_smoke] run k: 30 s after its kill its processes are still there: {left}")
    logged = checks.check_kill_landed(work, run.proc.pid)
    print(
        f"[cpu_smoke] SIGKILL -> run k (pid {run.proc.pid}, {killed} processes; resumed from A's step "
        f"{SAVE_FREQ}) after its step-3 checkpoint, before the step-3 log call: logged steps {logged}, "
        "the dead run's lock file left",
        flush=True,
    )
    # K': K's command with resume_mode=auto, from K's tracker file (step 3)
    train(work, files, "k", k_overrides(work, "auto"), timeout, steps=K_STEPS, watch=watch, device=device)
    checks.check_killed(work)
    checks.check_exact_resume(work, files)
    if vllm:
        resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={work / 'ckpt_a' / 'global_step_2'}"]
        train(work, files, "c", resume, timeout, rollout="vllm", steps=VLLM_STEPS, watch=watch, device=device)
        checks.check_vllm(work, files)
    print(f"[cpu_smoke] OK (leaks, one node): {watch.final()}", flush=True)


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
