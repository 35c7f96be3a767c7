"""How every rlax process writes to the terminal: its own log records and warnings as one line.

``rlax: warning: MESSAGE`` (and ``rlax: error: ...`` from the CLI) is the one
format a user sees, from the CLI and from every role it starts; other
libraries' records and warnings keep Python's format.
"""

from __future__ import annotations

import logging
import sys
import warnings

PYTHON_SHOWWARNING = warnings.showwarning


class Lines(logging.Formatter):
    """rlax's log records as ``rlax: warning: MESSAGE``; other libraries' as Python's default."""

    def __init__(self) -> None:
        super().__init__(logging.BASIC_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        if record.name == "rlax" or record.name.startswith("rlax."):
            return f"rlax: {record.levelname.lower()}: {record.getMessage()}"
        return super().format(record)


def log_as_rlax() -> None:
    """Log lines and warnings (:func:`show_warning`) in rlax's format on stderr.

    Importing orbax makes absl call ``logging.basicConfig()``, which gives the
    root logger a plain stderr handler in Python's ``WARNING:name:msg`` format;
    that handler (or a new one) gets :class:`Lines`. Handlers someone else
    installed (a test's capture, an application's) are left alone.
    """
    plain = [h for h in logging.root.handlers if type(h) is logging.StreamHandler]
    if not logging.root.handlers:
        plain = [logging.StreamHandler(sys.stderr)]
        logging.root.addHandler(plain[0])
    for handler in plain:
        if handler.stream in (sys.stderr, sys.__stderr__):
            handler.setFormatter(Lines())
    logging.getLogger("absl").addFilter(_NOISE)  # once: a filter is added only once
    warnings.showwarning = show_warning


class _CheckpointNoise(logging.Filter):
    """Drops two lines orbax logs through absl that tell a user nothing: "Metadata file
    does not exist" (a step folder without orbax's metadata: whether that checkpoint
    restores is said once, by rlax) and "Global object size logging disabled" (every
    checkpointer of one process)."""

    NOISE = ("Metadata file does not exist", "Global object size logging disabled")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOISE)


_NOISE = _CheckpointNoise()


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """rlax's own warnings as one ``rlax: warning: ...`` line; others as Python shows them."""
    if category.__module__.startswith("rlax."):
        print(f"rlax: warning: {message}", file=file or sys.stderr, flush=True)
        return
    PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)
