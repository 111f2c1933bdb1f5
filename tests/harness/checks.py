"""What the smoke runs must show: metrics logged, EB state continued, curriculum order, the kill landing where
it should, the two-node checkpoints."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness.invariants import batch_groups, check_continues
from tests.harness.settings import BATCH, EBPO_KEYS, K_STEPS, NODES, SAVE_FREQ, STEPS, VAL_KEY, VLLM_STEPS, N


def check_run(work: Path, run: str, steps: list[int]) -> dict[int, dict]:
    """One run's metrics log: its provenance sidecar, exactly ``steps``, the ``ebpo/*`` metrics, a training
    update and rollout probabilities equal to the actor's at every step, validation at the last step."""
    from ebpo_verl.ops.metrics_log import read_metrics_log, read_provenance
    from ebpo_verl.ops.provenance import check as check_provenance

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


def _train_rows(train_file: Path) -> list[tuple[str, str]]:
    """(problem text, topic) of each row of the training parquet."""
    import pyarrow.parquet as pq

    table = pq.read_table(train_file)
    prompts, infos = table.column("prompt").to_pylist(), table.column("extra_info").to_pylist()
    return [(p[0]["content"], e["topic"]) for p, e in zip(prompts, infos, strict=True)]


def topic_of(train_file: Path) -> Callable[[str], str]:
    """``label_of(rollout input text)``: the topic of the one training problem the text contains."""
    pairs = _train_rows(train_file)

    def label_of(text: str) -> str:
        hits = {topic for problem, topic in pairs if problem in text}
        if len(hits) != 1:
            raise AssertionError(f"a rollout input matches topics {sorted(hits)}: {text[:120]!r}")
        return hits.pop()

    return label_of


def dump_lines(path: Path) -> list[str] | None:
    """The lines of a verl rollout or validation dump, or None (not written, or torn: a line not JSON)."""
    lines = path.read_text().splitlines() if path.is_file() else []
    try:
        [json.loads(line) for line in lines]
    except ValueError:
        return None
    return lines or None


def _dump(work: Path, run: str, step: int) -> list[str]:
    lines = dump_lines(work / f"rollouts_{run}" / f"{step}.jsonl")
    assert lines is not None, f"run {run} step {step}: no complete rollout dump"
    return lines


def step_rows(work: Path, run: str, step: int, train_file: Path) -> list[int]:
    """Rows of the training parquet used at ``step`` (from verl's rollout dump), sorted, one per prompt group."""
    problems = [problem for problem, _ in _train_rows(train_file)]
    rows = []
    for line in _dump(work, run, step):
        hits = [i for i, p in enumerate(problems) if p in json.loads(line)["input"]]
        if len(hits) != 1:
            raise AssertionError(f"run {run} step {step}: a rollout input matches {len(hits)} training rows")
        rows.append(hits[0])
    if len(rows) != BATCH * N or any(rows.count(r) != N for r in rows):
        raise AssertionError(f"run {run} step {step}: expected {BATCH} prompts x {N} samples, got rows {rows}")
    return sorted(set(rows))


def dump_groups(work: Path, run: str, step: int, train_file: Path | None = None) -> list[tuple[str | None, Any]]:
    """One (topic or None, rewards) per prompt of ``step``'s rollout dump; the topic from the prompt's training row."""
    return batch_groups(_dump(work, run, step), topic_of(train_file) if train_file else lambda _text: None)


def topic_block(work: Path, files: dict, run: str, step: int) -> str:
    """The one curriculum topic of ``run``'s training batch at ``step``."""
    pairs, rows = _train_rows(files["train"]), step_rows(work, run, step, files["train"])
    step_topics = {pairs[r][1] for r in rows}
    assert len(step_topics) == 1, f"run {run} step {step} mixes topics {sorted(step_topics)} (rows {rows})"
    return step_topics.pop()


def check_exact_resume(work: Path, files: dict) -> None:
    """K started from A's step-2 checkpoint with A's settings and seed, so its step-3 ``ebpo/*`` metrics and saved
    EB state equal A's exactly, and A's is the step-2 state plus its step-3 batch."""
    a, resumed = check_run(work, "a", [1, 2, 3]), check_run(work, "k", [STEPS, K_STEPS])
    assert 0 < a[3]["critic/score/mean"] < 1, f"degenerate step-3 rewards: {a[3]['critic/score/mean']}"
    saved = saved_state(work, "a", 2)
    assert a[2]["ebpo/prompts_seen"] == 2 * BATCH, f"A saw {a[2]['ebpo/prompts_seen']} prompts by step 2"
    state_a, state_k = saved_state(work, "a", 3), saved_state(work, "k", 3)
    check_continues(saved, state_a, [dump_groups(work, "a", 3)])
    for key in sorted(name for name in a[3] if name.startswith("ebpo/")):
        assert key in resumed[3], f"run K step 3: {key} missing"
        want, got = a[3][key], resumed[3][key]
        # equal up to the order of a float sum over the batch's groups (verl's batch order varies)
        assert want == got or math.isclose(want, got, rel_tol=1e-12, abs_tol=1e-15), (
            f"step-3 {key}: uninterrupted {want!r} != resumed {got!r}"
        )
    assert state_a == state_k, "the EB state saved after step 3 differs between the uninterrupted and resumed runs"
    blocks = [topic_block(work, files, "a", s) for s in (1, 2, 3)]
    assert len(set(blocks)) == STEPS, f"run A repeated a topic block: {blocks}"
    k_block = topic_block(work, files, "k", K_STEPS)
    assert k_block not in blocks, f"run K' step {K_STEPS} repeated a topic block: {k_block} after {blocks}"
    print(
        f"[cpu_smoke] OK (hf rollout): topic blocks {blocks} then {k_block}; K (resumed from A's step 2, killed, "
        f"logged by K'): its step-3 ebpo/* and saved EB state equal A's (uninterrupted) exactly; {VAL_KEY} logged",
        flush=True,
    )


def check_kill_landed(work: Path, run_pid: int) -> list[int]:
    """K was killed after its step-3 checkpoint, before its step-3 log call: only that checkpoint with its EB state,
    nothing logged, the lock left, nothing moved aside. Returns the steps logged (none)."""
    from ebpo_verl.ops.metrics_log import read_records
    from ebpo_verl.trainer.checkpoint.run_lock import RUN_LOCK_FILE
    from tests.harness.runs import lock_holder

    ckpt = work / "ckpt_k"
    start = work / "ckpt_a" / f"global_step_{SAVE_FREQ}"
    text = (work / "k.log").read_text(errors="replace")
    assert text.count(f"resumes from {start}") == 1, f"run K did not say once that it resumes from {start}"
    folders = sorted(p.name for p in ckpt.glob("global_step_*"))
    assert folders == [f"global_step_{STEPS}"], f"run K's checkpoints {folders}, expected step {STEPS} only"
    log = ckpt / "metrics.jsonl"
    logged = [step for step, _ in read_records(log)] if log.exists() else []
    assert logged == [], f"run K logged steps {logged} before the kill, expected none"
    assert not list(ckpt.glob("metrics.superseded-*")), "a metrics log was moved aside"
    assert (ckpt / f"global_step_{STEPS}" / "ebpo_state.json").is_file(), f"no EB state in K's step-{STEPS} checkpoint"
    assert lock_holder(ckpt / RUN_LOCK_FILE) == run_pid, "a SIGKILLed run leaves its lock file"
    return logged


def check_killed(work: Path) -> None:
    """Run K' (``resume_mode=auto``, step 3): took over the lock, logged step 3 once (no step time), trained step 4,
    counted every prompt once, continued K's EB state, released the folder."""
    from ebpo_verl.ops.metrics_log import read_metrics_log, read_records
    from ebpo_verl.trainer.checkpoint.run_lock import RUN_LOCK_FILE
    from ebpo_verl.trainer.ray_trainer import STEP_TIME_KEYS

    ckpt = work / "ckpt_k"
    text = (work / "k.log").read_text(errors="replace")
    folder = ckpt / f"global_step_{STEPS}"
    assert text.count(f"resumes from {folder}") == 1, f"the rerun did not say once that it resumes from {folder}"
    notice = f"step {STEPS}'s training metrics were not logged before the last run stopped"
    assert text.count(notice) == 1, f"the rerun did not say once that it logs step {STEPS}'s metrics ({notice!r})"
    steps = list(range(STEPS, K_STEPS + 1))
    training = [(step, data) for step, data in read_records(ckpt / "metrics.jsonl") if "actor/grad_norm" in data]
    assert [step for step, _ in training] == steps, "each step's training metrics must be logged once"
    assert not STEP_TIME_KEYS & set(training[0][1]), f"the unfinished step {STEPS}'s total time was logged"
    merged = read_metrics_log(ckpt / "metrics.jsonl")
    for step in steps:
        assert 0 <= merged[step]["critic/score/mean"] <= 1, f"run K step {step}: {merged[step]['critic/score/mean']}"
        seen = merged[step]["ebpo/prompts_seen"]
        assert seen == step * BATCH, f"run K step {step}: {seen} prompts seen, expected {step * BATCH}"
    assert merged[STEPS]["training/global_step"] == STEPS and "timing_s/gen" in merged[STEPS], "step 3 incomplete"
    last = saved_state(work, "k", K_STEPS)
    check_continues(saved_state(work, "k", STEPS), last, [dump_groups(work, "k", K_STEPS)])
    assert not (ckpt / RUN_LOCK_FILE).exists() and not (ckpt / "metrics.jsonl.lock").exists(), "folder not released"
    print(
        f"[cpu_smoke] OK (kill): the rerun resumed K's step {STEPS}, took over the dead run's lock, logged step "
        f"{STEPS}'s training metrics once (from the checkpoint), trained step {K_STEPS} (its EB state continues "
        f"the step-{STEPS} one) and released the folder; training metrics of steps {steps} logged once each",
        flush=True,
    )


def check_vllm(work: Path, files: dict) -> None:
    """Run C (vLLM rollout, from A's step 2): step-4 EB state = step 2 + its two batches; curriculum continues A's."""
    c = check_run(work, "c", [3, VLLM_STEPS])
    saved = saved_state(work, "a", 2)
    assert c[3]["ebpo/prompts_seen"] == saved["prompts_seen"] + BATCH, "C did not start from the step-2 state"
    check_continues(saved, saved_state(work, "c", VLLM_STEPS), [dump_groups(work, "c", s) for s in (3, VLLM_STEPS)])
    assert step_rows(work, "c", 3, files["train"]) == step_rows(work, "a", 3, files["train"]), "C's step 3 != A's"
    blocks = [topic_block(work, files, "a", s) for s in (1, 2, 3)]
    c_blocks = [topic_block(work, files, "c", s) for s in (3, VLLM_STEPS)]
    assert c_blocks[0] == blocks[2] and c_blocks[1] not in blocks, f"run C's blocks {c_blocks} after A's {blocks}"
    print(
        f"[cpu_smoke] OK (vllm rollout): resumed from A's step 2, topic blocks {c_blocks}; the EB state continues "
        f"the saved one; rollout probabilities match the actor's at steps 3-{VLLM_STEPS}; {VAL_KEY} logged",
        flush=True,
    )


def check_nodes_run(work: Path, files: dict, attempts: int, last_step: int) -> None:
    """The two-node run: every step logged once, the node check in every attempt, reruns resumed from step 2, two
    shards and one EB state per checkpoint, the last EB state = step 2 + the resumed batches, curriculum continued."""
    metrics = check_run(work, "nodes", list(range(1, last_step + 1)))
    text = (work / "nodes.log").read_text(errors="replace")
    ckpt = work / "ckpt_nodes"
    assert text.count("pre-flight: ok (world size 2;") == attempts, f"expected {attempts} starts at world size 2"
    resumed = text.count(f"resumes from {ckpt / f'global_step_{SAVE_FREQ}'}")
    assert resumed == attempts - 1, f"{resumed} of the {attempts - 1} reruns resumed from step {SAVE_FREQ}"
    checked = sum(f"node check: ok on {NODES} Ray nodes" in a for a in text.split("pre-flight: ok (")[1:])
    assert checked == attempts, f"the node check ran on {NODES} nodes in {checked} of {attempts} attempts"
    for step in (SAVE_FREQ, last_step):
        folder = ckpt / f"global_step_{step}"
        shards = sorted(p.name for p in (folder / "actor").glob("model_world_size_*.pt"))
        assert shards == [f"model_world_size_{NODES}_rank_{r}.pt" for r in range(NODES)], f"{folder}: {shards}"
        states = sorted(str(p.relative_to(folder)) for p in folder.rglob("ebpo_state*.json"))
        assert states == ["ebpo_state.json"], f"{folder}: EB state files {states}"
    saved = saved_state(work, "nodes", SAVE_FREQ)
    assert metrics[SAVE_FREQ]["ebpo/prompts_seen"] == SAVE_FREQ * BATCH, "prompts counted once over both ranks"
    assert saved["clusters"], "the two-node run has no topic clusters (algorithm.ebpo.cluster_key=topic)"
    batches = [dump_groups(work, "nodes", s, files["train"]) for s in range(SAVE_FREQ + 1, last_step + 1)]
    what = check_continues(saved, saved_state(work, "nodes", last_step), batches)
    blocks = [topic_block(work, files, "nodes", s) for s in range(1, last_step + 1)]
    assert len(set(blocks)) == last_step, f"the curriculum repeated a topic block across the resume: {blocks}"
    print(
        f"[cpu_smoke] OK (two nodes): {attempts} attempts at world size {NODES}, the reruns resumed from step "
        f"{SAVE_FREQ}; steps 1-{last_step} logged once; shards {shards}, one ebpo_state.json per checkpoint; "
        f"the step-{last_step} EB state continues the step-{SAVE_FREQ} one ({what}); topic blocks {blocks}",
        flush=True,
    )
