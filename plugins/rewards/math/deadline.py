"""Deadlines for the math verifier that no library can swallow.

On the main thread the deadline is a ``SIGALRM`` timer (``signal.setitimer``)
whose handler raises :class:`VerifierTimeout`, a :class:`BaseException`: the
``except Exception`` blocks of math-verify, latex2sympy and sympy let it pass,
so a comparison stuck in Python-level code (sympy evaluating ``(10^{10})!``,
a factorial or a power tower) is interrupted at the deadline in the calling
process. The reward pool's workers and the trainer's inline path both call
the verifier on their main thread.

Signals reach only the main thread, so off it no timer can interrupt anything.
There the symbolic comparison runs in a child process started by
``forkserver`` (never ``fork``: the caller is multithreaded) and is killed at
the deadline: slower (the child imports sympy) but bounded. See
:func:`on_main_thread` and :func:`run_in_child`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["VerifierTimeout", "deadline", "on_main_thread", "run_in_child", "within"]


class VerifierTimeout(BaseException):
    """The verifier ran past its deadline.

    A ``BaseException`` on purpose: libraries that catch ``Exception`` around
    their own work (math-verify does, at every stage) must not be able to
    catch it and carry on without a deadline.

    Attributes:
      owner: the :func:`deadline` that expired (None for a killed child), so
        that a caller catches its own deadline and lets an outer one through.
    """

    def __init__(self, message: str, owner: object = None) -> None:
        super().__init__(message)
        self.owner = owner


@dataclasses.dataclass(eq=False)
class _Deadline:
    seconds: float
    end: float  # time.monotonic()


@dataclasses.dataclass
class _Timers:
    """The main thread's active deadlines, innermost last, and a foreign timer."""

    active: list[_Deadline] = dataclasses.field(default_factory=list)
    previous: Any = None  # the SIGALRM handler before the outermost deadline
    foreign_end: float = 0.0  # when a timer set by someone else fires (0: none)


_TIMERS = _Timers()


def on_main_thread() -> bool:
    """True where a ``SIGALRM`` deadline can interrupt the caller."""
    return threading.current_thread() is threading.main_thread()


def _arm() -> None:
    ends = [d.end for d in _TIMERS.active] + ([_TIMERS.foreign_end] if _TIMERS.foreign_end else [])
    signal.setitimer(signal.ITIMER_REAL, max(min(ends) - time.monotonic(), 1e-6))


# A raised timeout can be lost: Python ignores an exception raised in a
# weakref callback, a ``__del__`` or a garbage-collector callback (it prints
# "Exception ignored in ..."), and a bare ``except:`` swallows it. So every
# raise re-arms the timer this much later; the deadline's own exit disarms it.
RETRY_S = 0.02


def _unwinding(frame: Any) -> bool:
    """True while ``frame`` is the deadline's own entry or exit, or contextlib's.

    A timeout raised there would escape before the exit disarms the timer and
    pops the stack; the retry fires again once the block is back in user code.
    """
    code = frame.f_code if frame is not None else None
    return code is not None and (code is _DEADLINE_CODE or code.co_filename == contextlib.__file__)


def _expire(signum: int, frame: Any) -> None:
    now = time.monotonic() + 1e-4  # the timer's clock and monotonic differ by a hair
    due = [d for d in _TIMERS.active if d.end <= now]
    if due:
        signal.setitimer(signal.ITIMER_REAL, RETRY_S)  # again, should this one be lost
        if _unwinding(frame):
            return
        first = min(due, key=lambda d: d.end)
        raise VerifierTimeout(f"took longer than {first.seconds:g}s", first)
    if _TIMERS.foreign_end and _TIMERS.foreign_end <= now:
        _TIMERS.foreign_end = 0.0  # the foreign timer's turn: its own handler decides
        if _TIMERS.active:
            _arm()
        if callable(_TIMERS.previous):
            _TIMERS.previous(signum, frame)
        elif _TIMERS.previous == signal.SIG_DFL:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGALRM)
    elif _TIMERS.active:
        _arm()  # early: wait for the next one that is due


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[object]:
    """Raises :class:`VerifierTimeout` in the block after ``seconds`` (main thread).

    Yields the deadline's handle (the ``owner`` of its timeout; None off the
    main thread). Deadlines nest: the earliest one fires, as its owner, and an
    outer one is re-armed when an inner one exits; a timer someone else set
    (``ITIMER_REAL``) still fires on time, through its own handler. A timeout
    that is swallowed (raised inside a weakref callback, or caught by a bare
    ``except:``) is raised again every :data:`RETRY_S` until the block exits.
    Off the main thread the block runs without a timer: use :func:`run_in_child`
    there for work that can hang.

    Raises:
      ValueError: ``seconds`` is not > 0.
    """
    if seconds <= 0:
        raise ValueError(f"deadline: seconds must be > 0, got {seconds}")
    if not on_main_thread():
        yield None
        return
    mine = _Deadline(seconds, time.monotonic() + seconds)
    if not _TIMERS.active:
        foreign = signal.getitimer(signal.ITIMER_REAL)[0]
        _TIMERS.foreign_end = time.monotonic() + foreign if foreign else 0.0
        _TIMERS.previous = signal.signal(signal.SIGALRM, _expire)
    _TIMERS.active.append(mine)
    _arm()
    try:
        yield mine
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)  # first: no alarm while the stack changes
        # Mine and any inner one left behind (an outer timeout can interrupt an
        # inner deadline's own clean-up): the stack never keeps a stale entry.
        if mine in _TIMERS.active:
            del _TIMERS.active[_TIMERS.active.index(mine) :]
        if _TIMERS.active:
            _arm()
        else:
            previous = _TIMERS.previous
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
            if _TIMERS.foreign_end:
                left = _TIMERS.foreign_end - time.monotonic()
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6))


_DEADLINE_CODE = deadline.__wrapped__.__code__  # type: ignore[attr-defined]


def within(seconds: float, function: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """``(True, function(*args))``, or ``(False, why)`` if its deadline passed.

    Only this call's own deadline is caught (or one of its inner ones, or a
    killed child's): the timeout of an enclosing deadline, still active,
    propagates to its owner.
    """
    try:
        with deadline(seconds):
            return True, function(*args)
    except VerifierTimeout as exc:
        if exc.owner is not None and exc.owner in _TIMERS.active:
            raise
        return False, str(exc)


def _child_main(sender: Any, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        sender.send(("ok", function(*args)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        sender.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()


def run_in_child(function: Callable[..., Any], args: tuple[Any, ...], seconds: float) -> Any:
    """``function(*args)`` in a fresh child process, killed after ``seconds``.

    Args:
      function: a module-level (picklable) function; its result must pickle.
      args: its arguments.
      seconds: the deadline, start-up of the child included.

    Returns:
      What ``function`` returned.

    Raises:
      VerifierTimeout: no result within ``seconds`` (the child is killed).
      RuntimeError: the child raised or died; the message says which.
    """
    context = multiprocessing.get_context("forkserver")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(sender, function, args), daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(seconds):
            raise VerifierTimeout(f"took longer than {seconds:g}s (child process killed)")
        status, value = receiver.recv()
    except EOFError:
        raise RuntimeError(f"math verifier child process died (exit {child.exitcode})") from None
    finally:
        child.kill()
        child.join()
        receiver.close()
    if status != "ok":
        raise RuntimeError(f"math verifier child process raised {value}")
    return value
