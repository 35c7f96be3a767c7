"""Subword tokenizers (the ``tokenizers`` library) with chat templates, behind rlax's tokenizer API.

rlax's tasks and rewards see one small interface: ``encode(text, bos=...)``,
``decode(ids)``, ``pad_id`` / ``bos_id`` / ``eos_id``. A task encodes a prompt
with ``bos=True``; for an instruct model (one whose tokenizer carries a chat
template) that prompt becomes the user turn of the template, rendered with the
generation prompt, so the model sees the conversation format it was tuned on.
A base model gets its bos token instead (when its config asks for one).

Text is text. Every text this class encodes (``encode``'s text, every
message's content) is untrusted: the spelling of an added token in it, special
(``<|im_end|>``, ``<|im_start|>``) or not (``<think>``, ``<tool_response>``),
becomes the ordinary tokens of those characters, never the added id. Control ids come only from the chat
template's own framing, rendered around placeholders that stand for the
messages' contents (:meth:`HFTokenizer.chat_parts`), and from explicit ids
(``bos_id``). Plain text next to the framing is encoded with it, so for text
without special spellings the ids are those of the whole rendering encoded
with its special tokens, as before.

Sources: an HF directory (``tokenizer.json`` + ``tokenizer_config.json``, the
template possibly in ``chat_template.jinja``) or GGUF metadata (built by
:mod:`rlax.core.models.gguf`). Chat templates are jinja, rendered the way
transformers renders them (sandboxed, ``trim_blocks`` and ``lstrip_blocks``).
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

if TYPE_CHECKING:
    import jinja2

__all__ = ["HFTokenizer", "TokenizerError"]


# Stands for message k's content while the template renders its framing.
_SLOT = "\x00rlax-text-{}\x00"
_SLOTS = re.compile("\x00rlax-text-([0-9]+)\x00")


class TokenizerError(ValueError):
    """Tokenizer files that are missing or malformed."""


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json spells a token as a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with its special ids and optional chat template.

    Args:
      tokenizer: the fast tokenizer (its added special tokens are already registered).
      bos_id / eos_id / pad_id: special ids; ``eos_id`` is the sampler's stop token.
        ``pad_id`` may equal ``eos_id`` (padding is always masked by length).
      chat_template: jinja source, or None for a base model.
      add_bos: prefix ``bos_id`` when a prompt is encoded without a template.
      use_chat_template: apply the template to prompts (``encode(..., bos=True)``).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        bos_id: int | None,
        eos_id: int,
        pad_id: int | None = None,
        chat_template: str | None = None,
        add_bos: bool = False,
        use_chat_template: bool = True,
    ):
        self.tokenizer = tokenizer
        self.bos_id = None if bos_id is None else int(bos_id)
        self.eos_id = int(eos_id)
        self.pad_id = self.eos_id if pad_id is None else int(pad_id)
        self.chat_template = chat_template
        self.add_bos = add_bos
        self.use_chat_template = use_chat_template and chat_template is not None
        self._template: jinja2.Template | None = None  # compiled on first use

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokenizer.id_to_token(token_id)

    # -- encoding --------------------------------------------------------------

    def encode(self, text: str, *, bos: bool = False) -> np.ndarray:
        """int32 [T]: ``text`` as plain text; with ``bos`` it is a prompt (templated or bos-prefixed).

        No control id comes from ``text``: special tokens' spellings in it are ordinary text.
        """
        if bos and self.use_chat_template:
            return self.encode_chat([{"role": "user", "content": text}])
        ids = self._plain_ids(text)
        if bos and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return np.asarray(ids, dtype=np.int32)

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        """The conversation rendered by the model's jinja chat template, as text.

        To read, not to encode: its special spellings cannot be told from the
        messages' (use :meth:`encode_chat`).
        """
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template (a base model)")
        if self._template is None:
            self._template = _compile(self.chat_template)
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token(self.bos_id) or "",
            eos_token=self.token(self.eos_id) or "",
        )

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True
    ) -> np.ndarray:
        """int32 [T]: the rendered conversation, control ids from the template's framing only."""
        return self.encode_parts(
            self.chat_parts(messages, add_generation_prompt=add_generation_prompt)
        )

    def chat_parts(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True
    ) -> list[str]:
        """The rendering as [framing, text, framing, ..., text, framing], in message order.

        Each text is a message's content as the template renders it; the framing
        between is the template's own, rendered with placeholders for every
        content, so it holds no message's text. Messages without a ``content``
        string (None or absent) have no text part.

        Raises:
          ValueError: a content that is not a string; a template that does not
            show a content exactly once, shows contents out of order, or frames a
            content differently from a placeholder (its framing depends on the text).
        """
        texts = []
        for k, message in enumerate(messages):
            content = message.get("content")
            if isinstance(content, str):
                texts.append(k)
            elif content is not None:
                raise ValueError(f"message {k}'s content is not text: {type(content).__name__}")

        def render(real: int | None) -> str:
            shown = [
                {**m, "content": _SLOT.format(k)} if k in texts and k != real else m
                for k, m in enumerate(messages)
            ]
            return self.apply_chat_template(shown, add_generation_prompt=add_generation_prompt)

        pieces = _SLOTS.split(render(None))  # framing, k, framing, k, ..., framing
        order = [int(k) for k in pieces[1::2]]
        if order != texts:
            raise ValueError(
                f"the chat template shows message contents {order}, not each of {texts} once in order"
            )
        parts = list(pieces)
        for n, k in enumerate(texts):
            parts[2 * n + 1] = messages[k]["content"]
        # One render with every content real: when it is the placeholders' framing with
        # each content as given, that is the decomposition (no text in the framing).
        # Otherwise (a template that changes a content, or frames it by its text) each
        # content is rendered on its own among placeholders, to find how or refuse.
        if self.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt
        ) == "".join(parts):
            return parts
        shown = [_SLOT.format(p) if i % 2 else p for i, p in enumerate(pieces)]
        for n, k in enumerate(texts):
            before, after = "".join(shown[: 2 * n + 1]), "".join(shown[2 * n + 2 :])
            full = render(k)
            if not (
                full.startswith(before)
                and full.endswith(after)
                and len(full) >= len(before) + len(after)
            ):
                raise ValueError(f"the chat template's framing of message {k} depends on its text")
            parts[2 * n + 1] = full[len(before) : len(full) - len(after)]
        return parts

    def encode_parts(self, parts: Sequence[str]) -> np.ndarray:
        """int32 [T]: [framing, text, framing, ...]; control ids from the framing only.

        Even parts are the template's framing: the spellings of special tokens
        there are their ids. Odd parts are text, encoded as plain text together
        with the framing's plain text next to them (up to the nearest special
        token), so for text without special spellings the ids are those of the
        joined parts encoded with their special tokens.
        """
        ids: list[int] = []
        run: list[str] = []  # plain text not yet encoded
        pattern, by_group = self._specials
        for k, part in enumerate(parts):
            if k % 2 or pattern is None:
                run.append(part)
                continue
            start = 0
            for found in pattern.finditer(part):
                run.append(part[start : found.start()])
                ids += self._plain_ids("".join(run))
                ids.append(by_group[found.lastindex or 0])
                run, start = [], found.end()
            run.append(part[start:])
        ids += self._plain_ids("".join(run))
        return np.asarray(ids, np.int32)

    @property
    def control_ids(self) -> frozenset[int]:
        """Ids text must never produce: every added token (special-flagged or not), bos, eos, pad."""
        ids = {self.eos_id, self.pad_id, *self._specials[1].values()}
        if self.bos_id is not None:
            ids.add(self.bos_id)
        return frozenset(ids)

    def _plain_ids(self, text: str) -> list[int]:
        return self._plain.encode(text, add_special_tokens=False).ids if text else []

    @functools.cached_property
    def _plain(self) -> Any:
        """A copy of the ``tokenizers`` object that reads every added token's spelling as text.

        Added tokens not flagged special (``<think>``, ``<tool_response>`` in Qwen-style
        vocabularies) are matched in text as the special ones are; the copy flags them
        all special and encodes special spellings as text, so none is matched.
        """
        from tokenizers import Tokenizer

        config = json.loads(self.tokenizer.to_str())
        for token in config.get("added_tokens") or []:
            token["special"] = True
        plain = Tokenizer.from_str(json.dumps(config))
        plain.encode_special_tokens = True
        return plain

    @functools.cached_property
    def _specials(self) -> tuple[re.Pattern[str] | None, dict[int, int]]:
        """A pattern of the added tokens' spellings (longest first) and group -> id.

        Every added token, special-flagged or not: the framing's spellings are ids,
        and text never produces any of them.

        Matched as ``tokenizers`` matches them: ``lstrip`` / ``rstrip`` take the
        whitespace beside the spelling with it.
        """
        added = self.tokenizer.get_added_tokens_decoder()
        special = sorted(
            ((i, t) for i, t in added.items() if t.content),
            key=lambda it: -len(it[1].content),
        )
        if not special:
            return None, {}
        alternatives = [
            ("\\s*" if t.lstrip else "")
            + f"({re.escape(t.content)})"
            + ("\\s*" if t.rstrip else "")
            for _, t in special
        ]
        return re.compile("|".join(alternatives)), {g + 1: i for g, (i, _) in enumerate(special)}

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``ids`` up to the first eos; special tokens are dropped."""
        listed: list[int] = np.asarray(ids).tolist()
        if self.eos_id in listed:
            listed = listed[: listed.index(self.eos_id)]
        return self.tokenizer.decode(listed, skip_special_tokens=True)

    # -- files -------------------------------------------------------------------

    def special_ids(self) -> dict[str, int]:
        """The ids HF configs name (``bos_token_id`` ...), for an exported checkpoint."""
        out = {"eos_token_id": self.eos_id, "pad_token_id": self.pad_id}
        if self.bos_id is not None:
            out["bos_token_id"] = self.bos_id
        return out

    def save_hf(self, model_dir: str | pathlib.Path) -> None:
        """Writes ``tokenizer.json`` and ``tokenizer_config.json`` (transformers' fast tokenizer)."""
        model_dir = pathlib.Path(model_dir)
        self.tokenizer.save(str(model_dir / "tokenizer.json"))
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": self.token(self.eos_id),
            "pad_token": self.token(self.pad_id),
            "add_bos_token": self.add_bos,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1 << 30,
        }
        if self.bos_id is not None:
            config["bos_token"] = self.token(self.bos_id)
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_hf_dir(cls, model_dir: str | pathlib.Path) -> HFTokenizer:
        """Reads an HF model directory's ``tokenizer.json`` and ``tokenizer_config.json``."""
        from tokenizers import Tokenizer

        model_dir = pathlib.Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{model_dir}: no tokenizer.json (needed for an HF model)")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # noqa: BLE001 -- the Rust side raises a bare Exception
            raise TokenizerError(f"{path}: cannot read tokenizer: {err}") from None
        config_path = model_dir / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text())
            except json.JSONDecodeError as err:
                raise TokenizerError(f"{config_path}: not valid JSON: {err}") from None
        template = config.get("chat_template")
        if (model_dir / "chat_template.jinja").is_file():
            template = (model_dir / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)

        def id_of(key: str) -> int | None:
            text = _token_text(config.get(key))
            return None if text is None else tokenizer.token_to_id(text)

        eos_id = id_of("eos_token")
        if eos_id is None:
            raise TokenizerError(f"{config_path}: no eos_token that the vocabulary knows")
        return cls(
            tokenizer,
            bos_id=id_of("bos_token"),
            eos_id=eos_id,
            pad_id=id_of("pad_token"),
            chat_template=template,
            add_bos=bool(config.get("add_bos_token", False)),
        )


def _compile(source: str) -> jinja2.Template:
    """A jinja template in a sandbox, with the helpers HF chat templates call."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> NoReturn:
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt: str) -> str:
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
        x, indent=indent, ensure_ascii=False
    )
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env.from_string(source)
