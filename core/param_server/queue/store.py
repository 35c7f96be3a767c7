"""The rollout queue's state in SQLite: what a restarted parameter server resumes from.

One database file (WAL mode) mirrors every place a prompt can be — the pool
of returned prompts, the leases, the submitted groups waiting for the trainer,
the takes being trained on, and the consumed log — plus the data cursor, the
counters and the curricula's state. :class:`QueueDB` offers one operation per
kind of change; the queue groups the operations of one call (a Lease, Submit,
Take, Ack or an expiry) in :meth:`QueueDB.transaction`, so the file always
holds the state between two calls, never half of one. WAL with
``synchronous=NORMAL`` makes a committed transaction survive the process being
killed (SIGKILL); only an operating-system crash can lose the last ones.

Prompts and groups are stored as their protocol messages (``PromptMsg``,
``GroupMsg``), the same bytes that travel on the wire.

Schema (version 1)::

    meta(key, value)                          cursor, counters, curricula, version floor
    pool(pos, prompt)                         returned prompts, served in ``pos`` order
    leases(lease_id, worker, prompt)
    queued(seq, grp)                          submitted groups, oldest first
    taken(take_id, idx, version, grp)         groups the trainer took, not yet acknowledged
    consumed(seq, prompt_id, take_id, version, lease_id, prompt)   the consumed log
    partials(prompt_id, msg)                  partial work attached to a prompt (pool or lease)

``partials`` holds ``SubmitPartialRequest`` messages; a database written
before it existed gains the (empty) table when opened, so the schema version
did not change.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pool (pos INTEGER PRIMARY KEY, prompt BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
  lease_id TEXT PRIMARY KEY, worker TEXT NOT NULL, prompt BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS queued (seq INTEGER PRIMARY KEY AUTOINCREMENT, grp BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS taken (
  take_id TEXT NOT NULL, idx INTEGER NOT NULL, version INTEGER NOT NULL, grp BLOB NOT NULL,
  PRIMARY KEY (take_id, idx));
CREATE TABLE IF NOT EXISTS consumed (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, prompt_id TEXT NOT NULL, take_id TEXT NOT NULL,
  version INTEGER NOT NULL, lease_id TEXT NOT NULL, prompt BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS partials (prompt_id TEXT PRIMARY KEY, msg BLOB NOT NULL);
"""


class QueueDBError(Exception):
    """The queue database cannot be used; the message names the file and the problem."""


class QueueDB:
    """The rollout queue's tables in one SQLite file (created if missing).

    Not thread-safe by itself: the queue calls it under its own lock.

    Raises:
      QueueDBError: the file is not a valid queue database (corrupt, another
        schema); the file is left untouched.
    """

    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._depth = 0
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            (ok,) = self._conn.execute("PRAGMA quick_check").fetchone()
            if ok != "ok":
                raise sqlite3.DatabaseError(ok)
            self._conn.executescript(_SCHEMA)
            version = self.get_meta("schema_version")
            if version is None:
                self._conn.execute(
                    "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(version) != SCHEMA_VERSION:
                raise QueueDBError(
                    f"{self.path}: queue database schema {version}, expected {SCHEMA_VERSION}"
                )
        except sqlite3.DatabaseError as err:
            raise QueueDBError(
                f"{self.path}: not a usable rollout-queue database ({err}); it was left as it "
                "is: move it away to start the queue afresh"
            ) from None

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Groups the operations inside into one transaction (nested: the outermost commits)."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            else:
                self._conn.execute("COMMIT")
            finally:
                self._depth = 0

    def _x(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, args)

    # -- meta ----------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self._x("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: Any) -> None:
        self._x("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def load_meta(self, key: str, default: Any = None) -> Any:
        raw = self.get_meta(key)
        return default if raw is None else json.loads(raw)

    # -- pool (served from the lowest pos) -----------------------------------

    def pool_push_front(self, prompt: bytes) -> None:
        self._x(
            "INSERT INTO pool VALUES ((SELECT COALESCE(MIN(pos), 0) - 1 FROM pool), ?)", (prompt,)
        )

    def pool_pop_front(self) -> None:
        self._x("DELETE FROM pool WHERE pos = (SELECT MIN(pos) FROM pool)")

    def pool(self) -> list[bytes]:
        return [r[0] for r in self._x("SELECT prompt FROM pool ORDER BY pos")]

    # -- leases ----------------------------------------------------------------

    def lease_add(self, lease_id: str, worker: str, prompt: bytes) -> None:
        self._x("INSERT INTO leases VALUES (?, ?, ?)", (lease_id, worker, prompt))

    def lease_del(self, lease_id: str) -> None:
        self._x("DELETE FROM leases WHERE lease_id = ?", (lease_id,))

    def leases(self) -> list[tuple[str, str, bytes]]:
        return list(self._x("SELECT lease_id, worker, prompt FROM leases ORDER BY rowid"))

    # -- queued groups -----------------------------------------------------------

    def queued_push(self, group: bytes) -> None:
        self._x("INSERT INTO queued (grp) VALUES (?)", (group,))

    def queued_push_front(self, group: bytes) -> None:
        self._x(
            "INSERT INTO queued (seq, grp) VALUES ((SELECT COALESCE(MIN(seq), 1) - 1 FROM queued), ?)",
            (group,),
        )

    def queued_pop_front(self) -> None:
        self._x("DELETE FROM queued WHERE seq = (SELECT MIN(seq) FROM queued)")

    def queued(self) -> list[bytes]:
        return [r[0] for r in self._x("SELECT grp FROM queued ORDER BY seq")]

    # -- partial work (one entry per prompt, the last handed in) -------------------

    def partial_put(self, prompt_id: str, msg: bytes) -> None:
        self._x("INSERT OR REPLACE INTO partials VALUES (?, ?)", (prompt_id, msg))

    def partial_del(self, prompt_id: str) -> None:
        self._x("DELETE FROM partials WHERE prompt_id = ?", (prompt_id,))

    def partials(self) -> list[bytes]:
        return [r[0] for r in self._x("SELECT msg FROM partials ORDER BY rowid")]

    # -- takes and the consumed log -------------------------------------------------

    def take_add(self, take_id: str, version: int, groups: list[bytes]) -> None:
        self._conn.executemany(
            "INSERT INTO taken VALUES (?, ?, ?, ?)",
            [(take_id, i, version, g) for i, g in enumerate(groups)],
        )

    def take_del(self, take_id: str) -> None:
        self._x("DELETE FROM taken WHERE take_id = ?", (take_id,))

    def takes(self) -> dict[str, tuple[int, list[bytes]]]:
        out: dict[str, tuple[int, list[bytes]]] = {}
        for take_id, version, grp in self._x(
            "SELECT take_id, version, grp FROM taken ORDER BY rowid, idx"
        ):
            out.setdefault(take_id, (version, []))[1].append(grp)
        return out

    def consumed_add(self, rows: list[tuple[str, str, int, str, bytes]]) -> None:
        """Appends (prompt_id, take_id, take version, lease_id, prompt) rows."""
        self._conn.executemany(
            "INSERT INTO consumed (prompt_id, take_id, version, lease_id, prompt) "
            "VALUES (?, ?, ?, ?, ?)",
            rows,
        )

    def consumed_since(self, version: int) -> list[tuple[str, bytes]]:
        """(prompt_id, prompt) of entries taken at ``version`` or later, in log order."""
        return list(
            self._x(
                "SELECT prompt_id, prompt FROM consumed WHERE version >= ? ORDER BY seq", (version,)
            )
        )

    def consumed_drop_since(self, version: int) -> None:
        self._x("DELETE FROM consumed WHERE version >= ?", (version,))

    def consumed_ids(self) -> list[str]:
        return [r[0] for r in self._x("SELECT prompt_id FROM consumed ORDER BY seq")]

    def recent_take_ids(self, n: int) -> list[str]:
        rows = self._x(
            "SELECT take_id FROM consumed GROUP BY take_id ORDER BY MAX(seq) DESC LIMIT ?", (n,)
        )
        return [r[0] for r in rows][::-1]


def read_consumed_log(path: str | pathlib.Path) -> list[str]:
    """The prompt ids of a queue database's consumed log, in order (read-only)."""
    uri = f"file:{pathlib.Path(path).absolute()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        return [r[0] for r in conn.execute("SELECT prompt_id FROM consumed ORDER BY seq")]
