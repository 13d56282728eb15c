"""Exact worlds as chat tasks: a finite turn-boundary MDP rendered as a multi-turn tool-use chat.

This module owns the llm side of the exact worlds: the MDP as the chat task sees it (`World`, plain
per-turn arrays in rtpo.tabular.mdp.TurnMDP's layout: successors, probabilities, rewards, τ, the
initial distribution), its words (`WorldChat`: the prompt, the observation after each turn, one tool per
action, each action's canonical response), the environment (`WorldEnv`, the core's Environment
protocol) and the task section (`WorldTaskConfig`).  It imports no other backend: which MDP a `task`
section means is decided by a provider registered in `WORLDS` from the wiring layer above both backends
(rtpo.worlds registers every tabular task kind), so a scenario runs on both backends by changing
`backend` alone.

The chat.  The user message states the horizon and the start state; every tool result is the next
observation ("State s'. Turn k+2 of K."; rewards are paid, not shown).  Actions are tools
`tool_0 … tool_{A-1}` (no arguments; listed in the system prompt by the chat template, schema checked
through the shared tool registry).  Action a's canonical response is

    <tool_call>\\n{"name": "tool_a", "arguments": {}}\\n</tool_call><|im_end|>

as token ids: the tokenizer's encoding of that text plus the stop token.  A response is action a exactly
when its ids equal a's canonical ids (so the probability of action a is the probability of those ids,
which rtpo.llm.exact scores teacher-forced).

The malformed rule (the same as the tabular backend's, rtpo.tabular.backend.TabularEnv): any other
response — empty, cut off, no tool call, JSON garbage, an unknown tool, arguments, several calls, extra
text, or the right text in other tokens — ends the episode with reward `task.malformed_reward` (default
0) and τ = its token count; the feedback names the problem and the metrics count it (`malformed`,
`malformed/<reason>`).  Every well-formed turn pays the MDP's reward (a Bernoulli draw with that mean
when the task's rewards are Bernoulli), lasts the MDP's τ(s, a) discount steps (so discounted values
equal the tabular backend's), and moves to a successor drawn from the MDP's row; a row of
probabilities summing to 0 (an answer) or the last turn ends the episode.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rtpo.core.registry import Registry
from rtpo.core.types import Generation, Ragged, StepOutcome
from rtpo.llm.chat import Qwen3Chat, parse_response
from rtpo.llm.contexts import ChatState, TurnBlocks, make_context_map
from rtpo.llm.tools.base import TOOLS, Tool, ToolResult, ToolSet


@dataclass(frozen=True, eq=False)
class World:
    """A finite turn-boundary MDP (SPEC §1), per turn k = 0..K−1, in TurnMDP's array layout:

    succ[k], prob[k]: (S_k, A, B_k) successor index in turn k+1 and its probability (rows sum to 1, or
                      to 0 where the action ends the episode; the last turn's rows are all 0).
    reward[k]:        (S_k, A) expected reward; tau[k]: (S_k, A) token durations τ ≥ 1 (Eq. 19).
    init:             (S_0,) initial distribution; gamma: per-step discount.
    bernoulli:        the environment pays a Bernoulli draw with mean reward[k] (else the mean).
    v_star:           the MDP's optimal value V* (computed by the provider's exact solver).
    kind:             the task kind that built it (for messages)."""

    succ: tuple[np.ndarray, ...]
    prob: tuple[np.ndarray, ...]
    reward: tuple[np.ndarray, ...]
    tau: tuple[np.ndarray, ...]
    init: np.ndarray
    gamma: float = 1.0
    bernoulli: bool = False
    v_star: float = float("nan")
    kind: str = "world"

    @property
    def num_turns(self) -> int:
        return len(self.reward)

    @property
    def num_actions(self) -> int:
        return int(self.reward[0].shape[1])

    @classmethod
    def of(cls, mdp: Any, v_star: float, kind: str) -> World:
        """From any object with TurnMDP's attributes (succ, prob, reward, tau, init, gamma, bernoulli_rewards)."""
        return cls(
            tuple(mdp.succ),
            tuple(mdp.prob),
            tuple(mdp.reward),
            tuple(mdp.tau),
            np.asarray(mdp.init),
            float(mdp.gamma),
            bool(mdp.bernoulli_rewards),
            float(v_star),
            kind,
        )


# -- the task section ---------------------------------------------------------------------------------


class WorldTaskConfig(BaseModel):
    """An exact world on the llm backend: any task section the tabular backend accepts (its `kind`, its
    parameters, `psi`, `policy`, `init_scale`; the tabular-only `policy` and `init_scale` are kept and
    unused), plus these chat keys.  The tabular `psi` must be identity: the chat contexts of `context_map`
    keep the history (identity and think_strip are decision-sufficient)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, arbitrary_types_allowed=True)
    kind: str = Field(description="a tabular task kind (tool_chain, region_chain, random, ...) rendered as a chat")
    tabular: Any = Field(description="the tabular task section (the provider's typed object)")
    context_map: str = Field("think_strip", description="chat context map psi: think_strip | identity | last_turns")
    system: str | None = Field(None, description="optional system prompt")
    enable_thinking: bool = Field(False, description="Qwen3 thinking mode (the canonical actions carry no thinking)")
    malformed_reward: float = Field(
        0.0, description="reward of a malformed response, which ends the episode (the tabular backend pays 0)"
    )
    eval_queries: int = Field(256, ge=1, description="episodes per sampled evaluation (rtpo eval; exact_fallback)")
    exact_max_contexts: int = Field(
        20000,
        ge=1,
        description="exact evaluation enumerates every reachable decision context; more than this is a "
        "config error naming this key (or sampled evaluation, see exact_fallback)",
    )
    exact_fallback: Literal["error", "sampled"] = Field(
        "error",
        description="an MDP with more reachable contexts than exact_max_contexts: error (default), or "
        "sampled: log a Monte-Carlo estimate under eval/value_sampled (never under eval/value)",
    )
    exact_batch_tokens: int = Field(16384, ge=1, description="tokens per forward pass of the exact evaluator")
    format_warmup_steps: int = Field(
        0,
        ge=0,
        description="supervised steps that teach the model the canonical tool-call format before RL, with every "
        "action equally likely in every context (uniform targets: no task knowledge; a random model "
        "practically never writes a canonical call); 0 = none",
    )
    format_warmup_lr: float = Field(3e-3, gt=0, description="AdamW learning rate of the format warm start")
    format_warmup_batch: int = Field(
        8, ge=1, description="contexts per format warm-start step (each with every action)"
    )

    @property
    def num_turns(self) -> int:
        """K of the world (the tabular section's num_turns)."""
        return int(getattr(getattr(self.tabular, "params", None), "num_turns", 1))

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.model_dump(exclude={"tabular"}).items()}
        out.update(self.tabular.to_dict())
        return out


LLM_KEYS = tuple(k for k in WorldTaskConfig.model_fields if k not in ("kind", "tabular"))


@dataclass(frozen=True)
class WorldProvider:
    """A source of exact worlds, registered in WORLDS by the wiring layer above the backends.

    kinds:  () -> the task kinds it builds (asked each time: a plugin may register more).
    parse:  raw task mapping without LLM_KEYS -> typed section (ConfigError naming task.<key>).
    build:  typed section -> World (with its V*)."""

    kinds: Callable[[], Sequence[str]]
    parse: Callable[[dict], Any]
    build: Callable[[Any], World]


WORLDS: Registry[WorldProvider] = Registry("exact world source")


def provider_of(kind: Any) -> WorldProvider | None:
    """The provider that builds task kind `kind`, None when no registered provider does."""
    if not isinstance(kind, str):
        return None
    for name in WORLDS.names():
        p = WORLDS.get(name)
        if kind in p.kinds():
            return p
    return None


def world_kinds() -> list[str]:
    return sorted({k for name in WORLDS.names() for k in WORLDS.get(name).kinds()})


def parse_world_task(data: dict) -> WorldTaskConfig:
    """`task` of a world kind: the chat keys here, the rest to the kind's provider."""
    from pydantic import ValidationError

    from rtpo.scenario.schema import ConfigError, pydantic_error

    provider = provider_of(data.get("kind"))
    if provider is None:
        raise ConfigError(f"task.kind: {data.get('kind')!r} is not an exact world (valid: {', '.join(world_kinds())})")
    own = {k: data[k] for k in LLM_KEYS if k in data}
    rest = {k: v for k, v in data.items() if k not in LLM_KEYS}
    tabular = provider.parse(rest)
    psi = getattr(tabular, "psi", "identity")
    if psi != "identity":
        raise ConfigError(
            f"task.psi: the llm backend shows the chat history (task.context_map), so psi must be identity, got {psi!r}"
        )
    try:
        make_context_map(own.get("context_map", "think_strip"))
    except (KeyError, ValueError, TypeError) as e:
        raise ConfigError(f"task.context_map: {' '.join(str(e).split())}") from None
    try:
        return WorldTaskConfig(kind=data["kind"], tabular=tabular, **own)
    except ValidationError as e:
        raise pydantic_error(e, "task", WorldTaskConfig) from None


def build_world(task: WorldTaskConfig) -> World:
    provider = provider_of(task.kind)
    if provider is None:
        raise KeyError(f"no exact-world provider builds task kind {task.kind!r}")
    return provider.build(task.tabular)


# -- words --------------------------------------------------------------------------------------------


class WorldAction(Tool):
    """One action of an exact world as a tool without arguments.  Never executed: the environment moves the
    MDP itself (the tool set is there for the system prompt's schema and for checking a call)."""

    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    def __init__(self, name: str, description: str = "") -> None:
        self.name = name
        self.description = description or f"Take action {name}."

    def execute(self, arguments: dict, state: Any = None) -> ToolResult:
        return ToolResult(f"{self.name} done.")


TOOLS.register("world_action")(WorldAction)


def action_name(a: int) -> str:
    return f"tool_{a}"


def canonical_text(a: int) -> str:
    """Action a's canonical response text (the stop token follows it)."""
    return f'<tool_call>\n{{"name": "{action_name(a)}", "arguments": {{}}}}\n</tool_call>'


def prompt_text(num_turns: int, num_actions: int, s0: int) -> str:
    """The user message: the horizon, the tools and the start state."""
    return (
        f"You act for at most {num_turns} turns. Each turn call exactly one tool (tool_0 to "
        f"tool_{num_actions - 1}), with no arguments and nothing else. State {s0}. Turn 1 of {num_turns}."
    )


class WorldChat:
    """The words of one world in one tokenizer: prompt, observations and canonical actions as token ids."""

    def __init__(self, world: World, tokenizer: Any, system: str | None = None, enable_thinking: bool = False) -> None:
        self.world = world
        A = world.num_actions
        self.tools = ToolSet(WorldAction(action_name(a)) for a in range(A))
        self.chat = Qwen3Chat(tokenizer, tools=self.tools.schemas, system=system, enable_thinking=enable_thinking)
        self.canonical: tuple[np.ndarray, ...] = tuple(
            _frozen(np.concatenate([self.chat.ids(canonical_text(a)), [self.chat.im_end_id]])) for a in range(A)
        )
        self._by_ids = {tuple(int(i) for i in c): a for a, c in enumerate(self.canonical)}
        if len(self._by_ids) != A:
            raise ValueError("two actions share one canonical token sequence")
        self._prompts: dict[int, np.ndarray] = {}
        self._stripped = tuple(_frozen(self.chat.assistant_block(canonical_text(a))) for a in range(A))
        self._raw = tuple(_frozen(self.chat.raw_assistant_block(c)) for c in self.canonical)

    def prompt_text(self, s: int) -> str:
        return prompt_text(self.world.num_turns, self.world.num_actions, s)

    def observation(self, k: int, s: int) -> str:
        """The tool result after turn k: the state reached at boundary k+1 (rewards are not shown: a
        context is a function of the states and actions alone, so a Bernoulli draw never forks it)."""
        return f"State {s}. Turn {k + 2} of {self.world.num_turns}."

    def first_state(self, s0: int) -> ChatState:
        if s0 not in self._prompts:
            self._prompts[s0] = _frozen(self.chat.prompt_block(self.prompt_text(s0)))
        return ChatState(self._prompts[s0], (), self.chat.generation_prompt)

    def after(self, state: ChatState, k: int, a: int, s_next: int) -> ChatState:
        """S_{k+1}: S_k with turn k (action a's canonical response) and its observation appended."""
        fb = self.chat.tool_block([self.observation(k, s_next)])
        return state.append(TurnBlocks(raw=self._raw[a], stripped=self._stripped[a], feedback=fb))

    def action_of(self, ids: np.ndarray) -> int | None:
        """The action whose canonical ids `ids` are, else None."""
        return self._by_ids.get(tuple(int(i) for i in np.asarray(ids).reshape(-1)))

    def diagnose(self, ids: np.ndarray) -> tuple[str, str]:
        """(metric reason, feedback) for a response that is no action's canonical ids."""
        ids = np.asarray(ids, dtype=np.int64)
        finished = ids.size > 0 and int(ids[-1]) in self.chat.stop_ids
        if ids.size == 0 or (finished and ids.size == 1):
            return "empty", "Error: empty response; call exactly one tool."
        text = self.chat.decode(ids[:-1] if finished else ids)
        if not finished:
            return "cut_off", "Error: the response was cut off before it ended; call exactly one tool, nothing else."
        p = parse_response(text, finished=True)
        if p.errors:
            return "tool_call", f"Error: {p.errors[0]}."
        if not p.tool_calls:
            return "no_call", "Error: no tool call found; call exactly one tool."
        if len(p.tool_calls) > 1:
            return "several_calls", "Error: call exactly one tool per turn."
        call = p.tool_calls[0]
        problem = self.tools.check(call.name, call.arguments)
        if problem:
            return ("unknown_tool" if call.name not in self.tools else "arguments"), f"Error: {problem}."
        return "not_canonical", (
            f"Error: write the call alone, exactly as {canonical_text(int(call.name.split('_')[1]))!r}."
        )


def _frozen(a: Any) -> np.ndarray:
    a = np.array(a, dtype=np.int64).reshape(-1)
    a.flags.writeable = False
    return a


# -- the environment ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorldEpisode:
    """One episode at boundary k: the MDP state s (index within turn k's states) and the chat S_k."""

    s: int
    state: ChatState
    history: tuple[tuple[str, str], ...] = ()
    done: bool = False
    ret: float = field(default=0.0)

    @property
    def k(self) -> int:
        return self.state.k


class WorldEnv:
    """The core's Environment protocol over a World in chat form (module docstring: the rules)."""

    def __init__(
        self,
        world: World,
        tokenizer: Any,
        context_map: str = "think_strip",
        system: str | None = None,
        enable_thinking: bool = False,
        malformed_reward: float = 0.0,
    ) -> None:
        self.world = world
        self.words = WorldChat(world, tokenizer, system=system, enable_thinking=enable_thinking)
        self.chat = self.words.chat
        self.psi = make_context_map(context_map)
        self.num_turns = world.num_turns
        self.gamma = world.gamma
        self.malformed_reward = float(malformed_reward)
        self.metrics: collections.Counter = collections.Counter()
        self._cum_init = np.cumsum(world.init)

    def reset(self, query_ids: np.ndarray, rng: np.random.Generator) -> list[WorldEpisode]:
        n = len(np.asarray(query_ids))
        s0 = np.minimum(np.searchsorted(self._cum_init, rng.random(n), side="right"), self.world.init.size - 1)
        return [WorldEpisode(int(s), self.words.first_state(int(s))) for s in s0]

    def contexts(self, episodes: Sequence[WorldEpisode]) -> Ragged:
        return Ragged.from_rows([self.psi(e.state) for e in episodes], dtype=np.int64)

    def turn_index(self, episodes: Sequence[WorldEpisode]) -> np.ndarray:
        return np.fromiter((e.k for e in episodes), dtype=np.int64, count=len(episodes))

    def snapshot(self, episodes: Sequence[WorldEpisode]) -> list[WorldEpisode]:
        return list(episodes)

    def restore(self, snapshots: Sequence[Any]) -> list[WorldEpisode]:
        for s in snapshots:
            if not isinstance(s, WorldEpisode):
                raise TypeError(f"WorldEnv.restore: expected WorldEpisode snapshots, got {type(s).__name__}")
            if s.done:
                raise ValueError("WorldEnv.restore: cannot fork from a finished episode")
        return list(snapshots)

    def take(self, episodes: Sequence[WorldEpisode], idx: np.ndarray) -> list[WorldEpisode]:
        return [episodes[int(i)] for i in np.asarray(idx, dtype=np.int64)]

    def step(
        self, episodes: Sequence[WorldEpisode], gen: Generation, rng: np.random.Generator
    ) -> tuple[list[WorldEpisode], StepOutcome]:
        n = len(episodes)
        if len(gen) != n:
            raise ValueError(f"WorldEnv.step: {len(gen)} responses for {n} episodes")
        w, m = self.world, self.metrics
        reward = np.zeros(n)
        duration = np.zeros(n)
        done = np.zeros(n, dtype=bool)
        malformed = np.zeros(n, dtype=bool)
        feedback: list[str | None] = [None] * n
        out: list[WorldEpisode] = []
        m["turns"] += n
        for i, e in enumerate(episodes):
            ids = gen.tokens[i]
            k, s = e.k, e.s
            a = self.words.action_of(ids)
            text = self.chat.decode(ids)
            if a is None:
                reason, fb = self.words.diagnose(ids)
                malformed[i] = done[i] = True
                reward[i] = self.malformed_reward
                duration[i] = max(int(ids.size), 1)
                feedback[i] = fb
                m["malformed"] += 1
                m[f"malformed/{reason}"] += 1
                m["episodes_done"] += 1
                m["return_sum"] += e.ret + reward[i]
                out.append(replace(e, history=e.history + (("assistant", text), ("feedback", fb)), done=True))
                continue
            m[f"action/{a}"] += 1
            r = float(w.reward[k][s, a])
            if w.bernoulli:
                r = float(rng.random() < r)
            reward[i] = r
            duration[i] = float(w.tau[k][s, a])
            row = w.prob[k][s, a]
            if k >= self.num_turns - 1 or row.sum() <= 0.0:
                done[i] = True
                m["episodes_done"] += 1
                m["return_sum"] += e.ret + r
                out.append(replace(e, history=e.history + (("assistant", text),), done=True, ret=e.ret + r))
                continue
            b = min(int(np.searchsorted(np.cumsum(row), rng.random(), side="right")), row.size - 1)
            s_next = int(w.succ[k][s, a, b])
            obs = self.words.observation(k, s_next)
            feedback[i] = obs
            out.append(
                WorldEpisode(
                    s_next,
                    self.words.after(e.state, k, a, s_next),
                    e.history + (("assistant", text), ("tool", obs)),
                    ret=e.ret + r,
                )
            )
        outcome = StepOutcome(reward=reward, duration=duration, done=done, feedback=feedback, malformed=malformed)
        return out, outcome

    def pop_metrics(self) -> dict[str, float]:
        """Counters since the last call: turns, malformed (by reason), actions, finished episodes, their
        mean return (`mean_return`)."""
        out = dict(self.metrics)
        if out.get("episodes_done"):
            out["mean_return"] = out.pop("return_sum") / out["episodes_done"]
        out.pop("return_sum", None)
        self.metrics = collections.Counter()
        return out


# -- the format warm start -------------------------------------------------------------------------------


def world_env(task: WorldTaskConfig, tokenizer: Any) -> WorldEnv:
    """The chat environment of a checked world task section over `tokenizer` (its MDP built by the
    provider registered for task.kind)."""
    return WorldEnv(
        build_world(task),
        tokenizer,
        context_map=task.context_map,
        system=task.system,
        enable_thinking=task.enable_thinking,
        malformed_reward=task.malformed_reward,
    )


def random_contexts(env: WorldEnv, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """n contexts ψ(S_k) of uniformly random canonical walks, each stopped at a uniformly drawn turn."""
    w = env.world
    out = []
    for _ in range(n):
        s = int(min(np.searchsorted(np.cumsum(w.init), rng.random(), side="right"), w.init.size - 1))
        state = env.words.first_state(s)
        stop = int(rng.integers(w.num_turns))
        for k in range(stop):
            a = int(rng.integers(w.num_actions))
            row = w.prob[k][s, a]
            if row.sum() <= 0:
                break
            b = min(int(np.searchsorted(np.cumsum(row), rng.random(), side="right")), row.size - 1)
            s = int(w.succ[k][s, a, b])
            state = env.words.after(state, k, a, s)
        out.append(env.psi(state))
    return out


def format_warm_start(
    model: Any, env: WorldEnv, steps: int, lr: float = 3e-3, batch: int = 16, seed: int = 0
) -> list[float]:
    """Teach a causal LM (in place) the canonical actions: `steps` AdamW steps of maximum likelihood of
    every action's canonical ids after each of `batch` random contexts (random_contexts).  Every action is
    a target equally often in every context, so the optimum is the uniform policy over actions with no
    malformed mass — the tabular backend's θ0 — and nothing about the task's rewards is learned.
    Returns the loss (mean negative log-likelihood of one action's ids) of each step."""
    import torch

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    actions = env.words.canonical
    A, r_max = len(actions), max(x.size for x in actions)
    pad = int(getattr(model.config, "pad_token_id", None) or 0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        ctxs = random_contexts(env, batch, rng)
        width = max(c.size for c in ctxs) + r_max
        ids = np.full((batch * A, width), pad, np.int64)
        att = np.zeros_like(ids)
        labels = np.full_like(ids, -100)
        for i, c in enumerate(ctxs):
            for a, x in enumerate(actions):
                lo = width - r_max - c.size
                ids[i * A + a, lo : lo + c.size + x.size] = np.concatenate([c, x])
                att[i * A + a, lo : lo + c.size + x.size] = 1
                labels[i * A + a, lo + c.size : lo + c.size + x.size] = x
        t_ids, t_att = torch.as_tensor(ids), torch.as_tensor(att)
        logits = model(input_ids=t_ids, attention_mask=t_att, position_ids=(t_att.cumsum(-1) - 1).clamp(min=0)).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        tgt = torch.as_tensor(labels[:, 1:])
        keep = tgt >= 0
        lp = logp.gather(-1, tgt.clamp(min=0)[..., None]).squeeze(-1) * keep
        loss = -lp.sum() / (batch * A)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


__all__ = [
    "LLM_KEYS",
    "WORLDS",
    "World",
    "WorldAction",
    "WorldChat",
    "WorldEnv",
    "WorldEpisode",
    "WorldProvider",
    "WorldTaskConfig",
    "action_name",
    "build_world",
    "canonical_text",
    "format_warm_start",
    "prompt_text",
    "random_contexts",
    "parse_world_task",
    "provider_of",
    "world_env",
    "world_kinds",
]
