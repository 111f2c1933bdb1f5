"""The smoke harness's own checks (tests/harness/), each fed a broken case it must reject: a fault
timeline past its bound, a process or /dev/shm entry left behind, a scan that sees nothing or fails, a resumed EB state
off in one moment of one cluster, a grade that does not match its planted file, time limits not nested, the
SIGTERM handler absent. Fast: fabricated inputs and small child processes, no Ray, no verl trainer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from ebpo_verl.algos.ebpo import EBPOOptions
from ebpo_verl.algos.ebpo_math import compute_ebpo_advantages
from ebpo_verl.algos.ebpo_state import EBPOState
from ebpo_verl.algos.estimator import Batch
from ebpo_verl.cpu import tiny_runs
from tests.harness import evaluation, faults, invariants, limits, scan, settings

REPO = Path(__file__).resolve().parents[1]


# -- bounds ------------------------------------------------------------------------------------------------------


def test_bounds_are_90s_after_a_kill_and_the_step_timeout_plus_90s_after_a_stop():
    assert faults.bound_s(signal.SIGKILL, None) == 90
    assert faults.bound_s(signal.SIGSTOP, 120) == 210
    with pytest.raises(ValueError, match="step timeout"):
        faults.bound_s(signal.SIGSTOP, None)
    assert faults.check_end("SIGKILL of a rank", 41.6, 90) == "42 s after the SIGKILL of a rank (bound 90 s)"


@pytest.mark.parametrize(("after", "bound"), [(90.5, 90), (211.0, 210)])
def test_a_run_that_ends_past_its_bound_fails(after, bound):
    with pytest.raises(AssertionError, match="past its bound"):
        faults.check_end("SIGSTOP of a rank", after, bound)


def test_fault_check_fails_on_a_late_end_even_with_the_right_line(tmp_path):
    fault = faults.Fault(signal.SIGKILL, 3, "rollout")
    fault.pid, fault.injected_at = 4242, 1000.0
    log = tmp_path / "nodes.log"
    log.write_text("pre-flight: ok (world size 2;\nebpo-train: error: step 3, phase gen: a worker died: "
                   "vLLMHttpServer actor (pid 4242, node 127.0.0.1 (id ab)): died\n")  # fmt: skip
    fault.check(1, log, 1000.0 + 89)  # within the bound: passes
    with pytest.raises(AssertionError, match="ended 91 s after the SIGKILL of a rollout server .bound 90 s.: past"):
        fault.check(1, log, 1000.0 + 91)


def test_fault_injection_has_a_deadline(tmp_path, monkeypatch):
    """A run that never reaches the fault's moment: inject gives up after INJECT_TIMEOUT_S, naming the fault."""
    monkeypatch.setattr(faults, "INJECT_TIMEOUT_S", 0.3)
    log = tmp_path / "nodes.log"
    log.write_text("starting\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = time.monotonic()
        with pytest.raises(SystemExit, match="no moment for the SIGKILL of a rank at step 3"):
            faults.Fault(signal.SIGKILL, 3).inject(proc, log, cluster=None)
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
        proc.wait()


# -- leak scans --------------------------------------------------------------------------------------------------


def test_a_scan_that_sees_nothing_fails():
    with pytest.raises(AssertionError, match="saw no Ray process"):
        scan.check_sighted("run x", 0, 3, need_shm=True)
    with pytest.raises(AssertionError, match="saw no segment"):
        scan.check_sighted("run x", 2, 0, need_shm=True)
    assert "2 Ray processes and 0 /dev/shm" in scan.check_sighted("run x", 2, 0, need_shm=False)


def test_an_entry_made_during_the_run_and_held_by_nobody_is_left_whoever_made_it():
    before = {"old", "other-live"}
    now = {"old", "other-live", "sem.loky-abc", "psm_1", "theirs"}
    left = scan.leftover_shm(before, now, held={"theirs"}, seen={"psm_1": "VLLM::EngineCore"})
    assert left == {"psm_1": "VLLM::EngineCore", "sem.loky-abc": "?"}
    # a semaphore never seen held: named after the run's process whose pid its name carries
    now.add("sem.loky-16470-1cwwqyl3")
    left = scan.leftover_shm(before, now, {"theirs"}, {}, titles={16470: "VLLM::Worker", 99: "raylet"})
    assert left["sem.loky-16470-1cwwqyl3"] == "made by pid 16470 (VLLM::Worker)" and left["psm_1"] == "?"
    with pytest.raises(AssertionError, match=r"/dev/shm entries left .*sem.loky-abc"):
        scan.check_none_left("the cluster", [], left)
    with pytest.raises(AssertionError, match=r"processes left: \[\(7, 'raylet'\)\]"):
        scan.check_none_left("the cluster", [(7, "raylet")], {})
    scan.check_none_left("the cluster", [], {})


CHILD = """
import os, sys, time
name = sys.argv[1]
fd = os.open('/dev/shm/' + name, os.O_CREAT | os.O_RDWR, 0o600)
print('ready', flush=True)
sys.stdin.readline()
if sys.argv[2] == 'clean':
    os.unlink('/dev/shm/' + name)
if sys.argv[2] == 'unseen':  # made after the watch's last sample, and left
    os.close(os.open('/dev/shm/' + name + '-late', os.O_CREAT | os.O_RDWR, 0o600))
"""


def _fake_ray_child(tag: str, name: str, mode: str) -> subprocess.Popen:
    """A tagged process titled ``ray::Fake`` (as Ray's workers are) holding /dev/shm/<name> open."""
    cmd = ["bash", "-c", f'exec -a ray::Fake {sys.executable} -c "$0" "$1" "$2"', CHILD, name, mode]
    env = {**os.environ, scan.TAG_ENV: tag}
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("mode", ["clean", "leak", "unseen"])
def test_watch_sees_the_run_unlinks_what_it_saw_held_and_fails_on_what_it_did_not(mode):
    """clean: the child unlinks its segment. leak: it dies leaving the segment the watch saw it hold: the watch
    unlinks it (its proof: seen held by its own process, now gone) and says so. unseen: it also leaves one made
    after the last sample, never seen held: left in /dev/shm and reported, the check fails."""
    tag, name = f"test-{os.getpid()}-{mode}", f"ebpo-smoke-test-{os.getpid()}-{mode}"
    watch = scan.Watch("run x", need_shm=True, tag=tag, period=0.1)
    proc = _fake_ray_child(tag, name, mode)
    try:
        watch.sample()
        assert proc.pid in watch.ray_seen and watch.shm_seen == {name: "ray::Fake"}
        assert watch.inodes_seen == {os.stat(f"/dev/shm/{name}").st_ino: "ray::Fake"}
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
        if mode == "unseen":
            with pytest.raises(AssertionError, match=rf"entries left \(name: holder seen\): \{{'{name}-late': '\?'\}}"):
                watch.final(grace=5)
            assert os.path.exists(f"/dev/shm/{name}-late") and not os.path.exists(f"/dev/shm/{name}")
        else:
            summary = watch.final(grace=5)
            assert "saw 1 Ray processes and 1 /dev/shm segments" in summary
            unlinked = [name] if mode == "leak" else []
            assert f"{len(unlinked)} left by its killed processes unlinked: {unlinked}; 0 made since" in summary
            assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        proc.kill()
        for path in (f"/dev/shm/{name}", f"/dev/shm/{name}-late"):
            if os.path.exists(path):
                os.unlink(path)


def test_an_entry_an_untagged_process_held_and_left_is_neither_unlinked_nor_counted():
    """A concurrent run's process (no tag) makes an entry, the watch samples it held, the process dies leaving it:
    not the run's, so the leak check passes and the entry stays. Without that sample it is a leftover (the check
    can see it)."""
    tag, name = f"test-{os.getpid()}-foreign", f"ebpo-smoke-test-{os.getpid()}-foreign"
    watch = scan.Watch("run x", need_shm=False, tag=tag, period=0.1)
    blind = scan.Watch("run x", need_shm=False, tag=tag)  # never samples the other process
    own = _fake_ray_child(tag, f"{name}-own", "clean")
    other = _fake_ray_child(f"{tag}-not", name, "leak")
    try:
        watch.sample()
        assert other.pid not in watch.ray_seen and watch.shm_seen == {f"{name}-own": "ray::Fake"}
        assert os.stat(f"/dev/shm/{name}").st_ino in watch.inodes_foreign
        blind.ray_seen.add(own.pid)  # the sighting proof, without a sample of the other process
        for proc in (own, other):
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(timeout=30)
        summary = watch.final(grace=5)
        assert "1 made since and seen held only by other processes, not its own, left alone" in summary
        assert os.path.exists(f"/dev/shm/{name}")
        with pytest.raises(AssertionError, match=rf"entries left \(name: holder seen\): \{{'{name}': '\?'\}}"):
            blind.final(grace=5)
    finally:
        for proc in (own, other):
            proc.kill()
        for path in (f"/dev/shm/{name}", f"/dev/shm/{name}-own"):
            if os.path.exists(path):
                os.unlink(path)


@pytest.mark.parametrize("other_run", [True, False])
def test_a_run_orphan_never_seen_held_is_left_to_another_run_only_while_one_lives(other_run):
    """A ``verl_weights_*`` entry (a run's kind of orphan) made after the last sample and never seen held: while an
    untagged Ray process (another run) was seen alive it may be that run's, so it is listed and left; with none it
    is this run's leftover and fails the check (a non-orphan name fails either way: the tests above)."""
    tag, name = f"test-{os.getpid()}-orphan{other_run}", f"ebpo-smoke-test-{os.getpid()}-orphan{other_run}"
    orphan = f"verl_weights_ebpo_smoke_test_{os.getpid()}_{other_run}"
    watch = scan.Watch("run x", need_shm=False, tag=tag)
    own = _fake_ray_child(tag, name, "clean")
    other = _fake_ray_child(f"{tag}-not" if other_run else tag, f"{name}-other", "clean")
    try:
        watch.sample()
        assert (other.pid in watch.foreign_ray) is other_run
        if not other_run:
            watch.foreign_ray.clear()  # Ray processes of a concurrent test (CI's other worker) would count too
        for proc in (own, other):
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(timeout=30)
        os.close(os.open(f"/dev/shm/{orphan}", os.O_CREAT | os.O_RDWR, 0o600))  # never seen held
        if other_run:
            summary = watch.final(grace=5)  # (a concurrent test's Ray processes count too)
            assert re.search(rf"1 run orphans never seen held while \d+ Ray processes of other runs lived, left to "
                             rf"them: \['{orphan}'\]", summary)  # fmt: skip
        else:
            with pytest.raises(AssertionError, match=rf"entries left \(name: holder seen\): \{{'{orphan}': '\?'\}}"):
                watch.final(grace=5)
        assert os.path.exists(f"/dev/shm/{orphan}")
    finally:
        for proc in (own, other):
            proc.kill()
        for path in (f"/dev/shm/{orphan}", f"/dev/shm/{name}", f"/dev/shm/{name}-other"):
            if os.path.exists(path):
                os.unlink(path)


def test_watch_fails_on_a_process_left_behind():
    tag, name = f"test-{os.getpid()}-proc", f"ebpo-smoke-test-{os.getpid()}-proc"
    watch = scan.Watch("run x", need_shm=False, tag=tag)
    proc = _fake_ray_child(tag, name, "clean")
    try:
        watch.sample()
        with pytest.raises(AssertionError, match=rf"processes left: \[\({proc.pid}, 'ray::Fake'\)\]"):
            watch.final(grace=0.5)
    finally:
        proc.kill()
        proc.wait()
        os.unlink(f"/dev/shm/{name}")


def test_a_scan_error_is_not_swallowed(monkeypatch):
    def denied(tag):
        raise PermissionError("/proc/1/environ")

    monkeypatch.setattr(scan, "split_processes", denied)
    watch = scan.Watch("run x", need_shm=False, period=0.05).start()
    time.sleep(0.3)
    with pytest.raises(AssertionError, match="the leak scan failed: PermissionError"):
        watch.final(grace=0)


# -- EB continuation ---------------------------------------------------------------------------------------------


def _train(state: EBPOState, options: EBPOOptions, rng, topics: list[str]) -> list[tuple[str, list[float]]]:
    """One batch through the real estimator; the (label, rewards) groups the check is fed."""
    groups = [(topic, rng.integers(0, 2, size=4).astype(float).tolist()) for topic in topics]
    scores = torch.tensor([x for _, g in groups for x in g])
    index = [f"p{i}" for i, (_, g) in enumerate(groups) for _ in g]
    labels = [topic for topic, g in groups for _ in g]
    compute_ebpo_advantages(Batch(scores, index, torch.ones(len(index), dtype=torch.bool), labels), options, state)
    return groups


def test_continuation_holds_for_the_estimator_and_fails_on_one_moment_of_one_cluster():
    rng = np.random.default_rng(3)
    options, state = EBPOOptions(cluster_key="topic"), EBPOState()
    _train(state, options, rng, ["algebra", "algebra", "geometry", "prealgebra"])
    saved = json.loads(json.dumps(state.state_dict()))
    batches = [_train(state, options, rng, ["geometry", "number_theory", "algebra", "geometry"]) for _ in range(2)]
    after = json.loads(json.dumps(state.state_dict()))
    assert "4 parts in the global scope and 4 clusters" in invariants.check_continues(saved, after, batches)
    broken = json.loads(json.dumps(after))
    broken["clusters"]["geometry"]["within_var"][2] *= 1.0 + 1e-6
    with pytest.raises(AssertionError, match=r"cluster 'geometry'.within_var M2"):
        invariants.check_continues(saved, broken, batches)
    broken = json.loads(json.dumps(after))
    broken["global"]["rewards"][2] += 0.25
    with pytest.raises(AssertionError, match=r"global.rewards M2"):
        invariants.check_continues(saved, broken, batches)
    with pytest.raises(AssertionError, match="EB steps 1 \\+ 1 != 3"):
        invariants.check_continues(saved, after, batches[:1])


# -- evaluation --------------------------------------------------------------------------------------------------


def _generations(path: Path, keys) -> None:
    lines = [{"benchmark": "amc23", "index": i, "sample": s, "response": "x", "response_tokens": 1,
              "finish_reason": "length"} for i, s in keys]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    Path(f"{path}.meta.json").write_text("{}")


def test_planted_generations_grade_to_the_recomputed_pass_at_1(tmp_path):
    gen, planted = tmp_path / "gen.jsonl", tmp_path / "planted.jsonl"
    _generations(gen, [(0, 0), (0, 1), (5, 0), (5, 1)])
    assert len(evaluation.check_generations(gen)) == 4
    truths = {0: "12", 5: "7/2"}
    evaluation.plant(gen, planted, truths)
    # runs: sample 0 -> both right (100 %), sample 1 -> problem 0 right, problem 5 (the last) wrong (50 %)
    assert evaluation.pass_at_1(planted, truths) == 75.0
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"benchmarks": {"amc23": {"pass@1": 75.0}}}))
    assert evaluation.check_grade(results, 75.0) == 75.0
    results.write_text(json.dumps({"benchmarks": {"amc23": {"pass@1": 0.0}}}))
    with pytest.raises(AssertionError, match="pass@1 0.0 != 75.0"):
        evaluation.check_grade(results, 75.0)


def test_a_generations_file_short_of_benchmarks_x_problems_x_runs_fails(tmp_path):
    gen = tmp_path / "gen.jsonl"
    _generations(gen, [(0, 0), (0, 1), (5, 0)])
    with pytest.raises(AssertionError, match="3 generations .* = 4"):
        evaluation.check_generations(gen)


# -- time limits, --device cuda ----------------------------------------------------------------------------------


def test_time_limits_are_nested_and_a_wrong_order_is_refused():
    from tests.conftest import MODULE_TIMEOUTS_S

    for outer, module in ((limits.ONE_NODE_OUTER_S, "test_cpu_smoke.py"), (limits.TWO_NODE_OUTER_S, "test_cluster.py")):
        limits.check_order(600, outer - limits.CLEANUP_MARGIN_S, outer, limits.test_timeout(outer))
        assert limits.test_timeout(outer) < MODULE_TIMEOUTS_S[module]  # pytest-timeout's tier is the outermost
    with pytest.raises(SystemExit, match="--run-timeout 900 s must be shorter than --deadline 600 s"):
        limits.check_order(900, 600)
    with pytest.raises(SystemExit, match="cpu_smoke.sh timeout 1500 s must be shorter than test subprocess"):
        limits.check_order(600, 1380, 1500, 1500)


def test_cpu_smoke_sh_passes_a_deadline_inside_its_timeout():
    env = {**os.environ, "CPU_SMOKE_TIMEOUT": "700", "PYTHON": sys.executable}
    cmd = ["bash", str(REPO / "scripts" / "cpu_smoke.sh"), "--run-timeout", "500", "--print-limits"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == f"run-timeout 500 deadline {700 - limits.CLEANUP_MARGIN_S}", out.stderr
    cmd[3] = "650"  # longer than the deadline the script gets
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "--run-timeout 650 s must be shorter than --deadline 580 s" in out.stderr


def test_the_wheels_smoke_command_names_the_harness_in_one_line(tmp_path):
    """``python -m ebpo_verl.smoke`` (the harness left the wheel): exit 2 and one line naming the commands to run
    instead, each a module of this checkout (the harness's from its root, the self-check's)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "ebpo_verl.smoke"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out
    named = re.findall(r"`python -m ([\w.]+)`", out.stderr)
    assert named == ["tests.harness", "ebpo_verl.smoke.selfcheck"], out.stderr
    paths = [REPO.joinpath(*name.split(".")) for name in named]
    assert all((p / "__main__.py").is_file() or p.with_suffix(".py").is_file() for p in paths), paths


def test_device_cuda_overrides():
    files = {"train": "t", "val": "v", "model": "m", "prompt_length": 70}
    cpu = settings.overrides(Path("/w"), files, "a", "/tmp/r", device="cpu")
    cuda = settings.overrides(Path("/w"), files, "a", "/tmp/r", device="cuda")
    env = "+ray_kwargs.ray_init.runtime_env.env_vars"
    assert "trainer.device=cpu" in cpu and f"{env}.VERL_PLATFORM=cpu" in cpu
    assert "trainer.device=cuda" in cuda and not [o for o in cuda if "VERL_PLATFORM" in o or "device=cpu" in o]
    assert f"{env}.VERL_USE_EXTERNAL_MODULES=ebpo_verl.cpu.backend" in cuda  # registers the hf rollout
    assert "actor_rollout_ref.rollout.name=hf" in cuda and "actor_rollout_ref.actor.strategy=fsdp2" in cuda
    assert f"{env}.EBPO_HF_ROLLOUT_DEVICE=cuda" in cuda  # the hf rollout's model on the same GPU
    assert set(cpu) - set(cuda) == {"trainer.device=cpu", f"{env}.VERL_PLATFORM=cpu"}
    assert tiny_runs.run_env("cpu")["VERL_PLATFORM"] == "cpu" and "VERL_PLATFORM" not in tiny_runs.run_env("cuda")


# -- SIGTERM -----------------------------------------------------------------------------------------------------


def _tagged(tag: str) -> list[psutil.Process]:
    return scan.tagged_processes(tag)


def _hold(tmp_path: Path, with_handler: bool) -> tuple[subprocess.Popen, str]:
    args = ["--hold", "--stand-in", "--work-dir", str(tmp_path / "w"), "--run-timeout", "120", "--deadline", "200"]
    code = "import sys; import tests.harness.__main__ as m\n"
    code += "" if with_handler else "m.install_handlers = lambda: None  # the handler absent\n"
    code += f"m.main({args!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("[cpu_smoke] holding: tag "), line
    return proc, line.split(f"{scan.TAG_ENV}=")[1].split(",")[0]


@pytest.mark.parametrize("with_handler", [True, False])
def test_sigterm_to_the_smoke_script_leaves_nothing_and_without_the_handler_it_does(tmp_path, with_handler):
    proc, tag = _hold(tmp_path, with_handler)
    assert _tagged(tag), "the stand-in run is not running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == (128 + signal.SIGTERM if with_handler else -signal.SIGTERM)
    deadline = time.monotonic() + (30 if with_handler else 3)
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in left:
        p.kill()
    assert bool(left) is not with_handler, f"left: {scan.describe(left)}"


def test_each_node_gets_its_own_ports_and_the_head_the_gcs_port():
    from tests.harness.cluster import node_command

    ports = list(range(30001, 30016))
    head, second = (node_command("ray", n, "127.0.0.1:30000", ports, "/t") for n in (0, 1))
    assert "--port=30000" in head and "--ray-client-server-port=30015" in head
    assert "--node-manager-port=30001" in head and "--node-manager-port=30008" in second
    assert "--address=127.0.0.1:30000" in second and "--temp-dir=/t/1" in second
    used = [int(a.split("=")[1]) for a in head + second if a.split("=")[0].endswith("-port") and "worker" not in a]
    assert len(used) == len(set(used)) == 1 + 6 * 2 + 1, used  # gcs, 6 per node, the client server


def test_a_cluster_stop_interrupted_by_sigterm_is_done_again_by_the_cleanup(monkeypatch, capsys):
    """SIGTERM (here KeyboardInterrupt, SIGINT's) landing inside ``stop`` leaves the cluster in ``LIVE``, so the
    handler's cleanup stops it again instead of skipping it as stopped."""
    from tests.harness import cluster as cluster_mod
    from tests.harness.__main__ import cleanup

    c = cluster_mod.LocalCluster(need_shm=False)
    cluster_mod.LIVE.append(c)
    calls = []

    def end() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        os.rmdir(c.temp)

    monkeypatch.setattr(c, "_end_processes", end)
    monkeypatch.setattr(c.watch, "final", lambda grace: "the scans saw 3 Ray processes")
    with pytest.raises(KeyboardInterrupt):
        c.stop()
    assert c in cluster_mod.LIVE and not c.stopped
    try:
        cleanup()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL if sig == signal.SIGTERM else signal.default_int_handler)
    assert len(calls) == 2 and c.stopped and c not in cluster_mod.LIVE
    assert "[cpu_smoke] cluster stopped: the scans saw 3 Ray processes" in capsys.readouterr().out
