"""AIME 2025 (I and II, 30 problems), an evaluation set; same answer rules as :mod:`data_prep.aime2024`.

Accepts ``yentinglin/aime_2025`` (``id, problem, answer``), ``opencompass/AIME2025`` (``question, answer``)
and ``MathArena/aime_2025`` (``problem_idx, problem, answer``) shaped files.
"""

from __future__ import annotations

from pathlib import Path

from data_prep.aime2024 import aime_example
from data_prep.schema import cli, finish, load_source

NAME = "aime2025"
HUB_ID, HUB_CONFIG, HUB_SPLIT = "yentinglin/aime_2025", None, "train"


def prepare(
    out_dir: str | Path,
    local_path: str | Path | None = None,
    template: str = "dapo",
    skip_invalid: bool = False,
    revision: str | None = None,
) -> Path:
    """Write ``out_dir/aime2025.parquet`` from AIME 2025 (hub or ``local_path``)."""
    df = load_source(local_path, HUB_ID, HUB_SPLIT, HUB_CONFIG, revision)
    return finish(NAME, out_dir, df, aime_example, "test", template, skip_invalid, str(local_path or HUB_ID))


def main(argv: list[str] | None = None) -> Path:
    return cli(NAME, prepare, argv)


if __name__ == "__main__":
    main()
