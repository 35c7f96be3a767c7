"""A setting's constraint, stated where it is declared and checked on the bound literals."""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Sequence
from typing import Annotated

import gin
import pytest

from rlax.core import config
from rlax.core.config import checks
from rlax.core.config.bindings import Origins, hints
from rlax.core.constraints import (
    AtLeast,
    Built,
    ExistingPath,
    NonNegative,
    OneOf,
    Positive,
    Probability,
    Range,
    check_arguments,
    check_fields,
    check_rules,
    checked_by,
    constrained,
    ordered,
    refusal,
)
from rlax.core.errors import BadSetting, ConfigError


def _window(*, low: int = 0, high: int = 0, **_) -> None:
    if high and low > high:
        raise BadSetting("low", f"must be <= high ({high}), got {low}")


@checked_by(_window)
def knobs(
    *,
    count: Annotated[int, AtLeast(1)] = 1,
    every: Annotated[int, AtLeast(0, means="0: never")] = 0,
    rate: Annotated[float, Positive] = 0.1,
    share: Annotated[float, Probability] = 0.5,
    mode: Annotated[str, OneOf("fast", "exact")] = "fast",
    ks: Sequence[Annotated[int, AtLeast(1)]] = (1,),
    cap: Annotated[int, AtLeast(1)] | None = None,
    scale: float = 1.0,
    low: int = 0,
    high: int = 0,
    files: Sequence[Annotated[str, ExistingPath]] = (),
) -> dict:
    return dict(locals())


class Base:
    def __init__(self, *, temperature: Annotated[float, Positive] = 1.0):
        self.temperature = temperature


class Derived(Base):
    def __init__(self, *, slots: Annotated[int, AtLeast(1)] = 4, **rest):
        super().__init__(**rest)


@pytest.fixture(autouse=True)
def fresh_gin():
    config.register_configurables("ctest", {"knobs": knobs, "derived": Derived}, exclusive=True)
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize(
    ("value", "annotation", "expected"),
    [
        (0, Annotated[int, AtLeast(1)], "must be >= 1, got 0"),
        (1, Annotated[int, AtLeast(1)], None),
        (-1, Annotated[int, AtLeast(0, means="0: never")], "must be >= 0 (0: never), got -1"),
        (0.0, Annotated[float, Positive], "must be > 0, got 0.0"),
        (1e-30, Annotated[float, Positive], None),
        (1.5, Annotated[float, Range(gt=0, le=1)], "must be in (0, 1], got 1.5"),
        (1.0, Annotated[float, Range(gt=0, le=1)], None),
        (0.0, Annotated[float, Probability], None),
        (-0.0001, Annotated[float, NonNegative], "must be >= 0, got -0.0001"),
        (math.inf, float, "must be a finite number, got inf"),
        (-math.inf, Annotated[float, Range(le=0)], "must be a finite number, got -inf"),
        (math.nan, Annotated[float, NonNegative], "must be a finite number, got nan"),
        ("slow", Annotated[str, OneOf("fast", "exact")], "one of fast, exact, got 'slow'"),
        ([1, 0], Sequence[Annotated[int, AtLeast(1)]], "item 1: must be >= 1, got 0"),
        ((2, -1), tuple[Annotated[int, AtLeast(0)], ...], "item 1: must be >= 0, got -1"),
        (None, Annotated[int, AtLeast(1)] | None, None),
        (0, Annotated[int, AtLeast(1)] | None, "must be >= 1, got 0"),
        ("x", Annotated[int, AtLeast(1)], None),  # a wrong type is check_types' to say
    ],
)
def test_a_value_is_refused_with_the_rule_it_breaks(value, annotation, expected):
    assert refusal(value, annotation) == expected


def test_a_path_that_is_not_there_is_refused_and_a_model_reference_is_left_alone(tmp_path):
    (tmp_path / "here.jsonl").write_text("")

    assert refusal(str(tmp_path / "here.jsonl"), Annotated[str, ExistingPath]) is None
    assert refusal(str(tmp_path / "gone.jsonl"), Annotated[str, ExistingPath]) == (
        f"no such file or directory: {tmp_path / 'gone.jsonl'}"
    )
    assert refusal("hf:org/model", Annotated[str, ExistingPath]) is None


@pytest.mark.parametrize(
    ("binding", "expected"),
    [
        ("knobs.count=0", "--gin.knobs.count=0: ctest.knobs.count: must be >= 1, got 0"),
        (
            "knobs.every=-5",
            "--gin.knobs.every=-5: ctest.knobs.every: must be >= 0 (0: never), got -5",
        ),
        ("knobs.rate=0.0", "--gin.knobs.rate=0.0: ctest.knobs.rate: must be > 0, got 0.0"),
        (
            "knobs.share=1e999",
            "--gin.knobs.share=1e999: ctest.knobs.share: must be a finite number, got inf",
        ),
        (
            "knobs.scale=-1e999",
            "--gin.knobs.scale=-1e999: ctest.knobs.scale: must be a finite number, got -inf",
        ),
        (
            "knobs.mode='slow'",
            "--gin.knobs.mode='slow': ctest.knobs.mode: one of fast, exact, got 'slow'",
        ),
        ("knobs.ks=[1, 0]", "--gin.knobs.ks=[1, 0]: ctest.knobs.ks: item 1: must be >= 1, got 0"),
        ("knobs.cap=0", "--gin.knobs.cap=0: ctest.knobs.cap: must be >= 1, got 0"),
        ("knobs.low=5", None),  # high = 0: no upper end
        ("derived.temperature=0.0", "ctest.derived.temperature: must be > 0, got 0.0"),
        ("derived.slots=0", "ctest.derived.slots: must be >= 1, got 0"),
    ],
)
def test_a_binding_that_breaks_its_constraint_is_one_line_naming_it(binding, expected):
    if expected is None:
        config.parse([], [binding])
        return
    with pytest.raises(ConfigError) as info:
        config.parse([], [binding])

    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_a_rule_between_settings_is_the_configurable_s_own_validator():
    with pytest.raises(ConfigError) as info:
        config.parse([], ["knobs.low=5", "knobs.high=3"])

    assert str(info.value) == "--gin.knobs.low=5: ctest.knobs.low: must be <= high (3), got 5"


def test_a_macro_s_value_is_reported_where_it_was_written(tmp_path):
    gin_file = tmp_path / "run.gin"
    gin_file.write_text("COUNT = 1\nknobs.count = %COUNT\n")

    with pytest.raises(ConfigError) as info:
        config.parse([str(gin_file)], ["COUNT = -2"])

    assert str(info.value) == (
        "--gin.COUNT = -2: ctest.knobs.count (via %COUNT): must be >= 1, got -2"
    )


def test_a_value_in_a_file_is_reported_at_its_file_and_line(tmp_path):
    gin_file = tmp_path / "run.gin"
    gin_file.write_text("knobs.count = 1\n\nknobs.share = 2.0\n")

    with pytest.raises(ConfigError) as info:
        config.parse([str(gin_file)])

    assert str(info.value) == f"{gin_file}:3: ctest.knobs.share: must be in [0, 1], got 2.0"


def test_nan_bound_in_process_is_refused_by_the_same_check():
    gin.bind_parameter(("", "ctest.knobs", "rate"), math.nan)

    with pytest.raises(ConfigError, match=r"^ctest.knobs.rate: must be a finite number, got nan$"):
        checks.check_constraints(Origins())


def test_valid_values_reach_the_configurable_unchanged(tmp_path):
    (tmp_path / "a.jsonl").write_text("")
    config.parse(
        [],
        [
            "knobs.count=3",
            "knobs.share=1.0",
            "knobs.mode='exact'",
            f"knobs.files=['{tmp_path}/a.jsonl']",
        ],
    )

    got = config.configured("ctest", "knobs")()
    assert (got["count"], got["share"], got["mode"]) == (3, 1.0, "exact")


def test_a_subclass_s_keyword_arguments_carry_its_bases_annotations():
    found = hints("ctest.derived")

    assert set(found) >= {"slots", "temperature"}


@dataclasses.dataclass(frozen=True)
class Settings:
    every: Annotated[int, AtLeast(0, means="0: never")] = 1
    mode: Annotated[str, OneOf("a", "b")] = "a"

    def __post_init__(self) -> None:
        check_fields(self)


def test_code_that_builds_without_gin_checks_the_same_markers():
    with pytest.raises(BadSetting) as info:
        Settings(every=-1)
    assert (info.value.parameter, str(info.value)) == ("every", "must be >= 0 (0: never), got -1")

    with pytest.raises(BadSetting) as info:
        check_arguments(knobs, {"count": 2, "mode": "slow"})
    assert (info.value.parameter, str(info.value)) == ("mode", "one of fast, exact, got 'slow'")


def test_existing_path_marker_refuses_a_missing_file_in_a_list(tmp_path):
    missing = pathlib.Path(tmp_path) / "missing.jsonl"

    with pytest.raises(ConfigError) as info:
        config.parse([], [f"knobs.files=['{missing}']"])

    assert str(info.value).endswith(
        f"ctest.knobs.files: item 0: no such file or directory: {missing}"
    )


def test_ordered_refuses_a_low_end_above_the_high_end_and_zero_can_mean_no_limit():
    rates = ordered("min_rate", "max_rate")
    lengths = ordered("min_length", "max_length", zero_is_unbounded=True)

    rates(min_rate=0.2, max_rate=0.2)
    lengths(min_length=50, max_length=0)
    with pytest.raises(BadSetting) as info:
        rates(min_rate=0.6, max_rate=0.5)
    assert (info.value.parameter, str(info.value)) == (
        "max_rate",
        "must be >= min_rate (0.6), got 0.5",
    )
    with pytest.raises(BadSetting, match=r"must be >= min_length \(9\) or 0 \(no limit\), got 3"):
        lengths(min_length=9, max_length=3)


def library_step(rate, *, momentum=0.0):
    return rate, momentum


def test_constrained_adds_marks_to_a_library_function_and_keeps_its_behaviour():
    wrapped = constrained(library_step, rate=Positive, momentum=Range(ge=0, lt=1))
    config.register_configurables("ctest", {"step": wrapped})

    assert wrapped(0.5, momentum=0.9) == (0.5, 0.9)
    with pytest.raises(ConfigError, match=r"ctest.step.rate: must be > 0, got -0.5$"):
        config.parse([], ["step.rate=-0.5"])
    config.parse([], ["step.rate=0.5", "step.momentum=0.5"])
    assert config.configured("ctest", "step")() == (0.5, 0.5)


def test_the_learning_rate_is_held_to_be_positive_and_a_schedule_to_be_non_zero():
    from rlax.core.trainer.optimizer import optax_configurables

    config.register_configurables("optax", optax_configurables())
    with pytest.raises(ConfigError, match=r"optax.adam.learning_rate: must be > 0, got -0.001$"):
        config.parse([], ["optax.adam.learning_rate=-0.001"])
    with pytest.raises(ConfigError, match="learning rate would be 0 throughout"):
        config.parse(
            [],
            [
                "optax.linear_schedule.init_value=0.0",
                "optax.linear_schedule.end_value=0.0",
                "optax.linear_schedule.transition_steps=5",
            ],
        )
    with pytest.raises(ConfigError, match=r"must be >= 1 \(for no warm-up set init_value to"):
        config.parse([], ["optax.linear_schedule.transition_steps=0"])


def test_check_rules_runs_a_configurable_s_rule_without_gin_naming_owner_and_parameter():
    @checked_by(ordered("low", "high"))
    class Band:
        pass

    check_rules(Band, "rewards.band", low=1, high=2)
    check_rules(object, "anything", low=9, high=1)  # nothing attached: nothing to check
    with pytest.raises(BadSetting) as info:
        check_rules(Band, "rewards.band", low=3, high=2)
    assert (info.value.parameter, str(info.value)) == (
        "high",
        "rewards.band.high: must be >= low (3), got 2",
    )


class Gear:
    built = 0

    def __init__(self):
        Gear.built += 1


def test_a_rule_that_names_a_parameter_bound_by_reference_sees_what_it_will_build():
    seen: dict[str, object] = {}

    def names_it(*, gear=None, turns=1, **_):
        seen["named"] = gear
        if isinstance(gear, Built) and turns > 1:
            raise BadSetting("turns", f"{gear.factory.__name__} turns once, got {turns}")

    def takes_all(**settings):
        seen["all"] = sorted(settings)

    @checked_by(names_it)
    def machine(*, gear=None, turns: int = 1):
        return gear, turns

    @checked_by(takes_all)
    def other(*, gear=None, turns: int = 1):
        return gear, turns

    config.register_configurables("rtest", {"gear": Gear, "machine": machine, "other": other})
    config.parse([], ["GEAR = @rtest.gear()", "machine.gear = %GEAR", "other.gear = %GEAR"])

    assert seen["named"] == Built("rtest.gear", Gear)  # through the macro, not built
    assert seen["all"] == ["turns"]  # a rule that does not name it never meets a Built
    assert Gear.built == 0
    with pytest.raises(
        ConfigError, match=r"^--gin.machine.turns=2: rtest.machine.turns: Gear turns once"
    ):
        config.parse([], ["machine.gear = @rtest.gear()", "machine.turns=2"])
