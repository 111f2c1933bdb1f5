"""One declaration per knob a user sets, one absent-key rule: the watchdog's timeouts and the reward's environment
knobs (issue 37). A config without ``trainer.step_timeout_s`` runs the watchdog at the declared 3600 s; a negative
timeout, zero reward workers, a negative or non-numeric reward timeout are refused in one line (exit 2) before any
work; the driver hands the reward's resolved knobs to verl's reward workers through ``reward_kwargs``; a bad value
that reaches a reward worker anyway neither hangs it nor scores a right answer 0."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from omegaconf import OmegaConf

from ebpo_verl import reward as R
from ebpo_verl.evaluate import __main__ as evaluate_cli
from ebpo_verl.options import cli, parsing
from ebpo_verl.options.parsing import OptionSection, ints, option, reals, text
from ebpo_verl.recipes import spec
from ebpo_verl.trainer import watchdog
from ebpo_verl.trainer.preflight import Cleared
from ebpo_verl.trainer.preflight.config import resolve_reward_options
from ebpo_verl.trainer.run_options import INIT_TIMEOUT_ENV, STEP_TIMEOUT_ENV, RunOptions, TrainerOptions
from tests.in_process import ebpo_train

CONFIG = Path(watchdog.__file__).parent / "config" / "ebpo_trainer.yaml"
KNOB_ENV = (STEP_TIMEOUT_ENV, INIT_TIMEOUT_ENV, R.WORKERS_ENV, R.TIMEOUT_ENV)


@pytest.fixture(autouse=True)
def _no_knob_env(monkeypatch):
    for variable in KNOB_ENV:
        monkeypatch.delenv(variable, raising=False)


def _ebpo_train(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of :func:`tests.in_process.ebpo_train`."""
    code, _, err = ebpo_train(monkeypatch, capsys, *args)
    return code, err


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ebpo-train: error:")]


# --- the watchdog's timeouts --------------------------------------------------------------------------------------


def test_a_config_without_the_timeouts_runs_the_watchdog_at_the_declared_defaults(monkeypatch, capsys, tmp_path):
    """``ebpo-train --config-dir D --config-name C`` with a config lacking both keys: the driver writes the declared
    3600 s into the config and the trainer's watchdog (the TaskRunner's read of that config) runs at 3600 s."""
    import verl.trainer.main_ppo

    from ebpo_verl import main as entry

    config = yaml.safe_load(CONFIG.read_text())
    del config["trainer"]["step_timeout_s"], config["trainer"]["init_timeout_s"]
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text(yaml.safe_dump(config))
    seen = {}

    def run_ppo(config, task_runner_class=None):
        trainer = watchdog.StepWatchdogMixin()
        trainer.options = RunOptions.from_config(config)  # the TaskRunner's one parse, handed to the trainer
        seen["timeouts"] = trainer._started_watchdog().timeouts
        trainer._watchdog.stop()
        seen["options"] = trainer.options.trainer

    def preflight(config, dry_run):  # the pre-flight's one parse; the data checks are not this test's
        return Cleared(RunOptions.from_config(config), [])

    monkeypatch.setattr(entry, "preflight", preflight)
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", run_ppo)
    code, err = _ebpo_train(
        monkeypatch, capsys, "--config-dir", str(tmp_path / "conf"), "--config-name", "mine",
        f"hydra.run.dir={tmp_path / 'hydra'}", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    )  # fmt: skip
    assert code == 0, err
    assert seen["timeouts"] == {"init": 3600.0, "step": 3600.0}
    assert seen["options"].step_timeout_s == 3600.0 and seen["options"].init_timeout_s == 3600.0


def _timeouts(trainer: dict) -> dict:
    return watchdog.timeouts(TrainerOptions.from_trainer(OmegaConf.create(trainer)))


def test_timeouts_follow_the_one_absent_key_rule(monkeypatch):
    assert _timeouts({}) == {"init": 3600.0, "step": 3600.0}
    assert _timeouts({"step_timeout_s": 60}) == {"init": 3600.0, "step": 60.0}
    assert _timeouts({"step_timeout_s": 0, "init_timeout_s": None}) == {"init": None, "step": None}
    monkeypatch.setenv(STEP_TIMEOUT_ENV, "120")
    monkeypatch.setenv(INIT_TIMEOUT_ENV, "0")
    assert _timeouts({"step_timeout_s": 3600}) == {"init": None, "step": 120.0}


@pytest.mark.parametrize("key", ["step_timeout_s", "init_timeout_s"])
def test_a_negative_timeout_is_refused_at_the_preflight(monkeypatch, capsys, key):
    code, err = _ebpo_train(monkeypatch, capsys, "--cfg", "job", f"trainer.{key}=-5")
    assert code == 2 and _errors(err) == [
        f"ebpo-train: error: trainer.{key}=-5 is invalid; use null or a number of seconds >= 0 (0: off)"
    ]
    for off in ("0", "null"):
        code, err = _ebpo_train(monkeypatch, capsys, "--cfg", "job", f"trainer.{key}={off}")
        assert code == 0, err


@pytest.mark.parametrize("variable", [STEP_TIMEOUT_ENV, INIT_TIMEOUT_ENV])
@pytest.mark.parametrize("raw", ["-5", "two minutes"])
def test_a_bad_timeout_variable_is_refused_at_the_preflight(monkeypatch, capsys, variable, raw):
    monkeypatch.setenv(variable, raw)
    code, err = _ebpo_train(monkeypatch, capsys, "--cfg", "job")
    assert code == 2 and _errors(err) == [
        f"ebpo-train: error: {variable}={raw!r} is invalid; use null or a number of seconds >= 0 (0: off)"
    ]


def test_the_timeout_variables_are_parsed_by_the_declaration():
    assert TrainerOptions.from_trainer({}, env={STEP_TIMEOUT_ENV: " 90 "}).step_timeout_s == 90
    assert TrainerOptions.from_trainer({}, env={STEP_TIMEOUT_ENV: "null"}).watchdog_timeout_s is None
    assert TrainerOptions.from_trainer({}, env={STEP_TIMEOUT_ENV: ""}).step_timeout_s == 3600
    for raw in ("nan", "inf", "-0.5"):
        with pytest.raises(ValueError, match=f"^{STEP_TIMEOUT_ENV}="):
            TrainerOptions.from_trainer({}, env={STEP_TIMEOUT_ENV: raw})


# --- the reward's knobs -------------------------------------------------------------------------------------------

BAD_REWARD_ENV = {
    (R.WORKERS_ENV, "0"): "EBPO_REWARD_WORKERS='0' is invalid; use null or a positive integer",
    (R.WORKERS_ENV, "2.5"): "EBPO_REWARD_WORKERS='2.5' is invalid; use null or a positive integer",
    (R.TIMEOUT_ENV, "-1"): "EBPO_REWARD_TIMEOUT='-1' is invalid; use a number of seconds > 0",
    (R.TIMEOUT_ENV, "0"): "EBPO_REWARD_TIMEOUT='0' is invalid; use a number of seconds > 0",
    (R.TIMEOUT_ENV, "abc"): "EBPO_REWARD_TIMEOUT='abc' is invalid; use a number of seconds > 0",
}


@pytest.mark.parametrize(("setting", "message"), BAD_REWARD_ENV.items(), ids=lambda x: "=".join(x))
def test_a_bad_reward_variable_is_refused_before_any_work(monkeypatch, capsys, tmp_path, setting, message):
    """A real run: one line, exit 2, Ray never started, nothing written in the working folder."""
    import ray

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(*setting)
    code, err = _ebpo_train(monkeypatch, capsys)
    assert code == 2 and _errors(err) == [f"ebpo-train: error: {message}"] and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [] and not ray.is_initialized()


def test_a_bad_reward_kwarg_is_refused(monkeypatch, capsys):
    key = "reward.custom_reward_function.reward_kwargs"
    code, err = _ebpo_train(monkeypatch, capsys, "--cfg", "job", f"+{key}.timeout=-1")
    message = f"ebpo-train: error: {key}.timeout=-1 is invalid; use a number of seconds > 0"
    assert code == 2 and _errors(err) == [message]


def test_the_driver_hands_the_resolved_knobs_to_the_reward_workers(monkeypatch, compose_config):
    """The driver writes the knobs into ``reward_kwargs``; verl's own loader of the custom reward passes them to
    every ``compute_score`` call (its ``timeout`` reaches the grading, its ``workers`` the pool)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    monkeypatch.setenv(R.WORKERS_ENV, "3")
    monkeypatch.setenv(R.TIMEOUT_ENV, "12.5")
    config = compose_config("+reward.custom_reward_function.reward_kwargs.extra=1")
    resolve_reward_options(config)
    kwargs = OmegaConf.to_container(config.reward.custom_reward_function.reward_kwargs)
    assert kwargs == {"extra": 1, "workers": 3, "timeout": 12.5}
    calls = []
    monkeypatch.setattr(R._POOL, "resize", lambda size: calls.append(("resize", size)))
    monkeypatch.setattr(R, "is_equivalent", lambda gold, pred, timeout, max_answer_chars: calls.append(timeout))
    score = get_custom_reward_fn(config)(data_source="d", solution_str="Answer: 7", ground_truth="7", extra_info={})
    assert score["score"] == 0.0 and calls == [("resize", 3), 12.5]  # the stand-in grader said no
    monkeypatch.delenv(R.WORKERS_ENV)
    config = compose_config()
    resolve_reward_options(config)
    assert OmegaConf.to_container(config.reward.custom_reward_function.reward_kwargs) == {
        "workers": None,
        "timeout": 12.5,
    }


def test_another_reward_keeps_its_own_kwargs(monkeypatch, compose_config):
    monkeypatch.setenv(R.TIMEOUT_ENV, "12.5")
    config = compose_config(
        "reward.custom_reward_function.path=pkg://ebpo_verl.paper_reward",
        "+reward.custom_reward_function.reward_kwargs.timeout=-1",  # its own meaning, not ours
    )
    resolve_reward_options(config)
    assert OmegaConf.to_container(config.reward.custom_reward_function.reward_kwargs) == {"timeout": -1}


def test_bad_knobs_in_a_reward_worker_neither_hang_nor_score_right_answers_0():
    """Passed by a caller (``reward_kwargs`` that bypassed the pre-flight, e.g. stock verl): warned and replaced by
    the declared defaults; ``3/8`` equals ``0.375`` only through math-verify (no fast path, no equal text)."""
    with pytest.warns(RuntimeWarning, match=r"timeout=-1 is invalid .*; using 5"):
        assert R.compute_score("t", "Answer: \\frac{3}{8}", "0.375", timeout=-1)["score"] == 1.0
    with pytest.warns(RuntimeWarning, match=r"workers=0 is invalid \(use null or a positive integer\)"):
        assert R.compute_score("t", "Answer: \\frac{5}{8}", "0.625", workers=0, timeout=60)["score"] == 1.0
    assert R._POOL.size >= 1


@pytest.mark.parametrize("env", [{R.WORKERS_ENV: "0", R.TIMEOUT_ENV: "-1"}, {R.TIMEOUT_ENV: "abc"}])
def test_bad_variables_in_a_reward_worker_neither_hang_nor_score_right_answers_0(env):
    """A reward worker reads no environment (ebpo-train's driver resolves the variables into ``reward_kwargs``): one
    whose environment has a bad value grades with the declared defaults, ``\\frac{1}{2}`` against ``0.5`` scores 1,
    and nothing is read or warned at import."""
    import os

    code = "from ebpo_verl.reward import compute_score; print(compute_score('t', 'Answer: \\\\frac{1}{2}', '0.5'))"
    root = str(Path(R.__file__).resolve().parents[1])
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    assert "'score': 1.0" in run.stdout and "ebpo_verl.reward" not in run.stderr


def test_the_reward_variables_are_read_by_the_declaration():
    assert R.RewardOptions.env_values({R.WORKERS_ENV: "3", R.TIMEOUT_ENV: "2.5"}) == {"workers": 3, "timeout": 2.5}
    assert R.RewardOptions.env_values({}) == {} and R.DEFAULTS == R.RewardOptions(workers=None, timeout=5)
    assert R.RewardOptions(workers=3).pool_size == 3 and R.RewardOptions().pool_size >= 1


# --- command lines and switches from one declaration ----------------------------------------------------------------


def _normal(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class _Toy(OptionSection):
    SECTION: ClassVar[str] = "toy"

    path: str = option(MISSING, "where", rule=text("a path"))
    runs: int | None = option(None, "how many; null: all", choices=(None,), rule=ints(1))
    mode: str = option("fast", "how", choices=("fast", "slow"))
    names: tuple[str, ...] = option(("a",), "which", choices=("a", "b"))
    scale: float = option(0.5, "how much", rule=reals(0, 1))
    strict: bool = option(False, "refuse more", choices=(True, False))


def test_a_declaration_builds_its_command_line(capsys):
    toy = cli.parse(_Toy, "toy", ["--path", "p", "--runs", "3", "--names", "b", "a", "--scale", "1", "--strict"])
    assert toy == _Toy(path="p", runs=3, mode="fast", names=("b", "a"), scale=1.0, strict=True)
    assert cli.parse(_Toy, "toy", ["--path", "p", "--runs", "null"]) == _Toy(path="p")
    bad = {
        ("--runs", "0"): "argument --runs: '0' is invalid; use null or a positive integer",
        ("--runs", "x"): "argument --runs: 'x' is invalid; use null or a positive integer",
        ("--mode", "slower"): "argument --mode: 'slower' is invalid; use fast or slow",
        ("--names", "c"): "argument --names: 'c' is invalid; use a or b",
        ("--scale", "2"): "argument --scale: '2' is invalid; use a float in [0, 1]",
        (): "the following arguments are required: --path",
    }
    for args, message in bad.items():
        with pytest.raises(SystemExit) as exit_:
            cli.parse(_Toy, "toy", [*(["--path", "p"] if args else []), *args])
        assert exit_.value.code == 2 and capsys.readouterr().err == f"toy: error: {message}\n"
    with pytest.raises(SystemExit):
        cli.parse(_Toy, "toy", ["--help"])
    shown = _normal(capsys.readouterr().out)
    assert "--runs RUNS how many; null: all (default null; null or a positive integer)" in shown
    assert "--mode {fast,slow} how (default fast; fast or slow)" in shown
    assert "--names NAMES [NAMES ...] which (default a; a or b)" in shown
    assert "--path PATH where (required; a path)" in shown


def _help_of(parser, *args: str) -> str:
    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
        parser.parse_args([*args, "--help"])
    return _normal(out.getvalue())


def _check_help(shown: str, cls: type) -> None:
    for f in cls.declarations():
        name = cli.flag_of(f)
        if not name.startswith("-") and f.metadata["rule"] is None:  # a positional word of a list: {a,b}
            name = "{" + ",".join(f.metadata["choices"]) + "}"
        assert name in shown and _normal(cli.help_text(f)) in shown, f.name


def test_every_evaluate_help_shows_its_declarations():
    for stage, cls in evaluate_cli.STAGES.items():
        _check_help(_help_of(evaluate_cli.parser(), stage), cls)
    with pytest.raises(AssertionError):  # the check sees a declaration that --help does not show
        _check_help(_help_of(evaluate_cli.parser(), "grade"), _Toy)


def test_evaluate_refuses_a_bad_value_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        evaluate_cli.main(["generate", "--model", "m", "--data-dir", "d", "--out", "o", "--runs", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "python -m ebpo_verl.evaluate generate: error: argument --runs: '0' is invalid; "
        "use null or a positive integer\n"
    )


def test_the_run_switches_help_is_the_declaration():
    from ebpo_verl.recipes.__main__ import RUN_SWITCHES

    shown = _normal(RUN_SWITCHES)
    for f in spec.RunSwitches.declarations():
        assert f" {f.name} {_normal(f.metadata['help'])}" in shown, f.name
        if f.default is not None:
            assert f"(default {f.default}" in shown, f.name
    assert "GROUP_SIZE responses per prompt G (rollout.n); at least 2 (1 for spo) (default 4)" in shown
    assert "NNODES nodes of the Ray cluster (default 4)" in shown and "GPUS_PER_NODE GPUs per node (default 8)" in shown


@pytest.mark.parametrize("command", ["run qwen3_8b", "table main", "eval"])
def test_each_recipe_commands_switches_help_is_their_declaration(command):
    """Every switch a recipe command reads is listed by its ``--help`` with its declared help and default."""
    from ebpo_verl.recipes import switches
    from ebpo_verl.recipes.__main__ import main

    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
        main([*command.split(), "--help"])
    shown = _normal(out.getvalue())
    declared = {
        "run qwen3_8b": (spec.RunSwitches, switches.Modes),
        "table main": (switches.DriveSwitches, switches.Modes),
        "eval": (switches.EvalSwitches,),
    }[command]
    for cls in declared:
        for f in cls.declarations():
            assert f" {f.name} {_normal(f.metadata['help'])}" in shown, f.name
            if f.default is not None:
                assert f"(default {parsing.shown(f.default)}" in shown, f.name


def test_switches_read_from_the_environment_are_checked_in_one_line():
    """An unset or empty variable is the declared default; a value is read as null, an integer, a number or text,
    whichever the declaration accepts (a path of digits stays text); anything else is one line naming it."""
    from ebpo_verl.recipes.switches import DriveSwitches, EvalSwitches, Modes

    assert DriveSwitches.from_variables({}) == DriveSwitches() == DriveSwitches.from_variables({"FINAL_EVAL": " "})
    assert DriveSwitches.from_variables({"FINAL_EVAL": "0", "SELECT": "best"}) == DriveSwitches(0, SELECT="best")
    assert EvalSwitches.from_variables({"EVAL_DIR": "2024"}).EVAL_DIR == "2024"
    assert Modes.from_variables({"PRINT_OVERRIDES": "1"}).dry and not Modes().dry
    for cls, variable, raw, use in [
        (Modes, "DRY_RUN", "yes", "0 or 1"),
        (Modes, "SHOW_CONFIG", "1.0", "0 or 1"),
        (DriveSwitches, "EVAL_PROTOCOL", "both,paper", "paper, verl or both"),
    ]:
        with pytest.raises(ValueError) as err:
            cls.from_variables({variable: raw})
        assert str(err.value) == f"{variable}={raw!r} is invalid; use {use}"


def test_a_run_reads_its_defaults_from_the_declaration(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    run = spec.RunSpec.from_env("qwen3_8b", {})
    d = spec.RunSwitches()
    assert (run.algo, run.group_size, run.order, run.topics) == (d.ALGO, d.GROUP_SIZE, d.ORDER, d.TOPICS)
    sh = run.shared
    assert (sh.reward, sh.baselines, sh.keep_ckpts, sh.nnodes, sh.gpus_per_node) == (
        d.REWARD, d.BASELINES, d.KEEP_CKPTS, d.NNODES, d.GPUS_PER_NODE,
    )  # fmt: skip
    assert (sh.project, sh.loggers, sh.paths.work) == (d.PROJECT, d.LOGGERS, str(tmp_path / "ebpo_runs"))
    sc = run.schedule
    assert (sc.test_freq, sc.save_freq, sc.val_n, ",".join(sc.val_sets)) == (
        d.TEST_FREQ, d.SAVE_FREQ, d.VAL_N, d.VAL_SETS,
    )  # fmt: skip
    monkeypatch.setitem(spec.SWITCHES, "GROUP_SIZE", 8)  # one place: a changed declaration is the run's default
    assert spec.RunSpec.from_env("qwen3_8b", {}).group_size == 8


def test_one_docs_command_writes_every_generated_block(tmp_path, capsys):
    """``python -m ebpo_verl.docs_tables --check`` passes on the checkout; on a copy, a stale default in any table is
    seen by ``--check`` and rewritten by the command; every generated block of README.md and docs/*.md is one of
    its blocks, in the one marker style."""
    import re

    from ebpo_verl import docs_tables
    from ebpo_verl.ops.readme_block import markers

    assert docs_tables.main(["--check"]) == 0, capsys.readouterr().err
    pages = docs_tables.pages(docs_tables.DocsOptions(), docs_tables.ROOT)
    for rel in [docs_tables.YAML, *pages, "docs/study_quick.json", docs_tables.RIVALS2]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((docs_tables.ROOT / rel).read_text())
    page = tmp_path / "docs/reproduction.md"
    page.write_text(page.read_text().replace("| `GROUP_SIZE` | `4` |", "| `GROUP_SIZE` | `8` |"))
    capsys.readouterr()
    assert docs_tables.main(["--check", "--root", str(tmp_path)]) == 1  # the check sees a stale default
    assert "docs/reproduction.md: generated blocks out of date" in capsys.readouterr().err
    assert docs_tables.main(["--root", str(tmp_path)]) == 0
    assert "| `GROUP_SIZE` | `4` | a positive integer |" in page.read_text()
    for cls, where, table in (
        (spec.RunSwitches, "docs/reproduction.md", "run-switches"),
        (evaluate_cli.GenerateOptions, "docs/evaluation.md", "evaluate-generate"),
    ):
        assert len(pages[where][table]().splitlines()) == 2 + len(cls.declarations())
    root = docs_tables.ROOT
    for md in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        rel, text = str(md.relative_to(root)), md.read_text()
        found = re.findall(r"^<!-- (/?[a-z]+:\S+) -->$", text, re.M)  # every marker-like comment line
        names = {re.fullmatch(r"generated:([a-z0-9-]+):(begin|end)", m)[1] for m in found}  # one style (no None)
        assert names == set(pages.get(rel, {})), rel
        assert all(text.count(m) == 1 for n in names for m in markers(n))


def _bench(name: str):
    """``benchmarks/<name>.py`` as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    module_spec = importlib.util.spec_from_file_location(f"knobs_{name}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # dataclasses read their module's namespace
    module_spec.loader.exec_module(module)
    return module


def _commands():
    """(name, how to run it with argv, its declaration) of every command line built from a declaration."""
    from ebpo_verl import docs_tables
    from ebpo_verl.data import all as prepare_all
    from ebpo_verl.data import amc23, label_topics, schema
    from ebpo_verl.integrations import trl_example
    from ebpo_verl.recipes import __main__ as recipes
    from ebpo_verl.recipes import make_tables, plot_dynamics, plot_pass_at_k
    from ebpo_verl.smoke import selfcheck
    from ebpo_verl.study import __main__ as study
    from tests.harness import __main__ as smoke
    from tests.harness import campaign

    yield "evaluate generate", lambda argv: evaluate_cli.main(["generate", *argv]), evaluate_cli.GenerateOptions
    yield "evaluate grade", lambda argv: evaluate_cli.main(["grade", *argv]), evaluate_cli.GradeOptions
    yield "data.all", prepare_all.main, prepare_all.PrepareAllOptions
    yield "data.amc23", amc23.main, schema.PrepareOptions
    yield "data.label_topics", label_topics.main, label_topics.LabelTopicsOptions
    yield "study", study.main, study.StudyOptions
    yield "make_tables", make_tables.main, make_tables.MakeTablesOptions
    yield "harness", lambda argv: smoke.parser().parse_args(argv), smoke.SmokeOptions
    yield "harness.campaign", campaign.main, campaign.CampaignOptions
    yield "smoke.selfcheck", selfcheck.main, selfcheck.SelfCheckOptions
    yield "docs_tables", docs_tables.main, docs_tables.DocsOptions
    yield "recipes.plot_dynamics", plot_dynamics.main, plot_dynamics.PlotOptions
    yield "recipes.plot_pass_at_k", plot_pass_at_k.main, plot_pass_at_k.PassAtKOptions
    yield "integrations.trl_example", trl_example.main, trl_example.ExampleOptions
    yield "recipes table", lambda argv: recipes.main(["table", "main", *argv]), recipes.TableOptions
    yield "recipes eval", lambda argv: recipes.main(["eval", *argv]), recipes.EvalOptions
    for name in ("bench_advantage", "bench_step_cost"):
        module = _bench(name)
        yield name, module.main, module.BenchOptions


def test_every_converted_help_shows_its_declarations(monkeypatch):
    seen = set()
    for name, run, cls in _commands():
        with pytest.raises(SystemExit) as exit_, contextlib.redirect_stdout(io.StringIO()) as out:
            run(["--help"])
        assert exit_.value.code == 0, name
        _check_help(_normal(out.getvalue()), cls)
        seen.add(name)
    grading = _bench("bench_grading")
    monkeypatch.setattr(sys, "argv", ["bench_grading.py", "--help"])
    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
        grading.main()
    _check_help(_normal(out.getvalue()), grading.BenchOptions)
    assert len(seen) == 18


def test_every_converted_command_refuses_a_bad_value_in_one_line(capsys):
    """The first declared option that does not take the word ``no-such-value-0``, given it: one line, exit 2."""
    from ebpo_verl.options.parsing import accepts

    without = []  # commands with no such option (test_front_door_cli checks the recipes' refusals)
    for name, run, cls in _commands():
        f = next(
            (
                f
                for f in cls.declarations()
                if not accepts(f, "no-such-value-0") and f.metadata["choices"] != (True, False)
            ),
            None,
        )
        if f is None:
            without.append(name)
            continue
        with pytest.raises(SystemExit) as exit_:
            run([cli.flag_of(f), "no-such-value-0"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and "is invalid; use" in err, (name, err)
    assert without == ["recipes table", "recipes eval"]


def test_bench_step_cost_reads_the_last_checkpoint_by_step_number(tmp_path):
    """``state_sizes``: global_step_10 is after global_step_6 (a text sort puts it before)."""
    state_sizes = _bench("bench_step_cost").state_sizes
    for step, size in ((6, 3), (10, 5)):
        folder = tmp_path / "ckpt_ebpo" / f"global_step_{step}"
        folder.mkdir(parents=True)
        (folder / "ebpo_state.json").write_text("x" * size)
    assert state_sizes(tmp_path, ["ebpo", "grpo"]) == ["ebpo: global_step_10/ebpo_state.json 5 bytes"]
