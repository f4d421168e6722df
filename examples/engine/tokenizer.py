"""Byte-level tokenizer: token ids 0..255 are bytes, 256 is EOS (also used as BOS)."""
from __future__ import annotations

import codecs

EOS = 256
VOCAB_SIZE = 257


def encode(text: str) -> list[int]:
    """BOS followed by the UTF-8 bytes of ``text``."""
    return [EOS, *text.encode("utf-8")]


def decode(ids) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class Detokenizer:
    """Turns a stream of ids into text pieces without splitting a UTF-8 character."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._decoder.decode(bytes((token,))) if token < 256 else ""

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def chat_prompt(messages: list[tuple[str, str]]) -> str:
    """The chat template: one ``<|role|>content`` line per message, then the assistant's turn."""
    return "".join(f"<|{role}|>{content}\n" for role, content in messages) + "<|assistant|>"
