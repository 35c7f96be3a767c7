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
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["VerifierTimeout", "deadline", "on_main_thread", "run_in_child"]


class VerifierTimeout(BaseException):
    """The verifier ran past its deadline.

    A ``BaseException`` on purpose: libraries that catch ``Exception`` around
    their own work (math-verify does, at every stage) must not be able to
    catch it and carry on without a deadline.
    """


def on_main_thread() -> bool:
    """True where a ``SIGALRM`` deadline can interrupt the caller."""
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raises :class:`VerifierTimeout` in the block after ``seconds`` (main thread).

    Deadlines nest: inside another timer (an outer ``deadline`` or anyone's
    ``ITIMER_REAL``), the block gets ``min(seconds, outer remaining)`` and the
    outer timer is re-armed with what is left of it on exit, so it still
    fires (at once, if it expired meanwhile). Off the main thread the block
    runs without a timer: use :func:`run_in_child` there for work that can hang.
    """
    if not on_main_thread():
        yield
        return
    if seconds <= 0:
        raise VerifierTimeout("deadline already passed")
    outer = signal.getitimer(signal.ITIMER_REAL)[0]
    start = time.monotonic()

    def expire(signum: int, frame: object) -> None:
        raise VerifierTimeout(f"took longer than {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, outer) if outer else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer:
            left = outer - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6))


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
