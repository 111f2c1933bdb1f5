"""Curriculum orders as a verl dataset class: topic-clustered, difficulty-ordered, random or native.

verl 0.9 has no curriculum-sampler API; with ``data.shuffle=False`` a ``SequentialSampler`` reads the set, so the
dataset decides what position p holds. Select it in stock verl with::

    data.custom_cls.path=pkg://ebpo_verl.trainer.curriculum data.custom_cls.name=CurriculumDataset
    data.shuffle=False data.dataloader_num_workers=0 +data.curriculum.order=topic

Options: ``data.curriculum`` (:class:`ebpo_verl.algos.ordering.CurriculumOptions`); labels from ``extra_info``.
An epoch's order is a pure function of (rows, options, seed, epoch); ``state_dict`` (epoch, last position,
fingerprint) rides in verl's ``data.pt``, so a resume sees the uninterrupted run's prompts (needs
``dataloader_num_workers=0``). verl's legacy trainer skips ``data.pt`` at an epoch boundary: call
:meth:`CurriculumDataset.set_epoch` there. Only ``data.train_files`` is reordered; other sets act as ``RLHFDataset``.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl.utils.dataset.rl_dataset import RLHFDataset

from ebpo_verl.algos.ordering import (
    FALLBACK_DIFFICULTY_KEY,
    PASS_RATE_KEY,
    PURITY_THRESHOLD,
    CurriculumOptions,
    Layout,
    batch_purity,
    epoch_layout,
)
from ebpo_verl.ops.node_check import path_list
from ebpo_verl.options.parsing import is_missing

__all__ = ["CurriculumDataset", "CurriculumOptions", "parse_curriculum_config", "validate_curriculum_config"]
STATE_VERSION = 1
_SHOWN_BLOCKS = 12


def _options_mapping(data_config: Mapping[str, Any]) -> dict[str, Any]:
    node = data_config.get("curriculum", None)
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    if node is not None and not isinstance(node, Mapping):
        raise ValueError(f"data.curriculum must be a mapping of options, got {node!r}")
    return dict(node or {})


def parse_curriculum_config(data_config: Mapping[str, Any]) -> CurriculumOptions:
    """Options of ``data.curriculum``, checked against ``data.shuffle``, ``data.dataloader_num_workers`` and
    ``data.train_batch_size`` (each refusal says why); ValueError if unusable."""
    opts = CurriculumOptions.from_mapping(_options_mapping(data_config))
    shuffle = bool(data_config.get("shuffle", False))
    if shuffle and opts.order != "random":
        raise ValueError(
            f"data.curriculum.order={opts.order} needs data.shuffle=False: CurriculumDataset puts the rows in "
            f"{opts.order} order itself and verl's RandomSampler (data.shuffle=True) would scramble it. "
            "Set data.shuffle=False, or use data.curriculum.order=random for a shuffled stream."
        )
    workers = int(data_config.get("dataloader_num_workers", 0) or 0)
    if opts.epoch_dependent and not shuffle and workers > 0:
        raise ValueError(
            f"data.curriculum.order={opts.order} needs data.dataloader_num_workers=0 (got {workers}): "
            "CurriculumDataset follows the epoch from the sequence of positions it is asked for, which worker "
            "processes (each with its own copy of the dataset) would lose. __getitem__ does no tokenisation in "
            "verl 0.9, so workers gain nothing."
        )
    if opts.aligned:
        batch = data_config.get("train_batch_size", None)
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"data.curriculum.align needs a positive data.train_batch_size, got {batch!r}")
        if opts.block_size is not None and opts.block_size % batch:
            raise ValueError(
                f"data.curriculum.block_size={opts.block_size} must be a multiple of data.train_batch_size={batch} "
                "with align (blocks are made of whole batches); set align=false or a multiple."
            )
    return opts


def validate_curriculum_config(data_config: Mapping[str, Any]) -> CurriculumOptions:
    """The ``data.curriculum`` options, refused (ValueError) before any rollout when the curriculum cannot work:
    :func:`parse_curriculum_config`'s checks, and a curriculum set while ``data.custom_cls`` selects another class
    (verl would ignore it)."""
    custom = data_config.get("custom_cls", None) or {}
    path, name = custom.get("path", None), custom.get("name", None)
    if path is not None:
        from verl.utils.import_utils import load_extern_object

        if getattr(load_extern_object(path, name), "ebpo_curriculum", False):
            return parse_curriculum_config(data_config)
    opts = CurriculumOptions.from_mapping(_options_mapping(data_config))
    if opts != CurriculumOptions():
        raise ValueError(
            f"data.curriculum is set ({opts.as_dict()}) but data.custom_cls ({path}, {name}) is not "
            "CurriculumDataset, so verl would ignore it. Set data.custom_cls.path=pkg://ebpo_verl.trainer.curriculum "
            "data.custom_cls.name=CurriculumDataset, or remove data.curriculum."
        )
    return opts


def difficulty_key(opts: CurriculumOptions, extra_infos: Sequence[Mapping[str, Any]]) -> str:
    """The field ``order=difficulty`` sorts by: ``difficulty_key``, else pass_rate when a row has it, else
    difficulty."""
    if opts.difficulty_key is not None:
        return opts.difficulty_key
    has_pass_rate = any(not is_missing(e.get(PASS_RATE_KEY)) for e in extra_infos)
    return PASS_RATE_KEY if has_pass_rate else FALLBACK_DIFFICULTY_KEY


def _file_list(files: Any) -> list[str]:
    return [os.path.normpath(f) for f in path_list(files)]


class CurriculumDataset(RLHFDataset):
    """``RLHFDataset`` whose training rows come in a curriculum order (``data.curriculum``, see module doc)."""

    ebpo_curriculum = True  # marker for validate_curriculum_config (a file-path load makes a new class object)
    topics = difficulties = difficulty_key = None  # labels of the training set (set in __init__)

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        self.curriculum = parse_curriculum_config(config)
        train_files = config.get("train_files", None)
        self.is_train = train_files is None or _file_list(data_files) == _file_list(train_files)
        val_files = config.get("val_files", None)
        if (
            self.curriculum.epoch_dependent
            and val_files is not None
            and _file_list(val_files) == _file_list(train_files)
        ):
            raise ValueError(
                "data.val_files is the same as data.train_files: CurriculumDataset reorders only the training "
                "set and tells it apart by its files. Point data.val_files at a copy (or symlink) of the file."
            )
        super().__init__(data_files, tokenizer, config, processor=processor, max_samples=max_samples)

        opts = self.curriculum
        self.shuffled_by_sampler = opts.order == "random" and bool(config.get("shuffle", False))
        self.reorders = self.is_train and opts.epoch_dependent and not self.shuffled_by_sampler
        data_seed = config.get("seed", None)
        self.order_seed = int(opts.seed if opts.seed is not None else data_seed if data_seed is not None else 0)
        self.batch_size = int(config.get("train_batch_size", 0) or 0)
        self._epoch, self._last_position = 0, None
        self._layout_cache: tuple[int, Layout] | None = None
        if not self.is_train:
            return
        column = self.dataframe["extra_info"] if "extra_info" in self.dataframe.column_names else [None] * len(self)
        self._extra = extra = [e if isinstance(e, Mapping) else {} for e in column]
        self.topics = [e.get(opts.topic_key) for e in extra]
        self.difficulty_key = difficulty_key(opts, extra)
        self.difficulties: list[float | None] | None = None
        if opts.order == "topic":
            self._check_missing(self.topics, opts.topic_key, "topic_key")
        elif opts.order == "difficulty":
            self.difficulties = self._difficulty_values(extra)
        labels = self.topics if opts.order == "topic" else self.difficulties
        self.fingerprint = {
            "options": opts.as_dict(),
            "seed": self.order_seed,
            "batch_size": self.batch_size,
            "rows": len(self),
            "labels_sha256": hashlib.sha256(repr(labels).encode()).hexdigest()[:16] if labels is not None else None,
        }
        self._print_summary()

    # -- labels ---------------------------------------------------------------------------------------

    def _difficulty_values(self, extra: Sequence[Mapping[str, Any]]) -> list[float | None]:
        key = self.difficulty_key
        raw = [e.get(key) for e in extra]
        self._check_missing(raw, key, "difficulty_key")
        values: list[float | None] = []
        for row, v in enumerate(raw):
            try:
                number = None if is_missing(v) else float(v)
            except (TypeError, ValueError):
                raise ValueError(
                    f"CurriculumDataset: row {row}{self._row_id(row)} has extra_info[{key!r}]={v!r}, not a number; "
                    f"order=difficulty sorts by it (set data.curriculum.difficulty_key to a numeric field)."
                ) from None
            values.append(None if is_missing(number) else number)
        return values

    def _check_missing(self, values: Sequence[Any], key: str, option: str) -> None:
        rows = [i for i, v in enumerate(values) if is_missing(v)]
        if not rows or self.curriculum.missing == "last":
            return
        row = rows[0]
        present = sorted(k for k, v in self._extra[row].items() if v is not None)
        listed = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
        raise ValueError(
            f"CurriculumDataset (order={self.curriculum.order}): row {row}{self._row_id(row)} of "
            f"{self.original_data_files} has no extra_info[{key!r}] ({len(rows)} such row(s): {listed}); its "
            f"extra_info keys are {present}. Set data.curriculum.{option} to the field that holds the label, "
            "or data.curriculum.missing=last to put such rows at the end."
        )

    def _row_id(self, row: int) -> str:
        index = self._extra[row].get("index", None)
        return f" (extra_info.index={index!r})" if index is not None else ""

    # -- order ----------------------------------------------------------------------------------------

    def layout(self, epoch: int) -> Layout:
        """The order of ``epoch`` (``layout(e).order[p]`` = row at position p); pure, does not advance."""
        if self._layout_cache is None or self._layout_cache[0] != epoch:
            layout = epoch_layout(
                self.curriculum if self.reorders else CurriculumOptions(),  # not reordered: the file's order
                len(self),
                seed=self.order_seed,
                epoch=epoch,
                batch_size=self.batch_size,
                topics=self.topics,
                difficulties=self.difficulties,
                higher_is_easier=self.difficulty_key == PASS_RATE_KEY,
            )
            self._layout_cache = (epoch, layout)
        return self._layout_cache[1]

    def set_epoch(self, epoch: int) -> None:
        """Make the next position served start epoch ``epoch`` (for trainers that skip restoring data.pt)."""
        self._epoch, self._last_position = int(epoch), None

    def _row(self, position: int) -> int:
        position = int(position)
        if not 0 <= position < len(self):
            raise IndexError(f"position {position} out of range for {len(self)} rows")
        if not self.reorders:
            return position
        if self._last_position is not None and position <= self._last_position:
            self._epoch += 1
        self._last_position = position
        return int(self.layout(self._epoch).order[position])

    def __getitem__(self, item):
        return super().__getitem__(self._row(item))

    # -- torchdata Stateful: saved in data.pt by StatefulDataLoader -------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state = {"version": STATE_VERSION, "reorders": self.reorders}
        if self.reorders:
            state |= {"epoch": self._epoch, "last_position": self._last_position, "fingerprint": self.fingerprint}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not self.reorders:
            if state.get("reorders", False):  # e.g. eval.sh resumes a topic-ordered run with the native order
                warnings.warn(
                    f"the dataloader checkpoint (data.pt) was saved by a curriculum run ({state.get('fingerprint')}) "
                    "but this run keeps the file order: its training position now points at other prompts. Fine "
                    "for validation-only runs; to continue training, resume with the same data.curriculum.",
                    stacklevel=2,
                )
            return
        if not state.get("reorders", False):
            raise ValueError(
                "the dataloader checkpoint (data.pt) holds no curriculum position, but this run uses "
                f"data.curriculum.order={self.curriculum.order}: resume with the configuration it was saved "
                "with, or delete data.pt to restart the data stream from the first batch."
            )
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"the dataloader checkpoint (data.pt) was saved with curriculum {state.get('fingerprint')}, "
                f"this run has {self.fingerprint}; its position would point at other prompts. Resume with the "
                "same data files and data.curriculum, or delete data.pt to restart the data stream."
            )
        self._epoch, self._last_position = int(state["epoch"]), state["last_position"]

    # -- start-up summary -----------------------------------------------------------------------------

    def _print_summary(self) -> None:
        opts = self.curriculum
        if self.shuffled_by_sampler:
            head = f"order=random via verl's RandomSampler (data.shuffle=True, data.seed={self.config.get('seed')})"
        elif opts.order == "topic":
            align = f"aligned to batches of {self.batch_size}" if opts.aligned else "not aligned"
            chunk = f", block_size={opts.block_size}" if opts.block_size else ""
            head = f"order=topic by extra_info[{opts.topic_key!r}], {align}{chunk}, seed={self.order_seed}"
        elif opts.order == "difficulty":
            sense = "descending" if self.difficulty_key == PASS_RATE_KEY else "ascending"
            if opts.descending:
                sense += ", reversed (hard -> easy)"
            head = f"order=difficulty by extra_info[{self.difficulty_key!r}] {sense}, seed={self.order_seed}"
        else:
            head = f"order={opts.order}" + (f", seed={self.order_seed}" if opts.order == "random" else "")
        blocks = self.layout(0).blocks
        shown = " | ".join(f"{b.label}: {b.size}" for b in blocks[:_SHOWN_BLOCKS])
        more = f" | ... (+{len(blocks) - _SHOWN_BLOCKS} more)" if len(blocks) > _SHOWN_BLOCKS else ""
        print(f"[curriculum] {head}; {len(self)} rows in {len(blocks)} block(s) (epoch 0): {shown}{more}")
        print(f"[curriculum] {self._purity_line()}")

    def _purity_line(self) -> str:
        key = self.curriculum.topic_key
        if self.batch_size < 1:
            return "batch purity: n/a (data.train_batch_size unset)"
        if all(is_missing(t) for t in self.topics):
            return f"batch purity: n/a (no row has extra_info[{key!r}])"
        if self.shuffled_by_sampler:
            return "batch purity: n/a (order drawn by the sampler at run time)"
        labels = [self.topics[r] for r in self.layout(0).order]
        pure, full = batch_purity(labels, self.batch_size)
        frac = f"{pure / full:.3f}" if full else "n/a"
        return (
            f"batch purity (epoch 0): {pure}/{full} = {frac} of full batches of {self.batch_size} prompts "
            f"have one extra_info[{key!r}] on >= {PURITY_THRESHOLD:.0%} of their prompts"
        )
