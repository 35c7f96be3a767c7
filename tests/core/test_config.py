"""gin loading: bindings, includes, error messages, configurable registration."""

from __future__ import annotations

import pathlib
import types

import gin
import numpy as np
import pytest

from rlax.core import config, gin_state, hookimpl
from rlax.core.errors import ConfigError
from rlax.core.plugins import build_plugin_manager


def point(*, x: int = 0, y: int = 0) -> tuple[int, int]:
    return x, y


def other_point(*, x: int = 0, y: int = 0) -> tuple[int, int]:
    return -x, -y


@pytest.fixture(autouse=True)
def fresh_gin():
    config.register_configurables("cfgtest", {"point": point}, exclusive=True)
    gin.clear_config()
    yield
    gin.clear_config()


def write(path: pathlib.Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_files_then_bindings_in_order(tmp_path):
    base = write(tmp_path / "base.gin", "point.x = 1\npoint.y = 2\n")
    over = write(tmp_path / "over.gin", "point.y = 20\n")

    config.parse([base, over], ["point.x=100"])

    assert config.configured("cfgtest", "point")() == (100, 20)


def test_include_resolves_relative_to_the_including_file(tmp_path, monkeypatch):
    main = write(tmp_path / "exp" / "main.gin", 'include "parts/model.gin"\npoint.y = 2\n')
    write(tmp_path / "exp" / "parts" / "model.gin", 'include "sizes.gin"\n')
    write(tmp_path / "exp" / "parts" / "sizes.gin", "point.x = 7\n")
    monkeypatch.chdir(tmp_path / "exp" / "parts")  # neither file's directory is the CWD's parent

    config.parse([main], [])

    assert config.configured("cfgtest", "point")() == (7, 2)


def test_include_falls_back_to_the_working_directory(tmp_path, monkeypatch):
    write(tmp_path / "configs" / "shared.gin", "point.x = 5\n")
    main = write(tmp_path / "runs" / "main.gin", 'include "configs/shared.gin"\n')
    monkeypatch.chdir(tmp_path)

    config.parse([main], [])

    assert config.configured("cfgtest", "point")() == (5, 0)


def test_including_directory_wins_over_the_working_directory(tmp_path, monkeypatch):
    write(tmp_path / "x.gin", "point.x = 1\n")
    main = write(tmp_path / "sub" / "main.gin", 'include "x.gin"\n')
    write(tmp_path / "sub" / "x.gin", "point.x = 2\n")
    monkeypatch.chdir(tmp_path)

    config.parse([main], [])

    assert config.configured("cfgtest", "point")() == (2, 0)


def test_gin_file_readers_are_left_as_they_were(tmp_path):
    before = gin_state.file_readers()
    bad = write(tmp_path / "bad.gin", "point.x 1\n")

    config.parse([write(tmp_path / "ok.gin", "point.x = 1\n")], [])
    with pytest.raises(ConfigError):
        config.parse([bad], [])

    assert gin_state.file_readers() == before


# -- errors say what and where ---------------------------------------------


def test_syntax_error_reports_file_and_line(tmp_path):
    path = write(tmp_path / "bad.gin", "point.x = 1\n\npoint.y 2\n")

    with pytest.raises(ConfigError) as info:
        config.parse([path], [])

    assert str(info.value).startswith(f"{path}:3: syntax error: ")


def test_unclosed_bracket_reports_file_and_line(tmp_path):
    path = write(tmp_path / "bad.gin", "point.x = 1\npoint.y = (1,\n")

    with pytest.raises(ConfigError) as info:
        config.parse([path], [])

    assert str(info.value).startswith(f"{path}:3: syntax error: EOF in multi-line statement")


def test_syntax_error_in_an_included_file_reports_that_file(tmp_path):
    main = write(tmp_path / "main.gin", 'include "part.gin"\n')
    write(tmp_path / "part.gin", "point.x = 1\npoint.y == 2\n")

    with pytest.raises(ConfigError) as info:
        config.parse([main], [])

    assert str(info.value).startswith(f"{tmp_path / 'part.gin'}:2: syntax error:")


def test_syntax_error_in_a_binding_names_the_binding():
    with pytest.raises(ConfigError, match=r"^--gin.point.x 3: syntax error"):
        config.parse([], ["point.x 3"])


def test_unknown_parameter_is_an_error_with_its_location(tmp_path):
    main = write(tmp_path / "main.gin", 'point.x = 1\ninclude "part.gin"\n')
    write(tmp_path / "part.gin", "\npoint.zz = 2\n")

    with pytest.raises(ConfigError) as info:
        config.parse([main], [])

    assert str(info.value) == (
        f"{tmp_path / 'part.gin'}:2: point has no parameter 'zz' (valid: x, y)"
        f" (included from {main}:2)"
    )


def test_unknown_configurable_is_an_error(tmp_path):
    path = write(tmp_path / "main.gin", "nothing_here.x = 1\n")

    with pytest.raises(ConfigError) as info:
        config.parse([path], [])

    assert str(info.value) == f"{path}:1: No configurable matching 'nothing_here'."


def test_unknown_binding_is_an_error_naming_the_binding():
    with pytest.raises(ConfigError) as info:
        config.parse([], ["point.x=1", "point.zz=2"])

    assert str(info.value) == "--gin.point.zz=2: point has no parameter 'zz' (valid: x, y)"


def test_unknown_plugin_reference_lists_the_valid_names(tmp_path):
    plugin = types.SimpleNamespace(
        rlax_register_algorithms=hookimpl(lambda: {"ppo": point, "grpo": other_point})
    )
    pm = build_plugin_manager(autoload=False, builtins=False, extra=[plugin])
    path = write(tmp_path / "main.gin", "point.x = 1\npoint.y = @algorithms.nope()\n")

    with pytest.raises(ConfigError) as info:
        config.parse([path], [], plugins=pm)

    message = str(info.value)
    assert message.startswith(f"{path}:2: ")
    assert "No algorithms plugin is named 'nope'; valid algorithms: grpo, ppo" in message


def test_unknown_plugin_configurable_lists_the_valid_names():
    plugin = types.SimpleNamespace(rlax_register_rewards=hookimpl(lambda: {"exact": point}))
    pm = build_plugin_manager(autoload=False, builtins=False, extra=[plugin])

    with pytest.raises(ConfigError, match="valid rewards: exact$"):
        config.parse([], ["rewards.exakt.x = 1"], plugins=pm)


def test_required_value_left_unset_is_an_error(tmp_path):
    path = write(tmp_path / "main.gin", "point.x = %gin.REQUIRED\n")

    with pytest.raises(
        ConfigError, match=r"^cfgtest.point.x is required \(.*main.gin:1\) and not set"
    ):
        config.parse([path], [])
    config.parse([path], ["point.x = 3"])
    assert config.configured("cfgtest", "point")() == (3, 0)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="nope.gin: no such gin file"):
        config.parse([tmp_path / "nope.gin"], [])


def test_missing_include_is_an_error_with_its_location(tmp_path):
    path = write(tmp_path / "main.gin", 'include "gone.gin"\n')

    with pytest.raises(ConfigError) as err:
        config.parse([path], [])
    assert str(err.value) == (
        f"{path}:1: include 'gone.gin': no such file beside the including file, in the "
        "working directory or among rlax's packaged configs"
    )


# -- registration ------------------------------------------------------------


def test_registration_is_idempotent_and_replaces_a_changed_factory():
    gin.parse_config("point.x = 4")
    config.register_configurables("cfgtest", {"point": point})
    assert config.configured("cfgtest", "point")() == (4, 0)

    config.register_configurables("cfgtest", {"point": other_point})

    assert config.configured("cfgtest", "point")() == (-4, 0)


def test_exclusive_registration_drops_the_module_s_other_names():
    config.register_configurables("cfgtest", {"extra": other_point})
    config.register_configurables("cfgtest", {"point": point}, exclusive=True)

    with pytest.raises(ConfigError, match="'cfgtest.extra'"):
        config.configured("cfgtest", "extra")
    assert config.configured("cfgtest", "point")() == (0, 0)


def test_registration_works_after_the_config_is_locked(tmp_path):
    config.parse([write(tmp_path / "a.gin", "point.x = 1\n")], [])
    assert gin.config_is_locked()

    config.register_configurables("cfgtest", {"late": other_point})

    assert gin.config_is_locked()
    assert config.configured("cfgtest", "late")(x=2) == (-2, 0)


def test_core_configurables_optax_and_rlax():
    from rlax.core.trainer.spec import TrainerSpec

    config.register_core_configurables()
    config.register_core_configurables()  # idempotent

    config.parse(
        [],
        [
            "optax.adam.learning_rate = 0.5",
            "rlax.run.train = @rlax.train()",
            "rlax.train.steps = 9",
        ],
    )

    optimizer = config.configured("optax", "adam")().build()  # a setting until the trainer's
    grads = {"w": np.ones(2, np.float32)}
    updates, _ = optimizer.update(grads, optimizer.init(grads))
    np.testing.assert_allclose(updates["w"], [-0.5, -0.5], rtol=1e-5)  # Adam's first step: -lr
    assert config.configured("rlax", "train")() == TrainerSpec(steps=9)  # the trainer's part
    for name in ("adamw", "sgd", "constant_schedule", "linear_schedule"):
        config.configured("optax", name)
    schedule = config.configured("optax", "warmup_cosine_decay_schedule")(
        init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=4
    ).build()
    assert float(schedule(1)) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("binding", "instead"),
    [
        ("rlax.train.task = None", "rlax.run.task"),
        ("rlax.worker.reward = None", "rlax.run.reward"),
        ("rlax.worker.curation = []", "rlax.run.curation"),
        ("rlax.train.init_checkpoint = 'm'", "rlax.run.init_checkpoint"),
        ("rlax.train.deterministic = True", "rlax.run.deterministic"),
        ("rlax.worker.deterministic = True", "rlax.run.deterministic"),
        ("rlax.train.seed = 1", "rlax.run.seed"),
        ("rlax.param_server.max_staleness = 1", "rlax.run.max_staleness"),
        ("rlax.local_cluster.settings = None", "rlax.run.server"),
        ("rlax.train.held_out = None", "rlax.run.held_out"),
        ("rlax.evaluate.eval_samples = 2", "rlax.held_out.samples"),
        ("rlax.evaluate.eval_ks = (1,)", "rlax.held_out.ks"),
    ],
)
def test_a_role_binding_of_a_setting_the_run_holds_is_refused_naming_its_new_name(
    tmp_path, binding, instead
):
    config.register_core_configurables()
    old = binding.split(" =")[0]
    says = f"{old} is the run's now, one value for every role: bind {instead} instead"

    with pytest.raises(ConfigError) as on_line:
        config.parse([], [binding])
    with pytest.raises(ConfigError) as in_file:
        config.parse([write(tmp_path / "old.gin", f"# an old experiment\n{binding}\n")], [])

    assert str(on_line.value) == f"--gin.{binding}: {says} (configs/base/roles.gin)"
    assert str(in_file.value) == f"{tmp_path / 'old.gin'}:2: {says} (configs/base/roles.gin)"


def test_config_texts_show_bound_and_used_values(tmp_path):
    config.parse([write(tmp_path / "a.gin", "point.x = 3\n")], [])
    assert "point.x = 3" in config.config_text()
    assert "point.x" not in config.operative_config_text()

    config.configured("cfgtest", "point")()

    assert "point.x = 3" in config.operative_config_text()
    assert "point.y = 0" in config.operative_config_text()


def test_a_required_value_left_unset_names_it_and_where_it_was_required(tmp_path):
    path = write(tmp_path / "roles.gin", "# wiring\nMODEL = %gin.REQUIRED\npoint.x = %MODEL\n")

    with pytest.raises(ConfigError) as info:
        config.parse([path], [])

    assert str(info.value) == (
        f"MODEL is required ({path}:2) and not set: set it in a gin file or with --gin.MODEL=..."
    )


def test_a_bare_word_is_a_syntax_error_with_a_hint_not_an_ast_repr(tmp_path):
    path = write(tmp_path / "bad.gin", "point.x = 1\npoint.y = five\n")

    with pytest.raises(ConfigError) as info:
        config.parse([path], [])

    assert str(info.value) == (
        f"{path}:2: syntax error: five is not a value (a string is quoted: 'five'; "
        "a macro is %five; a configurable is @five())"
    )


def test_a_gin_file_that_is_not_utf8_names_the_file_line_and_byte(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_bytes(b"point.x = 1\n# na\xefve\npoint.y = 2\n")
    outer = write(tmp_path / "outer.gin", "include 'bad.gin'\n")

    with pytest.raises(ConfigError) as alone:
        config.parse([str(bad)])
    with pytest.raises(ConfigError) as included:
        config.parse([outer])

    assert str(alone.value) == (
        f"{bad}:2: not UTF-8 text (byte 0xef at column 5); gin files are read as UTF-8: "
        "save it as UTF-8"
    )
    assert str(included.value) == f"{alone.value} (included from {outer}:1)"


def test_a_settings_object_bound_but_not_taken_is_refused_unless_scoped():
    """``rlax.mesh.tensor = 2`` with ``rlax.train.mesh`` unset would be ignored: refused,
    naming the parameter to bind (not roles.gin, which does not wire the mesh). A scoped
    binding (``sampler/rlax.mesh``) belongs to the reference that names its scope."""
    config.register_core_configurables()
    config.register_configurables("cfgtest", {"holder": lambda mesh=None: mesh})
    mesh_only = ["rlax.mesh.tensor = 2"]
    scoped = ["cfgtest.holder.mesh = @sampler/rlax.mesh()", "sampler/rlax.mesh.tensor = 2"]

    with pytest.raises(ConfigError) as ignored:
        config.parse([], mesh_only)
    config.parse([], scoped)  # no error: the scoped mesh is built where it is referenced
    assert config.configured("cfgtest", "holder")().tensor == 2

    assert str(ignored.value) == (
        "--gin.rlax.mesh.tensor = 2: rlax.mesh.tensor is bound, but rlax.train.mesh is not "
        "@rlax.mesh(), so it would be ignored; bind rlax.train.mesh = @rlax.mesh()"
    )
