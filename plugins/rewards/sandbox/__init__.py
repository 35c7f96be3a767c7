"""The sandbox untrusted programs run in: :func:`run.run_sandboxed` and its supervisor.

The code reward (:mod:`rlax.plugins.rewards.code`) and the Python tool
environment run programs through it. ``supervisor.py`` and the modules it
imports (``capture``, ``cgroup``, ``seccomp``, ``sweep``, ``world``) are standard library
only: the supervisor runs from this folder alone on ``sys.path``, so no module
here may share a name with one of the standard library.
"""
