"""A worker's relay: it serves the version it holds, or is receiving, to other workers.

The parameter server decides who pulls from whom (:mod:`rlax.core.param_server.transport.relay_routes`);
this module is the worker's side. :class:`Relay` listens beside the worker
and streams its pull buffer to each puller the server sent, **as the bytes
arrive** (cut-through): a chain or tree of relays then moves a version at the
speed of one link, not one link per hop. A puller greets a relay with
``RLXR + version + key`` (key: an HMAC of the shared token and the version,
handed out with the server's pull ticket); a relay that does not hold that
version, or a wrong key, closes the connection at once.

Integrity never depends on the relay: the puller checks every segment
against the checksums the *server* gave it (relay_lane.py), so a relay
that dies mid-transfer, serves another version or corrupts a byte costs the
puller a retry from another source (which it reports, so the server stops
pointing to that relay), never a corrupt version. A relay whose own pull
fails cuts off its pullers the same way.

:class:`Limiter` is a token bucket for a node's uplink, used by the
simulation in ``benchmarks/fanout.py`` to rate-limit links in user space.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

from rlax.core.param_server.transport import transfer

log = logging.getLogger("rlax.relay")

RELAY_MAGIC = b"RLXR"
_HELLO = struct.Struct("<4sQ16s")  # magic, version, key
_STEP = 64 << 10  # bytes per send between checks (and per limiter grant)


def relay_key(token: str, version: int) -> bytes:
    """The 16-byte key that opens a relay's stream of ``version`` (HMAC-SHA256 of the token)."""
    return hmac.new(token.encode(), b"rlax-relay/%d" % version, hashlib.sha256).digest()[:16]


def relay_hello(version: int, key: bytes) -> bytes:
    return _HELLO.pack(RELAY_MAGIC, version, key)


class Limiter:
    """A token bucket: ``take(n)`` blocks until ``n`` more bytes fit ``bytes_per_s``.

    Shared by every connection of one node, it stands for that node's uplink.
    """

    def __init__(self, bytes_per_s: float, burst: int = _STEP):
        self.rate, self.burst = float(bytes_per_s), burst
        self._lock = threading.Lock()
        self._tokens, self._at = float(burst), time.monotonic()

    def take(self, n: int) -> None:
        with self._lock:  # callers queue here, so the rate is shared fairly
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= n
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
            if wait:
                time.sleep(wait)


def send_view(
    conn: socket.socket,
    view: memoryview,
    limiter: Limiter | None = None,
    count: Callable[[int], None] | None = None,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Sends ``view`` (one ``sendall`` without a limiter), counting bytes as they go.

    Bytes are counted as they are handed to the socket, before the peer can hold
    them (see ``_counted``). With ``alive``, stops with ConnectionError as soon
    as it returns False.
    """
    if limiter is None and alive is None:
        _counted(count, len(view), conn.sendall, view)
        return
    for start in range(0, len(view), _STEP):
        if alive is not None and not alive():
            raise ConnectionError("relay: the stream was withdrawn")
        step = view[start : start + _STEP]
        if limiter is not None:
            limiter.take(len(step))
        _counted(count, len(step), conn.sendall, step)


def _counted(
    count: Callable[[int], None] | None, n: int, send: Callable[..., object], *args: object
) -> None:
    """Counts ``n`` bytes, then sends them; takes the count back if the send fails.

    Counting first means a peer that holds the bytes always finds them counted:
    a puller that reads a server's counter right after its pull ends sees its
    own transfer in full (counted after ``sendall``, the last chunk could still
    be missing from it while the puller already had it).
    """
    if count is not None:
        count(n)
    try:
        send(*args)
    except BaseException:
        if count is not None:
            count(-n)
        raise


def send_file(
    conn: socket.socket,
    fd: int,
    nbytes: int,
    limiter: Limiter | None = None,
    count: Callable[[int], None] | None = None,
) -> None:
    """Sends the first ``nbytes`` of the open file ``fd`` with ``sendfile``, counting them.

    The bytes go from the kernel's page cache to the socket without passing
    through this process's memory; ``fd``'s offset is left alone (a copy of it
    is read at explicit offsets), so several sends of one file can run at once.
    """
    step = nbytes if limiter is None else _STEP
    with open(os.dup(fd), "rb") as f:
        for start in range(0, nbytes, max(1, step)):
            n = min(step, nbytes - start)
            if limiter is not None:
                limiter.take(n)
            _counted(count, n, _send_part, conn, f, start, n)


def _send_part(conn: socket.socket, f, start: int, n: int) -> None:
    if conn.sendfile(f, start, n) != n:
        raise ConnectionError(f"sendfile: the file ended before byte {start + n}")


class Relay:
    """Serves this worker's pull buffer to the pullers the server points here.

    ``begin(version, buffer)`` when a pull starts, ``progress(n)`` as bytes
    land, ``done()`` or ``fail()`` at its end.
    """

    def __init__(
        self,
        token: str,
        host: str = "127.0.0.1",
        *,
        max_connections: int = 16,
        timeout_s: float = 60.0,
        egress: Limiter | None = None,
    ):
        self._token = token
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.5)
        self.host, self.port = host, self._sock.getsockname()[1]
        self.timeout_s, self.egress = timeout_s, egress
        self.begin_wait_s = min(timeout_s, 10.0)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._cond = threading.Condition()
        self._generation, self._version, self._have = 0, -1, 0
        self._buffer = memoryview(b"")
        self.bytes_sent = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rlax-relay", daemon=True)
        self._thread.start()

    # -- the worker's pull drives these ---------------------------------------

    def begin(self, version: int, buffer: bytearray | memoryview) -> None:
        """A pull of ``version`` into ``buffer`` starts: streams of older bytes stop."""
        with self._cond:
            self._generation += 1
            self._version, self._have, self._buffer = version, 0, memoryview(buffer)
            self._cond.notify_all()

    def progress(self, received: int) -> None:
        with self._cond:
            self._have = received
            self._cond.notify_all()

    def done(self) -> None:
        self.progress(len(self._buffer))

    def fail(self) -> None:
        """The pull failed: every stream of it is cut off (its pullers will retry elsewhere)."""
        with self._cond:
            self._generation += 1
            self._version, self._have = -1, 0
            self._cond.notify_all()

    @property
    def version(self) -> int:
        """The version this relay serves (-1: none)."""
        with self._cond:
            return self._version

    def close(self) -> None:
        self._closed.set()
        self.fail()
        self._sock.close()
        self._thread.join(timeout=5)

    # -- serving ---------------------------------------------------------------

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(self.timeout_s)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = transfer._recv_exact(conn, _HELLO.size)
                magic, version, key = _HELLO.unpack(hello)
                expected = relay_key(self._token, version)
                if magic != RELAY_MAGIC or not hmac.compare_digest(key, expected):
                    log.warning("relay: bad greeting; closing")
                    return
                generation = self._generation_of(version)
                if generation is None:  # never serve another version than the one asked for
                    log.info(
                        "relay: asked for version %d, holding %d; closing", version, self.version
                    )
                    return
                self._stream(conn, generation)
        except OSError as err:
            log.info("relay: a stream ended early: %s", err)
        finally:
            self._slots.release()

    def _generation_of(self, version: int) -> int | None:
        """The generation serving ``version``; None if this relay does not hold it.

        The server registers a relay when it asks for ``version``, a moment before
        its own pull begins: a greeting for a newer version waits for that
        (``begin_wait_s``), one for an older version is refused at once.
        """
        deadline = time.monotonic() + self.begin_wait_s
        with self._cond:
            while self._version < version and time.monotonic() < deadline:
                self._cond.wait(0.1)
            return self._generation if self._version == version else None

    def _stream(self, conn: socket.socket, generation: int) -> None:
        sent = 0
        while True:
            with self._cond:
                deadline = time.monotonic() + self.timeout_s
                while self._generation == generation and self._have <= sent:
                    if sent == len(self._buffer) or time.monotonic() > deadline:
                        return
                    self._cond.wait(0.5)
                if self._generation != generation:
                    return  # the pull failed, or a newer one began: cut off
                view, have = self._buffer, self._have
            send_view(
                conn,
                view[sent:have],
                self.egress,
                self._count,
                alive=lambda: self._generation == generation,
            )
            sent = have

    def _count(self, n: int) -> None:
        with self._cond:
            self.bytes_sent += n
