"""A two-node Ray cluster on this machine, started and stopped the way a user does, with its leak checks."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from ebpo_verl.cpu.tiny_runs import run_env
from tests.harness import limits, scan
from tests.harness.runs import kill_procs
from tests.harness.settings import NODES

STOP_GRACE_S = 10
"""Seconds the cluster's processes get between SIGTERM and SIGKILL at the end (``ray start --block``, the GCS and
idle workers outlive a SIGTERM by more than 30 s here; nothing of a run is left by then)."""
NODE_TITLES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
"""A Ray node's own processes with a ``ray::`` title: pooled idle workers and the node's agents."""
START_ATTEMPTS = 3
"""Times a node is started before the cluster gives up (a second node's ``ray start`` has, rarely, failed to
reach the head's GCS within Ray's 60 s on a loaded machine; started again it joins)."""
NODE_PORTS = ("node-manager", "object-manager", "dashboard-agent-listen", "dashboard-agent-grpc", "metrics-export",
              "runtime-env-agent")  # fmt: skip
"""A node's own ports, ``--<name>-port``, in the order of its 7 ports (the 7th: the base of its worker ports)."""
LIVE: list[LocalCluster] = []
"""Clusters started and not yet stopped (stopped by the script's SIGTERM/SIGINT handler)."""


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as open_sockets:  # all bound at once: distinct ports
        socks = [open_sockets.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def node_command(
    ray: str,
    node: int,
    address: str,
    ports: list[int],
    temp: str,
    cpus: int = 8,
    gpus: int = 1,
    object_store_bytes: int = 300_000_000,
    worker_ports: int = 60,
) -> list[str]:
    """``ray start --block`` of node ``node`` (0: the head, at ``address``) on 127.0.0.1 with its own ports, temp
    folder, ``cpus``, ``gpus``, object store and ``worker_ports``."""
    gcs = address.rsplit(":", 1)[1]
    if node == 0:
        cmd = [ray, "start", "--head", f"--port={gcs}", "--include-dashboard=false"]
        cmd.append(f"--ray-client-server-port={ports[-1]}")
    else:
        cmd = [ray, "start", f"--address={address}"]
    p = ports[7 * node : 7 * node + 7]
    return cmd + [
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={cpus}",
        f"--num-gpus={gpus}",
        f"--object-store-memory={object_store_bytes}",
        *(f"--{name}-port={port}" for name, port in zip(NODE_PORTS, p, strict=False)),
        f"--min-worker-port={20000 + p[6] % 20000}",
        f"--max-worker-port={20000 + p[6] % 20000 + worker_ports}",
        f"--temp-dir={temp}/{node}",  # one per node: else each log monitor forwards both nodes' logs
        "--block",
    ]


def _session(proc: psutil.Process) -> int | None:
    try:
        return os.getsid(proc.pid)
    except (ProcessLookupError, PermissionError):
        return None


def _log_tail(log: Path, temp: Path, lines: int = 12) -> str:
    """The last ``lines`` lines of a node's ``ray start`` output and of its raylet's and GCS's error logs."""
    logs = temp / "session_latest" / "logs"
    parts = []
    for path in (log, logs / "raylet.err", logs / "gcs_server.err", logs / "raylet.out"):
        if path.is_file() and (text := path.read_text(errors="replace").strip()):
            parts.append(f"--- {path.name}\n" + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(parts) or "(no log)"


class LocalCluster:
    """A two-node local Ray cluster (one ``GPU`` resource and own ports per node; address file in its own temp
    folder, so no plain ``ray.init()`` attaches). :meth:`stop` ends exactly its and the runs' processes (by
    :data:`scan.TAG`) and raises on any leftover process, ``/dev/shm`` entry or temp folder, or blind scans."""

    def __init__(self, need_shm: bool = True) -> None:
        self.temp = tempfile.mkdtemp(prefix="ebpo-rc-", dir="/tmp")  # short: Ray's socket paths fit 107 bytes
        self.procs: list[subprocess.Popen] = []
        self.address = ""
        self.watch = scan.Watch("the two-node cluster", need_shm)
        self.stopped = False

    def start(self) -> LocalCluster:
        """Each node in turn until it joined; a failed ``ray start`` is retried on fresh ports up to
        :data:`START_ATTEMPTS` times, each failure reported with its log tail."""
        LIVE.append(self)
        env = {**os.environ, **run_env(), scan.TAG_ENV: scan.TAG}
        env.pop("RAY_ADDRESS", None)
        self.watch.start()
        for node in range(NODES):
            for attempt in range(1, START_ATTEMPTS + 1):
                failure = self._start_node(node, env)
                if failure is None:
                    break
                if attempt == START_ATTEMPTS:
                    raise SystemExit(f"[cpu_smoke] {failure}")
                print(f"[cpu_smoke] {failure}; starting node {node} again", file=sys.stderr, flush=True)
        print(f"[cpu_smoke] Ray cluster of {NODES} nodes at {self.address} (temp folder {self.temp})", flush=True)
        return self

    def _start_node(self, node: int, env: dict) -> str | None:
        """Start ``node`` on fresh ports and wait for ``node + 1`` live nodes; None, or why not."""
        ports = free_ports(1 + 7 * NODES + 1)
        if node == 0:
            self.address = f"127.0.0.1:{ports[0]}"
        temp = Path(self.temp) / str(node)
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir()
        log_path = Path(self.temp) / f"ray_start_{node}.log"
        ray = str(Path(sys.executable).with_name("ray"))
        with open(log_path, "w") as log:
            cmd = node_command(ray, node, self.address, ports[1:], self.temp)
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        if self._wait_nodes(node + 1, env):
            return None
        if dead := [str(i) for i, other in enumerate(self.procs[:-1]) if other.poll() is not None]:
            raise SystemExit(f"[cpu_smoke] node {', '.join(dead)}'s `ray start` exited; see {self.temp}")
        self.procs.remove(proc)
        kill_procs([p for p in scan.tagged_processes() if _session(p) == proc.pid], timeout=30)
        proc.wait(timeout=30)
        why = f"exited with {proc.returncode}" if proc.returncode is not None else "did not join"
        return f"node {node}'s `ray start` {why}; its log ends:\n{_log_tail(log_path, temp)}"

    def _wait_nodes(self, count: int, env: dict) -> bool:
        """True once the cluster has ``count`` live nodes; False once a ``ray start`` exited or after 120 s."""
        probe = "import ray; ray.init(address=%r, logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
        deadline = time.monotonic() + limits.left(120)
        while time.monotonic() < deadline:
            if any(proc.poll() is not None for proc in self.procs):
                return False
            out = subprocess.run(
                [sys.executable, "-c", probe % self.address], env=env, capture_output=True, text=True,
                timeout=limits.left(120),
            )  # fmt: skip
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(count)]:
                return True
            time.sleep(1)
        return False

    def job_processes(self) -> list[psutil.Process]:
        """The script's processes beside the cluster's machinery: drivers, busy ``ray::<Class>`` workers, vLLM."""
        nodes = {proc.pid for proc in self.procs}
        return [
            proc
            for proc, name in scan.titled(scan.tagged_processes())
            if _session(proc) not in nodes
            or "VLLM" in name
            or (name.startswith("ray::") and name.split()[0] not in NODE_TITLES)
        ]

    def wait_job_gone(self, seconds: float = 30.0) -> None:
        """After a run ended: within ``seconds`` no process of it is left on the cluster, else raise."""
        deadline = time.monotonic() + seconds
        while (left := self.job_processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left := scan.describe(left):
            raise SystemExit(f"[cpu_smoke] {seconds:.0f}s after the run ended, its processes are still there: {left}")
        print(f"[cpu_smoke] no process of the run is left on the cluster ({seconds:.0f}s after its end at most)")

    def worker_node_process(self, prefix: str) -> psutil.Process | None:
        """The second node's live process whose title starts with ``prefix``, or None. Only its session's processes
        are read (a fault polls this at its moment: reading every process's environment could miss a short step)."""
        session = [p for p in psutil.process_iter() if _session(p) == self.procs[1].pid]
        return next((p for p, name in scan.titled(session) if name.startswith(prefix)), None)

    def stop(self) -> None:
        """SIGTERM the ``ray start`` sessions, SIGKILL what is left after :data:`STOP_GRACE_S`, then the leak checks
        (:meth:`scan.Watch.final`); idempotent once the processes are ended."""
        if self.stopped:
            return
        self._end_processes()
        self.stopped = True  # only now: a stop interrupted by SIGTERM is redone by the handler's cleanup
        if self in LIVE:
            LIVE.remove(self)
        if os.path.exists(self.temp):
            raise AssertionError(f"[cpu_smoke] the cluster's temp folder {self.temp} is left")
        summary = self.watch.final(grace=5)
        print(f"[cpu_smoke] cluster stopped: {summary}; {self.temp} removed", flush=True)

    def _end_processes(self) -> None:
        """SIGTERM the ``ray start`` sessions, SIGKILL tagged processes left after the grace, remove the temp folder."""
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        self.watch.wait_gone(STOP_GRACE_S)
        self.watch.sample_now()  # what they hold right before the SIGKILL: the watch unlinks it once they are gone
        left = scan.tagged_processes()
        names = sorted({name for _, name in scan.describe(left)})
        kill_procs(left, timeout=30)
        for proc in self.procs:
            proc.wait(timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)
        if left:
            print(f"[cpu_smoke] SIGKILLed {len(left)} processes that outlived SIGTERM by {STOP_GRACE_S}s: {names}",
                  flush=True)  # fmt: skip
