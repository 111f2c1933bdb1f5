"""Generation engines and the data-parallel dispatcher: one engine per GPU of the node, or per core group on CPU
(docs/vllm_cpu.md).

* ``vllm``: vLLM offline ``LLM.generate``, one GPU group per worker process, which leads its own process group.
* ``hf``: Hugging Face ``generate`` on CPU (or one device), for tests with a tiny local model.

Every sample has its own seed, :func:`sample_seed`, so a sample is the same whatever the number of engines, the
chunking and the resumes. A prompt too long for the model is :class:`PromptTooLong` before anything is generated.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import json
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from ebpo_verl.evaluate.prompts import MAX_NEW_TOKENS, EvalInputError
from ebpo_verl.ops.shm import unlink_engine_shm
from ebpo_verl.options.parsing import OptionSection, ints, nullable, option, reals

Prompt = str | list[dict[str, str]]
ENGINES = ("vllm", "hf")


@dataclass(frozen=True)
class Request:
    """One sample to generate: ``key`` = (benchmark, index, sample)."""

    key: tuple[str, int, int]
    prompt: Prompt


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: int
    finish_reason: str  # "stop" (end of sequence), "length" (hit max_new_tokens) or vLLM's "abort"


@dataclass(frozen=True)
class EngineSpec:
    """Everything a worker needs to build its engine (picklable, sent to spawned processes)."""

    engine: str
    model: str
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int = 0
    batch_size: int = 8  # hf: prompts per generate call
    chunk_size: int = 1024  # requests per LLM.generate call (the unit saved to disk)
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool = False  # vllm: no torch.compile / CUDA graphs
    worker_env: tuple[dict[str, str], ...] = field(default=())  # per worker: CUDA_VISIBLE_DEVICES or CPU binding


VLLM_ARGS = ("model", "seed", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "enforce_eager")
"""The fields of :class:`EngineSpec` that vLLM's ``LLM`` takes under the same name."""


class PromptTooLong(EvalInputError):
    """A prompt that leaves less than ``--max-new-tokens`` of room within the model length."""


def sample_seed(seed: int, key: tuple[str, int, int]) -> int:
    """The seed of one sample: 63 bits of sha256 over (run seed, benchmark, index, sample)."""
    digest = hashlib.sha256(json.dumps([seed, *key]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def render(tokenizer: Any, prompt: Prompt) -> str:
    """The text fed to the model: a raw string unchanged, chat messages via the chat template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def vllm_input(tokenizer: Any, prompt: Prompt) -> str | dict[str, list[int]]:
    """What ``LLM.generate`` gets: a raw string unchanged, chat messages as ``{"prompt_token_ids": ...}`` (vLLM's
    ``TokensPrompt``: the chat template with the generation prompt, tokenized as verl's rollout does), so that no
    BOS is added on top of the template's own."""
    if isinstance(prompt, str):
        return prompt
    ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
    return {"prompt_token_ids": [int(i) for i in (ids["input_ids"] if isinstance(ids, Mapping) else ids)]}


def sampling_kwargs(spec: EngineSpec, seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one sample per request (with its seed, if given)."""
    kw = {"n": 1, "temperature": spec.temperature, "top_p": spec.top_p, "max_tokens": spec.max_new_tokens}
    return kw if seed is None else {**kw, "seed": seed}


def collect_vllm(outputs: Sequence[Any]) -> list[Completion]:
    """Completions from ``LLM.generate``'s ``RequestOutput`` list (same order as the prompts)."""
    firsts = [out.outputs[0] for out in outputs]
    return [Completion(c.text, len(c.token_ids), str(c.finish_reason or "unknown")) for c in firsts]


class VLLMEngine:
    """One vLLM engine on the GPUs this process sees, or on its CPU cores (vLLM's CPU build)."""

    def __init__(self, spec: EngineSpec):
        from vllm import LLM, SamplingParams

        self.spec, self.sampling_params = spec, SamplingParams
        self.llm = LLM(**{name: getattr(spec, name) for name in VLLM_ARGS})
        unlink_engine_shm()  # no /dev/shm segment outlives the engine, however its process ends
        self.tokenizer = self.llm.get_tokenizer()
        self.model_len = int(self.llm.llm_engine.model_config.max_model_len)

    def prompt_tokens(self, prompt: Prompt) -> int:
        """Prompt length as vLLM sees it (a raw string with the tokenizer's special tokens, chat as token ids)."""
        inp = vllm_input(self.tokenizer, prompt)
        return len(inp["prompt_token_ids"]) if isinstance(inp, dict) else len(self.tokenizer(inp)["input_ids"])

    def generate(self, requests: list[Request]) -> list[Completion]:
        inputs = [vllm_input(self.tokenizer, r.prompt) for r in requests]
        params = [
            self.sampling_params(**sampling_kwargs(self.spec, sample_seed(self.spec.seed, r.key))) for r in requests
        ]
        return collect_vllm(self.llm.generate(inputs, params, use_tqdm=False))


class SeededSampler:
    """``transformers`` logits processor: each row samples with its own ``torch.Generator`` (after HF's warpers) and
    keeps only the drawn token, so a sample depends on its seed only."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        import torch
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        self.torch = torch
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        warpers = [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
        self.warp = LogitsProcessorList(warpers)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        torch = self.torch
        probs = torch.softmax(self.warp(input_ids, scores.float()), dim=-1)
        drawn = [torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)]
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, torch.stack(drawn).to(scores.device), 0.0)
        return out


class HFEngine:
    """Hugging Face ``generate`` in batches (left padding), each sample with its own seed."""

    def __init__(self, spec: EngineSpec, device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.spec, self.device = torch, spec, device
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(spec.model).to(device).eval()
        self.model_len = spec.max_model_len or int(self.model.config.max_position_embeddings)

    def prompt_tokens(self, prompt: Prompt) -> int:
        return len(self.tokenizer(render(self.tokenizer, prompt), add_special_tokens=False)["input_ids"])

    def generate(self, requests: list[Request]) -> list[Completion]:
        size = self.spec.batch_size
        return [c for start in range(0, len(requests), size) for c in self._batch(requests[start : start + size])]

    def _batch(self, requests: list[Request]) -> list[Completion]:
        from transformers import LogitsProcessorList

        texts = [render(self.tokenizer, r.prompt) for r in requests]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        seeds = [sample_seed(self.spec.seed, r.key) for r in requests]
        sampler = SeededSampler(seeds, self.spec.temperature, self.spec.top_p) if self.spec.temperature > 0 else None
        processors = LogitsProcessorList([sampler] if sampler else [])
        with self.torch.no_grad():
            ids = self.model.generate(
                **enc,
                do_sample=False,  # greedy over SeededSampler's one remaining token (or plain greedy at T = 0)
                logits_processor=processors,
                max_new_tokens=self.spec.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        result = []
        for row in ids[:, enc["input_ids"].shape[1] :].tolist():
            stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
            n = len(row) if stop is None else stop + 1
            text = self.tokenizer.decode(row[:n], skip_special_tokens=True)
            result.append(Completion(text, n, "length" if stop is None else "stop"))
        return result


def run_worker(spec: EngineSpec, requests: list[Request], emit: Callable[[list[tuple[Request, Completion]]], None]):
    """Generate ``requests`` with one engine, ``spec.chunk_size`` at a time, into ``emit``; every prompt's length is
    checked first (:class:`PromptTooLong`)."""
    if spec.engine not in ENGINES:
        raise ValueError(f"unknown engine {spec.engine!r}; choose one of {ENGINES}")
    engine = VLLMEngine(spec) if spec.engine == "vllm" else HFEngine(spec)
    for r in {r.key[:2]: r for r in requests}.values():  # each problem once, in order (its samples share a prompt)
        tokens, new = engine.prompt_tokens(r.prompt), spec.max_new_tokens
        if tokens + new > engine.model_len:
            raise PromptTooLong(
                f"{r.key[0]} problem {r.key[1]}: its prompt has {tokens} tokens, so --max-new-tokens {new} needs a "
                f"model length of {tokens + new}, but the model length is {engine.model_len}; "
                "lower --max-new-tokens or raise --max-model-len (up to what the model supports)"
            )
    for start in range(0, len(requests), spec.chunk_size):
        chunk = requests[start : start + spec.chunk_size]
        emit(list(zip(chunk, engine.generate(chunk), strict=True)))


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    """SIGKILL this worker's process group as soon as ``parent`` dies (``PR_SET_PDEATHSIG`` and a watchdog thread;
    SIGKILL also skips the queue's blocking exit-time flush)."""

    def end_group(*_: object) -> None:
        os.killpg(os.getpgid(0), signal.SIGKILL)

    signal.signal(signal.SIGTERM, end_group)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        end_group()

    if os.getppid() != parent:  # it died before the death signal was armed
        end_group()
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _worker_main(spec: EngineSpec, env: dict[str, str], requests: list[Request], q: Any, parent: int) -> None:
    """Spawned worker: lead a process group, die with ``parent``, set devices or cores (``env``) before torch is
    imported, stream chunks to ``q``."""
    os.setpgid(0, 0)
    _die_with_parent(parent)
    os.environ.update(env)
    try:
        run_worker(spec, requests, lambda pairs: q.put(("chunk", pairs)))
        q.put(("done", None))
    except PromptTooLong as e:
        q.put(("input_error", str(e)))
    except BaseException:
        q.put(("error", traceback.format_exc()))
        raise


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a worker and e.g. vLLM's engine-core child); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def shard(requests: list[Request], workers: int) -> list[list[Request]]:
    """Split by problem (all samples of a prompt go to one engine, for its prefix cache), round robin."""
    owner = {p: i % workers for i, p in enumerate(sorted({r.key[:2] for r in requests}))}
    shards = [[r for r in requests if owner[r.key[:2]] == w] for w in range(workers)]
    return [s for s in shards if s]


def device_groups(workers: int, tensor_parallel_size: int, visible: str | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each worker: consecutive groups of ``tensor_parallel_size`` visible GPUs."""
    ids = visible.split(",") if visible else [str(i) for i in range(workers * tensor_parallel_size)]
    if len(ids) < workers * tensor_parallel_size:
        raise ValueError(f"{workers} engine(s) x {tensor_parallel_size} GPU(s) need more GPUs than visible ({ids})")
    return [",".join(ids[w * tensor_parallel_size : (w + 1) * tensor_parallel_size]) for w in range(workers)]


def core_groups(workers: int, cores: Sequence[int]) -> list[str]:
    """``VLLM_CPU_OMP_THREADS_BIND`` of each CPU worker: ``cores`` in ``workers`` near-equal consecutive groups."""
    if workers > len(cores):
        raise ValueError(f"--workers {workers} needs a core per engine, but this process may use {len(cores)} core(s)")
    return [",".join(map(str, group)) for group in np.array_split(sorted(cores), workers)]


def visible_gpus() -> int:
    """GPUs this process may use (0 without CUDA)."""
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def generate_all(
    spec: EngineSpec,
    requests: list[Request],
    workers: int,
    on_chunk: Callable[[list[tuple[Request, Completion]]], None],
) -> None:
    """Generate every request on ``workers`` engines (1: in-process; more: spawned, ``spec.worker_env``), calling
    ``on_chunk`` here as chunks finish; a failed worker stops the run with its traceback."""
    if not requests:
        return
    if workers == 1:
        for k, v in (spec.worker_env[0] if spec.worker_env else {}).items():
            os.environ.setdefault(k, v)  # a binding the user set for this one engine wins
        run_worker(spec, requests, on_chunk)
        return
    shards = shard(requests, workers)
    envs = list(spec.worker_env[: len(shards)]) if spec.worker_env else [{} for _ in shards]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # not daemonic: vLLM starts its own engine-core process, which a daemonic process may not do
    procs = [
        ctx.Process(target=_worker_main, args=(spec, e, s, q, os.getpid())) for e, s in zip(envs, shards, strict=True)
    ]
    for p in procs:
        p.start()
    running = len(procs)
    try:
        while running:
            try:
                kind, payload = q.get(timeout=5)
            except queue_mod.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(
                        f"generation worker(s) {dead} died (exit codes "
                        f"{[procs[i].exitcode for i in dead]}) without a traceback"
                    ) from None
                continue
            if kind == "chunk":
                on_chunk(payload)
            elif kind == "done":
                running -= 1
            elif kind == "input_error":
                raise PromptTooLong(payload)
            else:
                raise RuntimeError(f"a generation worker failed:\n{payload}")
    finally:
        for p in procs:
            if running or p.is_alive():  # after a failure, also the engine-core children of exited workers
                kill_group(p.pid)
            p.join(timeout=30)


@dataclass(frozen=True)
class EngineOptions(OptionSection):
    """The engine options shared by evaluation and pass-rate estimation (``--engine``, ``--gpus``, ...)."""

    SECTION: ClassVar[str] = "engine"

    engine: str = option("vllm", "vllm (GPU or vLLM's CPU build) or hf", choices=ENGINES)
    gpus: int | None = nullable("GPUs to use; null: all visible; 0: vLLM on CPU", ints(0))
    tensor_parallel_size: int = option(1, "GPUs per vLLM engine", rule=ints(1))
    workers: int = option(1, "engines when there is no GPU (hf, vllm on CPU)", rule=ints(1))
    max_new_tokens: int = option(MAX_NEW_TOKENS, "new tokens per response at most", rule=ints(1))
    max_model_len: int | None = nullable("model length; null: the model's", ints(1))
    gpu_memory_utilization: float = option(0.9, "vLLM's share of each GPU's memory", rule=reals(0, 1, open_low=True))
    kv_cache_gib: int = option(4, "vLLM on CPU: KV cache per engine in GiB", rule=ints(1))
    enforce_eager: bool | None = option(
        None,
        "vLLM without torch.compile/CUDA graphs; null: on CPU yes, on GPU no",
        choices=(True, False, None),
    )
    chunk_size: int = option(1024, "requests per generate call and per save", rule=ints(1))
    batch_size: int = option(8, "hf engine: prompts per generate call", rule=ints(1))
    seed: int = option(0, "run seed; each sample's seed derives from it and its key", rule=ints(0))


def engine_setup(options: EngineOptions, model: str, temperature: float, top_p: float) -> tuple[EngineSpec, int]:
    """(spec, number of workers) from the engine options; ValueError on impossible settings."""
    same = {f.name for f in fields(EngineOptions)} - {"engine", "enforce_eager"}
    cpu, envs, workers = False, (), options.workers
    if options.engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "--engine vllm: vLLM is not installed (GPU: pip install -e '.[gpu]'; CPU: see docs/vllm_cpu.md), "
                "or use --engine hf"
            )
        gpus = visible_gpus() if options.gpus is None else options.gpus
        cpu, per_engine = gpus == 0, options.tensor_parallel_size
        if cpu:
            cache = str(options.kv_cache_gib)
            cores = core_groups(workers, sorted(os.sched_getaffinity(0)))
            envs = tuple({"VLLM_CPU_OMP_THREADS_BIND": c, "VLLM_CPU_KVCACHE_SPACE": cache} for c in cores)
        elif gpus < per_engine:
            raise ValueError(f"--engine vllm needs at least {per_engine} GPU(s), found {gpus}")
        else:
            workers = gpus // per_engine
            groups = device_groups(workers, per_engine, os.environ.get("CUDA_VISIBLE_DEVICES"))
            envs = tuple({"CUDA_VISIBLE_DEVICES": g} for g in groups)
    spec = EngineSpec(
        engine=options.engine,
        model=model,
        temperature=temperature,
        top_p=top_p,
        enforce_eager=cpu if options.enforce_eager is None else options.enforce_eager,
        worker_env=envs,
        **{f.name: getattr(options, f.name) for f in fields(EngineSpec) if f.name in same},  # taken as they are
    )
    return spec, workers
