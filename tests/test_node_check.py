"""ebpo_verl.ops.node_check on a real two-node Ray cluster started on this machine (`ray start --head` + `ray start
--address`), one of whose nodes sees a node-local disk (a tmpfs mounted in its own mount namespace) at a path
where the head sees the shared folder, as a node without the shared mount would (that needs root and unshare;
otherwise the failing case is a data file the driver can stat but no node may read)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ebpo_verl.ops.node_check import MARKER_PREFIX, NodeCheckError, check_here, check_nodes, run_paths
from tests.harness.cluster import START_ATTEMPTS, _log_tail, free_ports, node_command

RAY = str(Path(sys.executable).with_name("ray"))


def config(train: Path, val: Path, ckpt: Path, logs: Path):
    return OmegaConf.create(
        {
            "data": {"train_files": [str(train)], "val_files": [str(val)]},
            "trainer": {
                "default_local_dir": str(ckpt),
                "metrics_log_path": str(logs / "metrics.jsonl"),
                "validation_data_dir": None,
                "rollout_data_dir": None,
            },
        }
    )


def test_run_paths_lists_data_files_and_output_folders(tmp_path):
    cfg = config(tmp_path / "t.parquet", tmp_path / "v.parquet", tmp_path / "ckpt", tmp_path / "logs")
    cfg.data.val_files = [str(tmp_path / "v.parquet"), "hdfs://remote/v.parquet", str(tmp_path / "t.parquet")]
    cfg.trainer.rollout_data_dir = "~/dump"
    paths = run_paths(cfg)
    assert paths.files == (str(tmp_path / "t.parquet"), str(tmp_path / "v.parquet"))  # remote and repeats dropped
    assert paths.dirs == (str(tmp_path / "ckpt"), str(tmp_path / "logs"), os.path.expanduser("~/dump"))


def test_check_here_reports_each_problem(tmp_path):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"12345")
    shared = tmp_path / "out"
    shared.mkdir()
    (shared / f"{MARKER_PREFIX}abc").write_text("abc")
    other = tmp_path / "other"
    other.mkdir()
    assert check_here({str(data): 5}, {str(shared): "abc"}) == []
    problems = check_here({str(data): 7, str(tmp_path / "gone.parquet"): 1}, {str(shared): "abc", str(other): "abc"})
    assert problems == [
        f"{data}: 5 bytes here but 7 on the driver, so not the same file",
        f"{tmp_path / 'gone.parquet'}: cannot read the data file (No such file or directory)",
        f"{other}: the driver's marker file is not there, so this is not the driver's folder",
    ]


def _can_shadow(folder: Path) -> bool:
    """Whether this process may start a process that sees its own tmpfs at ``folder`` (root + unshare)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs", str(folder)],
        capture_output=True,
    )
    return probe.returncode == 0


DRIVER = """
import json, sys, time
import ray
from omegaconf import OmegaConf
from ebpo_verl.ops.node_check import NodeCheckError, check_nodes

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[2])
while sum(n["Alive"] for n in ray.nodes()) < 2 and time.monotonic() < deadline:
    time.sleep(1)
nodes = [n for n in ray.nodes() if n["Alive"]]
outcomes = []
for cfg in json.loads(sys.argv[3]) if len(nodes) == 2 else []:
    try:
        check_nodes(OmegaConf.create(cfg), timeout_s=60)
        outcomes.append(None)
    except NodeCheckError as err:
        outcomes.append(str(err))
workers = [n["NodeID"][:8] for n in nodes if not n.get("Resources", {}).get("node:__internal_head__")]
ray.shutdown()
print(json.dumps({"nodes": len(nodes), "workers": workers, "outcomes": outcomes}))
"""
"""The Ray driver: it connects, waits (up to argv[2] s) for the two nodes, runs check_nodes on each config of
argv[3] (JSON) and prints the alive nodes, the worker's id and each outcome (None or the NodeCheckError's message).
A process of its own, each run bounded in time: a driver that hangs or crashes fails the test with its stderr and
the nodes' log tails, instead of holding the pytest worker until the heavy tests' limit kills it (CI of stop 49)."""


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory):
    """Head + one worker node on 127.0.0.1, each with its own ports; the worker sees a tmpfs at ``local``.
    Yields ``(shared, local or None, drive)``; ``drive(configs)`` runs :data:`DRIVER` on them."""
    root = tmp_path_factory.mktemp("cluster")
    shared, local = root / "shared", root / "local"
    shared.mkdir()
    local.mkdir()
    shadow_local = _can_shadow(local)  # else (not root): the failing case is a file no node may read
    # hermetic: no token auth picked up from a ~/.ray/auth_token another cluster left, no RAY_ADDRESS
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    gcs, *ports = free_ports(16)

    address, temp = f"127.0.0.1:{gcs}", f"/tmp/ray_nc_{gcs}"  # short: Ray's socket paths must fit in 107 characters

    def ray_start(n: int) -> list[str]:  # the smoke cluster's `ray start` of node n, smaller (1 CPU, no GPU)
        return node_command(
            RAY, n, address, ports, temp, cpus=1, gpus=0, object_store_bytes=80_000_000, worker_ports=40
        )

    def logs() -> str:
        return "".join(f"\nnode {n}:\n{_log_tail(Path(os.devnull), Path(temp) / str(n))}" for n in (0, 1))

    def drive(configs: list, wait_s: float = 0.0, limit_s: float = 300.0) -> dict:
        """Run :data:`DRIVER`; a driver that exits badly or runs past ``wait_s + limit_s`` fails with its stderr."""
        args = [
            sys.executable,
            "-c",
            DRIVER,
            address,
            str(wait_s),
            json.dumps([OmegaConf.to_container(c) for c in configs]),
        ]
        try:
            proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=wait_s + limit_s)
        except subprocess.TimeoutExpired as err:
            stderr = (err.stderr or b"").decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr
            pytest.fail(f"the Ray driver process ran past {wait_s + limit_s:.0f} s:\n{(stderr or '')[-4000:]}{logs()}")
        assert proc.returncode == 0, f"the Ray driver exited {proc.returncode}:\n{proc.stderr[-4000:]}{logs()}"
        return json.loads(proc.stdout.splitlines()[-1])

    def start(command: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    procs = [start(ray_start(0))]
    try:
        worker = ray_start(1)
        shadow = f'mount -t tmpfs tmpfs {local} && exec "$@"'
        command = ["unshare", "-m", "--propagation", "private", "sh", "-c", shadow, "sh", *worker]
        deadline = time.monotonic() + 120  # the head's GCS answers `ray status` (each call bounded: none may hang)
        while time.monotonic() < deadline:
            with suppress(subprocess.TimeoutExpired):
                status = [RAY, "status", f"--address={address}"]
                if subprocess.run(status, env=env, capture_output=True, timeout=20).returncode == 0:
                    break
            time.sleep(1)
        procs.append(start(command if shadow_local else worker))
        for _ in range(4):  # at most 4 x 90 s: with the head's 120 s and a check's 300 s, within the heavy limit
            if joined := drive([], wait_s=30, limit_s=60)["nodes"] == 2:
                break
            if procs[1].poll() is not None and len(procs) < 2 + START_ATTEMPTS - 1:  # as LocalCluster: start again
                procs.insert(1, start(command if shadow_local else worker))
        assert joined, "the second Ray node did not join"
        yield shared, local if shadow_local else None, drive
    finally:
        for proc in reversed(procs):  # the process groups we started, nothing else
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_two_nodes_shared_paths_pass_and_node_local_paths_are_named(two_node_cluster):
    shared, local, drive = two_node_cluster
    train, val = shared / "train.parquet", shared / "val.parquet"
    train.write_bytes(b"x" * 100)
    val.write_bytes(b"y" * 10)
    ckpt, logs = shared / "ckpt" / "run", shared / "logs" / "run"

    if local is None:  # not root: a data file the driver can stat but no node may read
        if os.geteuid() == 0:
            pytest.skip("root without unshare: no way to make a path differ between two local Ray nodes")
        secret = shared / "secret.parquet"
        secret.write_bytes(b"z")
        secret.chmod(0)
        result = drive([config(train, val, ckpt, logs), config(secret, val, ckpt, logs)])
        assert result["outcomes"][0] is None  # all shared: passes
        assert result["outcomes"][1].count(f"{secret}: cannot read the data file (Permission denied)") == 2
        assert not [p for p in ckpt.iterdir() if p.name.startswith(MARKER_PREFIX)]
        return

    (local / "train.parquet").write_bytes(b"x" * 100)
    result = drive(
        [
            config(train, val, ckpt, logs),  # all shared: passes
            config(local / "train.parquet", val, ckpt, logs),  # data on a node-local disk: the worker cannot read it
            config(train, val, local / "ckpt" / "run", logs),  # checkpoints on a node-local disk: not the head's
            config(shared / "missing.parquet", val, ckpt, logs),  # missing everywhere: refused on the driver
        ]
    )
    (worker,) = result["workers"]
    passed, data_local, ckpt_local, missing = result["outcomes"]
    assert passed is None
    assert (
        f"(id {worker}): {local / 'train.parquet'}: cannot read the data file (No such file or directory)" in data_local
    )
    assert data_local.count("(id ") == 1 and "shared by all nodes" in data_local
    assert f"(id {worker}): {local / 'ckpt' / 'run'}: the driver's marker file is not there" in ckpt_local
    assert re.match(r"the driver \(.*\): .*missing.parquet: cannot read the data file", missing), missing
    for folder in (ckpt, local / "ckpt" / "run"):
        assert not [p for p in folder.iterdir() if p.name.startswith(MARKER_PREFIX)]


def test_a_check_task_that_dies_names_its_node(tmp_path, monkeypatch):
    """ray.get raising (the task's worker crashed, the node died) is reported with that node, not a traceback;
    the markers are removed. Ray's scheduling is stubbed: one healthy node, one whose task dies."""
    import ray
    from ray.exceptions import WorkerCrashedError

    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    train.write_bytes(b"x")
    val.write_bytes(b"y")
    cfg = config(train, val, tmp_path / "ckpt", tmp_path / "logs")
    nodes = [
        {"Alive": True, "NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.1"},
        {"Alive": True, "NodeID": "b" * 56, "NodeManagerAddress": "10.0.0.2"},
    ]

    class Task:
        def options(self, scheduling_strategy):
            self.node = scheduling_strategy.node_id
            return self

        def remote(self, file_sizes, markers):
            return (self.node, tuple(check_here(file_sizes, markers)))

    def get(ref):
        if ref[0] == "b" * 56:
            raise WorkerCrashedError()
        return ref[1]

    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray, "remote", lambda **kw: lambda fn: Task())
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns, timeout: (refs, []))
    monkeypatch.setattr(ray, "get", get)
    with pytest.raises(NodeCheckError) as err:
        check_nodes(cfg)
    message = str(err.value)
    assert message.startswith("node 10.0.0.2 (id bbbbbbbb): the check task failed (WorkerCrashedError: ")
    assert "10.0.0.1" not in message  # the healthy node has nothing to report
    assert not [p for p in tmp_path.rglob(f"{MARKER_PREFIX}*")]


@pytest.mark.slow
def test_task_runner_checks_the_nodes_before_building_the_trainer(monkeypatch):
    """EBPOTaskRunner.run: pre-flight, then the node check, whose failure stops the run before any trainer."""
    import ebpo_verl.trainer.ray_trainer as trainer

    calls = []
    runner_cls = trainer.EBPOTaskRunner.__ray_actor_class__
    monkeypatch.setattr(runner_cls, "preflight", lambda self, config: calls.append("preflight"))

    def refuse(config):
        calls.append("check_nodes")
        raise NodeCheckError("node 10.0.0.2 (id 3f2a91c0): /x: cannot read the data file")

    monkeypatch.setattr(trainer, "check_nodes", refuse)
    monkeypatch.setattr(trainer, "ebpo_trainer_cls", lambda mode: calls.append("trainer") or pytest.fail("built"))
    with pytest.raises(NodeCheckError, match="node 10.0.0.2"):
        runner_cls.run(object.__new__(runner_cls), OmegaConf.create({}))
    assert calls == ["preflight", "check_nodes"]
