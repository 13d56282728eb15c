"""The one place text enters a model context: control tokens only where the chat format puts them.

A context is token ids.  Two kinds of text become ids:

- structure: the chat template's own text (`<|im_start|>user\\n`, `<tool_response>`, the tool schemas
  the template lists, the generation prompt) and the model's own sampled output.  Every added token of
  the tokenizer spelled there (`<|im_end|>`, `<think>`, `<tool_call>`, ...) is that token's id.
- untrusted text: tool output (Python sandbox, search results), retrieved passages, the user
  simulator's messages, questions and instructions from data files, summaries built from them.  Here no
  added token is ever recognised: the text is encoded by the same normaliser, pre-tokenizer and BPE
  model with the added vocabulary taken away, so a forged `<|im_end|>\\n<|im_start|>system` keeps its
  characters (decoding the context gives the text back unchanged) but is spelled with ordinary byte-level
  pieces (`<`, `|`, `im`, `_end`, `|>` ...), never as a control id.

Text with no forged marker encodes to exactly the ids the tokenizer gives the rendered conversation
(`tokenizer.encode(apply_chat_template(...))`): encoding stops and restarts only at trusted markers,
where the tokenizer splits anyway.  `ContextEncoder.for_tokenizer` builds one encoder per tokenizer
(the added-token-free twin is the tokenizer's JSON read once more) and keeps it while the tokenizer
lives.

Owns: ContextEncoder.  Imports: numpy, tokenizers (through the tokenizer it is given).
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
# placeholders for message contents while the chat template renders (private-use code points)
_MARK = "\ue000rtpo-content-{}\ue001"


class ContextEncoder:
    """Encodes trusted structure and untrusted text for one (fast) Hugging Face tokenizer.

    markers: every added token's text -> its id (special or not: Qwen3's `<think>` and `<tool_call>` are
             added tokens that are not "special", and they are control tokens all the same).
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TypeError(f"{type(tokenizer).__name__} is not a fast tokenizer: contexts need one")
        from tokenizers import Tokenizer

        self.tokenizer = tokenizer
        self.markers: dict[str, int] = {t.content: int(i) for i, t in tokenizer.added_tokens_decoder.items()}
        spec = json.loads(backend.to_str())
        spec["added_tokens"] = []  # the same normaliser, pre-tokenizer and BPE, no added vocabulary
        spec["post_processor"] = None
        self._plain = Tokenizer.from_str(json.dumps(spec))
        names = sorted(self.markers, key=len, reverse=True)  # longest first: `<|im_end|>` before `<|im`
        self._marker_re = re.compile("|".join(map(re.escape, names))) if names else None

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> ContextEncoder:
        """The shared encoder of `tokenizer` (built once, dropped with the tokenizer)."""
        with _LOCK:
            enc = _ENCODERS.get(tokenizer)
            if enc is None:
                enc = _ENCODERS[tokenizer] = cls(tokenizer)
            return enc

    def __reduce__(self):
        # pickled as its tokenizer (a chat or environment already carries it): the twin is rebuilt on load
        return (ContextEncoder.for_tokenizer, (self.tokenizer,))

    def untrusted(self, text: str) -> np.ndarray:
        """Ids of untrusted text: never an added token, whatever the text spells."""
        return np.asarray(self._plain.encode(str(text), add_special_tokens=False).ids, dtype=np.int64)

    def encode(self, pieces: Iterable[tuple[str, bool]]) -> np.ndarray:
        """Ids of a sequence of (text, trusted) pieces: added tokens count only inside trusted pieces.

        Text between two trusted markers is encoded in one go (trusted and untrusted pieces joined), so
        without forged markers the ids equal the tokenizer's own on the joined text.
        """
        out: list[int] = []
        run: list[str] = []

        def flush() -> None:
            if run:
                out.extend(self._plain.encode("".join(run), add_special_tokens=False).ids)
                run.clear()

        for text, trusted in pieces:
            if not trusted or self._marker_re is None:
                run.append(str(text))
                continue
            pos = 0
            for m in self._marker_re.finditer(text):
                run.append(text[pos : m.start()])
                flush()
                out.append(self.markers[m.group(0)])
                pos = m.end()
            run.append(text[pos:])
        flush()
        return np.asarray(out, dtype=np.int64)

    def chat(self, messages: Sequence[Mapping[str, Any]], **template_kwargs: Any) -> np.ndarray:
        """Ids of `apply_chat_template(messages, **template_kwargs)` with every message's content untrusted.

        The template renders placeholders in place of the contents; a template that does not place a
        content verbatim exactly once is refused (ValueError), never guessed around.
        """
        marks = [_MARK.format(i) for i in range(len(messages))]
        shown = [dict(m, content=mark) for m, mark in zip(messages, marks)]
        text = self.tokenizer.apply_chat_template(shown, tokenize=False, **template_kwargs)
        found = []
        for i, mark in enumerate(marks):
            if text.count(mark) != 1:
                raise ValueError(f"the chat template does not place message {i}'s content verbatim once")
            found.append((text.index(mark), i))
        pieces: list[tuple[str, bool]] = []
        pos = 0
        for at, i in sorted(found):
            pieces += [(text[pos:at], True), (str(messages[i]["content"]), False)]
            pos = at + len(marks[i])
        pieces.append((text[pos:], True))
        return self.encode(pieces)


__all__ = ["ContextEncoder"]
