"""``python -m tests.harness`` (from a checkout): the end-to-end smoke run of verl's real trainer (package docstring).

SIGTERM and SIGINT (``timeout``, a job scheduler, Ctrl-C) raise :class:`Stopped` in the main thread; on the
way out, :func:`cleanup` kills every live run's process tree and stops every live cluster (with its leak
checks), so that nothing of the script is left. Exit status 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ebpo_verl.cpu.tiny_runs import DEVICES
from ebpo_verl.options.cli import OneLineParser, add_options, parse_options
from ebpo_verl.options.parsing import OptionSection, ints, option, text
from tests.harness import cluster, limits, runs
from tests.harness.settings import NODES, prepare


class Stopped(SystemExit):
    """The script received SIGTERM or SIGINT."""


def _stop(signum: int, frame) -> None:
    raise Stopped(128 + signum)


def install_handlers() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)


def cleanup() -> None:
    """Kill the live runs' trees, stop the live clusters; a second signal meanwhile is ignored."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    killed = runs.kill_all()
    for live in list(cluster.LIVE):
        try:
            live.stop()
        except (AssertionError, SystemExit) as err:  # reported; the first failure is the one that counts
            print(err, flush=True)
    print(f"[cpu_smoke] stopped: killed {killed} live runs, stopped the cluster if one was up", flush=True)


@dataclass(frozen=True)
class SmokeOptions(OptionSection):
    """The smoke script's options, declared once."""

    SECTION: ClassVar[str] = "smoke"

    work_dir: str | None = option(
        None, "output folder; null: a new temp folder", choices=(None,), rule=text("a folder")
    )
    run_timeout: int = option(900, "seconds allowed per training run", rule=ints(1))
    deadline: int = option(1380, "seconds allowed for everything", rule=ints(1))  # cpu_smoke.sh: its timeout - margin
    vllm: bool = option(False, "also run C: resume A's step 2 with verl's vLLM rollout", choices=(True, False))
    nodes: int = option(1, "2: the two-node run instead of A/K/K'/C", choices=(1, NODES))
    faults: bool = option(False, "--nodes 2: kill, hang, kill the rollout at step 3", choices=(True, False))
    step_timeout: int = option(120, "--faults: EBPO_STEP_TIMEOUT_S of the hang", rule=ints(1))
    device: str = option("cpu", "cuda: actor and reference on the GPU (NCCL)", choices=DEVICES)
    hold: bool = option(False, "start the cluster and a stand-in run, wait to be stopped", choices=(True, False))
    stand_in: bool = option(False, "--hold without a Ray cluster", choices=(True, False))
    print_limits: bool = option(False, "print the time limits and exit", choices=(True, False))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.faults and self.nodes != NODES:
            raise ValueError("--faults needs --nodes 2")
        if self.device == "cuda" and (self.nodes != 1 or self.vllm):
            raise ValueError("--device cuda runs the one-node flow with the HF rollout; drop --nodes 2 / --vllm")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m tests.harness", description=__doc__.splitlines()[0])
    add_options(p, SmokeOptions)
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = parse_options(SmokeOptions, p.parse_args(argv), p)
    limits.check_order(args.run_timeout, args.deadline)
    if args.print_limits:
        print(f"run-timeout {args.run_timeout} deadline {args.deadline}")
        return
    limits.set_deadline(args.deadline)
    install_handlers()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ebpo-cpu-smoke-")).resolve()
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"[cpu_smoke] --work-dir {work} is not empty; pass a new or empty folder")
    work.mkdir(parents=True, exist_ok=True)
    from tests.harness import flows
    from tests.harness.flows import one_node

    try:
        if args.hold:
            flows.hold(work, args.stand_in, args.run_timeout)
            return
        files = prepare(work)
        if args.nodes == NODES:
            flows.two_nodes(work, files, args.run_timeout, args.faults, args.step_timeout)
        else:
            one_node(work, files, args.run_timeout, args.vllm, args.device)
    except BaseException:
        cleanup()
        raise


if __name__ == "__main__":
    main()
