"""What every preparer shares: prompt templates, the verl row schema, row validation, the printed summary, atomic
parquet writes, the common command line and the checks of a prepared file (the sources: :mod:`.sources`).

Output row (verl's ``RLHFDataset`` schema, identical columns and ``extra_info`` keys for every dataset so
that train/val file lists concatenate)::

    data_source   str   the dataset name, e.g. "aime2024" (validation metrics read val-core/aime2024/...)
    prompt        list  [{"role": "user", "content": <template applied to the problem>}]
    ability       str   "math"
    reward_model  dict  {"style": "rule", "ground_truth": <answer as a string>}
    extra_info    dict  {"index": int, "split": str, "source_id": str,
                         "topic": str | None, "difficulty": int | None,
                         "raw_problem": str | None, "raw_answer": str | None}

``raw_problem`` / ``raw_answer`` (evaluation sets only, else None): the source's untemplated problem and reference
answer, from which the paper's evaluation protocol (``ebpo_verl.evaluate``) builds its prompt and ground truth.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from ebpo_verl.data.sources import DataPrepError, load_hub, read_local
from ebpo_verl.ops.atomic import atomic_write
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import PATH, OptionSection, ints, is_finite_number, nullable, option, text
from ebpo_verl.reward import missing_ground_truth

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
BOXED_SUFFIX = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."
TEMPLATES = ("dapo", "boxed")

EXTRA_INFO_TYPE = pa.struct(
    [
        ("index", pa.int64()),
        ("split", pa.string()),
        ("source_id", pa.string()),
        ("topic", pa.string()),
        ("difficulty", pa.int64()),
        ("raw_problem", pa.string()),
        ("raw_answer", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        ("extra_info", EXTRA_INFO_TYPE),
    ]
)


class InvalidRowError(ValueError):
    """A source row that cannot become an example; ``columns``: those the missing field is read from."""

    def __init__(self, field: str, reason: str, columns: tuple[str, ...] = ()):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason, self.columns = field, reason, columns


@dataclass
class Example:
    """One problem as a preparer extracts it from a source row, before templating."""

    problem: str
    answer: str
    source_id: str
    topic: str | None = None
    difficulty: int | None = None
    raw_problem: str | None = None  # evaluation sets: the source's problem text, unmodified
    raw_answer: str | None = None  # evaluation sets: the source's reference answer as a string


def apply_template(problem: str, template: str) -> list[dict[str, str]]:
    """The single user message for ``problem`` under ``template`` ("dapo" or "boxed")."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {TEMPLATES}")
    prefix, suffix = {"dapo": (DAPO_PREFIX, DAPO_SUFFIX), "boxed": ("", BOXED_SUFFIX)}[template]
    return [{"content": prefix + problem + suffix, "role": "user"}]


def strip_dapo_wrapper(content: str) -> str:
    """The bare problem inside a DAPO-Math-17k prompt (text without the wrapper is returned unchanged)."""
    return content.strip().removeprefix(DAPO_PREFIX.strip()).removesuffix(DAPO_SUFFIX.strip()).strip()


def pick(row: dict[str, Any], names: Iterable[str]) -> Any:
    """The value of the first column of ``names`` present (and not null) in ``row``, else None."""
    for name in names:
        value = row.get(name)
        if value is not None and not (pd.api.types.is_scalar(value) and pd.isna(value)):
            return value
    return None


MAX_PROBLEM_CHARS = 32_768
"""Default of ``--max-problem-chars``: the longest problem text a preparer accepts (the paper's sets' longest, an
OlympiadBench problem with its context, has 4,415 characters); a longer one is an invalid row."""


def verbatim(row: dict[str, Any], problem: tuple[str, ...], answer: tuple[str, ...]) -> dict[str, str]:
    """An evaluation set's ``raw_problem`` and ``raw_answer``: first present columns, as str."""
    return {"raw_problem": str(pick(row, problem)), "raw_answer": str(pick(row, answer))}


def require_text(row: dict[str, Any], names: tuple[str, ...], field: str | None = None, numbers: bool = False) -> str:
    """A non-empty string from the first present column of ``names`` (with ``numbers`` also a finite number, as its
    ``str``; lists, dicts never); InvalidRowError otherwise."""
    value = pick(row, names)
    field = field or "/".join(names)
    if value is None:
        raise InvalidRowError(field, f"missing (looked for columns {list(names)})", columns=names)
    return as_text(value, field, numbers)


def optional_text(row: dict[str, Any], names: tuple[str, ...], field: str, numbers: bool = False) -> str | None:
    """Like :func:`require_text` for an optional column: None when absent or blank, else checked text."""
    value = pick(row, names)
    if value is None or isinstance(value, str) and not value.strip():
        return None
    return as_text(value, field, numbers)


def source_id(row: dict[str, Any], names: tuple[str, ...], i: int) -> str:
    """The row's id from the first present column of ``names`` (a string or an integer), else its number ``i``."""
    return optional_text(row, names, "id", numbers=True) or str(i)


def as_text(value: Any, field: str, numbers: bool = False) -> str:
    """``value`` stripped if non-empty text (``numbers``: or finite number), else InvalidRowError naming ``field``."""
    if numbers and is_finite_number(value):
        return str(value)
    if not isinstance(value, str):
        kinds = "a string or a number" if numbers else "a string"
        raise InvalidRowError(field, f"expected {kinds}, got {type(value).__name__} {_preview(value)}")
    text = value.strip()
    if not text:
        raise InvalidRowError(field, "empty")
    return text


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def build_rows(
    name: str,
    df: pd.DataFrame,
    convert: Callable[[dict[str, Any], int], Example],
    split: str,
    template: str,
    skip_invalid: bool,
    source: str,
    dedupe: bool = False,
    max_problem_chars: int = MAX_PROBLEM_CHARS,
) -> tuple[list[dict[str, Any]], int, int]:
    """Convert every source row: (verl rows, number skipped as invalid, number of duplicates). An invalid row raises
    ``DataPrepError`` naming file, 0-based row, field and fix unless ``skip_invalid`` drops it; a field whose
    columns the file lacks raises even then. ``dedupe`` keeps each problem text's first row; a problem over
    ``max_problem_chars`` is invalid."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {TEMPLATES}")
    rows, skipped, duplicates, seen = [], 0, 0, set()
    records = df.to_dict(orient="records")
    for i, record in enumerate(tqdm(records, desc=f"{name}", unit="row", disable=len(records) < 2000)):
        try:
            ex = convert(record, i)
            if len(ex.problem) > max_problem_chars:
                raise InvalidRowError(
                    "problem", f"{len(ex.problem)} characters, more than --max-problem-chars={max_problem_chars}"
                )
        except InvalidRowError as e:
            if e.columns and not set(e.columns) & set(df.columns):
                raise DataPrepError(
                    f"{name}: the columns of {source} do not match the expected schema: {e.field} is read from "
                    f"column {' or '.join(map(repr, e.columns))}, found columns {list(map(str, df.columns))}"
                ) from None
            if skip_invalid:
                skipped += 1
                continue
            raise DataPrepError(
                f"{name}: invalid row {i} (0-based) of {source}: field {e.field}: {e.reason}. "
                "Fix the source row or pass --skip-invalid to drop such rows."
            ) from None
        if dedupe:
            key = " ".join(ex.problem.split())
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
        info = {f.name: getattr(ex, f.name, None) for f in EXTRA_INFO_TYPE} | {"index": len(rows), "split": split}
        rows.append(
            {
                "data_source": name,
                "prompt": apply_template(ex.problem, template),
                "ability": "math",
                "reward_model": {"ground_truth": ex.answer, "style": "rule"},
                "extra_info": info,
            }
        )
    if skip_invalid and skipped:
        print(f"{name}: --skip-invalid dropped {skipped} invalid row(s)")
    return rows, skipped, duplicates


def write_parquet_atomic(table: pa.Table, path: str | Path) -> Path:
    """Write ``table`` to ``path`` atomically (:func:`ebpo_verl.ops.atomic.atomic_write`): a failure leaves no file."""
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def summarize(name: str, rows_in: int, rows: list[dict[str, Any]], skipped: int, duplicates: int, out: Path) -> str:
    """A printable summary: rows in/out and per-topic / per-level counts."""
    lines = [
        f"{name}: {rows_in} rows in, {len(rows)} rows out, {skipped} invalid skipped, "
        f"{duplicates} duplicate problems removed -> {out}"
    ]
    for what, key in (("topic", "topic"), ("level", "difficulty")):
        counts = Counter(r["extra_info"][key] for r in rows)
        if any(v is not None for v in counts):
            lines.append(f"  per {what}: " + ", ".join(f"{v}={n}" for v, n in sorted(counts.items(), key=str)))
    return "\n".join(lines)


@dataclass(frozen=True)
class PrepareOptions(OptionSection):
    """The options of ``python -m ebpo_verl.data.<name>`` (one data set), declared once."""

    SECTION: ClassVar[str] = "prepare"

    out_dir: str = option(MISSING, "folder for <name>.parquet", rule=PATH)
    local_path: str | None = nullable(
        "local copy in the hub schema: a jsonl/json/parquet file or a dataset folder; null: the hub", PATH
    )
    template: str = option("dapo", "prompt template", choices=TEMPLATES)
    skip_invalid: bool = option(False, "drop invalid rows instead of stopping", choices=(True, False))
    revision: str | None = nullable("hub revision (commit/tag) to pin; null: main", text("a revision"))
    max_problem_chars: int = option(MAX_PROBLEM_CHARS, "longer problems are invalid rows", rule=ints(1))


@dataclass(frozen=True)
class Dataset:
    """One dataset of the paper: its pinned hub copy and how a source row becomes an :class:`Example`."""

    name: str
    hub_id: str
    hub_split: str
    convert: Callable[[dict[str, Any], int], Example]
    split: str = "test"  # the extra_info.split written for every row
    hub_config: str | None = None
    dedupe: bool = False  # drop rows whose prompt repeats an earlier one (DAPO-Math-17k)

    def prepare(
        self,
        out_dir: str | Path,
        local_path: str | Path | None = None,
        template: str = "dapo",
        skip_invalid: bool = False,
        revision: str | None = None,
        max_problem_chars: int = MAX_PROBLEM_CHARS,
    ) -> Path:
        """Write ``out_dir/<name>.parquet`` from the hub (pinned id, optional ``revision``) or ``local_path``."""
        if local_path is not None:
            df = read_local(local_path, self.hub_split)
        else:
            df = load_hub(self.hub_id, self.hub_split, self.hub_config, revision)
        source = str(local_path or self.hub_id)
        rows, skipped, duplicates = build_rows(
            self.name, df, self.convert, self.split, template, skip_invalid, source, self.dedupe, max_problem_chars
        )
        if not rows:
            raise DataPrepError(f"{self.name}: no valid rows in {source}")
        out = write_parquet_atomic(pa.Table.from_pylist(rows, schema=SCHEMA), Path(out_dir) / f"{self.name}.parquet")
        print(summarize(self.name, len(df), rows, skipped, duplicates, out))
        return out

    def main(self, argv: list[str] | None = None, prog: str | None = None) -> Path:
        """The command line ``prog`` (default ``python -m ebpo_verl.data.<name>``; ``data_prep/<name>.py`` passes its
        own): :class:`PrepareOptions` parsed, then :meth:`prepare`; bad input is one error line, exit status 2."""
        prog = prog or f"python -m ebpo_verl.data.{self.name}"
        args = parse(PrepareOptions, prog, argv, self.prepare.__doc__ or "")
        with one_line_errors(prog):
            return self.prepare(**asdict(args))


@contextlib.contextmanager
def one_line_errors(prog: str) -> Iterator[None]:
    """Report bad input (``ValueError``: ours, pyarrow's, ...; ``OSError``: files, network) as one line
    ``PROG: error: ...`` on stderr with exit status 2, as argparse does for bad arguments."""
    try:
        yield
    except (ValueError, OSError) as e:
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def bare_problem(content: str) -> str:
    """The problem inside a prompt written with either template (or none)."""
    return strip_dapo_wrapper(content).removesuffix(BOXED_SUFFIX.strip()).strip()


def read_prepared(path: str | Path) -> pa.Table:
    """A preparer's parquet, checked for the verl columns, >= 1 row and usable ground truths."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; prepare it first (python -m ebpo_verl.data.<name>)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataPrepError(f"{path} is not a readable parquet file (truncated or corrupt?): {e}") from None
    missing = [c for c in SCHEMA.names if c not in table.column_names]
    if missing:
        raise DataPrepError(f"{path}: missing columns {missing}; expected a file written by ebpo_verl.data")
    if table.num_rows == 0:
        raise DataPrepError(f"{path} has no rows; prepare it again with ebpo_verl.data, or pass a file that has rows")
    check_ground_truths(table, path)
    return table


CHAT_FORMAT = 'a list of {"role": ..., "content": ...} messages, e.g. [{"role": "user", "content": "..."}]'
"""verl's chat format of a prompt, in messages (``python -m ebpo_verl.data`` writes it)."""


def chat_prompt_problem(prompt: Any) -> str | None:
    """Why ``prompt`` is not in verl's chat format (:data:`CHAT_FORMAT`), or None when it is."""
    if not isinstance(prompt, list | tuple | np.ndarray):
        return f"a {type(prompt).__name__} ({_preview(prompt)}), not a list of chat messages"
    if len(prompt) == 0:
        return "an empty list of messages"
    for j, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            return f"message {j} is a {type(message).__name__}, not a {{role, content}} object"
        if not isinstance(message.get("role"), str) or not message["role"]:
            return f"message {j} has no role (a string such as 'user')"
        if not isinstance(message.get("content"), str):
            return f"message {j}'s content is a {type(message.get('content')).__name__}, not a string"
    return None


def check_chat_prompts(prompts: list[Any], source: str | Path, column: str = "prompt") -> None:
    """DataPrepError naming ``source``, the first bad row and the fix unless all ``prompts`` are chat prompts."""
    bad = [(row, why) for row, prompt in enumerate(prompts) if (why := chat_prompt_problem(prompt))]
    if bad:
        row, why = bad[0]
        raise DataPrepError(
            f"{source}: row {row} (0-based; {len(bad)} of {len(prompts)} rows alike): {column} is {why}; verl needs "
            f"{CHAT_FORMAT}: prepare the file with ebpo_verl.data or rewrite those prompts"
        )


def ground_truth_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a row's ground truth (:func:`~ebpo_verl.reward.missing_ground_truth`'s reasons, or
    not text: a list or a dict would reach the grader as its ``str``), or None when it can."""
    nan = isinstance(value, float | np.floating) and math.isnan(value)
    if value is not None and not isinstance(value, str) and not is_finite_number(value) and not nan:
        return f"not text: {type(value).__name__}"
    return missing_ground_truth(value)


def check_ground_truths(table: pa.Table | pd.DataFrame, source: str | Path) -> None:
    """:class:`DataPrepError` naming ``source``, the first bad rows (0-based) and the key when a row's
    ``reward_model.ground_truth`` is None, NaN, empty or not text (:func:`ground_truth_problem`)."""
    frame = isinstance(table, pd.DataFrame)
    if "reward_model" not in (list(table.columns) if frame else table.column_names):
        raise DataPrepError(f"{source}: no reward_model column (expected verl's schema, see ebpo_verl.data.schema)")
    values = table["reward_model"].tolist() if frame else table["reward_model"].to_pylist()
    bad = []
    for i, rm in enumerate(values):
        has = isinstance(rm, dict) and "ground_truth" in rm
        why = ground_truth_problem(rm["ground_truth"]) if has else "no ground_truth key"
        if why is not None:
            bad.append(f"{i} ({why})")
    if bad:
        raise DataPrepError(
            f"{source}: reward_model.ground_truth is None, NaN, empty or not text in {len(bad)} row(s), 0-based: "
            f"{', '.join(bad[:10])}{' ...' if len(bad) > 10 else ''}; give those rows an answer or drop them"
        )


def with_extra_info(table: pa.Table, updates: list[dict[str, Any]], new_fields: dict[str, pa.DataType]) -> pa.Table:
    """``table`` with ``extra_info`` of row i updated by ``updates[i]``; ``new_fields`` are added to the struct."""
    if len(updates) != table.num_rows:
        raise ValueError(f"{len(updates)} updates for {table.num_rows} rows")
    info_type = table.schema.field("extra_info").type
    fields = [*info_type, *(pa.field(n, t) for n, t in new_fields.items() if info_type.get_field_index(n) < 0)]
    schema = table.schema.set(table.schema.get_field_index("extra_info"), pa.field("extra_info", pa.struct(fields)))
    rows = table.to_pylist()
    for row, upd in zip(rows, updates, strict=True):
        row["extra_info"] = {**row["extra_info"], **upd}
    return pa.Table.from_pylist(rows, schema=schema)
