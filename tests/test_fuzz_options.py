"""Fuzzing the option values of every options section the package declares (as Hydra hands them over: plain
values or an OmegaConf node) and the environment variables the package reads. Each is accepted as given, or
refused with one ValueError line naming the key or the variable; never another exception or a value changed on
the way in."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from ebpo_verl.algos import registry
from ebpo_verl.algos.ordering import CurriculumOptions
from ebpo_verl.cpu.backend import weight_sync_timeout
from ebpo_verl.options.parsing import accepts
from ebpo_verl.reward import TIMEOUT_ENV, WORKERS_ENV, RewardOptions
from ebpo_verl.trainer.run_options import INIT_TIMEOUT_ENV, STEP_TIMEOUT_ENV, TrainerOptions

FUZZ = settings(
    max_examples=200, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
"""200 examples per property, derandomized (the same examples every run); every health check on but too_slow."""

SECTIONS = (
    *(spec.options_cls for spec in registry.estimators().values() if spec.options_cls is not None),
    CurriculumOptions,
    TrainerOptions,
    RewardOptions,
)
"""Every options section of the config: each estimator's (the registry's), the curriculum's, the trainer's, the
reward's."""
CONFIG_ROOTS = ("algorithm.", "data.", "reward.", "trainer")
"""Where the sections of the Hydra config live (the command lines' sections are fuzzed through their commands)."""
values = (
    st.none()
    | st.booleans()
    | st.integers(-(10**400), 10**400)
    | st.integers(-3, 20)
    | st.floats()
    | st.floats(0, 1)
    | st.text(max_size=8)
    | st.lists(st.integers(0, 3), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)


def _choices(cls) -> st.SearchStrategy:
    """Each option's listed choices, so that valid sections are drawn too (not only refusals)."""
    listed = [c for f in cls.declarations() for c in f.metadata["choices"]]
    return st.sampled_from(listed) if listed else st.nothing()


def _one_line(err: BaseException, *names: str) -> None:
    message = str(err)
    assert "\n" not in message and len(message) < 1000, message
    assert all(name in message for name in names), (names, message)


def _valid_section(cls, given_values: dict) -> bool:
    """The oracle: every key an option of the section whose declaration accepts its value, and the options
    together pass the section's checks between options (the curriculum's: align/block_size only with
    order=topic, descending only with order=difficulty)."""
    declared = {f.name: f for f in cls.declarations()}
    if not all(k in declared and accepts(declared[k], v) for k, v in given_values.items()):
        return False
    if cls is CurriculumOptions:
        values = {**cls.defaults(), **given_values}
        if values["order"] != "topic" and (values["align"] or values["block_size"] is not None):
            return False
        if values["order"] != "difficulty" and values["descending"]:
            return False
    return True


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__name__)
@FUZZ
@given(data=st.data())
def test_fuzz_option_sections(cls, data):
    """Any keys (the section's and others) with any values, as a dict and as an OmegaConf node: taken as given
    exactly when every value is one its option accepts, refused in one line naming the section when not."""
    keys = st.sampled_from(cls.keys()) | st.text(min_size=1, max_size=6)
    mapping = data.draw(st.dictionaries(keys, values | _choices(cls), max_size=4), label="mapping")
    if data.draw(st.booleans(), label="as OmegaConf node"):
        try:
            mapping = OmegaConf.create(mapping)
        except Exception:  # noqa: BLE001 (OmegaConf refuses some values itself: not ours to parse)
            mapping = OmegaConf.create({})
    given_values = dict(mapping.items())
    try:
        options = cls.from_mapping(mapping)
    except ValueError as err:
        assert not _valid_section(cls, given_values), err
        return _one_line(err, cls.SECTION)
    assert _valid_section(cls, given_values)
    for f in cls.declarations():
        value = getattr(options, f.name)
        assert accepts(f, value)
        if f.name in given_values:  # taken as given: no rounding, no type change
            assert value == given_values[f.name] and type(value) is type(given_values[f.name])
        else:
            assert value == f.default
        if isinstance(value, float):
            assert math.isfinite(value)


def test_fuzz_option_sections_fail_on_a_refusing_parser(monkeypatch):
    """The section property fails when from_mapping refuses everything; the variables' properties when their
    readers do."""
    from ebpo_verl.options import parsing
    from tests.fuzzing import fails_on_mutant

    def refuse(cls, mapping):
        raise ValueError(f"{cls.SECTION}: mutant refuses everything")

    fails_on_mutant(test_fuzz_option_sections, monkeypatch, parsing.OptionSection, "from_mapping", classmethod(refuse),
                    cls=TrainerOptions)  # fmt: skip
    fails_on_mutant(test_fuzz_trainer_timeout_variables, monkeypatch, TrainerOptions, "from_trainer",
                    classmethod(lambda cls, *a: refuse(cls, None)))  # fmt: skip
    fails_on_mutant(
        test_fuzz_reward_variables, monkeypatch, RewardOptions, "with_env", lambda self, env: refuse(self, env)
    )
    fails_on_mutant(test_fuzz_weight_sync_timeout_variable, monkeypatch, globals(), "weight_sync_timeout",
                    monkeypatch_session=monkeypatch)  # fmt: skip


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__name__)
def test_fuzz_option_sections_huge_integer(cls):
    # an integer beyond a float's range: math.isfinite raised OverflowError inside is_real (EBPOOptions' decay,
    # epsilon, shrinkage); an integer option takes it as it is
    for f in cls.declarations():
        try:
            options = cls.from_mapping({f.name: 10**400})
        except ValueError as err:
            _one_line(err, f"{cls.SECTION}.", f.name)
            continue
        assert getattr(options, f.name) == 10**400 and "integer" in f.metadata["rule"].text


def test_fuzz_option_sections_not_a_mapping():
    for cls in SECTIONS:
        for node in (5, "x", [1], True):
            with pytest.raises(ValueError) as err:
                cls.from_mapping(node)
            _one_line(err.value, cls.SECTION, "is not a mapping of options")


env_text = (
    st.text(max_size=12)
    | st.sampled_from(["nan", "inf", "-inf", "1e400", "0", "-5", " 30 ", "1_000", "0x10", "3600.5", "١٢"])
    | st.floats(allow_nan=True).map(repr)
)


@FUZZ
@given(step=env_text, init=env_text)
def test_fuzz_trainer_timeout_variables(step, init):
    """EBPO_STEP_TIMEOUT_S / EBPO_INIT_TIMEOUT_S: a finite number of seconds replaces the key, blank leaves it;
    anything else is refused naming the variable."""
    env = {STEP_TIMEOUT_ENV: step, INIT_TIMEOUT_ENV: init}
    try:
        options = TrainerOptions.from_trainer({}, env)
    except ValueError as err:
        bad = [v for v, raw in env.items() if raw.strip() and not _seconds(raw)]
        assert bad, err
        return _one_line(err, bad[0])
    for key, variable in TrainerOptions.ENV.items():
        raw = env[variable].strip()
        expected = float(raw) if raw else TrainerOptions().__getattribute__(key)
        assert getattr(options, key) == expected and _seconds(raw or "0")


def _workers(raw: str) -> bool:
    """A worker count the pre-flight takes: blank (the default), null/none, or an integer >= 1 as Python reads it."""
    word = raw.strip()
    if not word or word.lower() in ("null", "none"):
        return True
    try:
        return int(word) >= 1
    except ValueError:
        return False


def _seconds(raw: str) -> bool:
    """A timeout the declaration accepts: a finite number of seconds >= 0 (0: off)."""
    try:
        return math.isfinite(float(raw)) and float(raw) >= 0
    except ValueError:
        return False


@FUZZ
@given(workers=env_text, timeout=env_text)
def test_fuzz_reward_variables(workers, timeout):
    """EBPO_REWARD_WORKERS / EBPO_REWARD_TIMEOUT as the pre-flight reads them: an integer >= 1 and a number of
    seconds > 0 are taken, blank leaves the default, anything else is refused naming the variable."""
    env = {WORKERS_ENV: workers, TIMEOUT_ENV: timeout}
    try:
        options = RewardOptions().with_env(env)
    except ValueError as err:
        assert not (_workers(workers) and _seconds(timeout or "1") and (not timeout.strip() or float(timeout) > 0))
        return _one_line(err, "EBPO_REWARD_")
    assert _workers(workers) and (not timeout.strip() or float(timeout) > 0)
    if workers.strip():
        assert options.workers >= 1 and float(workers) == options.workers
    if timeout.strip():
        assert options.timeout > 0 and math.isfinite(options.timeout) and float(timeout) == options.timeout


@pytest.mark.parametrize("raw", ["nan", "inf", "1e400"])
def test_fuzz_timeout_variable_not_finite_names_the_variable(raw):
    # today: "trainer.step_timeout_s=nan is invalid", which names a key the user never set
    with pytest.raises(ValueError) as err:
        TrainerOptions.from_trainer({}, {STEP_TIMEOUT_ENV: raw})
    _one_line(err.value, f"{STEP_TIMEOUT_ENV}={raw!r}", "number of seconds")


@FUZZ
@given(raw=env_text.filter(lambda text: "\x00" not in text))  # an environment cannot hold a NUL
def test_fuzz_weight_sync_timeout_variable(raw, monkeypatch_session):
    """EBPO_WEIGHT_SYNC_TIMEOUT_S (the CPU backend's weight sync): a positive finite number, else one line."""
    monkeypatch_session.setenv(WEIGHT_SYNC_TIMEOUT_ENV := "EBPO_WEIGHT_SYNC_TIMEOUT_S", raw)
    try:
        seconds = weight_sync_timeout()
    except ValueError as err:
        assert not (_seconds(raw) and float(raw) > 0) or not raw.strip()
        return _one_line(err, WEIGHT_SYNC_TIMEOUT_ENV)
    assert seconds == (float(raw) if raw.strip() else 300.0) and math.isfinite(seconds) and seconds > 0


@pytest.fixture(scope="module")
def monkeypatch_session():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_fuzz_options_defaults_are_accepted():
    for cls in SECTIONS:
        assert cls.from_mapping(None) == cls() and dataclasses.asdict(cls()) == cls.defaults()


HYDRA_VALUES = {
    "algorithm.ebpo.decay=1e400": "algorithm.ebpo.decay=inf is invalid",  # Hydra reads 1e400 as inf
    "algorithm.ebpo.epsilon=nan": "algorithm.ebpo.epsilon=nan is invalid",
    f"algorithm.ebpo.shrinkage={10**400}": "algorithm.ebpo.shrinkage=1000",  # an int beyond a float's range
    "algorithm.ebpo.min_cluster_prompts=1.5": "algorithm.ebpo.min_cluster_prompts=1.5 is invalid",
    "algorithm.ebpo.cluster_key=[a,b]": "algorithm.ebpo.cluster_key=['a', 'b'] is invalid",
    "algorithm.ebpo.prior='1'": "algorithm.ebpo.prior='1' is invalid",
    "+algorithm.ebpo.x=1": "unknown option algorithm.ebpo.x",
}


@pytest.mark.parametrize("override", list(HYDRA_VALUES), ids=lambda override: override.split("=")[0])
def test_fuzz_hydra_override_values(override, compose_config):
    """Values as Hydra's override grammar types them (inf, nan, a 401-digit int, a list): one EBPOConfigError line."""
    from ebpo_verl.ops.errors import EBPOConfigError
    from ebpo_verl.trainer.preflight import check_config

    with pytest.raises(EBPOConfigError) as err:
        check_config(compose_config(override, "actor_rollout_ref.rollout.n=4"))
    _one_line(err.value, HYDRA_VALUES[override])


def test_fuzz_every_options_section_is_fuzzed():
    """A new options section joins SECTIONS (each estimator's through the registry, the trainer's, the curriculum's)."""
    from ebpo_verl.algos import registry
    from ebpo_verl.options.parsing import OptionSection

    declared = {spec.options_cls for spec in registry.estimators().values() if spec.options_cls is not None}
    package = {
        cls
        for cls in OptionSection.__subclasses__()
        if cls.__module__.startswith("ebpo_verl.") and cls.SECTION.startswith(CONFIG_ROOTS)
    }
    # the check sees the config's sections
    assert {registry.get("ebpo").options_cls, TrainerOptions, RewardOptions} <= package
    assert declared | package <= set(SECTIONS), sorted(c.__name__ for c in (declared | package) - set(SECTIONS))
