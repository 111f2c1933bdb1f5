"""Generation engines and the data-parallel dispatcher (one engine per GPU of the node).

* ``vllm``: vLLM offline ``LLM.generate``; each worker process sees one GPU group (``CUDA_VISIBLE_DEVICES``)
  and leads its own process group (so stopping it also stops vLLM's engine-core child), so an 8-GPU node runs
  8 engines (the 8B/14B models fit one H200).
* ``hf``: Hugging Face ``generate`` on CPU (or one device), for tests with a tiny local model.

Prompts (:func:`vllm_input`): a raw string (protocol ``paper``) goes to vLLM as is, tokenized by vLLM with the
tokenizer's special tokens, as the authors' eval script did; chat messages (protocol ``verl``) go as token ids
from ``apply_chat_template(tokenize=True)``, as verl's rollout sends them -- a rendered string would be
tokenized again with a second BOS on LLaMA, whose template already starts with one. The vLLM layer only builds
``SamplingParams``, calls ``LLM.generate`` and reads the outputs with :func:`collect_vllm`.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


def render(tokenizer: Any, prompt: Prompt) -> str:
    """The text fed to the model: a raw string unchanged, chat messages via the chat template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def chat_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat-templated prompt with the generation prompt, as verl's rollout builds them."""
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def vllm_input(tokenizer: Any, prompt: Prompt) -> str | dict[str, list[int]]:
    """What ``LLM.generate`` gets: a raw string unchanged, chat messages as ``{"prompt_token_ids": ...}``
    (vLLM's ``TokensPrompt``), so that no BOS is added on top of the template's own."""
    if isinstance(prompt, str):
        return prompt
    return {"prompt_token_ids": chat_token_ids(tokenizer, prompt)}


def sampling_kwargs(spec: EngineSpec) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one sample per request."""
    return {"n": 1, "temperature": spec.temperature, "top_p": spec.top_p, "max_tokens": spec.max_new_tokens}


def collect_vllm(outputs: Sequence[Any]) -> list[Completion]:
    """Completions from ``LLM.generate``'s ``RequestOutput`` list (same order as the prompts)."""
    result = []
    for out in outputs:
        c = out.outputs[0]
        result.append(Completion(c.text, len(c.token_ids), str(c.finish_reason or "unknown")))
    return result


class VLLMEngine:
    """One vLLM engine on the GPUs this process sees."""

    def __init__(self, spec: EngineSpec):
        from vllm import LLM, SamplingParams

        self.llm = LLM(
            model=spec.model,
            seed=spec.seed,
            tensor_parallel_size=spec.tensor_parallel_size,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            max_model_len=spec.max_model_len,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.params = SamplingParams(**sampling_kwargs(spec))

    def generate(self, prompts: list[Prompt]) -> list[Completion]:
        inputs = [vllm_input(self.tokenizer, p) for p in prompts]
        return collect_vllm(self.llm.generate(inputs, self.params, use_tqdm=False))


class HFEngine:
    """Hugging Face ``generate`` with sampling, in batches (left padding)."""

    def __init__(self, spec: EngineSpec, device: str = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(spec.seed)
        self.torch, self.spec, self.device = torch, spec, device
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(spec.model).to(device).eval()

    def generate(self, prompts: list[Prompt]) -> list[Completion]:
        out: list[Completion] = []
        for start in range(0, len(prompts), self.spec.batch_size):
            texts = [render(self.tokenizer, p) for p in prompts[start : start + self.spec.batch_size]]
            out.extend(self._batch(texts))
        return out

    def _batch(self, texts: list[str]) -> list[Completion]:
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        with self.torch.no_grad():
            ids = self.model.generate(
                **enc,
                do_sample=True,
                temperature=self.spec.temperature,
                top_p=self.spec.top_p,
                top_k=0,
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


def make_engine(spec: EngineSpec) -> VLLMEngine | HFEngine:
    if spec.engine == "vllm":
        return VLLMEngine(spec)
    if spec.engine == "hf":
        return HFEngine(spec)
    raise ValueError(f"unknown engine {spec.engine!r}; choose one of {ENGINES}")


def run_worker(spec: EngineSpec, requests: list[Request], emit: Callable[[list[tuple[Request, Completion]]], None]):
    """Generate ``requests`` with one engine, ``spec.chunk_size`` at a time, handing each chunk to ``emit``."""
    engine = make_engine(spec)
    for start in range(0, len(requests), spec.chunk_size):
        chunk = requests[start : start + spec.chunk_size]
        emit(list(zip(chunk, engine.generate([r.prompt for r in chunk]), strict=True)))


def _worker_main(spec: EngineSpec, devices: str | None, requests: list[Request], q: Any) -> None:
    """Entry of a spawned worker: lead a process group (its children die with it, see :func:`kill_group`), pin
    its GPUs before anything imports CUDA, then stream chunks to ``q``."""
    os.setpgid(0, 0)
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        run_worker(spec, requests, lambda pairs: q.put(("chunk", pairs)))
        q.put(("done", None))
    except BaseException:
        q.put(("error", traceback.format_exc()))
        raise


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a worker and e.g. vLLM's engine-core child); gone is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def shard(requests: list[Request], workers: int) -> list[list[Request]]:
    """Split by problem (all samples of a prompt go to one engine, for its prefix cache), round robin."""
    problems = sorted({r.key[:2] for r in requests})
    owner = {p: i % workers for i, p in enumerate(problems)}
    shards: list[list[Request]] = [[] for _ in range(workers)]
    for r in requests:
        shards[owner[r.key[:2]]].append(r)
    return [s for s in shards if s]


def device_groups(workers: int, tensor_parallel_size: int, visible: str | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each worker: consecutive groups of ``tensor_parallel_size`` visible GPUs."""
    ids = visible.split(",") if visible else [str(i) for i in range(workers * tensor_parallel_size)]
    if len(ids) < workers * tensor_parallel_size:
        raise ValueError(f"{workers} engine(s) x {tensor_parallel_size} GPU(s) need more GPUs than visible ({ids})")
    return [",".join(ids[w * tensor_parallel_size : (w + 1) * tensor_parallel_size]) for w in range(workers)]


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
    """Generate every request on ``workers`` engines (1: in this process; more: spawned processes, each with
    its own GPUs for vLLM), calling ``on_chunk`` in this process as chunks finish. A failed worker stops the
    run with its traceback; chunks already handed to ``on_chunk`` stay done."""
    if not requests:
        return
    if workers == 1:
        run_worker(spec, requests, on_chunk)
        return
    shards = shard(requests, workers)
    groups = (
        device_groups(len(shards), spec.tensor_parallel_size, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if spec.engine == "vllm"
        else [None] * len(shards)
    )
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # not daemonic: vLLM starts its own engine-core process, which a daemonic process may not do
    procs = [ctx.Process(target=_worker_main, args=(spec, g, s, q)) for g, s in zip(groups, shards, strict=True)]
    for p in procs:
        p.start()
    running = len(procs)
    finished = False
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
            else:
                raise RuntimeError(f"a generation worker failed:\n{payload}")
        finished = True
    finally:
        for p in procs:
            if not finished or p.is_alive():  # after a failure, also the engine-core children of exited workers
                kill_group(p.pid)
            p.join(timeout=30)


def add_engine_args(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    """The engine options shared by evaluation and pass-rate estimation."""
    p.add_argument("--engine", choices=ENGINES, default="vllm", help="vllm (GPU, default) or hf (CPU tests)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all visible; vllm only)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per vLLM engine (default 1)")
    p.add_argument("--workers", type=int, default=1, help="hf engine: parallel worker processes (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--max-model-len", type=int, default=None, help="vLLM max model length (default: model's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--chunk-size", type=int, default=1024, help="requests per generate call and per save")
    p.add_argument("--batch-size", type=int, default=8, help="hf engine: prompts per generate call")
    p.add_argument("--seed", type=int, default=0)


def engine_setup(a: argparse.Namespace, model: str, temperature: float, top_p: float) -> tuple[EngineSpec, int]:
    """(spec, number of workers) from the parsed engine options; ValueError on impossible settings."""
    for name in ("tensor_parallel_size", "workers", "max_new_tokens", "chunk_size", "batch_size"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if a.engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ValueError("--engine vllm: vLLM is not installed (pip install -e '.[gpu]'); on CPU use --engine hf")
        gpus = visible_gpus() if a.gpus is None else a.gpus
        if gpus < a.tensor_parallel_size:
            raise ValueError(
                f"--engine vllm needs at least {a.tensor_parallel_size} GPU(s), found {gpus}; "
                "on a CPU machine use --engine hf"
            )
        workers = gpus // a.tensor_parallel_size
    else:
        workers = a.workers
    spec = EngineSpec(
        engine=a.engine,
        model=model,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=a.max_new_tokens,
        seed=a.seed,
        batch_size=a.batch_size,
        chunk_size=a.chunk_size,
        gpu_memory_utilization=a.gpu_memory_utilization,
        max_model_len=a.max_model_len,
        tensor_parallel_size=a.tensor_parallel_size,
    )
    return spec, workers
