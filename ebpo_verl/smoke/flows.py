"""The one-node smoke flow (runs A, K, K', and C with ``--vllm``): the GPU self-check's ``train`` check and the
harness's one-node run; the harness's other flows are in ``tests/harness/flows.py``."""

from __future__ import annotations

from pathlib import Path

from ebpo_verl.smoke import checks, scan
from ebpo_verl.smoke.runs import k_overrides, run_killed, train
from ebpo_verl.smoke.settings import K_STEPS, SAVE_FREQ, VLLM_STEPS


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
