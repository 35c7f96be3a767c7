"""Where the parameter server listens, how clients reach it, and the shared secret.

Values come from gin (``rlax.ps_settings``) and the environment: the
environment wins for the address and token, so a supervisor or a cluster
scheduler can place processes without editing gin files.

  RLAX_PS_ADDRESS     host:port of the server (clients) / to bind (server)
  RLAX_PS_TOKEN       the shared token
  RLAX_PS_TOKEN_FILE  a file holding the token (first line)

A weight lane's own options (the relay fan-out, the weight shards, ...) are
its factory's parameters, ``weight_lanes.<name>.<param>`` in gin
(core/weight_lane.py), not fields here.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import grpc

from rlax.core.configurables import configurables
from rlax.core.constraints import AtLeast, OneOf, checked_by
from rlax.core.errors import BadSetting
from rlax.core.types import ConfigPath

ADDRESS_ENV = "RLAX_PS_ADDRESS"
TOKEN_ENV = "RLAX_PS_TOKEN"
TOKEN_FILE_ENV = "RLAX_PS_TOKEN_FILE"
MB = 1 << 20


LANE_KIND = "weight_lanes"  # the weight lanes' plugin kind, also their gin module


def lane_refusal(names: Sequence[str], known: Iterable[str]) -> str | None:
    """Why ``names`` is not a non-empty list of ``known`` lanes (None: it is)."""
    valid = sorted(known)
    unknown = [n for n in names if n not in valid]
    if not unknown and names:
        return None
    what = f"unknown weight lane {unknown[0]!r}" if unknown else "no weight lane"
    return f"{what}; valid weight lanes: {', '.join(valid) or '(none registered)'}"


def _known_lanes(*, weight_lanes: Any = (), **_: Any) -> None:
    """BadSetting unless ``weight_lanes`` names lanes of the plugin manager in use (checked
    before any role); with none loaded, where the lanes are built (transport/lanes.py)."""
    known = configurables(LANE_KIND)
    why = lane_refusal(tuple(weight_lanes or ()), known) if known else None
    if why is not None:
        raise BadSetting("weight_lanes", why)


@checked_by(_known_lanes)
@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """Connection settings shared by the server and its clients.

    Args:
      address: ``host:port``. The server binds to it (loopback by default: a
        wider address must be configured on purpose).
      token: shared secret for Push, Lease, Submit, Take and Ack.
      token_file: read the token from this file instead.
      tls_cert: PEM certificate chain. Set: the server serves TLS with it and
        ``tls_key``, and clients trust it as their root.
      tls_key: PEM private key (server only).
      tls_server_name: the name clients check in the certificate.
      chunk_mb: size of weight chunks on the wire.
      max_message_mb: gRPC message limit, both directions.
      max_version_mb: the largest weight version the server accepts.
      wire_dtype: dtype of weights on the wire: "float32" or "bfloat16".
      weight_lanes: the weight lanes, in order (transport/lanes.py): each push and
        pull goes through the first that carries it, and the server mounts the
        server half of each that has one. Built-ins: ``split`` (a store split over
        ``weight_lanes.split.shards``), ``relay`` (``weight_lanes.relay.fanout``,
        workers only), ``bulk`` (a plain TCP connection beside gRPC,
        transport/transfer.py; off under TLS) and ``grpc`` (streams; always
        available: the server's own ``WeightStore`` service).
      lanes: the lanes of ``weight_lanes`` as configured, ``(name, lane)`` pairs,
        pinned once (``transport.lanes.pinned``: the run specification, every
        server and client) so every process uses the same lane settings; a name
        not pinned here is built from the plugin registry where it is used.
    """

    address: str = "127.0.0.1:50051"
    token: str | None = None
    token_file: ConfigPath | None = None
    tls_cert: ConfigPath | None = None
    tls_key: ConfigPath | None = None
    tls_server_name: str | None = None
    chunk_mb: Annotated[int, AtLeast(1)] = 4
    max_message_mb: Annotated[int, AtLeast(1)] = 64
    max_version_mb: Annotated[int, AtLeast(1)] = 16_384
    wire_dtype: Annotated[str, OneOf("float32", "bfloat16")] = "float32"
    weight_lanes: tuple[str, ...] = ("split", "relay", "bulk", "grpc")
    lanes: tuple[tuple[str, Any], ...] = ()

    def resolved(self) -> ServerSettings:
        """A copy with the environment applied and the token read from its file."""
        address = os.environ.get(ADDRESS_ENV) or self.address
        token = os.environ.get(TOKEN_ENV) or self.token
        token_file = os.environ.get(TOKEN_FILE_ENV) or self.token_file
        if not token and token_file:
            try:
                token = pathlib.Path(token_file).read_text().splitlines()[0].strip()
            except (OSError, IndexError) as err:
                raise ValueError(f"parameter server token file {token_file}: {err}") from None
        if not token:
            raise ValueError(
                f"parameter server: no token; set {TOKEN_ENV}, {TOKEN_FILE_ENV}, "
                "rlax.ps_settings.token or rlax.ps_settings.token_file"
            )
        if self.chunk_mb * MB > self.max_message_mb * MB - 4096:
            raise ValueError("parameter server: chunk_mb must be below max_message_mb")
        return dataclasses.replace(
            self,
            address=address,
            token=token,
            token_file=token_file,
            weight_lanes=tuple(self.weight_lanes),
            lanes=tuple((name, lane) for name, lane in self.lanes),
        )

    def grpc_options(self) -> list[tuple[str, int | str]]:
        limit = self.max_message_mb * MB
        return [
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
            # Large flow-control windows: weights are big and loopback is fast.
            ("grpc.http2.lookahead_bytes", 64 * MB),
            ("grpc.http2.bdp_probe", 1),
        ]

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls_cert:
            return None
        if not self.tls_key:
            raise ValueError("parameter server: tls_cert is set but tls_key is not")
        key = pathlib.Path(self.tls_key).read_bytes()
        cert = pathlib.Path(self.tls_cert).read_bytes()
        return grpc.ssl_server_credentials([(key, cert)])

    def channel(self) -> grpc.Channel:
        options = self.grpc_options()
        if not self.tls_cert:
            return grpc.insecure_channel(self.address, options=options)
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        creds = grpc.ssl_channel_credentials(pathlib.Path(self.tls_cert).read_bytes())
        return grpc.secure_channel(self.address, creds, options=options)
