"""Preemption notices -> one "stop at the next safe point" event per process.

Preemption is normal, not an error (docs/preemption.md). A *notice source* is a
small plugin object that watches for one kind of notice and calls
``notify(reason)`` when it sees it::

    class NoticeSource(Protocol):
        def start(self, notify: Callable[[str], None]) -> None: ...
        def stop(self) -> None: ...

Three ship with rlax, each a gin configurable of module ``preemption``:

- ``@preemption.signals()`` — SIGTERM and SIGINT (what Kubernetes, Slurm
  and a spot VM's shutdown send first). The default.
- ``@preemption.notice_file(path=...)`` — a file appearing (a sidecar or an
  operator writes it).
- ``@preemption.gce_metadata()`` — Google Compute Engine's
  ``instance/preempted`` metadata value turning ``TRUE``; polled only when
  configured, so nothing talks to a metadata server by default.

A role builds one :class:`Preemption` from its sources, checks
``requested`` at its safe points (the trainer: after a step; a worker: after
a batch), and then stops in order: the trainer checkpoints, every role calls
:meth:`Preemption.stop_now`, which calls the ``rlax_on_preemption`` hook and
raises :class:`~rlax.core.errors.Preempted`, which the CLI turns into exit
status 75 (``EXIT_PREEMPTED``): a scheduler restarts the process rather than
counting a failure. ``noticed_at`` keeps when the notice came; ``stop_now`` tells the
local supervisor (:func:`rlax.core.runtime.recovery.write_notice`), so the restarted
process can count its recovery from the notice.
"""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Protocol, Self

from rlax.core.constraints import Positive
from rlax.core.errors import Preempted, RunFinished
from rlax.core.runtime import recovery

__all__ = [
    "FileNotice",
    "GceMetadataNotice",
    "NoticeSource",
    "Preemption",
    "SignalNotice",
]

log = logging.getLogger("rlax.preemption")

# The local supervisor ends a finished run's other processes with this signal
# (not SIGTERM): they stop the same way, but exit 0 without announcing a preemption.
FINISH_SIGNAL = signal.SIGUSR2

GCE_PREEMPTED_URL = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"


class NoticeSource(Protocol):
    """Watches for one kind of preemption notice."""

    def start(self, notify: Callable[[str], None]) -> None:
        """Begins watching; calls ``notify(reason)`` (from any thread) on a notice."""

    def stop(self) -> None:
        """Stops watching and releases what ``start`` took (handlers, threads)."""


class SignalNotice:
    """SIGTERM / SIGINT (by default) as notices. Main thread only, as Python's signals.

    Args:
      signals: signal names, e.g. ``("SIGTERM", "SIGINT", "SIGUSR1")``.
    """

    def __init__(self, *, signals: Sequence[str] = ("SIGTERM", "SIGINT")):
        try:
            self.signals = [signal.Signals[name] for name in signals]
        except KeyError as err:
            raise ValueError(f"preemption.signals: unknown signal {err.args[0]!r}") from None
        self._previous: dict[signal.Signals, Any] = {}

    def start(self, notify: Callable[[str], None]) -> None:
        for sig in self.signals:
            self._previous[sig] = signal.signal(
                sig, lambda signum, _: notify(signal.Signals(signum).name)
            )

    def stop(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class _Poller:
    """A daemon thread calling ``check()`` every ``poll_s`` until a notice or ``stop``."""

    def __init__(self, poll_s: float):
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        self.poll_s = poll_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> str | None:
        raise NotImplementedError

    def start(self, notify: Callable[[str], None]) -> None:
        def run() -> None:
            while not self._stopped.wait(self.poll_s):
                reason = self.check()
                if reason:
                    notify(reason)
                    return

        self._stopped.clear()
        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None


class FileNotice(_Poller):
    """A notice when ``path`` exists (checked every ``poll_s`` seconds).

    Args:
      path: the notice file. It is left in place (whoever wrote it removes it).
      poll_s: seconds between checks.
    """

    def __init__(self, *, path: str, poll_s: Annotated[float, Positive] = 1.0):
        super().__init__(poll_s)
        self.path = pathlib.Path(path)

    def check(self) -> str | None:
        return f"notice file {self.path}" if self.path.exists() else None


class GceMetadataNotice(_Poller):
    """GCE's preemption notice: the metadata value ``instance/preempted`` reads ``TRUE``.

    Args:
      url: the metadata value to poll.
      poll_s: seconds between polls.
      timeout_s: per request; an unreachable metadata server is logged once
        and polled again (it is not a notice).
    """

    def __init__(
        self,
        *,
        url: str = GCE_PREEMPTED_URL,
        poll_s: Annotated[float, Positive] = 5.0,
        timeout_s: Annotated[float, Positive] = 2.0,
    ):
        super().__init__(poll_s)
        self.url, self.timeout_s = url, timeout_s
        self._warned = False

    def check(self) -> str | None:
        request = urllib.request.Request(self.url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                value = reply.read(64).decode("ascii", "replace").strip()
        except (urllib.error.URLError, OSError) as err:
            if not self._warned:
                log.warning(
                    "preemption: metadata server %s unreachable (%s); still polling", self.url, err
                )
                self._warned = True
            return None
        return f"GCE metadata {self.url} = TRUE" if value.upper() == "TRUE" else None


class Preemption:
    """One process's stop-at-the-next-safe-point event, fed by notice sources.

    Args:
      sources: the notice sources (None: ``[SignalNotice()]``; ``[]``: none).
      role: this process's role, for the log and the hook.
      hook: a plugin manager's hook relay (``rlax_on_preemption`` is called by
        :meth:`stop_now`), or None.

    Use as a context manager (or ``start()`` / ``close()``).
    """

    def __init__(
        self, sources: Sequence[NoticeSource] | None = None, *, role: str, hook: Any = None
    ):
        self.sources = list(sources) if sources is not None else [SignalNotice()]
        self.role = role
        self.hook = hook
        self._event = threading.Event()
        self.reason: str | None = None
        self.noticed_at: float | None = None  # Unix seconds
        self.finished = False
        self._started = False
        self._previous_finish: Any = None

    def start(self) -> Self:
        for source in self.sources:
            source.start(self.notify)
        if threading.current_thread() is threading.main_thread():
            self._previous_finish = signal.signal(FINISH_SIGNAL, self._finish)
        self._started = True
        return self

    def close(self) -> None:
        if self._started:
            for source in self.sources:
                source.stop()
            if self._previous_finish is not None:
                signal.signal(FINISH_SIGNAL, self._previous_finish)
                self._previous_finish = None
            self._started = False

    def _finish(self, signum: int, frame: object) -> None:
        """The supervisor's "the run is over": stop at the next safe point, quietly."""
        self.finished = True
        if not self._event.is_set():
            self.reason = "the run finished"
            self._event.set()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def notify(self, reason: str) -> None:
        """Records a notice (the first reason is kept); safe from signal handlers and threads."""
        if not self._event.is_set():
            self.reason = reason
            self.noticed_at = time.time()
            self._event.set()
            # Logging from a signal handler can deadlock on the handler's lock: print instead.
            os.write(
                2,
                f"rlax: {self.role}: preemption notice ({reason}); stopping at the next safe point\n".encode(),
            )

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleeps until a notice or ``timeout``; True if a notice came."""
        return self._event.wait(timeout)

    def stop_now(self) -> None:
        """At a safe point after a notice: calls ``rlax_on_preemption`` and raises Preempted."""
        if self.finished:
            raise RunFinished(f"{self.role}: the run finished")
        reason = self.reason or "requested"
        recovery.write_notice(self.noticed_at or time.time(), reason)
        if self.hook is not None:
            self.hook.rlax_on_preemption(role=self.role, reason=reason)
        raise Preempted(f"{self.role} stopped at a safe point ({reason})")
