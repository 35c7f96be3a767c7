"""What rlax registers with gin is its own record, and a block can leave it as it found it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import gin

from rlax.core import configurables, gin_state
from rlax.core.configurables import configurables as registered
from rlax.core.configurables import kept, register_configurables
from rlax.core.param_server.transport import lanes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def point(x: int = 0) -> int:
    return x


def line(x: int = 0, y: int = 0) -> tuple[int, int]:
    return x, y


def test_a_module_holds_what_was_registered_under_it_and_exclusive_drops_the_rest():
    with kept():
        register_configurables("cfgkept", {"point": point, "line": line})
        register_configurables("cfgkept", {"line": line}, exclusive=True)

        assert sorted(registered("cfgkept")) == ["line"]
        assert not gin_state.is_registered("cfgkept.point")
        gin.bind_parameter("cfgkept.line.y", 3)
        assert registered("cfgkept")["line"]() == (0, 3)


def test_registering_the_same_factory_again_keeps_its_gin_entry():
    with kept():
        register_configurables("cfgkept", {"point": point})
        before = gin.get_configurable("cfgkept.point")
        register_configurables("cfgkept", {"point": point})

        assert gin.get_configurable("cfgkept.point") is before


def test_a_kept_block_puts_registrations_back_as_they_were():
    with kept():
        register_configurables("cfgkept", {"point": point})
        with kept():
            register_configurables("cfgkept", {"point": line}, exclusive=True)  # replaced
            register_configurables("cfgother", {"line": line})  # a new module
            assert registered("cfgkept")["point"]() == (0, 0)

        assert gin_state.configurable_of("cfgkept.point") is point
        assert sorted(registered("cfgkept")) == ["point"]
        assert registered("cfgother") == {}
        assert not gin_state.is_registered("cfgother.line")
    assert registered("cfgkept") == {}
    assert not gin_state.is_registered("cfgkept.point")


def test_a_kept_block_puts_gin_bindings_and_the_lock_back_as_they_were():
    with kept():
        register_configurables("cfgkept", {"point": point, "line": line})
        gin.bind_parameter("cfgkept.point.x", 1)
        with kept():
            gin.bind_parameter("cfgkept.point.x", 2)  # the same parameter, bound in place
            gin.bind_parameter("cfgkept.line.y", 5)
            gin.finalize()
            assert gin.config_is_locked()

        assert not gin.config_is_locked()
        assert gin.query_parameter("cfgkept.point.x") == 1
        assert gin_state.bindings_of("cfgkept.line") == {}
        with kept():
            gin.clear_config()
        assert gin.query_parameter("cfgkept.point.x") == 1


def test_a_plugin_manager_built_in_a_kept_block_leaves_the_lanes_as_they_were():
    """The leak of issue 51: a docs example's manager with one lane ('files') left every
    later lookup in the process with that lane alone."""
    from rlax.core import hookimpl
    from rlax.core.plugins import build_plugin_manager

    class Files:
        @hookimpl
        def rlax_register_weight_lanes(self):
            return {"files": lambda: None}

    before = sorted(lanes.factories())
    with kept():
        build_plugin_manager(autoload=False, builtins=False, extra=[Files()])
        assert sorted(lanes.factories()) == ["files"]

    assert sorted(lanes.factories()) == before
    assert {"bulk", "grpc", "split", "relay"} <= set(before)


def test_the_kept_record_is_the_module_s_own():
    # configurables() answers from what register_configurables recorded, not gin's registry:
    # a configurable registered with gin some other way is not one of the module's.
    with kept():
        gin_state.unregister("cfgkept.point")
        gin.external_configurable(point, name="point", module="cfgkept")
        try:
            assert registered("cfgkept") == {}
        finally:
            gin_state.unregister("cfgkept.point")
    assert configurables._registered.get("cfgkept") is None


def test_a_docs_example_s_lane_does_not_reach_a_later_test_module():
    """The issue's reproduction, in one pytest process in this order: the docs example
    registers one lane, then the bulk lane's tests ask for theirs."""
    first = "tests/test_plugin_hooks_docs.py::test_every_hook_s_example_runs"
    later = "tests/core/param_server/test_bulk.py::test_round_trip_on_either_path_is_bit_identical"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
        + ["-p", "no:random_order", f"{first}[rlax_register_weight_lanes]", later],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "3 passed" in result.stdout
