"""Arithmetic tasks with verifiable integer answers: four topics x three difficulty levels.

A prompt is ``BOS aaa OP bbb =``, both operands zero-padded to three digits (every prompt is 9 tokens). The
answer is the result without leading zeros, then EOS; reward 1 iff a response is exactly that (no parser).
Topics (``level`` = digits of the first operand): add a + b and sub a - b (a >= b), both operands with ``level``
digits; mul a * b and mod a % b, b in 2..9.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

PAD, BOS, EOS = 0, 1, 2
DIGIT0 = 3
OPS = {"add": "+", "sub": "-", "mul": "*", "mod": "%"}
TOPICS = tuple(OPS)
LEVELS = (1, 2, 3)
_SYMBOLS = ["<pad>", "<bos>", "<eos>", *"0123456789", "+", "-", "*", "%", "="]
VOCAB_SIZE = len(_SYMBOLS)
_TOKEN = {s: i for i, s in enumerate(_SYMBOLS)}
PROMPT_LEN = 9
ANSWER_LEN = 5  # at most 4 digits (999 + 999, 999 * 9) plus EOS


@dataclass(frozen=True)
class ProblemSet:
    """A set of problems as aligned arrays; ``prompts`` (N, 9) and ``targets`` (N, 5) are token ids."""

    prompts: torch.Tensor
    targets: torch.Tensor
    topic: np.ndarray  # (N,) str
    level: np.ndarray  # (N,) int
    answer: np.ndarray  # (N,) int
    misconception: torch.Tensor  # (N, 5) targets of the carry-free misconception (see ``misconceived``)

    def __len__(self) -> int:
        return len(self.answer)

    def subset(self, idx: np.ndarray | list[int]) -> ProblemSet:
        idx = np.asarray(idx, dtype=np.int64)
        t = torch.from_numpy(idx)
        return ProblemSet(self.prompts[t], self.targets[t], self.topic[idx], self.level[idx], self.answer[idx],
                          self.misconception[t])  # fmt: skip

    @property
    def target_mask(self) -> torch.Tensor:
        """(N, 5) bool: answer digits and the EOS that ends them."""
        return torch.arange(ANSWER_LEN) <= (self.targets == EOS).int().argmax(dim=1, keepdim=True)


def all_problems(topic: str, level: int) -> np.ndarray:
    """Every problem of a topic and level as rows (a, b, answer); 810,000 rows for 3-digit addition."""
    if topic not in OPS or level not in LEVELS:
        raise ValueError(f"unknown task ({topic!r}, {level}); topics {TOPICS}, levels {LEVELS}")
    a_vals = np.arange(0 if level == 1 else 10 ** (level - 1), 10**level)  # the operands with ``level`` digits
    b_vals = a_vals if topic in ("add", "sub") else np.arange(2, 10)
    a, b = (x.ravel() for x in np.meshgrid(a_vals, b_vals, indexing="ij"))
    if topic == "sub":
        a, b = a[a >= b], b[a >= b]
    answer = {"add": a + b, "sub": a - b, "mul": a * b, "mod": a % np.maximum(b, 1)}[topic]
    return np.stack([a, b, answer], axis=1)


def misconceived(topic: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The answer under a classic misconception: digit-wise with carries and borrows dropped; for mod, ``a``'s last
    digit only."""
    if topic == "mod":
        return (a % 10) % b
    da = _digits(a, 3)[:, ::-1]
    db = _digits(b, 3)[:, ::-1] if topic in ("add", "sub") else b[:, None]
    digit = {"add": da + db, "sub": da - db, "mul": da * db}[topic] % 10
    return (digit * 10 ** np.arange(3)[None, :]).sum(axis=1)


def _digits(x: np.ndarray, width: int) -> np.ndarray:
    """(N, width) most-significant-first decimal digits of non-negative integers."""
    return (x[:, None] // 10 ** np.arange(width - 1, -1, -1)[None, :]) % 10


def encode(topic: str, a: np.ndarray, b: np.ndarray, answer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of the prompts (N, 9) and of the answers + EOS, PAD-padded (N, 5). Answers are written
    least-significant digit first, so the carry rule is local and a tiny model can learn it."""
    n = len(a)
    op = np.full((n, 1), _TOKEN[OPS[topic]])
    prompts = np.concatenate(
        [np.full((n, 1), BOS), DIGIT0 + _digits(a, 3), op, DIGIT0 + _digits(b, 3), np.full((n, 1), _TOKEN["="])],
        axis=1,
    )
    if (answer < 0).any() or (answer >= 10 ** (ANSWER_LEN - 1)).any():
        raise ValueError(f"{topic}: answers must lie in [0, {10 ** (ANSWER_LEN - 1)})")
    n_digits = np.maximum(1, np.floor(np.log10(np.maximum(answer, 1))).astype(np.int64) + 1)
    lsb_first = DIGIT0 + _digits(answer, ANSWER_LEN)[:, ::-1]
    pos = np.arange(ANSWER_LEN)[None, :]
    targets = np.where(pos < n_digits[:, None], lsb_first, PAD)
    targets[np.arange(n), n_digits] = EOS
    return prompts, targets


def decode(tokens: torch.Tensor | list[int]) -> str:
    """Readable text of token ids (stops at the first EOS or PAD)."""
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
    return "".join(_SYMBOLS[t] for t in itertools.takewhile(lambda t: t not in (EOS, PAD), ids))


def make_splits(
    sizes: dict[str, int], seed: int, topics: tuple[str, ...] = TOPICS, levels: tuple[int, ...] = LEVELS
) -> dict[str, ProblemSet]:
    """Disjoint splits, ``sizes[split]`` problems per (topic, level) cell in the given order (``seed`` fixes which).
    In a small cell every split but the last gets at most 1/(n_splits + 1): list the large warm-start split last."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list] = {name: [] for name in sizes}
    for topic in topics:
        for level in levels:
            pool = all_problems(topic, level)
            pool = pool[rng.permutation(len(pool))]
            start = 0
            for i, (name, n) in enumerate(sizes.items()):
                k = min(n, len(pool) - start if i == len(sizes) - 1 else len(pool) // (len(sizes) + 1))
                rows = pool[start : start + k]
                start += k
                prompts, targets = encode(topic, rows[:, 0], rows[:, 1], rows[:, 2])
                _, wrong = encode(topic, rows[:, 0], rows[:, 1], misconceived(topic, rows[:, 0], rows[:, 1]))
                parts[name].append(
                    (prompts, targets, np.full(len(rows), topic), np.full(len(rows), level), rows[:, 2], wrong)
                )
    splits = {}
    for name, ps in parts.items():
        prompts, targets, topic, level, answer, wrong = (np.concatenate(field) for field in zip(*ps, strict=True))
        ids = [torch.from_numpy(x).long() for x in (prompts, targets, wrong)]
        splits[name] = ProblemSet(*ids[:2], topic, level.astype(np.int64), answer.astype(np.int64), ids[2])
    return splits


def verify(responses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Reward 1.0 iff a response is exactly the answer digits followed by EOS; (bs, 5) -> (bs,) float."""
    relevant = torch.arange(targets.shape[1]) <= (targets == EOS).int().argmax(dim=1, keepdim=True)
    return ((responses == targets) | ~relevant).all(dim=1).float()
