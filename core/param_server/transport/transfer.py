"""How weight bytes travel: the bulk lane, and the checksum every path carries.

Two paths carry the same bytes and the same checks:

* **gRPC streams** (``WeightStore.Push`` / ``Pull``): ``WeightChunk`` messages
  encoded and decoded by hand around the payload (transport/chunk_codec.py), so
  a chunk's bytes are copied once on the way out and once on the way in. Always
  available, and the only path under TLS.
* **The bulk lane**: a plain TCP connection beside the gRPC server, for the
  bytes only. Control stays on gRPC: an authenticated ``Stage`` (push) or an
  ``OpenPull`` call validates the request and hands out a one-use ticket; the
  client connects to the lane's port, sends ``MAGIC + ticket``, and then
  the bytes flow with no message framing to build or parse. A push is a
  sequence of frames ``<length u64><xxh3_64 u64><data>`` written into a
  preallocated buffer on the server and verified frame by frame, answered with
  one reply frame; a pull is the served buffer sent in one ``sendall`` and
  received with ``recv_into`` into the puller's reusable buffer, verified
  against the segment checksums the ticket carried.

Every segment carries an xxh3_64 checksum (Collet, xxHash,
https://github.com/Cyan4973/xxHash: a non-cryptographic hash at memory speed,
~25 GB/s here vs ~4 GB/s for zlib's CRC32): it catches corruption, while the
token and the tickets keep strangers out.
"""

from __future__ import annotations

import functools
import logging
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable

import grpc
import xxhash

log = logging.getLogger("rlax.param_server")

MAGIC = b"RLX1"
TICKET_BYTES = 16
_FRAME = struct.Struct("<QQ")  # length, checksum
_REPLY = struct.Struct("<BI")  # status (0 = ok, else a grpc.StatusCode value), payload length
_CODES = {c.value[0]: c for c in grpc.StatusCode}
_RECV_MAX = 8 << 20


def checksum(data) -> int:
    """xxh3_64 of a bytes-like object."""
    return xxhash.xxh3_64_intdigest(data)


# -- the bulk lane: socket helpers -----------------------------------------


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], min(len(view) - got, _RECV_MAX))
        if not n:
            raise ConnectionError(f"bulk lane: connection closed after {got} of {len(view)} bytes")
        got += n


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def split_address(address: str) -> str:
    """The host part of ``host:port`` (brackets of an IPv6 literal removed)."""
    host = address.rpartition(":")[0] or address
    return host.strip("[]")


class BulkError(grpc.RpcError):
    """A bulk-lane transfer the server refused, with the gRPC status it would have used."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


# -- the bulk lane: client side ------------------------------------------


def _connect(
    host: str, port: int, ticket: bytes, timeout_s: float, hello: bytes | None = None
) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC + ticket if hello is None else hello)
    return sock


def _send_all(sock: socket.socket, views: list[memoryview]) -> None:
    """``sendall`` of several buffers with one gather-write per round (no joining copy)."""
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def _unavailable(fn):
    """Connection failures on the lane read as gRPC's UNAVAILABLE, which callers retry."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BulkError:
            raise
        except OSError as err:
            raise BulkError(grpc.StatusCode.UNAVAILABLE, f"bulk lane: {err}") from err

    return call


@_unavailable
def send_part(
    host: str,
    port: int,
    ticket: bytes,
    pieces: Iterable[tuple[int, memoryview]],
    *,
    timeout_s: float = 120.0,
) -> bytes:
    """Sends one staged part as frames; returns the server's serialized PushReply.

    Raises BulkError when the server refuses the part, or with UNAVAILABLE when
    the connection fails (the server restarting, say).
    """
    with _connect(host, port, ticket, timeout_s) as sock:
        try:
            for _, view in pieces:
                _send_all(sock, [memoryview(_FRAME.pack(len(view), checksum(view))), view])
        except OSError as err:  # refused mid-part: the server's reply says why
            try:
                status, n = _REPLY.unpack(_recv_exact(sock, _REPLY.size))
                payload = _recv_exact(sock, n)
            except OSError:
                raise err from None
        else:
            status, n = _REPLY.unpack(_recv_exact(sock, _REPLY.size))
            payload = _recv_exact(sock, n)
    if status:
        raise BulkError(
            _CODES.get(status, grpc.StatusCode.UNKNOWN), payload.decode(errors="replace")
        )
    return payload


@_unavailable
def receive_into(
    host: str,
    port: int,
    ticket: bytes,
    buffer: bytearray | memoryview,
    segments: list[tuple[int, int, int]],
    *,
    timeout_s: float = 120.0,
    hello: bytes | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> None:
    """Receives a pull's bytes into ``buffer`` and checks each segment's checksum.

    ``hello`` replaces the lane's ``MAGIC + ticket`` greeting (a relay's, see
    relay.py); ``on_progress(received)`` runs after every read (a relay
    forwards the bytes as they come).

    Raises BulkError: DATA_LOSS on a checksum mismatch, UNAVAILABLE when the
    connection fails.
    """
    view = memoryview(buffer)
    nbytes = len(buffer)
    with _connect(host, port, ticket, timeout_s, hello) as sock:
        got, next_seg = 0, 0
        while got < nbytes:
            n = sock.recv_into(view[got:], min(nbytes - got, _RECV_MAX))
            if not n:
                raise ConnectionError(f"bulk pull: connection closed after {got} of {nbytes} bytes")
            got += n
            if on_progress is not None:
                on_progress(got)
            while next_seg < len(segments) and sum(segments[next_seg][:2]) <= got:
                offset, length, expected = segments[next_seg]
                if checksum(view[offset : offset + length]) != expected:
                    raise BulkError(
                        grpc.StatusCode.DATA_LOSS,
                        f"bulk pull: checksum mismatch in the segment at {offset}",
                    )
                next_seg += 1
    if next_seg != len(segments):
        raise BulkError(
            grpc.StatusCode.DATA_LOSS,
            f"bulk pull: {len(segments) - next_seg} segments beyond the buffer",
        )


# -- the bulk lane: server side ------------------------------------------


class BulkLane:
    """The bulk lane's listener: one thread per connection, at most ``max_connections``.

    Tickets are issued by the gRPC handlers (after the token check and the
    request's validation) and are good for one connection within ``ttl_s``.
    A connection with a wrong magic, an unknown or expired ticket, or that
    stalls for ``timeout_s`` is closed without touching any state.
    """

    def __init__(self, host: str, *, max_connections: int = 16, timeout_s: float = 60.0):
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(1.0)
        self.port = self._sock.getsockname()[1]
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._tickets: dict[bytes, tuple[float, Callable, Callable]] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rlax-bulk", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._closed.set()
        self._sock.close()
        self._thread.join(timeout=5)
        self._expire(everything=True)

    def issue(
        self,
        handle: Callable[[socket.socket], None],
        expire: Callable[[], None],
        ttl_s: float = 60.0,
    ) -> bytes:
        """A one-use ticket: a connection presenting it runs ``handle(conn)``.

        ``expire()`` runs instead if no connection claims it within ``ttl_s``.
        """
        self._expire()
        ticket = secrets.token_bytes(TICKET_BYTES)
        with self._lock:
            self._tickets[ticket] = (time.monotonic() + ttl_s, handle, expire)
        return ticket

    def _expire(self, everything: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            gone = [
                t for t, (deadline, _, _) in self._tickets.items() if everything or deadline < now
            ]
            expired = [self._tickets.pop(t)[2] for t in gone]
        for fn in expired:
            fn()

    def _serve(self) -> None:
        while not self._closed.is_set():
            self._expire()
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                log.warning("bulk lane: too many connections; refusing %s", peer)
                conn.close()
                continue
            threading.Thread(
                target=self._connection, args=(conn, peer), name="rlax-bulk-conn", daemon=True
            ).start()

    def _connection(self, conn: socket.socket, peer) -> None:
        try:
            with conn:
                conn.settimeout(self.timeout_s)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = _recv_exact(conn, len(MAGIC) + TICKET_BYTES)
                with self._lock:
                    entry = self._tickets.pop(hello[len(MAGIC) :], None)
                if hello[: len(MAGIC)] != MAGIC or entry is None or entry[0] < time.monotonic():
                    log.warning("bulk lane: bad magic or unknown/expired ticket from %s", peer)
                    if entry is not None:
                        entry[2]()
                    return
                entry[1](conn)
        except (OSError, ConnectionError) as err:
            log.warning("bulk lane: connection from %s failed: %s", peer, err)
        finally:
            self._slots.release()


def reply(
    conn: socket.socket, code: grpc.StatusCode | None, payload: bytes, *, drain_bytes: int = 0
) -> None:
    """Writes a push's reply frame: ``code`` None means success.

    A refusal mid-part then reads and discards up to ``drain_bytes`` of what the
    client is still sending (for at most 10 s), so that closing does not reset
    the connection and destroy the reply before the client reads it.
    """
    status = 0 if code is None else code.value[0]
    conn.sendall(_REPLY.pack(status, len(payload)) + payload)
    if drain_bytes <= 0:
        return
    conn.shutdown(socket.SHUT_WR)
    deadline, scratch = time.monotonic() + 10.0, bytearray(1 << 20)
    while drain_bytes > 0 and time.monotonic() < deadline:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            n = conn.recv_into(scratch)
        except OSError:
            return
        if not n:
            return
        drain_bytes -= n


def read_frame_header(conn: socket.socket) -> tuple[int, int]:
    """(length, checksum) of the next push frame."""
    return _FRAME.unpack(_recv_exact(conn, _FRAME.size))


recv_into = _recv_into
