"""The GPU self-check's ``train`` check (:func:`check_train`): ``ebpo-train`` (``python -m ebpo_verl.main``, EBPO,
FSDP2) on the chosen device. Run ``a`` trains steps 1-3 and saves at steps 2 and 3; run ``b``, in a folder of its
own, resumes from a's step-2 checkpoint and trains step 3 again. Same seed, data and weights: b's step 3 is a's, so
its ``ebpo/*`` metrics equal a's (up to the order of a float sum over the batch), the EB state it saves equals a's,
and it counts prompts on from the saved step (:func:`compare`).

Self-contained, so it runs from an installed wheel: made-up sums as the prompts, a tiny random Qwen3, the coin reward
of :mod:`ebpo_verl.cpu.rewards`; each run on a private Ray instance, killed with what it started past its limit.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ebpo_verl.cpu import rewards
from ebpo_verl.cpu.tiny_runs import device_overrides, ray_overrides, run_env, tiny_trainer_overrides

STEPS, SAVE_STEP, BATCH, N = 3, 2, 4, 4
ENTRY = "ebpo_verl.main"
"""The module each run starts (``ebpo-train``)."""
REL_TOL = 1e-12
"""Resumed vs uninterrupted ``ebpo/*`` metric: verl's batch order varies, so a sum over its groups may round apart."""


def prepare(work: Path) -> dict[str, Any]:
    """The tiny model and its tokenizer, and ``STEPS x BATCH`` sums as verl's training (and validation) parquet."""
    import pyarrow as pa

    from ebpo_verl.cpu.tiny import build_model, build_tokenizer
    from ebpo_verl.data.schema import EXTRA_INFO_TYPE, SCHEMA, apply_template, write_parquet_atomic

    rows = []
    for i in range(STEPS * BATCH):
        a, b = 3 + 7 * i, 11 + 5 * i
        info = dict.fromkeys(f.name for f in EXTRA_INFO_TYPE) | {"index": i, "split": "train", "source_id": str(i)}
        rows.append({"data_source": "selfcheck", "prompt": apply_template(f"What is {a} + {b}?", "boxed"),
                     "ability": "math", "reward_model": {"ground_truth": str(a + b), "style": "rule"},
                     "extra_info": info})  # fmt: skip
    train = write_parquet_atomic(pa.Table.from_pylist(rows, schema=SCHEMA), work / "train.parquet")
    tokenizer = build_tokenizer(work / "model", corpus=[r["prompt"][0]["content"] for r in rows])
    build_model(work / "model", tokenizer)
    chats = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, return_dict=True) for r in rows]
    longest = max(len(chat["input_ids"]) for chat in chats)
    return {"train": train, "val": train, "model": work / "model", "prompt_length": longest}


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of a run: its process group and every descendant still attached to it."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    except psutil.NoSuchProcess:
        tree = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(tree, timeout=60)
    proc.wait()


def run(work: Path, files: dict, name: str, extra: list[str], device: str, timeout: float) -> Path:
    """Run ``name`` of ``STEPS`` steps (``extra`` overrides last) to its end on its own Ray instance, output in
    ``work/<name>.log``; past ``timeout`` s it is killed. Returns its checkpoint folder; AssertionError with the
    log's last lines when it fails or times out."""
    folder, log = work / f"ckpt_{name}", work / f"{name}.log"
    ray_tmp = tempfile.mkdtemp(prefix="ebpo-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    args = [
        *tiny_trainer_overrides(files, BATCH, N),
        "algorithm.adv_estimator=ebpo",
        "actor_rollout_ref.rollout.name=hf",
        f"reward.custom_reward_function.path={Path(rewards.__file__).resolve()}",
        "reward.custom_reward_function.name=coin_score",
        "trainer.logger=[console]",
        "trainer.project_name=selfcheck",
        f"trainer.experiment_name={name}",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.save_freq={SAVE_STEP}",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={folder}",
        *ray_overrides(ray_tmp),
        *device_overrides(device),
        *extra,
    ]
    env = {**os.environ, **run_env(device)}
    env.pop("RAY_ADDRESS", None)  # its own Ray instance, never one this shell points at
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", ENTRY, *args], cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if code != 0:
        what = f"exceeded {timeout:g} s (--run-timeout) and was killed" if code is None else f"failed (exit {code})"
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise AssertionError(f"ebpo-train run {name} {what}; see {log}, last lines:\n{tail}")
    return folder


def saved_state(folder: Path, step: int) -> dict:
    """The EB state run folder ``folder`` saved at ``step``."""
    from ebpo_verl.algos import registry

    path = folder / f"global_step_{step}" / registry.get("ebpo").state.file
    saved = json.loads(path.read_text()) if path.is_file() else {}
    if saved.get("global_step") != step:
        raise AssertionError(f"{path}: no EB state of step {step}")
    return saved["state"]


def compare(first: dict[int, dict], resumed: dict[int, dict], state_first: dict, state_resumed: dict) -> str:
    """What runs a (``first``: step -> metrics) and b (``resumed``) must show: a logged steps 1-3 and b step 3 only;
    every ``ebpo/*`` metric and the gradient norm finite, the norm > 0 (it trained); b's prompts seen continue the
    saved step's (not a fresh start's); b's step-3 ``ebpo/*`` metrics equal a's (:data:`REL_TOL`) and so do the EB
    states saved after step 3. AssertionError naming the first difference; else the check's line."""
    if sorted(first) != list(range(1, STEPS + 1)) or sorted(resumed) != [STEPS]:
        raise AssertionError(f"logged steps: a {sorted(first)}, b {sorted(resumed)}; want a 1-{STEPS}, b {STEPS}")
    keys = sorted(k for k in first[STEPS] if k.startswith("ebpo/"))
    for run, step, data in [*(("a", s, first[s]) for s in first), ("b", STEPS, resumed[STEPS])]:
        bad = [k for k in [*keys, "ebpo/prompts_seen", "actor/grad_norm"] if not math.isfinite(data.get(k, math.nan))]
        if bad or not data["actor/grad_norm"] > 0:
            raise AssertionError(f"run {run} step {step}: missing or not finite {bad}, or no gradient (no training?)")
    seen = resumed[STEPS]["ebpo/prompts_seen"]
    if seen != STEPS * BATCH:
        raise AssertionError(
            f"run b saw {seen} prompts by step {STEPS}, not {STEPS * BATCH}: it did not resume the EB state"
        )
    for key in keys:
        want, got = first[STEPS][key], resumed[STEPS].get(key, math.nan)
        if not math.isclose(want, got, rel_tol=REL_TOL, abs_tol=1e-15):
            raise AssertionError(f"step-{STEPS} {key}: uninterrupted {want!r} != resumed {got!r}")
    if state_first != state_resumed:
        raise AssertionError(
            f"the EB state saved after step {STEPS} differs between the uninterrupted and resumed runs"
        )
    equal = f"step {STEPS}'s {len(keys)} ebpo/* metrics and EB state equal the uninterrupted run's"
    return f"a run resumed from step {SAVE_STEP}: {equal}"


def check_train(device: str, work: Path, run_timeout: float) -> str:
    """Runs a and b (:mod:`this module <.train_check>`) on ``device``, each within ``run_timeout`` s; b must say
    once that it resumes from a's step-2 checkpoint; then :func:`compare`."""
    from ebpo_verl.ops.metrics_log import read_metrics_log

    folder = work / "train"
    folder.mkdir(parents=True)
    files = prepare(folder)
    first = run(folder, files, "a", [], device, run_timeout)
    start = first / f"global_step_{SAVE_STEP}"
    resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={start}"]
    resumed = run(folder, files, "b", resume, device, run_timeout)
    if (folder / "b.log").read_text(errors="replace").count(f"resumes from {start}") != 1:
        raise AssertionError(f"run b did not say once that it resumes from {start}")
    logs = [read_metrics_log(f / "metrics.jsonl") for f in (first, resumed)]
    line = compare(*logs, saved_state(first, STEPS), saved_state(resumed, STEPS))
    return f"ebpo-train on {device} (FSDP2, EBPO): {line}"
