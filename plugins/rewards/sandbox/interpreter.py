"""Which interpreter the sandbox runs, and the few host paths it needs to run.

:func:`interpreter_world` lists what ``sandbox/world.py`` binds read-only into
the sandbox's otherwise empty root: the interpreter, its standard library
(``lib-dynload`` included), and the shared libraries that the interpreter and
the standard library's extension modules link against (as ``ldd`` resolves
them, the dynamic loader included). It also lists what to hide: any
``site-packages`` / ``dist-packages`` inside the standard library (``-I -S``
keeps them off ``sys.path``; hiding them keeps them off the disk too).
Computed once per process and interpreter.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys

__all__ = ["interpreter_world", "python_for_sandbox"]

_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")
_PATHS = (
    "import json, sys, sysconfig;"
    "p = sysconfig.get_paths();"
    "print(json.dumps({'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'],"
    " 'dynload': [d for d in sys.path if d.endswith('lib-dynload')]}))"
)


def _world_executable(path: pathlib.Path) -> bool:
    """True if an unprivileged user can execute ``path`` (every parent traversable)."""
    try:
        if not path.stat().st_mode & stat.S_IXOTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)
    except OSError:
        return False


@functools.cache
def python_for_sandbox() -> str:
    """A Python interpreter that the unprivileged sandbox uid can run."""
    candidates = [
        pathlib.Path(sys.executable).resolve(),
        *(pathlib.Path(p).resolve() for p in ("/usr/bin/python3", "/usr/local/bin/python3")),
    ]
    if os.geteuid() != 0:
        return str(candidates[0])
    for candidate in candidates:
        if candidate.is_file() and _world_executable(candidate):
            return str(candidate)
    raise RuntimeError(
        "no Python interpreter is executable by an unprivileged user "
        f"(tried {', '.join(map(str, candidates))})"
    )


def _shared_libraries(binaries: list[str]) -> set[str]:
    ldd = shutil.which("ldd")
    if ldd is None:
        raise RuntimeError(
            "the sandbox's minimal world needs ldd (glibc's libc-bin) to list the "
            "interpreter's shared libraries; install it, or run with namespaces=False"
        )
    found: set[str] = set()
    for start in range(0, len(binaries), 64):
        out = subprocess.run(
            [ldd, *binaries[start : start + 64]], capture_output=True, text=True, check=False
        ).stdout
        found.update(m.group(1) for m in _LDD_PATH.finditer(out))
    return found


@functools.cache
def interpreter_world(python: str) -> dict[str, list[str]]:
    """``{"binds": [...], "hide": [...]}``: the host paths ``python`` needs, and those to mask."""
    out = subprocess.run(
        [python, "-I", "-S", "-c", _PATHS], capture_output=True, text=True, check=True
    ).stdout
    paths = json.loads(out)
    libraries = {paths["stdlib"], paths["platstdlib"], *paths["dynload"]}
    extensions = [str(f) for d in paths["dynload"] for f in sorted(pathlib.Path(d).glob("*.so"))]
    binds = {python, *libraries, *_shared_libraries([python, *extensions])}
    hide = [
        str(pathlib.Path(lib) / name)
        for lib in sorted(libraries)
        for name in ("site-packages", "dist-packages")
        if (pathlib.Path(lib) / name).is_dir()
    ]
    return {"binds": sorted(binds), "hide": hide}
