"""The ``rlax`` command.

::

    rlax plugins [--json] [-p no:NAME | -p MODULE ...]
    rlax run  --gin FILE [--gin FILE ...] [--gin.NAME=VALUE ...] [-p ...]
              [--run-dir DIR | --resume [DIR]] [--start-over] [--role ROLE]
    rlax eval --gin FILE [--gin FILE ...] [--gin.NAME=VALUE ...] [-p ...] --checkpoint DIR
              [--out FILE]
    rlax curate --gin FILE [--gin FILE ...] [--gin.NAME=VALUE ...] [-p ...] [--out DIR]
    rlax show RUN [--traces N]

Start-up, in this order: let host memory be reused from step to step
(:mod:`rlax.core.parallel.host_memory`; before JAX starts), build the plugin manager and
load the plugins (registering their components with gin), register the core
configurables, parse the gin files and bindings; in a role that compiles, turn the
compilation cache on (:mod:`rlax.core.runtime.compile_cache`); then call the configured
``rlax.train`` or ``rlax.evaluate``. Exit statuses: :mod:`rlax.core.errors`' ``EXIT_*``.

A trainer of several processes (``rlax.train.distributed``, or the ``RLAX_*`` variables
of docs/mesh.md) joins the others before gin builds anything (the sampler, the task):
JAX's multi-process runtime must start before any code touches a device.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import pathlib
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlax.core import config
from rlax.core.config.bindings import closest_names
from rlax.core.config.train_settings import join_trainer_processes
from rlax.core.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    USAGE_ERROR_FILE_ENV,
    ConfigError,
    PluginError,
    Preempted,
    RunFinished,
)
from rlax.core.parallel import host_memory
from rlax.core.plugins import (
    BUILTIN_DISTRIBUTION,
    PluginManager,
    autoload_notice,
    build_plugin_manager,
    installed_entry_points,
)
from rlax.core.runtime import compile_cache, recovery, terminal
from rlax.core.runtime.jax_free import record_jax_free
from rlax.core.runtime.run_dir import RunDir
from rlax.core.spec.checks import check_run

if TYPE_CHECKING:
    from rlax.core.spec import RunSpec

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_PREEMPTED", "EXIT_USAGE", "main"]


ROLES = ("all", "inline", "param_server", "trainer", "worker")
_BINDING_PREFIX = "--gin."
_PLUGIN_COLUMNS = ("kind", "name", "plugin", "distribution", "version")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``rlax`` command line and returns its exit status.

    Args:
      argv: the arguments after the program name; ``sys.argv[1:]`` if None.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    recovery.start_process()  # ends with a supervisor that started it; no gRPC fork handlers
    terminal.log_as_rlax()
    try:
        host_memory.reuse_freed_memory()
    except ValueError as exc:  # a bad RLAX_HOST_MALLOC
        return _error(str(exc), EXIT_USAGE)
    parser = _parser()
    try:
        argv, bindings = _split_bindings(argv)
        args = parser.parse_args(argv)
        args.bindings = bindings
    except SystemExit as exc:  # argparse has printed usage or help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        return _error(str(exc), EXIT_USAGE)
    if bindings and args.command in ("plugins", "show"):
        return _error("--gin.NAME=VALUE bindings apply to 'run' and 'eval' only", EXIT_USAGE)
    try:
        with compile_cache.session():  # a refused role takes back the cache folder it made
            return args.handler(args, bindings)
    except (ConfigError, PluginError) as exc:
        return _error(str(exc), EXIT_USAGE)
    except RunFinished:
        return 0
    except Preempted as exc:
        print(f"rlax: preempted: {str(exc).splitlines()[0]}", file=sys.stderr)
        _say_how_to_resume(args, bindings, exc.run_dir)
        return EXIT_PREEMPTED
    except Exception:  # noqa: BLE001 -- report, then fail with a status rather than a crash
        traceback.print_exc()
        return EXIT_FAILURE


def _shared_options() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parent parsers of the subcommands: ``-p NAME`` (all) and ``--gin FILE`` (run/eval/curate)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-p",
        dest="plugins",
        action="append",
        default=[],
        metavar="NAME",
        help="load plugin NAME (an entry-point name or a module), or block it with no:NAME",
    )
    gin_files = argparse.ArgumentParser(add_help=False)
    gin_files.add_argument(
        "--gin",
        action="append",
        required=True,
        metavar="FILE",
        help="gin file, or the name of a packaged config (quickstart); repeatable",
    )
    return common, gin_files


def _parser() -> argparse.ArgumentParser:
    common, gin_files = _shared_options()
    parser = argparse.ArgumentParser(
        prog="rlax",
        description="RL for language models in JAX.",
        epilog="--gin.NAME=VALUE adds the gin binding NAME = VALUE (after the files).",
    )
    parser.add_argument("--version", action="version", version=f"rlax {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plugins = commands.add_parser("plugins", parents=[common], help="list registered components")
    plugins.add_argument("--json", action="store_true", help="print a JSON list")
    plugins.set_defaults(handler=_plugins)

    _add_run_command(commands, [common, gin_files])

    evaluate = commands.add_parser(
        "eval", parents=[common, gin_files], help="evaluate a checkpoint (rlax.evaluate)"
    )
    evaluate.add_argument("--checkpoint", type=pathlib.Path, required=True, metavar="DIR")
    evaluate.add_argument(
        "--out", type=pathlib.Path, default=None, metavar="FILE", help="write the results as JSON"
    )
    evaluate.set_defaults(handler=_eval)

    curate = commands.add_parser(
        "curate", parents=[common, gin_files], help="curate a dataset offline (rlax.curate)"
    )
    curate.add_argument("--out", type=pathlib.Path, default=None, metavar="DIR")
    curate.set_defaults(handler=_curate)

    show = commands.add_parser("show", help="a run's state, evaluations and latest rollouts")
    show.add_argument("run_dir", type=pathlib.Path, metavar="RUN", help="a run directory")
    show.add_argument(
        "--traces",
        type=int,
        default=2,
        metavar="N",
        help="how many of the latest traced groups to print (default 2)",
    )
    show.set_defaults(handler=_show)
    return parser


def _add_run_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parents: list[argparse.ArgumentParser],
) -> None:
    """``rlax run``: where the run lives (a new, given or resumed run directory) and the role."""
    run = commands.add_parser("run", parents=parents, help="train (rlax.train)")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--run-dir", type=pathlib.Path, default=None, metavar="DIR")
    where.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        type=pathlib.Path,
        metavar="DIR",
        help="continue the run in DIR (default: the newest run of rlax.train.run_name)",
    )
    run.add_argument(
        "--start-over",
        action="store_true",
        help="with --resume or --run-dir: if none of the run's checkpoints can be restored, "
        "train it again from step 0 (they are moved aside) instead of refusing",
    )
    run.add_argument(
        "--role",
        choices=ROLES,
        default="all",
        help="all (default): parameter server + trainer + workers on this machine, supervised; "
        "inline: trainer with an in-process sampler; or one role of a cluster deployment",
    )
    run.set_defaults(handler=_run)


def _version() -> str:
    try:
        return importlib.metadata.version(BUILTIN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def _split_bindings(argv: list[str]) -> tuple[list[str], list[str]]:
    """Takes ``--gin.NAME=VALUE`` out of ``argv`` as gin bindings ``NAME=VALUE``."""
    rest, bindings = [], []
    for arg in argv:
        if not arg.startswith(_BINDING_PREFIX):
            rest.append(arg)
        elif "=" in arg:
            bindings.append(arg[len(_BINDING_PREFIX) :])
        else:
            raise ValueError(f"{arg}: a binding needs a value: --gin.NAME=VALUE")
    return rest, bindings


def _error(message: str, status: int) -> int:
    # gin appends "In call to configurable ..."; the message already says what and where.
    message = message.split("\n  In call to configurable")[0]
    if status == EXIT_USAGE and (report := os.environ.get(USAGE_ERROR_FILE_ENV)):
        pathlib.Path(report).write_text(message)  # the supervisor prints it, once
        return status
    print(f"rlax: error: {message}", file=sys.stderr)
    return status


def _plugin_manager(args: argparse.Namespace) -> PluginManager:
    disabled = [p.removeprefix("no:") for p in args.plugins if p.startswith("no:")]
    extra = [p for p in args.plugins if not p.startswith("no:")]
    known = sorted({ep.name for ep in installed_entry_points()})
    for name in disabled:
        if name not in known:  # a typo would otherwise block nothing, silently
            raise PluginError(
                f"-p no:{name}: no installed plugin is named {name!r}{closest_names(name, known)}"
            )
    return build_plugin_manager(disabled=disabled, extra=extra)


def _configure(args: argparse.Namespace, bindings: list[str]) -> PluginManager:
    pm = _plugin_manager(args)
    config.register_core_configurables()
    config.parse(args.gin, bindings, plugins=pm)
    return pm


def _plugins(args: argparse.Namespace, bindings: list[str]) -> int:
    pm = _plugin_manager(args)
    if notice := autoload_notice(pm):
        print(f"rlax: {notice}", file=sys.stderr)
    rows = [
        {column: str(getattr(c, column)) for column in _PLUGIN_COLUMNS} for c in pm.components()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    table = [{c: c.upper() for c in _PLUGIN_COLUMNS}, *rows]
    widths = {c: max(len(row[c]) for row in table) for c in _PLUGIN_COLUMNS}
    for row in table:
        print("  ".join(row[c].ljust(widths[c]) for c in _PLUGIN_COLUMNS).rstrip())
    return EXIT_OK


def _status(result: object) -> int:
    if result is None:
        return EXIT_OK
    if isinstance(result, int) and not isinstance(result, bool):
        return result
    raise TypeError(f"expected an exit status (int or None), got {result!r}")


def _run(args: argparse.Namespace, bindings: list[str]) -> int:
    pm, spec = _configure_run(args, bindings)
    role = args.role
    given = _given_run_dir(args, spec)
    if not config.supervised():  # a supervisor's child runs the spec it checked (its digest)
        check_run(spec, role, given)  # the whole specification, before any work or run dir
    if role in ("trainer", "inline"):
        join_trainer_processes(spec)
    if role not in ("all", "param_server"):  # they compile nothing (the supervisor: no JAX)
        compile_cache.start(spec.compile_cache, given)  # None: in RUN, later
    if role == "worker":
        from rlax.core.worker.role import worker

        return _status(worker(spec, hook=pm.hook))
    if role == "param_server":
        from rlax.core.param_server.role import param_server

        return _status(param_server(spec, hook=pm.hook, run_dir=given.path if given else None))
    if given is not None:
        lead = role == "all" or _multihost().is_lead()  # the supervisor never starts JAX
        if _says_finished(given, spec, lead):  # before any role starts
            return EXIT_OK
        before = given.contents() if role == "all" else frozenset()
        status = _train(args, pm, spec, given)
        if status == EXIT_USAGE and role == "all":  # a child refused: take back what it made
            given.remove_new(before)
        return status
    if role != "all":  # trainer process 0 makes it, once the trainer's settings are checked
        return _train(args, pm, spec, None)
    # One run directory for every child and every restart: resuming needs it.
    run_dir = RunDir.make(spec.train.run_root, spec.train.run_name)
    status = _train(args, pm, spec, run_dir)
    if status == EXIT_USAGE:  # a child refused its settings before any step
        run_dir.remove_fresh()
    return status


def _configure_run(args: argparse.Namespace, bindings: list[str]) -> tuple[PluginManager, RunSpec]:
    """The plugins, and the run specification gin builds once from the files and bindings."""
    pm = _configure(args, bindings)
    return pm, config.build_spec(pm)


def _train(
    args: argparse.Namespace, pm: PluginManager, spec: RunSpec, run_dir: RunDir | None
) -> int:
    """Every role on this machine (``all``), or the trainer in this process, in ``run_dir``.

    The children of ``all`` read the specification this process built, as the gin text it
    was built from (``RUN/spec.gin``, :func:`rlax.core.config.save_spec`): a restarted
    child runs the same run even if the files it came from were edited meanwhile.
    """
    if args.role == "all":
        assert run_dir is not None
        spec_file, spec_env = config.save_spec(run_dir)
        child_argv = ["--gin", str(spec_file), *(f"-p{p}" for p in args.plugins)]
        child_argv += ["--run-dir", str(run_dir)] + ["--start-over"] * args.start_over
        from rlax.core.launch.local_cluster import local_cluster

        try:
            status = _status(local_cluster(spec, argv=child_argv, env=spec_env))
        finally:  # checked last, whatever the run did: the supervisor never needs JAX
            record_jax_free(run_dir, "supervisor")
        if status == EXIT_PREEMPTED:
            _say_how_to_resume(args, args.bindings, run_dir)
        return status
    from rlax.core.trainer.role import train

    return _status(train(spec, hook=pm.hook, run_dir=run_dir, inline=args.role == "inline"))


def _says_finished(run_dir: RunDir, spec: RunSpec, lead: bool) -> bool:
    """The one place a run is found finished: True (and process 0 says so) if it has
    nothing left to do at ``rlax.train.steps``; then no role starts."""
    finished = run_dir.finished_message(spec.train.steps)
    if finished and lead:
        print(finished, flush=True)
    return finished is not None


def _multihost() -> Any:
    from rlax.core.parallel import multihost  # its is_lead imports JAX: only a trainer asks

    return multihost


def _given_run_dir(args: argparse.Namespace, spec: RunSpec) -> RunDir | None:
    """``--run-dir DIR``, ``--resume DIR`` (checked), bare ``--resume`` (newest run), or None."""
    if args.resume:
        given = RunDir.resumed(args.resume, spec.train.run_root, spec.train.run_name)
    elif args.run_dir:
        given = RunDir(args.run_dir)
    else:
        return None
    return dataclasses.replace(given, start_over=args.start_over)


def _say_how_to_resume(
    args: argparse.Namespace, bindings: list[str], run_dir: RunDir | pathlib.Path | None
) -> None:
    # Only the roles a person starts by hand: a cluster's scheduler restarts the others.
    if getattr(args, "role", None) not in ("all", "inline") or run_dir is None:
        return
    command = RunDir.of(run_dir).resume_command(args.gin, bindings, args.plugins, args.role)
    print(f"rlax: resume with: {command}", file=sys.stderr, flush=True)


def _eval(args: argparse.Namespace, bindings: list[str]) -> int:
    # INIT_CHECKPOINT is the checkpoint: configs that require it need no placeholder here.
    checkpoint = [f"INIT_CHECKPOINT = {str(args.checkpoint)!r}"]
    pm, spec = _configure_run(args, [*bindings, *checkpoint])
    check_run(spec, "eval")  # before the checkpoint loads (which names --checkpoint)
    compile_cache.start(spec.compile_cache, RunDir.owning(args.checkpoint))
    from rlax.core.evaluation.evaluate import evaluate

    return _status(evaluate(spec, hook=pm.hook, checkpoint=args.checkpoint, out=args.out))


def _curate(args: argparse.Namespace, bindings: list[str]) -> int:
    from rlax.core.evaluation import curate

    pm = _plugin_manager(args)
    config.register_core_configurables()
    config.register_configurables("rlax", {"curate": curate.curate})
    config.parse(args.gin, bindings, plugins=pm)
    run = config.configured("rlax", "curate")
    overrides = {"output_dir": str(args.out)} if args.out else {}
    return _status(run(hook=pm.hook, **overrides))


def _show(args: argparse.Namespace, bindings: list[str]) -> int:
    from rlax.core.evaluation.show import show_run

    run_dir = RunDir(args.run_dir).checked(str(args.run_dir))
    print(show_run(run_dir, traces_shown=args.traces))
    return EXIT_OK


if __name__ == "__main__":
    recovery.exit_promptly(main())
