"""TRL's generation blocks in a checkpoint: the micro-step counter file and each process's buffered block, checked
for what TRL 1.16.0's ``GRPOTrainer`` will read from them (:mod:`ebpo_verl.integrations.trl` writes and restores
them; docs/trl.md, Checkpoints and resume).

A block is the list TRL keeps in ``_buffered_inputs``: ``steps_per_generation`` micro-batches, each the dict that
``_generate_and_score_completions`` returned for the generation batch, cut into ``per_device_train_batch_size``
rows. :data:`FIELDS` says what each key holds in TRL 1.16.0; :func:`check_block` refuses in one line a block that
TRL's ``_compute_loss`` could not use as it was written (a missing or unknown key, a tensor of another kind, shape
or range), before the first micro-step runs.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from ebpo_verl.ops.errors import one_line, shorten

KNOWN_TRL = "1.16.0"
"""The TRL release whose buffered inputs :data:`FIELDS` describes; a resume under another one is refused."""
BLOCK_FILE = "trl_block.json"
"""TRL's micro-step counter and block settings at a save, in every checkpoint folder the mixin writes."""
BUFFER_FILE = "trl_block_rank{}.pt"
"""A process's generated block (TRL's ``_buffered_inputs``), written by every process at a save inside a block."""


@dataclass(frozen=True)
class Field:
    """One key of a buffered micro-batch: ``kind`` ``ids`` (integers in [0, vocab)), ``mask`` (0/1), ``float``
    (``finite``: no NaN or inf) or ``count`` (a 0-d number >= 0, the same in every micro-batch of a block);
    ``shapes``, the shapes allowed, in ``B`` (rows), ``P`` (prompt tokens), ``C`` (completion tokens) and ``1``."""

    kind: str
    shapes: tuple[str, ...] = ()
    finite: bool = False


FIELDS: Mapping[str, Field] = MappingProxyType(
    {
        "prompt_ids": Field("ids", ("BP",)),
        "prompt_mask": Field("mask", ("BP",)),
        "completion_ids": Field("ids", ("BC",)),
        "completion_mask": Field("mask", ("BC",)),
        "advantages": Field("float", ("B", "BC"), finite=True),
        "num_items_in_batch": Field("count"),
        "old_per_token_logps": Field("float", ("BC",)),
        "ref_per_token_logps": Field("float", ("BC",)),
        "importance_sampling_ratio": Field("float", ("BC", "B1")),
        "sampling_per_token_logps": Field("float", ("BC",)),
        "tool_mask": Field("mask", ("BC",)),
    }
)
"""TRL 1.16.0's text keys (``_generate_and_score_completions``' output), as ``_compute_loss`` reads them."""
ALWAYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")
"""The keys every block has; ``old_``/``ref_per_token_logps`` and ``importance_sampling_ratio`` follow the
settings (:class:`BlockLayout`), ``sampling_per_token_logps`` (vLLM's log-probs) and ``tool_mask`` the rollout."""
MULTIMODAL = frozenset(
    {"pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "image_sizes", "token_type_ids",
     "mm_token_type_ids", "image_position_ids", "num_images", "num_tiles"}
)  # fmt: skip
"""A vision model's keys: their shapes follow the processor, so only their type is checked (a tensor or a list)."""
ORDER = MappingProxyType({key: i for i, key in enumerate([*FIELDS, *sorted(MULTIMODAL)])})


@dataclass(frozen=True)
class BlockLayout:
    """What a block holds under a run's settings: ``rows`` per micro-batch (``per_device_train_batch_size``),
    token ids below ``vocab`` (the model's embedding rows), and each settings-dependent key present or not."""

    rows: int
    vocab: int
    implied: Mapping[str, bool]

    @classmethod
    def of(cls, args: Any, vocab: int) -> BlockLayout:
        """From a ``GRPOConfig``: TRL 1.16.0 keeps the old log-probs when the accumulation is not a multiple of a
        block's micro-steps or vLLM's importance sampling corrects them, the reference's when ``beta`` is not 0."""
        every = args.steps_per_generation * args.num_iterations
        vllm_is = bool(args.use_vllm and args.vllm_importance_sampling_correction)
        implied = {
            "old_per_token_logps": args.gradient_accumulation_steps % every != 0 or vllm_is,
            "ref_per_token_logps": args.beta != 0.0,
            "importance_sampling_ratio": vllm_is,
        }
        return cls(int(args.per_device_train_batch_size), int(vocab), implied)


def check_trl_version(version: str) -> None:
    """ValueError in one line unless ``version`` is :data:`KNOWN_TRL` (the blocks and counter it describes)."""
    if version != KNOWN_TRL:
        raise ValueError(
            f"TRL {shorten(version)} is installed, but ebpo-verl's resume checks TRL {KNOWN_TRL}'s generation "
            f"blocks: pip install trl=={KNOWN_TRL} to resume this checkpoint"
        )


def _field_problem(key: str, value: Any, field: Field, layout: BlockLayout, sizes: dict[str, int]) -> str | None:
    """What is wrong with ``value`` as ``key`` (None: nothing); ``sizes`` holds the block's ``P`` and ``C`` once
    seen, so every micro-batch must share them."""
    if not isinstance(value, torch.Tensor):
        return f"is {type(value).__name__}, not a tensor"
    if field.kind == "count":
        ok = value.ndim == 0 and not value.is_complex() and bool(torch.isfinite(value)) and float(value) >= 0
        return None if ok else f"is {shorten(value)}, not a count >= 0"
    floating = value.is_floating_point()
    if floating != (field.kind == "float") or value.is_complex() or (field.kind == "ids" and value.dtype == torch.bool):
        return f"has dtype {value.dtype}, not {'a floating' if field.kind == 'float' else 'an integer'} dtype"
    shape = tuple(value.shape)
    if not any(_shape_fits(pattern, shape, layout, sizes) for pattern in field.shapes):
        expected = " or ".join(f"({', '.join(p)})" for p in field.shapes)
        return f"has shape {shorten(shape)}, not {expected} (B = per_device_train_batch_size = {layout.rows})"
    if field.kind == "mask" and not bool(((value == 0) | (value == 1)).all()):
        return "holds values other than 0 and 1"
    if field.kind == "ids" and value.numel() and not (int(value.min()) >= 0 and int(value.max()) < layout.vocab):
        return f"holds token ids outside [0, {layout.vocab}) (the model's vocabulary)"
    if field.finite and not bool(torch.isfinite(value).all()):
        return "holds NaN or inf"
    return None


def _shape_fits(pattern: str, shape: tuple[int, ...], layout: BlockLayout, sizes: dict[str, int]) -> bool:
    """Whether ``shape`` fits ``pattern``; the first ``P``/``C`` that fits fixes the block's."""
    if len(pattern) != len(shape):
        return False
    trial = dict(sizes)
    for symbol, size in zip(pattern, shape, strict=True):
        want = layout.rows if symbol == "B" else 1 if symbol == "1" else trial.setdefault(symbol, size)
        if size != want:
            return False
    sizes.update(trial)
    return True


def check_block(block: Any, layout: BlockLayout, expected: int) -> str | None:
    """What makes ``block`` unusable as TRL 1.16.0's buffered block of ``expected`` micro-batches under ``layout``
    (None: it is usable)."""
    if not isinstance(block, list) or len(block) != expected:
        got = f"a list of {len(block)}" if isinstance(block, list) else f"a {type(block).__name__}"
        return f"expected a list of steps_per_generation={expected} micro-batches, got {got}"
    sizes: dict[str, int] = {}
    counts = set()
    wanted = {*ALWAYS, *(k for k, on in layout.implied.items() if on)}
    for i, batch in enumerate(block):
        if not isinstance(batch, dict):
            return f"micro-batch {i} is {type(batch).__name__}, not a dict of tensors"
        missing = sorted(wanted - set(batch))
        unexpected = [k for k in batch if (k not in FIELDS and k not in MULTIMODAL) or layout.implied.get(k) is False]
        if missing or unexpected:
            what = f"lacks {', '.join(missing)}" if missing else f"has {shorten(unexpected)}"
            return f"micro-batch {i} {what}, which TRL {KNOWN_TRL} with these settings does not write"
        for key in sorted(batch, key=ORDER.get):  # the ids first: they fix the block's P and C
            value = batch[key]
            if key in MULTIMODAL:
                problem = None if isinstance(value, torch.Tensor | list) else f"is {type(value).__name__}"
            else:
                problem = _field_problem(key, value, FIELDS[key], layout, sizes)
            if problem:
                return f"micro-batch {i} {key} {problem}"
        counts.add(float(batch["num_items_in_batch"]))
    if len(counts) > 1:
        return f"num_items_in_batch differs between micro-batches ({shorten(sorted(counts))}): not one generated block"
    return None


def block_settings(args: Any, processes: int) -> dict[str, int]:
    """The settings that place TRL's blocks and its data position: a resume must keep them."""
    names = ("gradient_accumulation_steps", "steps_per_generation", "num_iterations")
    return {**{name: int(getattr(args, name)) for name in names}, "processes": int(processes)}


def on_boundary(micro_step: int, settings: Mapping[str, int]) -> bool:
    """Whether TRL's micro-step counter (``GRPOTrainer._step``) is at a generation block's end: a multiple of
    ``steps_per_generation x num_iterations`` (not ``global_step x gradient_accumulation_steps``: Transformers ends an
    epoch whose micro-batches are not a multiple of the accumulation with a shorter update)."""
    return micro_step % (settings["steps_per_generation"] * settings["num_iterations"]) == 0


def read_counter(folder: str, settings: dict[str, int], global_step: int) -> int:
    """TRL's micro-step counter saved in ``folder``, checked against the block settings and the checkpoint's
    ``global_step`` (each optimizer step took 1 to ``gradient_accumulation_steps`` micro-batches). ValueError in one
    line for a missing or malformed file, a changed setting or a counter that does not fit."""
    path = os.path.join(folder, BLOCK_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except FileNotFoundError:
        raise ValueError(
            f"{path} is missing: resume from a checkpoint written by ebpo-verl's TRL integration (it records TRL's "
            "micro-step counter, which places the generation blocks)"
        ) from None
    except (ValueError, RecursionError) as err:
        raise ValueError(
            f"{path} is not valid JSON ({one_line(err)[:120]}): resume from an intact checkpoint"
        ) from None
    keys = {"micro_step", *settings}
    counts = isinstance(saved, dict) and set(saved) == keys and all(type(v) is int and v >= 0 for v in saved.values())
    if not counts:
        raise ValueError(f"{path} is malformed: expected non-negative integers {', '.join(sorted(keys))}")
    changed = [f"{k} {shorten(saved[k])} -> {v}" for k, v in settings.items() if saved[k] != v]
    if changed:
        raise ValueError(
            f"{path}: {', '.join(changed)} since the save: TRL's data position and generation blocks would not line "
            "up with the saved ones; resume with the saved settings"
        )
    micro, most = saved["micro_step"], global_step * settings["gradient_accumulation_steps"]
    if not global_step <= micro <= most:
        raise ValueError(
            f"{path}: micro_step {shorten(micro)} does not fit the checkpoint's global_step {global_step} (TRL counts "
            f"{global_step} to {most} micro-batches for it): resume from an intact checkpoint"
        )
    return micro


def load_block(
    folder: str, settings: dict[str, int], rank: int, device: Any, global_step: int, layout: BlockLayout, version: str
) -> tuple[int, list[Any] | None]:
    """TRL's counter at the save in ``folder`` (:func:`read_counter`) and, when it lies inside a block, this process's
    generated block, checked (:func:`check_block`; None at a boundary: TRL generates anew). ValueError in one line
    under a TRL ``version`` other than :data:`KNOWN_TRL`, or for a missing, unreadable or unusable file."""
    check_trl_version(version)
    micro = read_counter(folder, settings, global_step)
    if on_boundary(micro, settings):
        return micro, None
    buffer = os.path.join(folder, BUFFER_FILE.format(rank))
    if not os.path.isfile(buffer):
        raise ValueError(
            f"{buffer} is missing: the checkpoint lies inside a generation block (micro-step {micro}) and the "
            "block's completions are needed to continue it; resume from a checkpoint at a block's end"
        )
    try:
        block = torch.load(buffer, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
        raise ValueError(f"{buffer} is not a weights-only block of tensors ({one_line(err)[:120]})") from None
    problem = check_block(block, layout, settings["steps_per_generation"])
    if problem:
        raise ValueError(f"{buffer} is not a block TRL {KNOWN_TRL} can continue: {problem}")
    return micro, block
