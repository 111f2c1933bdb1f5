"""Prepare every dataset: ``python -m ebpo_verl.data.all --out-dir DIR [--local-dir DIR] [--template T]``.

With ``--local-dir`` (e.g. ``../shared/data``) each dataset is read from its file there (the names
``--help`` lists, from ``LOCAL_FILES``);
otherwise from the hub (an unreachable hub is one error line within seconds). Every dataset is attempted;
failures are listed at the end, one ``python -m ebpo_verl.data.all: error: <name>: ...`` line each (exit status 2).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import ClassVar

from ebpo_verl.data import DATASETS
from ebpo_verl.data.schema import TEMPLATES
from ebpo_verl.data.sources import DataPrepError, check_hub
from ebpo_verl.options.cli import parse
from ebpo_verl.options.parsing import PATH, OptionSection, nullable, option

LOCAL_FILES = {
    "dapo_math": "dapo_math_sample.jsonl",
    "math_train": "math_train.jsonl",
    "math500": "math500.jsonl",
    "aime2024": "aime2024.jsonl",
    "aime2025": "aime2025.jsonl",
    "amc23": "amc23.jsonl",
    "olympiadbench": "olympiadbench_math_en.jsonl",
}


def prepare_all(
    out_dir: str | Path,
    local_dir: str | Path | None = None,
    template: str = "dapo",
    skip_invalid: bool = False,
    names: tuple[str, ...] = DATASETS,
) -> dict[str, Path]:
    """Run each dataset's ``prepare``; name -> parquet path, or after trying all a :class:`PrepareAllError`
    (``failed``: name -> one-line message)."""
    if local_dir is not None and not Path(local_dir).is_dir():
        raise DataPrepError(f"--local-dir {local_dir} does not exist or is not a folder")
    if local_dir is None:
        check_hub()
    written, failed = {}, {}
    for name in names:
        module = importlib.import_module(f"ebpo_verl.data.{name}")
        local = None if local_dir is None else Path(local_dir) / LOCAL_FILES[name]
        if local is not None and not local.exists():
            failed[name] = f"--local-dir {local_dir} has no {LOCAL_FILES[name]}"
            continue
        try:
            written[name] = module.prepare(out_dir, local_path=local, template=template, skip_invalid=skip_invalid)
        except Exception as e:  # keep going: report all failures together
            message = " ".join(str(e).split())
            failed[name] = message if isinstance(e, ValueError | OSError) else f"{type(e).__name__}: {message}"
    if failed:
        raise PrepareAllError(failed, len(names))
    return written


class PrepareAllError(RuntimeError):
    """Some datasets failed; ``failed`` maps each to its one-line message."""

    def __init__(self, failed: dict[str, str], attempted: int):
        super().__init__(
            f"{len(failed)} of {attempted} datasets failed: " + "; ".join(f"{n}: {m}" for n, m in failed.items())
        )
        self.failed = failed


@dataclass(frozen=True)
class PrepareAllOptions(OptionSection):
    """The options of ``python -m ebpo_verl.data.all``, declared once."""

    SECTION: ClassVar[str] = "all"

    out_dir: str = option(MISSING, "folder for the parquet files", rule=PATH)
    local_dir: str | None = nullable(
        "folder holding the datasets' files: "
        + ", ".join(f"{f} ({n})" for n, f in LOCAL_FILES.items())
        + "; null: the hub",
        PATH,
    )
    template: str = option("dapo", "prompt template", choices=TEMPLATES)
    skip_invalid: bool = option(False, "drop invalid rows instead of failing", choices=(True, False))
    only: tuple[str, ...] = option(DATASETS, "subset to prepare", choices=DATASETS, metavar="NAME")


def main(argv: list[str] | None = None, prog: str = "python -m ebpo_verl.data.all") -> dict[str, Path]:
    args = parse(PrepareAllOptions, prog, argv, __doc__ or "")
    try:
        return prepare_all(args.out_dir, args.local_dir, args.template, args.skip_invalid, tuple(args.only))
    except PrepareAllError as e:
        for name, message in e.failed.items():
            print(f"{prog}: error: {name}: {message}", file=sys.stderr)
    except DataPrepError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    main()
