"""AirlineEnv: τ²-airline episodes (tools over a per-episode database, a simulated user) behind the
core's Environment protocol.

What one turn is.  τ² calls an *agent turn* everything the agent does until it addresses the user: its
tool calls and their results, then one message to the user.  Here the unit of the turn-boundary MDP is
one response l_k of the policy (one generation, the thing RTPO trains on), so a τ² agent turn spans one
MDP turn per generation:
- a response with tool calls  -> the calls run, in order, on the episode's database; f_k = their
                                 results (the template's tool message); the agent goes on;
- a response without a call   -> it addresses the user: its content (thinking removed) is shown to the
                                 user simulator, f_k = the user's reply (a user message); a reply with
                                 the stop signal ends the episode (scored);
- transfer_to_human_agents    -> a successful transfer ends the episode (scored), as in τ²;
- turn K-1, a next context longer than max_context_tokens, or max_errors failed tool calls -> the
                                 episode ends without a normal end (τ² scores such terminations 0).
Every boundary S_k therefore falls between two generations, and the snapshot at S_k holds exactly the
state S_k implies: the chat blocks, the database (the AirlineDB value: shared, never copied), the user
simulator's state and the messages so far.  The boundaries where a τ² agent turn ends (the user has just
replied) are among them; `user_turn_boundary(episodes)` marks them.

Rewards are sparse: τ²'s reward (reward.py) at the end; τ_k = the response's token count.  Malformed
output (a broken tool call, an unknown tool, wrong arguments, ids that do not exist) is feedback text
and a metric, never an exception.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rtpo.core.types import Generation, Ragged, StepOutcome
from rtpo.llm.airline.data import AirlineData, AirlineTask
from rtpo.llm.airline.db import AirlineDB
from rtpo.llm.airline.reward import AirlineScorer
from rtpo.llm.airline.tools import TOOLS, airline_toolset, call_tool
from rtpo.llm.airline.user import TRANSFER_MESSAGE
from rtpo.llm.chat import Qwen3Chat, parse_response
from rtpo.llm.contexts import ChatState, ContextMap, TurnBlocks, make_context_map

EMPTY_USER_REPLY = "(no reply)"
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.S)


@dataclass(frozen=True)
class AirlineTasks:
    """An indexable set of airline tasks (query ids index into it)."""

    name: str
    items: tuple[AirlineTask, ...]

    def __post_init__(self) -> None:
        if not self.items:
            raise ValueError(f"airline task set {self.name!r} is empty")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> AirlineTask:
        return self.items[i]


@dataclass(frozen=True)
class AirlineEpisode:
    """One episode at a boundary (immutable: its own snapshot).  messages: what the agent said to the user
    (turns without a tool call); said: the text of every assistant turn, beside a tool call too (what τ²'s
    COMMUNICATE and NL checks read); calls: the (name, arguments) it called, in order; history: the
    conversation for the generations log; user_state: the simulator's state; at_user: the previous turn's
    feedback was the user's reply (a τ² agent-turn boundary)."""

    query_id: int
    task: AirlineTask
    state: ChatState
    db: AirlineDB
    user_state: Any
    messages: tuple[str, ...] = ()
    calls: tuple[tuple[str, Any], ...] = ()
    said: tuple[str, ...] = ()  # the text of every assistant message, one that also calls a tool included
    history: tuple[tuple[str, str], ...] = ()  # (role, text): assistant turns, tool results, user replies
    tool_errors: int = 0
    at_user: bool = True
    done: bool = False

    @property
    def k(self) -> int:
        return self.state.k


class AirlineEnv:
    """Environment protocol over the τ²-airline domain.

    data:         the domain (rtpo.llm.airline.data.load_airline); tasks: the query ids' tasks.
    tokenizer:    a Qwen3 tokenizer; the system prompt is policy.md (include_policy) and the tool schemas.
    user:         a user simulator (user.py: ScriptedUser, LLMUser).
    context_map, num_turns, gamma, enable_thinking, max_context_tokens: as rtpo.llm.env.LLMEnv.
    max_calls_per_turn: further calls of one response are not run (an error result each).
    max_feedback_chars: a tool result or user reply shown to the model is cut to this (with a note).
    max_errors:   an episode with this many failed tool calls ends, scored 0 (τ²'s too-many-errors end;
                  None = no limit).
    judge:        optional nl_assertions judge (reward.AirlineScorer), reported separately.
    """

    def __init__(
        self,
        data: AirlineData,
        tasks: AirlineTasks,
        tokenizer: Any,
        user: Any,
        context_map: str | ContextMap = "think_strip",
        num_turns: int = 8,
        gamma: float = 1.0,
        enable_thinking: bool = True,
        include_policy: bool = True,
        max_calls_per_turn: int = 1,
        max_feedback_chars: int = 2000,
        max_context_tokens: int | None = None,
        max_errors: int | None = 10,
        judge: Any = None,
    ) -> None:
        if num_turns < 1:
            raise ValueError(f"AirlineEnv: num_turns must be >= 1, got {num_turns}")
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError(f"AirlineEnv: max_context_tokens must be >= 1, got {max_context_tokens}")
        self.data = data
        self.task = tasks
        self.user = user
        self.fresh = AirlineDB(data.db, source=data.folder)
        self.scorer = AirlineScorer(self.fresh, judge=judge)
        self.chat = Qwen3Chat(
            tokenizer,
            tools=airline_toolset().schemas,
            system=data.policy if include_policy else None,
            enable_thinking=enable_thinking,
        )
        self.psi: ContextMap = make_context_map(context_map) if isinstance(context_map, str) else context_map
        self.num_turns = num_turns
        self.gamma = gamma
        self.max_calls_per_turn = max_calls_per_turn
        self.max_feedback_chars = max_feedback_chars
        self.max_context_tokens = max_context_tokens
        if max_errors is not None and max_errors < 1:
            raise ValueError(f"AirlineEnv: max_errors must be >= 1 or None, got {max_errors}")
        self.max_errors = max_errors
        self._prompts: dict[int, tuple[np.ndarray, Any]] = {}
        self.metrics: collections.Counter = collections.Counter()
        self._capture = 0  # finished episodes still to keep for sample_log
        self._captured: list[dict] = []

    # ------------------------------------------------------------------ protocol

    def _first(self, q: int) -> tuple[ChatState, Any]:
        if q not in self._prompts:
            user_state, opening = self.user.start(self.task[q])
            block = self.chat.prompt_block(opening)
            block.flags.writeable = False
            self._prompts[q] = (block, user_state)
        block, user_state = self._prompts[q]
        return ChatState(block, (), self.chat.generation_prompt), user_state

    def reset(self, query_ids: np.ndarray, rng: np.random.Generator) -> list[AirlineEpisode]:
        eps = []
        for q in np.asarray(query_ids, dtype=np.int64):
            q = int(q)
            if not 0 <= q < len(self.task):
                raise IndexError(f"query id {q} outside task {self.task.name!r} of {len(self.task)} items")
            state, user_state = self._first(q)
            if self.max_context_tokens is not None and (n := len(self.psi(state))) > self.max_context_tokens:
                raise ValueError(
                    f"task {self.task[q].id} of {self.task.name!r}: its prompt has {n} tokens, "
                    f"more than max_context_tokens={self.max_context_tokens}"
                )
            eps.append(AirlineEpisode(q, self.task[q], state, self.fresh, user_state))
        return eps

    def check_prompts(self) -> list[tuple[int, int]]:
        if self.max_context_tokens is None:
            return []
        return [
            (q, n) for q in range(len(self.task)) if (n := len(self.psi(self._first(q)[0]))) > self.max_context_tokens
        ]

    def contexts(self, episodes: Sequence[AirlineEpisode]) -> Ragged:
        return Ragged.from_rows([self.psi(e.state) for e in episodes], dtype=np.int64)

    def turn_index(self, episodes: Sequence[AirlineEpisode]) -> np.ndarray:
        return np.fromiter((e.k for e in episodes), dtype=np.int64, count=len(episodes))

    def user_turn_boundary(self, episodes: Sequence[AirlineEpisode]) -> np.ndarray:
        """(B,) bool: the boundary follows a user message (a τ² agent turn starts here)."""
        return np.fromiter((e.at_user for e in episodes), dtype=bool, count=len(episodes))

    def snapshot(self, episodes: Sequence[AirlineEpisode]) -> list[AirlineEpisode]:
        return list(episodes)  # immutable, the database included: the episode is its own snapshot

    def restore(self, snapshots: Sequence[Any]) -> list[AirlineEpisode]:
        for s in snapshots:
            if not isinstance(s, AirlineEpisode):
                raise TypeError(f"AirlineEnv.restore: expected AirlineEpisode snapshots, got {type(s).__name__}")
            if s.done:
                raise ValueError("AirlineEnv.restore: cannot fork from a finished episode")
        return list(snapshots)

    def take(self, episodes: Sequence[AirlineEpisode], idx: np.ndarray) -> list[AirlineEpisode]:
        return [episodes[int(i)] for i in np.asarray(idx, dtype=np.int64)]

    def step(
        self, episodes: Sequence[AirlineEpisode], gen: Generation, rng: np.random.Generator
    ) -> tuple[list[AirlineEpisode], StepOutcome]:
        n = len(episodes)
        if len(gen) != n:
            raise ValueError(f"AirlineEnv.step: {len(gen)} responses for {n} episodes")
        m = self.metrics
        m["turns"] += n
        reward = np.zeros(n)
        done = np.zeros(n, dtype=bool)
        malformed = np.zeros(n, dtype=bool)
        feedback: list[str | None] = [None] * n
        out: list[AirlineEpisode | None] = [None] * n
        blocks: list[tuple[np.ndarray, np.ndarray] | None] = [None] * n
        to_user: list[int] = []
        for i, e in enumerate(episodes):
            ids = gen.tokens[i]
            finished = ids.size > 0 and int(ids[-1]) in self.chat.stop_ids
            raw_text = self.chat.decode(ids[:-1] if finished else ids)
            p = parse_response(raw_text, finished=finished)
            m["truncated_turns"] += int(not p.finished)
            sampled = ids[:-1] if finished else ids
            blocks[i] = (self.chat.raw_assistant_block(ids), self.chat.assistant_block(p.content, sampled))
            beside = _TOOL_CALL_BLOCK.sub("", p.content).strip()
            if beside:
                e = replace(e, said=e.said + (beside,))
            e = replace(e, history=e.history + (("assistant", raw_text),))
            if p.tool_calls or p.errors:
                invalid = m["tool/unknown"] + m["tool/invalid_arguments"]
                e, results, bad, transferred = self._run_calls(e, p)
                # eval/valid_turn_rate: every call parsed, named a tool and had valid arguments (a call the
                # database then refuses, e.g. an unknown reservation, is still a valid call)
                m["turns/valid"] += int(not bad and m["tool/unknown"] + m["tool/invalid_arguments"] == invalid)
                e = replace(e, history=e.history + tuple(("tool", r) for r in results))
                malformed[i] = bad
                if transferred:
                    out[i], done[i] = e, True
                    reward[i] = self._finish(e, "transfer")
                    continue
                feedback[i] = "\n\n".join(results)
                out[i] = replace(e, at_user=False)
                fb = self.chat.tool_block([self._cut(r) for r in results])
                out[i] = self._advance(out[i], blocks[i], fb)
            else:
                message = p.content.strip()
                e = replace(e, messages=e.messages + (message,))
                if not message:
                    malformed[i] = True
                    m["malformed/empty_message"] += 1
                m["turns/valid"] += int(bool(message) and p.finished)  # a whole message to the user: an answer
                if TRANSFER_MESSAGE in message.upper():
                    m["user/transfer_message"] += 1
                out[i] = e
                to_user.append(i)
        if to_user:
            replies = self.user.reply(
                [episodes[i].task for i in to_user], [out[i].user_state for i in to_user],
                [out[i].messages[-1] for i in to_user], rng,
            )  # fmt: skip
            for i, (user_state, text, stop) in zip(to_user, replies):
                if text is None or not str(text).strip():
                    m["user/empty"] += 1
                    text = EMPTY_USER_REPLY
                e = replace(out[i], user_state=user_state, at_user=True)
                m["user/replies"] += 1
                if stop:
                    out[i], done[i] = e, True
                    reward[i] = self._finish(e, "user_stop")
                    continue
                feedback[i] = str(text)
                e = replace(e, history=e.history + (("user", str(text)),))
                out[i] = self._advance(e, blocks[i], self._user_block(str(text)))
        for i in range(n):
            if done[i]:
                continue
            e = out[i]
            over = self.max_context_tokens is not None and len(self.psi(e.state)) > self.max_context_tokens
            errors = self.max_errors is not None and e.tool_errors >= self.max_errors
            if over or errors or episodes[i].k >= self.num_turns - 1:
                done[i], feedback[i] = True, None
                out[i] = e
                how = "too_many_errors" if errors else "context_overflow" if over else "horizon"
                reward[i] = self._finish(e, how)
        m["malformed"] += int(malformed.sum())
        m["episodes_done"] += int(done.sum())
        outcome = StepOutcome(
            reward=reward,
            duration=gen.tokens.lengths.astype(np.float64),
            done=done,
            feedback=feedback,
            malformed=malformed,
        )
        return [replace(e, done=bool(d)) if d else e for e, d in zip(out, done)], outcome

    # ------------------------------------------------------------------ helpers

    def _advance(
        self, e: AirlineEpisode, blocks: tuple[np.ndarray, np.ndarray], feedback: np.ndarray
    ) -> AirlineEpisode:
        raw, stripped = blocks
        return replace(e, state=e.state.append(TurnBlocks(raw=raw, stripped=stripped, feedback=feedback)))

    def _user_block(self, text: str) -> np.ndarray:
        return self.chat.user_block(self._cut(text))

    def _cut(self, text: str) -> str:
        cap = self.max_feedback_chars
        return text if len(text) <= cap else text[:cap] + "\n[output cut]"

    def _run_calls(self, e: AirlineEpisode, p) -> tuple[AirlineEpisode, list[str], bool, bool]:
        m = self.metrics
        results: list[str] = []
        bad = bool(p.errors)
        errors = 0
        for err in p.errors:
            m["malformed/tool_call"] += 1
            m["tool/parse_errors"] += 1
            results.append(f"Error: {err}.")
        db, calls, transferred = e.db, e.calls, False
        for c, call in enumerate(p.tool_calls):
            if c >= self.max_calls_per_turn:
                results.append(f"Error: at most {self.max_calls_per_turn} tool calls per turn; this one was not run.")
                m["tool/attempted"] += 1
                m["tool/errors"] += 1  # attempted and not run: an error of Table 9's 1 - errors/attempted
                m["tool/over_limit"] += 1
                bad = True
                continue
            calls = calls + ((call.name, call.arguments),)
            # the registry's ToolSet validates, runs and counts (tool/attempted, tool/calls, tool/ok, tool/errors,
            # tool/unknown, tool/invalid_arguments, per tool); the database is the airline tools' shared state
            db, text, ok = call_tool(db, call.name, call.arguments, m)
            results.append(text)
            if ok:
                if TOOLS[call.name].writes:
                    m["tool/writes"] += 1
                if call.name == "transfer_to_human_agents":
                    transferred = True
                    break
            else:
                errors += 1
                if call.name not in TOOLS:
                    bad = True
        return replace(e, db=db, calls=calls, tool_errors=e.tool_errors + errors), results, bad, transferred

    def _finish(self, e: AirlineEpisode, how: str) -> float:
        normal = how in ("user_stop", "transfer")
        r = self.scorer.score(e.task, e.db, e.said, e.calls, normal_end=normal)
        if self._capture > len(self._captured):
            self._captured.append(
                {
                    "query_id": int(e.query_id),
                    "question": e.task.id,
                    "gold": [{"name": a.name, "arguments": a.arguments} for a in e.task.actions],
                    "turns": [{"role": role, "text": text} for role, text in e.history],
                    "answer": None,
                    "reward": float(r.reward),
                    "end": how,
                }
            )
        m = self.metrics
        m[f"end/{how}"] += 1
        m["end/normal"] += int(normal)
        m["reward/db"] += float(r.db or 0.0)
        m["reward/communicate"] += float(r.communicate or 0.0)
        m["reward/success"] += float(r.reward > 0)
        if r.nl_assertion is not None:
            m["reward/nl_assertion"] += r.nl_assertion
            m["reward/nl_assertion_n"] += 1
        if how == "context_overflow":
            m["context_overflow"] += 1
        return r.reward

    def pop_metrics(self) -> dict[str, float]:
        """Counters since the last call; Appendix G's tool counters are always there (0 when no tool ran)."""
        out = {"tool/attempted": 0, "tool/calls": 0, "tool/errors": 0, **self.metrics}
        self.metrics = collections.Counter()
        return out

    def sample_log(self, n: int) -> list[dict]:
        """The finished episodes kept since the last call, then keep the first `n` that finish from now on
        (logging.generations_per_iteration): query_id, question (the task id), gold (the task's actions),
        turns (role, text: the assistant's raw text, tool results, user replies), reward, end."""
        out, self._captured, self._capture = self._captured, [], int(n)
        return out
