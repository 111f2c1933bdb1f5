"""Rule-based math reward for verl: the answer the response states last (its last ``Answer:`` line or balanced
``\\boxed{}``), graded by ``math-verify`` in a pool of child processes with a timeout (docs/reward.md).

``compute_score`` is what ``reward.custom_reward_function`` points at (``path=pkg://ebpo_verl.reward``). Grading:
equal cleaned text; integer literals compared directly (``025`` == ``25``); otherwise math-verify on braced
``\\frac12`` / ``\\sqrt2``, then equal plain text or equality without a trailing percent sign. Verdicts are cached
per (gold, prediction); answers over ``MAX_ANSWER_CHARS`` score 0 unparsed.
"""

from __future__ import annotations

import atexit
import json
import math
import numbers
import os
import re
import select
import subprocess
import sys
import threading
import time
import warnings
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ebpo_verl.options.parsing import OptionSection, Rule, accepts, allowed, ints, option, reals

WORKERS_ENV = "EBPO_REWARD_WORKERS"
TIMEOUT_ENV = "EBPO_REWARD_TIMEOUT"


@dataclass(frozen=True)
class RewardOptions(OptionSection):
    """The reward's knobs, set in ``reward.custom_reward_function.reward_kwargs`` (``ebpo-train`` also reads the env
    variables before Ray starts). This module reads no environment: a missing knob is its default, a bad one that
    default with a RuntimeWarning (:func:`_valid`)."""

    SECTION: ClassVar[str] = "reward.custom_reward_function.reward_kwargs"

    workers: int | None = option(
        None,
        f"grading child processes of each reward process (env {WORKERS_ENV}, read by ebpo-train); null: min(8, "
        "CPUs of its machine)",
        choices=(None,),
        rule=ints(1),
    )
    timeout: float = option(
        5,
        f"seconds one math-verify parse+verify may take before the answer scores 0 (env {TIMEOUT_ENV}, read by "
        "ebpo-train)",
        rule=Rule(reals(0, open_low=True).test, "a number of seconds > 0"),
    )

    ENV: ClassVar[dict[str, str]] = {"workers": WORKERS_ENV, "timeout": TIMEOUT_ENV}

    @property
    def pool_size(self) -> int:
        """Grading child processes: ``workers``, or min(8, CPUs of this machine)."""
        return self.workers or min(8, os.cpu_count() or 1)


DEFAULTS = RewardOptions()
"""The knobs of a call that passes none (a reward process that stock verl starts without ``reward_kwargs``)."""


def _valid(key: str, value: Any) -> Any:
    """``value`` if option ``key`` accepts it, else its declared default with a RuntimeWarning naming it."""
    declared = next(f for f in RewardOptions.declarations() if f.name == key)
    if accepts(declared, value):
        return value
    warnings.warn(
        f"ebpo_verl.reward: {key}={value!r} is invalid (use {allowed(declared)}); using {declared.default!r}",
        RuntimeWarning,
        stacklevel=3,
    )
    return declared.default


MAX_ANSWER_CHARS = 1000
"""Extracted answers longer than this score 0 without being parsed (no reference answer comes close)."""
STARTUP_TIMEOUT_S = 120.0
"""How long a fresh worker may take to import sympy/math-verify before it counts as broken."""
MAX_WORKERS = DEFAULTS.pool_size
"""Grading child processes at import (the declared default); a call's ``workers`` resizes the pool."""

_ANSWER_LINE_RE = re.compile(
    r"^[ \t>*#_-]*(?:the[ \t]+)?(?:final[ \t]+)?answer[ \t]*(?:\*\*|__)?[ \t]*:", re.IGNORECASE | re.MULTILINE
)
_ANSWER_ANYWHERE_RE = re.compile(r"answer\s*:", re.IGNORECASE)
_BOXED_OR_BRACE_RE = re.compile(r"\\boxed\s*\{|\\boxed\s+([^\s{}$][^\s{}$]*)|\{|\}")
_UNESCAPED_DOLLAR_RE = re.compile(r"(?<!\\)\$")
_FRAC_TWO_RE = re.compile(r"\\([dt]?frac)\s*([0-9a-zA-Z])\s*([0-9a-zA-Z])")
_FRAC_ONE_RE = re.compile(r"\\([dt]?frac)\s*([0-9a-zA-Z])\s*\{")
_FRAC_SECOND_RE = re.compile(r"\\([dt]?frac)\s*(\{[^{}]*\})\s*([0-9a-zA-Z])")
_SQRT_RE = re.compile(r"\\sqrt\s*([0-9a-zA-Z])")
_INT_RE = re.compile(r"^[+-]?\d{1,50}$")
_PERCENT_RE = re.compile(r"\s*\\?%\s*$")
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf)\s*\{([^{}]*)\}")
_SPACING_RE = re.compile(r"\\left|\\right|\\[,!;: ]|~|\s")
_EMPTY_BOX_RE = re.compile(r"^(?:\\boxed\s*\{\s*\}|\{\s*\})$")


def missing_ground_truth(value: Any) -> str | None:
    """Why ``value`` cannot be a reference answer (``"None"``, ``"NaN"`` also for the text ``"nan"``, ``"empty"``:
    nothing left after :func:`clean_answer`, or an empty box), or None when it can."""
    if value is None:
        return "None"
    nan = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isnan(value)
    if nan or isinstance(value, str) and value.strip().lower() == "nan":  # also as text (pandas' str(float("nan")))
        return "NaN"
    text = clean_answer(str(value))
    if not text or _EMPTY_BOX_RE.match(text):
        return "empty"
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` in ``text`` (:func:`last_boxed_span`), else None."""
    span = last_boxed_span(text)
    return None if span is None else text[span[0] : span[1]]


def last_boxed_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the content of the last balanced ``\\boxed{...}`` (the one closing last, so for nested boxes
    the outermost; ``\\boxed 2`` yields its token), else None. One linear pass over the braces."""
    stack: list[int | None] = []  # content start for boxed openers, None for plain braces
    best: tuple[int, int] | None = None
    for m in _BOXED_OR_BRACE_RE.finditer(text):
        tok = m.group()
        if m.group(1) is not None:  # unbraced form "\boxed 2" (two MATH-train solutions use it)
            best = m.span(1)
        elif tok == "}":
            if not stack:
                continue
            start = stack.pop()
            if start is not None:
                best = (start, m.start())
        else:
            stack.append(m.end() if tok != "{" else None)
    return best


def clean_answer(ans: str) -> str:
    """Strip whitespace, math delimiters (``$``, ``\\(``, ``\\[``), markdown bold, a trailing full stop."""
    s = ans.strip().rstrip(".").strip().strip("*").strip()  # "**12**." too: the full stop after the bold
    if (s.startswith("\\(") and s.endswith("\\)")) or (s.startswith("\\[") and s.endswith("\\]")):
        s = s[2:-2]
    s = _UNESCAPED_DOLLAR_RE.sub("", s).strip()
    return s.rstrip(".").strip()


def extract_answer(solution_str: str) -> str | None:
    """The answer the response states last: its last ``Answer:`` line or its last balanced ``\\boxed{}``,
    whichever comes later in the text (a box inside the answer line belongs to that line)."""
    line, line_end = _last_answer_line(solution_str)
    span = last_boxed_span(solution_str)
    if span is not None and (line is None or span[0] >= line_end):
        return clean_answer(solution_str[span[0] : span[1]])
    if line is None:  # neither convention: the last "answer:" inside a sentence ("so the answer: 12")
        line, _ = _last_answer_line(solution_str, _ANSWER_ANYWHERE_RE)
    if line is None:
        return None
    boxed = last_boxed(line)
    return clean_answer(boxed if boxed is not None else line)


def _last_answer_line(text: str, pattern: re.Pattern = _ANSWER_LINE_RE) -> tuple[str | None, int]:
    """The rest of the line after the last ``pattern`` match (or the next non-empty line) and where it ends."""
    last = deque(pattern.finditer(text), maxlen=1)  # the final match
    if not last:
        return None, -1
    pos = last[0].end()
    for line in text[pos:].split("\n"):
        pos += len(line) + 1
        if line.strip():
            return line.strip(), pos - 1
    return None, -1


def _fix_braceless(s: str) -> str:
    """``\\frac12``, ``\\dfrac1{2}``, ``\\frac{1}2``, ``\\sqrt2`` -> braced forms (latex2sympy needs braces)."""
    s = _FRAC_TWO_RE.sub(r"\\\1{\2}{\3}", s)
    s = _FRAC_ONE_RE.sub(r"\\\1{\2}{", s)
    s = _FRAC_SECOND_RE.sub(r"\\\1\2{\3}", s)
    return _SQRT_RE.sub(r"\\sqrt{\1}", s)


def _plain(s: str) -> str:
    """``s`` with ``\\text{...}``-style wrappers unwrapped and spacing commands/whitespace removed."""
    return _SPACING_RE.sub("", _TEXT_CMD_RE.sub(r"\1", s)).rstrip(".")


def _serve() -> None:  # pragma: no cover - runs in the child process; exercised through compute_score
    """The grading child: reads ``{"gold", "pred"}`` JSON lines on stdin, answers ``{"ok": bool}`` lines on stdout."""
    import logging
    from contextlib import suppress
    from functools import lru_cache

    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.disable(logging.WARNING)  # math-verify logs every deprecated-option warning
    norm = NormalizationConfig(
        basic_latex=True, units=True, malformed_operators=False, nits=True, boxed="all", equations=True
    )
    config = [LatexExtractionConfig(normalization_config=norm, boxed_match_priority=0), ExprExtractionConfig()]

    @lru_cache(maxsize=4096)
    def parsed(s: str) -> tuple:
        return tuple(parse("\\boxed{" + s + "}", config))

    def equal(gold: str, pred: str) -> bool:
        with suppress(Exception):
            return bool(verify(list(parsed(gold)), list(parsed(pred))))
        return False

    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        print(json.dumps({"ok": equal(req["gold"], req["pred"])}), flush=True)


class _Worker:
    """One child process running :func:`_serve`; used by one caller at a time."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", "from ebpo_verl.reward import _serve; _serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.buf = b""
        self.ready = False

    def _readline(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # child died
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def poll_ready(self) -> bool:
        """Whether the child has finished importing (never blocks)."""
        if not self.ready and select.select([self.proc.stdout.fileno()], [], [], 0)[0]:
            self.ready = self._readline(time.monotonic() + 1.0) == b"ready"
        return self.ready

    def ask(self, gold: str, pred: str, timeout: float) -> bool | None:
        """True/False from math-verify, or None when the child overran ``timeout`` or died."""
        self.ready = self.ready or self._readline(time.monotonic() + STARTUP_TIMEOUT_S) == b"ready"
        if not self.ready:
            return None
        deadline = time.monotonic() + timeout
        try:
            self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        line = self._readline(deadline)
        return None if line is None else bool(json.loads(line)["ok"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class _Pool:
    """Up to ``size`` workers shared by all threads; a worker that overruns is killed and replaced."""

    def __init__(self, size: int) -> None:
        self.lock = threading.Condition()
        self.idle: list[_Worker] = []
        self.count = 0
        self.size = size

    def resize(self, size: int) -> None:
        """At most ``size`` workers from now on (idle ones above it stay until shutdown)."""
        if size != self.size:
            with self.lock:
                self.size = size
                self.lock.notify_all()

    def _checkout(self) -> _Worker:
        with self.lock:
            while not self.idle and self.count >= self.size:
                self.lock.wait()
            if self.idle:  # prefer a child that has finished importing (replacements may still be)
                ready = [i for i, w in enumerate(self.idle) if w.poll_ready()]
                return self.idle.pop(ready[-1] if ready else -1)
            self.count += 1
        return self._start()

    def _start(self) -> _Worker:
        """A new worker for a counted slot; the slot is freed when it cannot start."""
        try:
            return _Worker()
        except Exception:
            with self.lock:
                self.count -= 1
                self.lock.notify()
            raise

    def _release(self, worker: _Worker, healthy: bool) -> None:
        if not healthy:  # replace it now, so the next caller finds a child already importing
            worker.kill()
            worker = self._start()
        with self.lock:
            self.idle.append(worker)
            self.lock.notify()

    def equal(self, gold: str, pred: str, timeout: float) -> bool | None:
        """math-verify's verdict, or None when it overran ``timeout`` (the worker is then replaced)."""
        worker = self._checkout()
        result = None
        try:
            result = worker.ask(gold, pred, timeout)
        finally:
            self._release(worker, healthy=result is not None)
        return result

    def shutdown(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
            self.count -= len(idle)
        for w in idle:
            w.kill()


_POOL = _Pool(MAX_WORKERS)
atexit.register(_POOL.shutdown)
_CACHE_SIZE = 1 << 16
_VERDICTS: OrderedDict[tuple[str, str], bool] = OrderedDict()  # (gold, pred) -> verdict, LRU
_CACHE_LOCK = threading.Lock()


def warm_up(n: int = 1) -> None:
    """Start ``n`` grading workers and wait until they have imported math-verify (the first calls skip that cost)."""
    for w in [_POOL._checkout() for _ in range(n)]:
        _POOL._release(w, healthy=w.ask("1", "1", STARTUP_TIMEOUT_S) is not None)


def is_equivalent(gold: str, pred: str, timeout: float | None = None, max_answer_chars: int = MAX_ANSWER_CHARS) -> bool:
    """Whether answer ``pred`` equals reference ``gold`` (both already extracted), within ``timeout`` s."""
    gold, pred = clean_answer(str(gold)), clean_answer(pred)
    if not gold or not pred or len(pred) > max_answer_chars:
        return False
    if _INT_RE.match(gold) and _INT_RE.match(pred):  # fast path: two integer literals ("025" == "25")
        return int(gold) == int(pred)
    gold, pred = _fix_braceless(gold), _fix_braceless(pred)
    if gold == pred:  # the same text is the same answer (math-verify may fail to parse, or overrun, on it)
        return True
    with _CACHE_LOCK:
        if (gold, pred) in _VERDICTS:
            _VERDICTS.move_to_end((gold, pred))
            return _VERDICTS[(gold, pred)]
    timeout = float(DEFAULTS.timeout) if timeout is None else _valid("timeout", timeout)
    verdict = _grade(gold, pred, time.monotonic() + timeout)
    if verdict is not None:  # an overrun is not cached: the next call may have a less loaded machine
        with _CACHE_LOCK:
            _VERDICTS[(gold, pred)] = verdict
            if len(_VERDICTS) > _CACHE_SIZE:
                _VERDICTS.popitem(last=False)
    return bool(verdict)


def _grade(gold: str, pred: str, deadline: float) -> bool | None:
    """math-verify, then the plain-string and percent fallbacks; None if math-verify overran ``deadline``."""
    verdict = _POOL.equal(gold, pred, deadline - time.monotonic())
    if verdict is not False:  # True, or None = overran the bound: score 0 without retrying
        return verdict
    if _plain(gold) == _plain(pred):
        return True
    g, p = _PERCENT_RE.sub("", gold), _PERCENT_RE.sub("", pred)
    left = deadline - time.monotonic()
    if (g, p) != (gold, pred) and g and p and left > 0:
        return _plain(g) == _plain(p) or _POOL.equal(g, p, left)
    return False


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    timeout: float | None = None,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    workers: int | None = None,
    **kwargs: Any,
) -> dict:
    """verl custom reward: ``{"score": 1.0|0.0, "acc": bool, "pred": str}``; never raises on model output.

    math-verify's work is bounded by ``timeout`` (an overrun scores 0, its process replaced); waiting for one of
    ``workers`` processes and its math-verify import is bounded too. Knobs: :class:`RewardOptions`. A ground truth that
    is None, NaN or empty (:func:`missing_ground_truth`) scores 0."""
    if workers is not None:
        _POOL.resize(RewardOptions(workers=_valid("workers", workers)).pool_size)
    pred = extract_answer(solution_str or "")
    acc = (  # a missing ground truth matches nothing: "None" must not equal str(None)
        pred is not None
        and missing_ground_truth(ground_truth) is None
        and is_equivalent(str(ground_truth), pred, timeout=timeout, max_answer_chars=max_answer_chars)
    )
    return {"score": 1.0 if acc else 0.0, "acc": acc, "pred": (pred or "")[:max_answer_chars]}
