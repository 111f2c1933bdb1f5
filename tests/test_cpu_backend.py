"""The CPU backend's process group (ebpo_verl/cpu/backend.py), in a fresh process each (torch.distributed's group
is per process)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

PROGRAM = """
import os, torch, torch.distributed as dist
from ebpo_verl.cpu.backend import _init_gloo_process_group
_init_gloo_process_group()
t = torch.ones(2)
dist.all_reduce(t)
print(dist.get_world_size(), t.tolist())
"""


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_one_rank_needs_no_free_port_and_two_still_rendezvous_on_it(world_size):
    """verl picks MASTER_PORT free and binds it later, when another process may have taken it (EADDRINUSE, seen in
    CI): one rank's store is in-process and never binds it; two ranks still rendezvous there, so they meet the
    taken port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": world_size}
        done = subprocess.run([sys.executable, "-c", PROGRAM], env={**_env(), **env}, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    if world_size == "1":
        assert done.returncode == 0 and done.stdout.split("\n")[0] == "1 [1.0, 1.0]", done.stderr[-2000:]
    else:
        assert done.returncode != 0 and "EADDRINUSE" in done.stderr, done.stderr[-2000:]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
