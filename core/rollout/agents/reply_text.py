"""A reply's text as the APIs give it: cut at a stop string, and each token's text and bytes.

Stop strings (``stop``, ``stop_sequences``): the sampler returns a whole
reply; :func:`cut_at_stop` keeps its ids up to the one that completes the
first stop string found in its text and drops the rest, so the recorded
reply (ids, logprobs, versions: a prefix of what was sampled, so each kept
id's logprob is still exactly the sampler's) is what the model wrote up to
and including the stop string. The content the client gets is the text
before the stop string (the API's content leaves it out) and the finish
reason is "stop". In the chat APIs the next request's assistant message
(that content) is recognised as this reply and rendered as its recorded ids
(:mod:`.chat_ids`), so the conversation continues from the ids the model
wrote, stop string included.

Logprob tokens (:func:`token_pieces`): each id's bytes as the tokenizer
decodes them (byte-level BPE symbols mapped back to their bytes;
SentencePiece's ``<0xNN>`` byte pieces and ``▁`` spaces), and its text:
those bytes as UTF-8, or ``bytes:\\xNN..`` for an id that is part of a
character. Control ids (the stop id) have no bytes and empty text. Joined,
the bytes of a reply's ids are its text's UTF-8.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import weakref
from typing import Any

import numpy as np

from rlax.core.types import Completion

__all__ = ["cut_at_stop", "token_pieces"]


def _decode(tokenizer: Any, ids: np.ndarray) -> str:
    return tokenizer.decode(ids)


def cut_at_stop(
    tokenizer: Any, c: Completion, stops: tuple[str, ...]
) -> tuple[Completion, str, str | None]:
    """(the reply cut after the first stop string, the content before it, that string).

    No stop string in the reply: (``c``, its text, None).
    """
    if not stops:
        return c, c.text, None
    found = _first_stop(c.text, stops)
    if found is None:
        return c, c.text, None
    ids = np.asarray(c.tokens)
    for k in range(1, len(ids) + 1):  # the first prefix whose text holds a stop string
        text = _decode(tokenizer, ids[:k])
        hit = _first_stop(text, stops)
        if hit is not None:
            at, stop = hit
            cut = dataclasses.replace(
                c,
                tokens=ids[:k],
                logprobs=np.asarray(c.logprobs)[:k],
                text=text,
                finish_reason="stop",
                versions=None if c.versions is None else np.asarray(c.versions)[:k],
                kept_floor=None if c.kept_floor is None else np.asarray(c.kept_floor)[:k],
            )
            return cut, text[:at], stop
    return c, c.text, None  # pragma: no cover -- the whole text holds one


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """(where the earliest stop string starts, which one), or None."""
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits) if hits else None


@functools.cache
def _byte_of_symbol() -> dict[str, int]:
    """Byte-level BPE's alphabet: each printable symbol back to the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            symbols.append(256 + extra)
            extra += 1
    return {chr(s): b for b, s in zip(printable, symbols)}


_KINDS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _decoder_kind(tokenizer: Any) -> str:
    """How the tokenizer's ids become bytes (cached: reading it serialises the tokenizer)."""
    try:
        return _KINDS[tokenizer]
    except (KeyError, TypeError):
        pass
    kind = _read_decoder_kind(tokenizer)
    try:
        _KINDS[tokenizer] = kind
    except TypeError:
        pass  # not weakly referable: read each time
    return kind


def _read_decoder_kind(tokenizer: Any) -> str:
    raw = getattr(tokenizer, "tokenizer", None)
    if raw is None:
        return ""
    try:
        decoder = json.loads(raw.to_str()).get("decoder") or {}
    except (AttributeError, TypeError, ValueError):
        return ""
    kinds = [d.get("type", "") for d in decoder.get("decoders", [])] or [decoder.get("type", "")]
    if "ByteLevel" in kinds:
        return "bytelevel"
    if "ByteFallback" in kinds or "Metaspace" in kinds or "Replace" in kinds:
        return "sentencepiece"
    return ""


def _bytes_of(tokenizer: Any, kind: str, token_id: int, control: frozenset[int]) -> bytes:
    if token_id in control:
        return b""
    symbol = tokenizer.token(token_id) if hasattr(tokenizer, "token") else None
    if symbol is not None and kind == "bytelevel":
        table = _byte_of_symbol()
        if all(ch in table for ch in symbol):
            return bytes(table[ch] for ch in symbol)
    if symbol is not None and kind == "sentencepiece":
        if len(symbol) == 6 and symbol.startswith("<0x") and symbol.endswith(">"):
            return bytes([int(symbol[3:5], 16)])
        return symbol.replace("\u2581", " ").encode()
    return tokenizer.decode([token_id]).encode()


def token_pieces(tokenizer: Any, ids: np.ndarray) -> list[tuple[str, list[int]]]:
    """Each id's (text, bytes) for the APIs' logprobs (see the module docstring)."""
    kind = _decoder_kind(tokenizer)
    control = frozenset(getattr(tokenizer, "control_ids", ()) or ())
    control |= {int(tokenizer.eos_id)} if hasattr(tokenizer, "eos_id") else set()
    out = []
    for i in np.asarray(ids).tolist():
        raw = _bytes_of(tokenizer, kind, int(i), control)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        out.append((text, list(raw)))
    return out
