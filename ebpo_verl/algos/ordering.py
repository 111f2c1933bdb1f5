"""Training-stream orders for curriculum runs (numpy only, no verl import).

Han et al., arXiv 2602.05165, cluster the training set by ORDER only: rows are sorted by topic and trained
with shuffle off, so consecutive batches share a topic and the running EB prior tracks that topic
(EBPO-topic); EBPO-diff sorts easy -> hard for one epoch; EBPO-naive keeps the file order.

Every order here is a pure function of (row labels, options, seed, epoch): position p of epoch e maps to
row ``epoch_layout(...).order[p]``, with randomness from ``numpy.random.default_rng([seed, epoch])`` only.

- ``native``: row order of the files.
- ``random``: a seeded permutation, new every epoch.
- ``topic``: one contiguous block per topic; block order and the order inside each block are seeded
  shuffles, new every epoch. ``block_size`` cuts each topic into chunks of that many prompts and shuffles
  the chunks of all topics together (topics interleave in chunks). With ``align`` each topic contributes
  only whole batches of ``batch_size`` prompts to its block(s), and the leftover prompts of every topic
  (n_t mod batch_size of them, grouped by topic) form a mixed tail at the end of the epoch, so batch
  boundaries fall on topic boundaries.
- ``difficulty``: easy -> hard: descending ``pass_rate``, or ascending value of any other key (e.g. a
  1-5 level); ties in a seeded random order; ``descending`` reverses the order.

Rows without the label (None, or NaN for difficulty) are an error, or with ``missing="last"`` a final
block in seeded random order.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from ebpo_verl.options.parsing import OptionSection, ints, is_missing, nullable, option, text

ORDERS = ("native", "random", "topic", "difficulty")
MISSING = ("error", "last")
PURITY_THRESHOLD = 0.9
PASS_RATE_KEY = "pass_rate"  # higher is easier; any other difficulty key: lower is easier
FALLBACK_DIFFICULTY_KEY = "difficulty"
MISSING_LABEL = "(missing)"
TAIL_LABEL = "(mixed leftovers)"


@dataclass(frozen=True)
class CurriculumOptions(OptionSection):
    """Options of ``data.curriculum`` (all optional; these are the defaults)."""

    SECTION: ClassVar[str] = "data.curriculum"

    order: str = option("native", "native | random | topic | difficulty (see the module doc)", choices=ORDERS)
    align: bool | None = option(
        None,
        "topic only; pack each topic into whole batches of data.train_batch_size prompts, leftovers in mixed "
        "batches at the end of the epoch; null means true for topic",
        choices=(True, False, None),
    )
    block_size: int | None = nullable(
        "topic only; chunk size (prompts) to interleave topics; with align, a multiple of data.train_batch_size; "
        "null: one block per topic",
        ints(1),
    )
    topic_key: str = option("topic", "extra_info field holding the topic label", rule=text("a non-empty string"))
    difficulty_key: str | None = nullable(
        "extra_info field holding the difficulty; null means pass_rate when any row has it (higher = easier), "
        "otherwise difficulty (lower = easier)",
        text("a non-empty string"),
    )
    descending: bool = option(False, "difficulty only; hard -> easy instead", choices=(True, False))
    seed: int | None = nullable("seed of every shuffle; null means data.seed (0 when that is null too)", ints(0))
    missing: str = option(
        "error", "error (a row without the label is refused) | last (such rows go to the end)", choices=MISSING
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        where = self.SECTION
        if self.order != "topic" and (self.align or self.block_size is not None):
            raise ValueError(f"{where}.align and {where}.block_size apply only to order=topic, not {self.order}")
        if self.order != "difficulty" and self.descending:
            raise ValueError(f"{where}.descending applies only to order=difficulty, not {self.order}")

    @property
    def aligned(self) -> bool:
        return self.order == "topic" and self.align is not False

    @property
    def epoch_dependent(self) -> bool:
        """Whether the order changes from epoch to epoch (every order but ``native``)."""
        return self.order != "native"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Block:
    """A contiguous run of positions in an epoch's order."""

    label: str
    size: int


@dataclass(frozen=True)
class Layout:
    """One epoch's order: ``order[p]`` is the row shown at position p; ``blocks`` partition the positions."""

    order: np.ndarray
    blocks: tuple[Block, ...]


def epoch_layout(
    options: CurriculumOptions,
    n_rows: int,
    *,
    seed: int,
    epoch: int,
    batch_size: int,
    topics: Sequence[Hashable | None] | None = None,
    difficulties: Sequence[float | None] | None = None,
    higher_is_easier: bool = False,
) -> Layout:
    """The order of epoch ``epoch``: a permutation of ``range(n_rows)`` plus its blocks.

    ``topics`` is needed for ``topic``, ``difficulties`` for ``difficulty`` (one value per row, None when
    missing); ``higher_is_easier`` is True for pass rates.
    """
    rng = np.random.default_rng([int(seed), int(epoch)])
    if options.order in ("native", "random"):
        order = np.arange(n_rows) if options.order == "native" else rng.permutation(n_rows)
        return Layout(order.astype(np.int64), (Block("all rows", n_rows),))
    if options.order == "topic":
        if topics is None or len(topics) != n_rows:
            raise ValueError("order=topic needs one topic label per row")
        return _topic_layout(options, topics, rng, batch_size)
    if difficulties is None or len(difficulties) != n_rows:
        raise ValueError("order=difficulty needs one difficulty value per row")
    return _difficulty_layout(options, difficulties, rng, higher_is_easier)


def _present_and_missing(values: Sequence[Any], options: CurriculumOptions) -> tuple[np.ndarray, np.ndarray]:
    missing = np.array([is_missing(v) for v in values], dtype=bool)
    if missing.any() and options.missing == "error":
        row = int(np.flatnonzero(missing)[0])
        raise ValueError(f"row {row} has no label (missing={options.missing!r}); use missing='last' to keep it")
    return np.flatnonzero(~missing), np.flatnonzero(missing)


def _topic_layout(
    options: CurriculumOptions, topics: Sequence[Hashable | None], rng: np.random.Generator, batch_size: int
) -> Layout:
    present, missing = _present_and_missing(topics, options)
    groups: dict[str, list[int]] = {}
    for row in present:
        groups.setdefault(str(topics[row]), []).append(int(row))
    labels = sorted(groups)  # canonical before shuffling: independent of the file's row order of topics
    labels = [labels[i] for i in rng.permutation(len(labels))]
    members = {
        label: np.asarray(groups[label], dtype=np.int64)[rng.permutation(len(groups[label]))] for label in labels
    }

    if options.aligned:
        if options.block_size is not None and options.block_size % batch_size:
            raise ValueError(f"block_size={options.block_size} must be a multiple of the batch size {batch_size}")
        heads = {label: rows[: len(rows) // batch_size * batch_size] for label, rows in members.items()}
        tail = [members[label][len(heads[label]) :] for label in labels]
    else:
        heads, tail = members, []

    chunks: list[tuple[str, np.ndarray]] = []
    for label in labels:
        rows = heads[label]
        step = options.block_size or max(len(rows), 1)
        chunks += [(label, rows[i : i + step]) for i in range(0, len(rows), step)]
    if options.block_size is not None:
        chunks = [chunks[i] for i in rng.permutation(len(chunks))]
    if sum(map(len, tail)):
        chunks.append((TAIL_LABEL, np.concatenate(tail)))
    if len(missing):
        chunks.append((MISSING_LABEL, missing[rng.permutation(len(missing))]))
    return Layout(
        np.concatenate([rows for _, rows in chunks]).astype(np.int64),
        tuple(Block(label, len(rows)) for label, rows in chunks),
    )


def _difficulty_layout(
    options: CurriculumOptions, difficulties: Sequence[float | None], rng: np.random.Generator, higher_is_easier: bool
) -> Layout:
    present, missing = _present_and_missing(difficulties, options)
    values = np.array([float(difficulties[row]) for row in present], dtype=np.float64)
    ease = -values if higher_is_easier else values  # ascending = easy -> hard
    tiebreak = rng.permutation(len(present))
    ranked = present[np.lexsort((tiebreak, ease))]
    if options.descending:
        ranked = ranked[::-1]
    blocks = [Block(f"{v:g}", len(list(run))) for v, run in itertools.groupby(float(difficulties[r]) for r in ranked)]
    parts = [ranked]
    if len(missing):
        parts.append(missing[rng.permutation(len(missing))])
        blocks.append(Block(MISSING_LABEL, len(missing)))
    return Layout(np.concatenate(parts).astype(np.int64), tuple(blocks))


def batch_purity(
    labels_in_order: Sequence[Hashable], batch_size: int, threshold: float = PURITY_THRESHOLD
) -> tuple[int, int]:
    """(pure, full): of the ``full`` complete batches of ``batch_size`` consecutive labels, how many have
    a most common label covering at least ``threshold`` of the batch (the incomplete last batch is what
    verl's ``drop_last`` discards, so it is not counted)."""
    full = len(labels_in_order) // batch_size
    batches = (labels_in_order[b * batch_size : (b + 1) * batch_size] for b in range(full))
    return sum(Counter(batch).most_common(1)[0][1] >= threshold * batch_size for batch in batches), full
