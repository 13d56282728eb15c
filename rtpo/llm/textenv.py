"""Text environments: multi-turn user environments written as plain text in, text out, registered by name.

What a user writes (docs/plugins.md, "Text environments"): a class with

    __len__()                      how many items (episodes' starting points) the split has; query ids index them
    reset(item, rng) -> (state, observation)
                                   the first state and the opening user message of item `item`
    step(state, action, rng) -> TextStep(state, observation, reward, done, metrics)
                                   one turn: `action` is the model's message (its thinking removed), the
                                   reply is the next user message; `reward` is paid for this turn

registered with `@register_text_env("name")` (the factory is called as `factory(split=..., **task.params)`
with split "train" or "eval") in a plugin module, and named by a scenario of the llm backend:

    plugins: [my_module]
    task: {kind: text, env: name, params: {...}, num_turns: 4}

`state` is the environment's whole per-episode state as an immutable, picklable value (a tuple, a frozen
dataclass): `step` returns the next one and never mutates the old one.  The episode keeps it, so a snapshot
at a turn boundary is the episode itself, restoring re-runs nothing, and sibling episodes forked from one
boundary never see each other's turns: the snapshot/restore contract of the built-in families (rtpo.llm.env's
ChatEpisode, the airline's AirlineEpisode and its user simulator's state), which `TextChatEnv` implements
over the user's class.  rng is the driver's generator of the step (each boundary's siblings draw from
their own streams); a deterministic environment ignores it.

`TextChatEnv` is the core's Environment protocol (reset/contexts/turn_index/snapshot/restore/take/step,
pop_metrics, sample_log) over a Qwen3 chat: the observation is a user message, the model's response an
assistant turn, c_k = ψ(S_k) as for every LLM task.  Text from the environment goes through
rtpo.llm.context_text (`Qwen3Chat.user_block`/`prompt_block`), so it can never become a control token;
it is cut to `max_feedback_chars`.  An episode ends when `step` says done, at turn K−1, or when its next
context would exceed max_context_tokens (metrics end/done, end/horizon, end/context_overflow).  A cut-off
response (no stop token) is still passed to `step` (metric truncated_turns).  The environment's own
metrics are summed under `text/<key>`.  An environment that breaks the contract (raises, returns no
TextStep, a non-string observation, a non-finite reward) is a one-line TextEnvError naming it: a bug in
the environment stops the run rather than training on garbage; what the model writes can never cause it.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtpo.core.registry import Registry
from rtpo.core.types import Generation, Ragged, StepOutcome
from rtpo.llm.chat import Qwen3Chat, parse_response
from rtpo.llm.contexts import ChatState, ContextMap, TurnBlocks, make_context_map

TEXT_ENVS: Registry = Registry("text environment")
"""name -> factory(split=..., **params) -> a text environment (see the module docstring)."""


def register_text_env(name: str):
    """Register a text environment factory (a class or function taking split= and the task's params)."""
    return TEXT_ENVS.register(name)


class TextEnvError(RuntimeError):
    """A text environment broke its contract (one line, naming the environment)."""


@dataclass(frozen=True)
class TextStep:
    """One turn's outcome.  state: the next state (a new value; the old one unchanged); observation: the
    next user message (ignored when done); reward: paid for this turn; done: the episode ends here;
    metrics: counters summed under text/<key>."""

    state: Any
    observation: str | None = None
    reward: float = 0.0
    done: bool = False
    metrics: Mapping[str, float] = field(default_factory=dict)


class TextEnvironment:
    """Optional base class of a text environment (duck typing works too): see the module docstring."""

    def __len__(self) -> int:
        raise NotImplementedError

    def reset(self, item: int, rng: np.random.Generator) -> tuple[Any, str]:
        raise NotImplementedError

    def step(self, state: Any, action: str, rng: np.random.Generator) -> TextStep:
        raise NotImplementedError


# -- the task section ---------------------------------------------------------------------------------------
class TextTaskConfig(BaseModel):
    """A registered text environment (rtpo.llm.textenv) as the llm backend's task."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    kind: Literal["text"] = Field(description="a text environment registered by a plugin (docs/plugins.md)")
    env: str = Field(description="its registered name (rtpo.llm.textenv.register_text_env)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of its factory")
    num_turns: int = Field(4, ge=1, description="K, the turn horizon (responses per episode)")
    context_map: str = Field("think_strip", description="psi: think_strip (E.4) | identity | last_turns")
    enable_thinking: bool = Field(False, description="Qwen3 thinking mode")
    system: str | None = Field(None, description="optional system prompt")
    max_feedback_chars: int = Field(2000, ge=16, description="an observation is cut to this many characters")
    max_context_tokens: int | None = Field(
        None, ge=1, description="longest turn context; null = backend.max_model_len - 1 when set"
    )
    eval_queries: int = Field(16, ge=1, description="items per in-run evaluation (of the eval split)")

    def to_dict(self) -> dict:
        return self.model_dump()


def parse_text_task(data: Any) -> TextTaskConfig:
    from rtpo.scenario.schema import ConfigError, pydantic_error

    try:
        task = TextTaskConfig.model_validate(data)
    except ValidationError as e:
        raise pydantic_error(e, "task", TextTaskConfig) from None
    if task.env not in TEXT_ENVS:
        known = ", ".join(TEXT_ENVS.names()) or "none registered: load the plugin that defines it (plugins:)"
        raise ConfigError(f"task.env: unknown text environment {task.env!r} (known: {known})")
    return task


@dataclass(frozen=True)
class TextItems:
    """The query ids' items of one split: the environment instance and how many items it has."""

    name: str
    env: Any

    def __len__(self) -> int:
        return int(len(self.env))

    def __getitem__(self, i: int) -> int:
        return i


def load_text_items(task: TextTaskConfig, which: str = "train") -> TextItems:
    from rtpo.scenario.schema import ConfigError

    split = "train" if which == "train" else "eval"
    if task.env not in TEXT_ENVS:  # a process that has not imported the plugin registering it
        known = ", ".join(TEXT_ENVS.names()) or "none"
        raise ConfigError(
            f"task.env: unknown text environment {task.env!r} in this process (known: {known}); "
            "load the plugin that registers it (plugins:)"
        )
    try:
        env = TEXT_ENVS.build(task.env, split=split, **task.params)
        n = len(env)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task.params: text environment {task.env!r}: {' '.join(str(e).split())}") from None
    if n < 1:
        raise ConfigError(f"task.env: text environment {task.env!r} has no {split} items")
    return TextItems(f"{task.env}:{split}", env)


# -- the environment ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TextEpisode:
    """One episode at a boundary (immutable: its own snapshot).  env_state: the text environment's state;
    history: ((role, text), ...) with roles user / assistant, for the generations log."""

    query_id: int
    state: ChatState
    env_state: Any
    history: tuple[tuple[str, str], ...] = ()
    ret: float = 0.0
    done: bool = False

    @property
    def k(self) -> int:
        return self.state.k


class TextChatEnv:
    """The core's Environment protocol over a registered text environment (see the module docstring).

    task: TextItems (the split's environment); tokenizer: a Qwen3 tokenizer; the rest as rtpo.llm.env.LLMEnv."""

    def __init__(
        self,
        task: TextItems,
        tokenizer: Any,
        context_map: str | ContextMap = "think_strip",
        num_turns: int = 4,
        gamma: float = 1.0,
        system: str | None = None,
        enable_thinking: bool = False,
        max_feedback_chars: int = 2000,
        max_context_tokens: int | None = None,
    ) -> None:
        if num_turns < 1:
            raise ValueError(f"TextChatEnv: num_turns must be >= 1, got {num_turns}")
        self.task = task
        self.name = task.name
        self.chat = Qwen3Chat(tokenizer, tools=None, system=system, enable_thinking=enable_thinking)
        self.psi: ContextMap = make_context_map(context_map) if isinstance(context_map, str) else context_map
        self.num_turns = num_turns
        self.gamma = gamma
        self.max_feedback_chars = max_feedback_chars
        self.max_context_tokens = max_context_tokens
        self.metrics: collections.Counter = collections.Counter()
        self._capture = 0
        self._captured: list[dict] = []

    # -- the user's environment, checked ------------------------------------------------------------------
    def _bad(self, what: str) -> TextEnvError:
        return TextEnvError(f"text environment {self.name!r}: {' '.join(what.split())}")

    def _reset_item(self, q: int, rng: np.random.Generator) -> tuple[Any, str]:
        try:
            out = self.task.env.reset(q, rng)
        except Exception as e:  # noqa: BLE001 - the environment's bug, named in one line
            raise self._bad(f"reset({q}) raised {type(e).__name__}: {e}") from e
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], str)):
            raise self._bad(f"reset({q}) must return (state, observation text), got {type(out).__name__}")
        return out

    def _step_env(self, e: TextEpisode, action: str, rng: np.random.Generator) -> TextStep:
        try:
            res = self.task.env.step(e.env_state, action, rng)
        except Exception as err:  # noqa: BLE001
            raise self._bad(f"step (item {e.query_id}, turn {e.k}) raised {type(err).__name__}: {err}") from err
        if not isinstance(res, TextStep):
            raise self._bad(f"step must return a TextStep, got {type(res).__name__}")
        if not math.isfinite(float(res.reward)):
            raise self._bad(f"step (item {e.query_id}, turn {e.k}) returned the reward {res.reward!r}")
        if not res.done and not isinstance(res.observation, str):
            raise self._bad(f"step (item {e.query_id}, turn {e.k}) returned no observation text and done=False")
        return res

    def _cut(self, text: str) -> str:
        cap = self.max_feedback_chars
        return text if len(text) <= cap else text[:cap] + "\n[output cut]"

    # -- protocol --------------------------------------------------------------------------------------------
    def _first(self, q: int, rng: np.random.Generator) -> tuple[ChatState, Any, str]:
        env_state, obs = self._reset_item(q, rng)
        return ChatState(self.chat.prompt_block(self._cut(obs)), (), self.chat.generation_prompt), env_state, obs

    def reset(self, query_ids: np.ndarray, rng: np.random.Generator) -> list[TextEpisode]:
        eps = []
        for q in np.asarray(query_ids, dtype=np.int64):
            q = int(q)
            if not 0 <= q < len(self.task):
                raise IndexError(f"query id {q} outside text environment {self.name!r} of {len(self.task)} items")
            state, env_state, obs = self._first(q, rng)
            if self.max_context_tokens is not None and (n := len(self.psi(state))) > self.max_context_tokens:
                raise ValueError(
                    f"item {q} of {self.name!r}: its prompt has {n} tokens, more than "
                    f"max_context_tokens={self.max_context_tokens}"
                )
            eps.append(TextEpisode(q, state, env_state, (("user", obs),)))
        return eps

    def contexts(self, episodes: Sequence[TextEpisode]) -> Ragged:
        return Ragged.from_rows([self.psi(e.state) for e in episodes], dtype=np.int64)

    def turn_index(self, episodes: Sequence[TextEpisode]) -> np.ndarray:
        return np.fromiter((e.k for e in episodes), dtype=np.int64, count=len(episodes))

    def snapshot(self, episodes: Sequence[TextEpisode]) -> list[TextEpisode]:
        return list(episodes)  # immutable, the environment's state included: the episode is its own snapshot

    def restore(self, snapshots: Sequence[Any]) -> list[TextEpisode]:
        for s in snapshots:
            if not isinstance(s, TextEpisode):
                raise TypeError(f"TextChatEnv.restore: expected TextEpisode snapshots, got {type(s).__name__}")
            if s.done:
                raise ValueError("TextChatEnv.restore: cannot fork from a finished episode")
        return list(snapshots)

    def take(self, episodes: Sequence[TextEpisode], idx: np.ndarray) -> list[TextEpisode]:
        return [episodes[int(i)] for i in np.asarray(idx, dtype=np.int64)]

    def step(
        self, episodes: Sequence[TextEpisode], gen: Generation, rng: np.random.Generator
    ) -> tuple[list[TextEpisode], StepOutcome]:
        n = len(episodes)
        if len(gen) != n:
            raise ValueError(f"TextChatEnv.step: {len(gen)} responses for {n} episodes")
        m = self.metrics
        m["turns"] += n
        reward = np.zeros(n)
        done = np.zeros(n, dtype=bool)
        feedback: list[str | None] = [None] * n
        out: list[TextEpisode] = []
        for i, e in enumerate(episodes):
            ids = gen.tokens[i]
            finished = ids.size > 0 and int(ids[-1]) in self.chat.stop_ids
            sampled = ids[:-1] if finished else ids
            raw_text = self.chat.decode(sampled)
            p = parse_response(raw_text, finished=finished)
            m["truncated_turns"] += int(not finished)
            res = self._step_env(e, p.content.strip(), rng)
            for k, v in res.metrics.items():
                m[f"text/{k}"] += float(v)
            reward[i] = float(res.reward)
            e = replace(e, env_state=res.state, history=e.history + (("assistant", raw_text),), ret=e.ret + reward[i])
            how = "done" if res.done else "horizon" if e.k >= self.num_turns - 1 else None
            if how is None:
                obs = str(res.observation)
                turn = TurnBlocks(
                    raw=self.chat.raw_assistant_block(ids),
                    stripped=self.chat.assistant_block(p.content, sampled),
                    feedback=self.chat.user_block(self._cut(obs)),
                )
                e = replace(e, state=e.state.append(turn), history=e.history + (("user", obs),))
                if self.max_context_tokens is not None and len(self.psi(e.state)) > self.max_context_tokens:
                    how = "context_overflow"
                else:
                    feedback[i] = obs
            if how is not None:
                done[i] = True
                m[f"end/{how}"] += 1
                e = replace(e, done=True)
                self._keep(e, how)
            out.append(e)
        m["episodes_done"] += int(done.sum())
        outcome = StepOutcome(
            reward=reward,
            duration=gen.tokens.lengths.astype(np.float64),
            done=done,
            feedback=feedback,
            malformed=np.zeros(n, dtype=bool),
        )
        return out, outcome

    def _keep(self, e: TextEpisode, how: str) -> None:
        if self._capture > len(self._captured):
            self._captured.append(
                {
                    "query_id": int(e.query_id),
                    "question": e.history[0][1] if e.history else "",
                    "gold": None,
                    "turns": [{"role": role, "text": text} for role, text in e.history],
                    "answer": None,
                    "reward": float(e.ret),
                    "end": how,
                }
            )

    def pop_metrics(self) -> dict[str, float]:
        out = dict(self.metrics)
        self.metrics = collections.Counter()
        return out

    def sample_log(self, n: int) -> list[dict]:
        """The finished episodes kept since the last call, then keep the first `n` that finish from now on."""
        out, self._captured, self._capture = self._captured, [], int(n)
        return out

    def check_prompts(self) -> list[tuple[int, int]]:
        if self.max_context_tokens is None:
            return []
        rng = np.random.default_rng(0)
        return [
            (q, n)
            for q in range(len(self.task))
            if (n := len(self.psi(self._first(q, rng)[0]))) > self.max_context_tokens
        ]


def text_env_factory(task: TextTaskConfig, tokenizer: Any, limit: int | None):
    """make_env(items, which) for rtpo.llm.build."""
    from rtpo.scenario.schema import ConfigError

    def make_env(t: TextItems, which: str) -> TextChatEnv:
        try:
            env = TextChatEnv(
                t,
                tokenizer,
                context_map=task.context_map,
                num_turns=task.num_turns,
                system=task.system,
                enable_thinking=task.enable_thinking,
                max_feedback_chars=task.max_feedback_chars,
                max_context_tokens=limit,
            )
        except (KeyError, ValueError) as e:
            raise ConfigError(f"task: {' '.join(str(e).split())}") from None
        long = env.check_prompts()
        if long:
            raise ConfigError(
                f"task.max_context_tokens: {len(long)} of {len(t)} {which} items have prompts longer than "
                f"{limit} tokens (first: item {long[0][0]}, {long[0][1]} tokens)"
            )
        return env

    return make_env


__all__ = [
    "TEXT_ENVS",
    "TextChatEnv",
    "TextEnvError",
    "TextEnvironment",
    "TextEpisode",
    "TextItems",
    "TextStep",
    "TextTaskConfig",
    "load_text_items",
    "parse_text_task",
    "register_text_env",
    "text_env_factory",
]
