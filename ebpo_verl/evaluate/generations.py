"""The generations file: one JSON line per sample, appended as samples finish, resumable after a crash.

Line: ``{"benchmark", "index", "sample", "response", "response_tokens", "finish_reason"}``. A sidecar
``<file>.meta.json`` (written atomically before the first line) records what produced the lines. A re-run must
match its protocol, model and sampling, and for every benchmark both name the rows, runs and problems
(:func:`problem_digest`); new benchmarks are added (aime2024, then aime2024 + math500, resumes aime2024 and adds
math500); any other mismatch is refused. A torn last line (a crash mid-write) is dropped and its sample generated
again; an unreadable line anywhere else is an error naming the line.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from ebpo_verl.evaluate import engines
from ebpo_verl.evaluate.prompts import EvalInputError, Problem
from ebpo_verl.ops.atomic import atomic_write_text, reporting_full_disk
from ebpo_verl.ops.locking import LockHeldError, exclusive_lock

Key = tuple[str, int, int]
"""(benchmark, index, sample)."""
FIELDS = {"benchmark": str, "index": int, "sample": int, "response": str, "response_tokens": int, "finish_reason": str}


def meta_path(path: str | Path) -> Path:
    return Path(f"{path}.meta.json")


def _parse(line: str, path: Path, lineno: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:
        why = getattr(e, "msg", "nested too deeply")
        raise EvalInputError(f"{path}: line {lineno} is not valid JSON ({why}); delete that line and re-run") from None
    bad = [k for k, t in FIELDS.items() if not isinstance(record, dict) or not _is(record.get(k), t)]
    if bad:
        raise EvalInputError(f"{path}: line {lineno} lacks or mistypes {bad}; delete that line and re-run")
    return record


def _is(value: Any, kind: type) -> bool:
    """``value`` is a ``kind``; an int is one >= 0 and not a bool (indices, sample numbers, token counts)."""
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, kind)


def read_generations(path: str | Path) -> tuple[dict[Key, dict[str, Any]], int]:
    """(records by key, byte length of the intact part). A torn final line is left out of both."""
    path = Path(path)
    if not path.is_file():
        return {}, 0
    records: dict[Key, dict[str, Any]] = {}
    intact = 0
    lines = path.read_bytes().split(b"\n")
    for lineno, raw in enumerate(lines, 1):
        last = lineno == len(lines)
        if last and not raw:
            break
        try:
            record = _parse(raw.decode("utf-8"), path, lineno)
        except (UnicodeDecodeError, EvalInputError) as e:
            if last:  # no newline after it: a write cut short by a crash
                break
            if isinstance(e, UnicodeDecodeError):
                raise EvalInputError(f"{path}: line {lineno} is not UTF-8; delete that line and re-run") from None
            raise
        key = (record["benchmark"], record["index"], record["sample"])
        if key in records:
            raise EvalInputError(f"{path}: line {lineno} repeats sample {key}; delete one of the two lines")
        records[key] = record
        intact += len(raw) + (0 if last else 1)
    return records, intact


def read_meta(path: str | Path) -> dict[str, Any] | None:
    """The settings stored beside ``path``, or None when there are none yet."""
    mp = meta_path(path)
    if not mp.is_file():
        return None
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        why = getattr(e, "msg", None) or ("nested too deeply" if isinstance(e, RecursionError) else "not UTF-8")
        raise EvalInputError(f"{mp} is not valid JSON ({why}); delete it with its generations file") from None
    if why := _meta_problem(meta):
        raise EvalInputError(
            f"{mp} is not the settings of a generations file ({why}); delete it with its generations file"
        )
    return meta


def _meta_problem(meta: Any) -> str | None:
    """What is wrong with a parsed ``.meta.json`` (None when nothing): the keys grading and a resume read."""
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    if not isinstance(meta.get("protocol"), str) or not isinstance(meta.get("model"), str):
        return "protocol and model must be strings"
    if not isinstance(meta.get("benchmarks"), dict) or not isinstance(meta.get("provenance", []), list):
        return "benchmarks must be an object and provenance a list"
    for name, spec in meta["benchmarks"].items():
        if not isinstance(spec, dict) or not _is(spec.get("runs"), int) or not spec["runs"]:
            return f"benchmarks.{name:.40}.runs must be an integer >= 1"
        if spec.get("limit") is not None and (not _is(spec["limit"], int) or not spec["limit"]):
            return f"benchmarks.{name:.40}.limit must be null or an integer >= 1"
        digests = spec.get("digests", {})
        if not isinstance(digests, dict) or not all(
            k.isascii() and k.isdigit() and isinstance(v, str) for k, v in digests.items()
        ):
            return f"benchmarks.{name:.40}.digests must map problem indices to digests"
    return None


def problem_digest(prompt: Any, ground_truth: Any) -> str:
    """16 hex digits of the SHA-256 of a problem's prompt and ground truth (the meta's ``benchmarks.<name>.digests``),
    so samples are never graded against or resumed with other problems."""
    blob = json.dumps([prompt, ground_truth], ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def benchmark_meta(problems: Sequence[Problem], runs: int, limit: int | None) -> dict[str, Any]:
    """A benchmark's entry in a meta's ``benchmarks`` (:func:`settings`): its runs, limit, problems and digests."""
    digests = {str(p.index): problem_digest(p.prompt, p.ground_truth) for p in problems}
    return {"runs": runs, "limit": limit, "problems": len(problems), "digests": digests}


def settings(
    protocol: str, model: str, temperature: float, top_p: float, engine: engines.EngineOptions, benchmarks: dict
) -> dict[str, Any]:
    """A generations file's meta: the protocol, model, sampling, the ``engine`` options' length and seed, and
    ``benchmarks`` ({name: {"runs", "limit", "problems", "digests"}})."""
    return {
        "protocol": protocol,
        "model": model,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": engine.max_new_tokens,
        "seed": engine.seed,  # every sample's seed derives from it (engines.sample_seed): a resume must keep it
        "benchmarks": benchmarks,
    }


def problems_differ(
    path: str | Path, bench: str, stored: dict[str, Any], current: dict[str, str], data: str = "the data"
) -> str | None:
    """A one-line refusal when benchmark ``bench`` of ``path`` (meta ``stored``) was generated from other problems than
    the digests ``current``, else None; a meta without digests cannot be checked."""
    if "digests" not in stored:
        return (
            f"{path} records no problem digests for {bench} (written by an older version), so its samples cannot "
            "be checked against the data; generate again into another --out"
        )
    old = stored["digests"]
    diff = [int(i) for i in set(old) | set(current) if old.get(i) != current.get(i)]  # an absent digest differs
    if not diff:
        return None
    i = min(diff)
    return (
        f"{path} was generated from other {bench} problems than {data} holds now: problem index {i} differs "
        "(prompt or ground truth; re-prepared data or other rows?); use the data it was generated from, or "
        "another --out"
    )


def merge_meta(old: dict[str, Any], new: dict[str, Any], path: Path) -> dict[str, Any]:
    """The stored settings extended by ``new``'s benchmarks; EvalInputError naming what differs."""
    diff = sorted(k for k in (set(old) | set(new)) - {"benchmarks", "provenance"} if old.get(k) != new.get(k))
    ob, nb = old.get("benchmarks", {}), new.get("benchmarks", {})
    for b in nb:
        if b in ob and "digests" in nb[b] and (why := problems_differ(path, b, ob[b], nb[b]["digests"])):
            raise EvalInputError(why)
    diff += [f"benchmarks.{b}" for b in nb if b in ob and ob[b] != nb[b]]
    if diff:
        raise EvalInputError(
            f"{path} was generated with other settings ({', '.join(diff)} differ); "
            "use another --out or delete the file and its .meta.json to start over"
        )
    # provenance: one record per generate invocation that wrote into the file, oldest first
    records = old.get("provenance", []) + new.get("provenance", [])
    return {**old, "benchmarks": {**ob, **nb}, **({"provenance": records} if records else {})}


class GenerationsFile(ExitStack):
    """Append-only writer that resumes ``path`` (``done``: the samples already there); holds ``<path>.lock`` until
    :meth:`close`, so a second writer gets an EvalInputError naming the holder."""

    def __init__(self, path: str | Path, meta: dict[str, Any]):
        super().__init__()
        self.path = Path(path)
        try:
            self.enter_context(exclusive_lock(f"{self.path}.lock", what=f"generations file {self.path}"))
        except LockHeldError as e:
            raise EvalInputError(str(e)) from None
        try:
            self._open(meta)
        except BaseException:
            self.close()
            raise

    def _open(self, meta: dict[str, Any]) -> None:
        old = read_meta(self.path)
        merged = meta if old is None else merge_meta(old, meta, self.path)
        self.done, intact = read_generations(self.path)
        if old is None and self.done:
            raise EvalInputError(
                f"{self.path} has samples but no {meta_path(self.path).name} saying how they were made; "
                "use another --out or delete the file to start over"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if merged != old:
            atomic_write_text(meta_path(self.path), json.dumps(merged, indent=1, sort_keys=True) + "\n")
        self._fh: IO[str] = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.callback(self._close_file)
        if self._fh.tell() != intact:  # drop a torn last line
            self._fh.truncate(intact)
        if intact and os.pread(self._fh.fileno(), 1, intact - 1) != b"\n":  # a complete last line without its newline
            self._fh.write("\n")

    def append(self, records: list[dict[str, Any]]) -> None:
        """Write ``records`` (one line each) and flush to disk; a full disk is a DiskFullError naming the file."""
        with reporting_full_disk(self.path):
            self._fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            self._fh.flush()
            os.fsync(self._fh.fileno())
        for r in records:
            self.done[(r["benchmark"], r["index"], r["sample"])] = r

    def _close_file(self) -> None:
        with reporting_full_disk(self.path):  # flushes what a failed append left in the buffer
            self._fh.close()


def generate_into(
    path: str | Path,
    meta: dict[str, Any],
    wanted: list[engines.Request],
    spec: engines.EngineSpec,
    workers: int,
    before: Callable[[], object] = lambda: None,
) -> tuple[dict[Key, dict[str, Any]], int]:
    """Generate the samples of ``wanted`` that ``path`` lacks (``before`` runs first if any), appending each chunk;
    (every sample of the file by key, number generated now)."""
    with GenerationsFile(path, meta) as gen:
        todo = [r for r in wanted if r.key not in gen.done]
        if todo:
            before()
            total, left = Counter(r.key[0] for r in wanted), Counter(r.key[0] for r in todo)
            bars = {
                b: tqdm(total=n, initial=n - left[b], desc=b, unit="sample", position=i)
                for i, (b, n) in enumerate(total.items())
            }

            def on_chunk(pairs: list[tuple[engines.Request, engines.Completion]]) -> None:
                gen.append(  # one line (FIELDS) per (Request, Completion) pair
                    [dict(zip(FIELDS, (*r.key, c.text, c.tokens, c.finish_reason), strict=True)) for r, c in pairs]
                )
                for r, _ in pairs:
                    bars[r.key[0]].update(1)

            try:
                engines.generate_all(spec, todo, workers, on_chunk)
            finally:
                for bar in bars.values():
                    bar.close()
    return gen.done, len(todo)
