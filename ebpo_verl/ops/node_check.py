"""Before training: every Ray node sees the run's data files and output folders at the same paths.

verl reads ``data.train_files`` / ``data.val_files`` in the TaskRunner and writes checkpoints
(``trainer.default_local_dir``) from every FSDP worker, so on a multi-node cluster those paths must be one shared
filesystem. Without a check, a node-local disk shows up hours later as a missing shard or a checkpoint split over
nodes. :func:`check_nodes` runs one Ray task per alive node (pinned with ``NodeAffinitySchedulingStrategy``) that
reads every data file (same size as on the driver) and, in every output folder, finds the driver's marker file
(same folder, not a node-local copy) and writes a probe file; any failure names the node and the path.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ebpo_verl.ops.errors import EBPOConfigError

MARKER_PREFIX = ".ebpo-node-check-"


class NodeCheckError(EBPOConfigError):
    """A Ray node does not see a data file or an output folder as the driver does."""


@dataclass(frozen=True)
class RunPaths:
    """Local paths of a run: ``files`` must be readable, ``dirs`` writable, on every node."""

    files: tuple[str, ...]
    dirs: tuple[str, ...]


def path_list(value: Any) -> list[str]:
    """A data-files setting (a path, a list of paths, or None) as a list of paths, ``~`` expanded."""
    if value is None:
        return []
    return [os.path.expanduser(str(v)) for v in ([value] if isinstance(value, str | os.PathLike) else value)]


def on_nodes(task: Callable[..., Any], args: Mapping[str, tuple]) -> dict[str, Any]:
    """``task(*args[node])`` as a Ray task pinned to each node id of ``args`` (no CPU, no retry): node id -> ref."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_retries=0)(task)
    pinned = {node: NodeAffinitySchedulingStrategy(node, soft=False) for node in args}
    return {node: remote.options(scheduling_strategy=pinned[node]).remote(*a) for node, a in args.items()}


def _unique(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(os.path.abspath(os.path.expanduser(p)) for p in paths if "://" not in p))


def run_paths(config: Any) -> RunPaths:
    """The data files (train + val) and output folders (checkpoints, metrics log, dumps) of a composed config."""
    files = [*path_list(config.data.get("train_files")), *path_list(config.data.get("val_files"))]
    trainer = config.trainer
    dirs = [str(trainer.default_local_dir)]
    if trainer.get("metrics_log_path"):
        dirs.append(os.path.dirname(os.path.abspath(str(trainer.metrics_log_path))))
    dirs += [str(trainer[k]) for k in ("validation_data_dir", "rollout_data_dir") if trainer.get(k)]
    return RunPaths(files=_unique(files), dirs=_unique(dirs))


def check_here(file_sizes: Mapping[str, int], dir_markers: Mapping[str, str]) -> list[str]:
    """Problems on this node: each file must read back at the driver's size, each folder must hold the
    driver's marker (same folder) and take a new file (writable). Returns ``"path: problem"`` strings."""
    problems = []
    for path, size in file_sizes.items():
        try:
            with open(path, "rb") as handle:
                handle.read(1)
                here = os.fstat(handle.fileno()).st_size
        except OSError as err:
            problems.append(f"{path}: cannot read the data file ({err.strerror or err})")
            continue
        if here != size:
            problems.append(f"{path}: {here} bytes here but {size} on the driver, so not the same file")
    for folder, marker in dir_markers.items():
        same = False
        with suppress(OSError), open(os.path.join(folder, MARKER_PREFIX + marker)) as handle:
            same = handle.read() == marker
        if not same:
            problems.append(f"{folder}: the driver's marker file is not there, so this is not the driver's folder")
            continue
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=MARKER_PREFIX):
                pass
        except OSError as err:
            problems.append(f"{folder}: not writable ({err.strerror or err})")
    return problems


def _describe(node: Mapping[str, Any]) -> str:
    return f"node {node.get('NodeManagerAddress', '?')} (id {str(node.get('NodeID', '?'))[:8]})"


def check_nodes(config: Any, timeout_s: float = 300.0) -> None:
    """Run :func:`check_here` on every alive Ray node (Ray must be initialised); raise :class:`NodeCheckError`."""
    import ray

    paths = run_paths(config)
    driver = f"the driver ({socket.gethostname()})"
    file_sizes = {}
    for path in paths.files:
        try:
            file_sizes[path] = os.stat(path).st_size
        except OSError as err:
            raise NodeCheckError(f"{driver}: {path}: cannot read the data file ({err.strerror or err})") from err
    markers: dict[str, str] = {}
    try:
        for folder in paths.dirs:
            token = uuid.uuid4().hex
            try:
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, MARKER_PREFIX + token), "w") as handle:
                    handle.write(token)
            except OSError as err:
                raise NodeCheckError(f"{driver}: {folder}: cannot create or write ({err.strerror or err})") from err
            markers[folder] = token
        nodes = {node["NodeID"]: node for node in ray.nodes() if node.get("Alive")}
        tasks = on_nodes(check_here, dict.fromkeys(nodes, (file_sizes, markers)))
        refs = {ref: nodes[node] for node, ref in tasks.items()}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        problems = [f"{_describe(refs[ref])}: did not answer within {timeout_s:.0f} s" for ref in pending]
        for ref in ready:
            try:
                problems += [f"{_describe(refs[ref])}: {problem}" for problem in ray.get(ref)]
            except ray.exceptions.RayError as err:  # the task or its worker died: say where
                reason = str(err).strip().splitlines()[-1] if str(err).strip() else ""
                problems.append(f"{_describe(refs[ref])}: the check task failed ({type(err).__name__}: {reason})")
    finally:
        for folder, token in markers.items():
            with suppress(OSError):
                os.remove(os.path.join(folder, MARKER_PREFIX + token))
    if problems:
        raise NodeCheckError(
            "; ".join(problems) + ". Every Ray node must see the data files, checkpoint and log folders at the same "
            "paths: put them on a filesystem shared by all nodes (set DATA_DIR / CKPT_DIR / LOG_DIR, or WORK_DIR, "
            "to a shared mount)."
        )
    print(f"node check: ok on {len(nodes)} Ray nodes ({', '.join(map(_describe, nodes.values()))})", flush=True)
