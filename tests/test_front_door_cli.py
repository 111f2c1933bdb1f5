"""The front door, tried as a new user would: each mistake below gets one error line, a non-zero exit status and
nothing written (no work folder, no output file, no data prepared), before any model is loaded or data read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``args`` from ``cwd`` with this interpreter and checkout, ``env`` added."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable, **env}
    return subprocess.run(list(args), cwd=cwd, env=environ, capture_output=True, text=True, timeout=300)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if "error" in line.lower() or "ebpo recipe:" in line]


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*"))


def assert_refused(result: subprocess.CompletedProcess, *words: str) -> None:
    """Non-zero, no traceback, exactly one error line, naming ``words``."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = error_lines(result)
    assert len(errors) == 1, result.stderr
    assert all(w in errors[0] for w in words), errors[0]


def test_a_missing_model_path_is_refused_by_the_dry_run(tmp_path):
    work = tmp_path / "work"
    script = str(ROOT / "recipe" / "ebpo" / "run_qwen3_8b.sh")
    result = run("bash", script, cwd=tmp_path, MODEL_PATH="/nonexistent/qwen", DRY_RUN="1", WORK_DIR=str(work))
    assert_refused(result, "MODEL_PATH=/nonexistent/qwen", "hub id")
    assert not work.exists()


def test_a_missing_model_path_is_refused_by_ebpo_trains_preflight(tmp_path):
    result = run(
        sys.executable, "-m", "ebpo_verl.main", "--cfg", "job", "actor_rollout_ref.model.path=/nonexistent/qwen",
        cwd=tmp_path,
    )  # fmt: skip
    assert_refused(result, "actor_rollout_ref.model.path=/nonexistent/qwen")
    assert files_under(tmp_path) == []


def test_a_hub_id_and_a_folder_pass_the_model_check(tmp_path):
    from ebpo_verl.ops.model_ref import model_reference_problem

    assert model_reference_problem("Qwen/Qwen3-8B") is None and model_reference_problem(str(tmp_path)) is None
    assert model_reference_problem("hdfs://cluster/models/qwen") is None  # remote: not checkable here
    (tmp_path / "weights.bin").write_bytes(b"")
    assert "is a file" in model_reference_problem(str(tmp_path / "weights.bin"))
    assert "no such folder" in model_reference_problem("./qwen-local")


def test_a_missing_user_train_file_is_refused_by_the_dry_run(tmp_path):
    work = tmp_path / "work"
    script = str(ROOT / "recipe" / "ebpo" / "run_qwen3_8b.sh")
    result = run("bash", script, cwd=tmp_path, TRAIN_FILE="/nonexistent/t.parquet", DRY_RUN="1", WORK_DIR=str(work))
    assert_refused(result, "TRAIN_FILE=/nonexistent/t.parquet")
    assert not work.exists()


def test_eval_of_a_missing_target_prepares_nothing(tmp_path):
    work = tmp_path / "work"
    result = run("bash", str(ROOT / "recipe" / "ebpo" / "eval.sh"), "/nonexistent/ckpt", cwd=tmp_path,
                 WORK_DIR=str(work))  # fmt: skip
    assert_refused(result, "/nonexistent/ckpt")
    assert not work.exists()


def test_make_tables_refuses_a_run_that_does_not_exist(tmp_path):
    out = tmp_path / "tables"
    result = run(sys.executable, "-m", "ebpo_verl.recipes.make_tables", "--out", str(out), "/nonexistent/run",
                 cwd=tmp_path)  # fmt: skip
    assert_refused(result, "/nonexistent/run")
    assert not out.exists()


@pytest.mark.parametrize(
    "args, shows",
    [
        (["--help"], "each answers --help"),
        (["run", "--help"], "MODEL one of: llama3_8b qwen3_14b qwen3_1_7b qwen3_4b qwen3_8b"),
        (["table", "-h"], "NAME one of: main group_size"),
        (["run", "qwen3_8b", "--help"], "GROUP_SIZE"),
        (["table", "main", "--help"], "FINAL_EVAL"),
        (["eval", "--help"], "TARGET"),
    ],
)
def test_every_level_of_the_recipes_command_answers_help(args, shows, capsys):
    from ebpo_verl.recipes.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0
    assert shows in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "python -m ebpo_verl.recipes: error: the following arguments are required: COMMAND"),
        (["train"], "python -m ebpo_verl.recipes: error: argument COMMAND: invalid choice: 'train'"),
        (["run", "qwen3_9b"], "python -m ebpo_verl.recipes run: error: argument MODEL: invalid choice: 'qwen3_9b'"),
        (["table"], "python -m ebpo_verl.recipes table: error: the following arguments are required: NAME"),
        (["eval"], "python -m ebpo_verl.recipes eval: error: the following arguments are required: TARGET"),
        (["eval", ""], "python -m ebpo_verl.recipes eval: error: argument TARGET: '' is invalid; use a path"),
        (["table", "main", "--list=yes"], "python -m ebpo_verl.recipes table main: error: argument --list/--no-list"),
    ],
)
def test_a_bad_recipes_command_line_is_one_line(args, says, capsys):
    from ebpo_verl.recipes.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(says) and err.count("\n") == 1, err


def test_recipes_pass_what_they_do_not_declare_through(monkeypatch):
    """Hydra overrides reach the run / table driver, generate's flags the evaluation, in their order; --list is the
    table's own flag wherever it stands."""
    from ebpo_verl.recipes import __main__ as recipes
    from ebpo_verl.recipes import driver

    seen = []
    monkeypatch.setattr(driver, "run", lambda name, args, env: seen.append(("run", name, args)) or 0)
    monkeypatch.setattr(
        driver, "drive", lambda name, args, env, listing: seen.append(("table", name, args, listing)) or 0
    )
    monkeypatch.setattr(driver, "evaluate", lambda target, args, env: seen.append(("eval", target, args)) or 0)
    assert recipes.main(["run", "qwen3_8b", "trainer.save_freq=5", "+x.y=1"]) == 0
    assert recipes.main(["table", "main", "a=1", "--list", "b=2"]) == 0
    assert recipes.main(["table", "ordering", "a=1"]) == 0
    assert recipes.main(["eval", "ckpt/run", "--engine", "hf", "--limit", "2", "--trust-checkpoint"]) == 0
    assert seen == [
        ("run", "qwen3_8b", ["trainer.save_freq=5", "+x.y=1"]),
        ("table", "main", ["a=1", "b=2"], True),
        ("table", "ordering", ["a=1"], False),
        ("eval", "ckpt/run", ["--engine", "hf", "--limit", "2", "--trust-checkpoint"]),
    ]


@pytest.fixture
def immutable_folder(tmp_path) -> Iterator[Path]:
    """A folder nobody may write, root included (``chattr +i``); the attribute is removed afterwards."""
    chattr = shutil.which("chattr")
    folder = tmp_path / "locked"
    folder.mkdir()
    if os.geteuid() != 0 or chattr is None or subprocess.run([chattr, "+i", str(folder)]).returncode != 0:
        pytest.skip("an unwritable folder needs root and chattr +i on this file system")
    try:
        yield folder
    finally:
        subprocess.run([chattr, "-i", str(folder)], check=True)


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "ebpo_verl.study", "--preset", "tiny", "--out", "{out}"],
        (
            "-m ebpo_verl.evaluate generate --model org/model --data-dir {tmp} --protocol paper "
            "--out {out}/generations.jsonl"
        ).split(),
        (
            "-m ebpo_verl.evaluate grade --protocol paper --generations {tmp}/g.jsonl --data-dir {tmp} "
            "--out {out}/results.json"
        ).split(),
    ],
    ids=["study", "evaluate-generate", "evaluate-grade"],
)
def test_an_unwritable_out_is_one_line_before_any_work(command, immutable_folder, tmp_path):
    words = [w.format(out=immutable_folder, tmp=tmp_path) for w in command]
    result = run(sys.executable, *words, cwd=tmp_path)
    assert_refused(result, f"--out {immutable_folder}", "Operation not permitted")
    assert files_under(immutable_folder) == []


def test_the_write_probe_leaves_nothing_and_sees_a_missing_parent(tmp_path):
    from ebpo_verl.ops.atomic import unwritable_reason

    assert unwritable_reason(tmp_path / "a" / "b", folder=True) is None  # judged by tmp_path, created by nobody
    assert unwritable_reason(tmp_path / "out.json") is None
    assert files_under(tmp_path) == []
    (tmp_path / "file").write_text("x")
    assert "is not a folder" in unwritable_reason(tmp_path / "file" / "sub", folder=True)
