"""The `task` section of an airline scenario (`task.kind: airline`) and the environments it builds.

rtpo.llm.schema (parse_task, load_task) and rtpo.llm.build dispatch here for kind airline; the backend section, engines, learner and evaluation
are the LLM backend's own.  Splits are split_tasks.json's (train 30 / test 20: the paper's Appendix G).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtpo.scenario.schema import ConfigError, pydantic_error


class AirlineTaskConfig(BaseModel):
    """τ²-airline: tools over a per-episode database, a simulated user, τ²'s reward."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    kind: Literal["airline"] = Field(description="τ²-airline (needs the airline extra or task.data_dir)")
    data_dir: str | None = Field(
        None, description="folder with db.json, tasks.json, policy.md, split_tasks.json (null = the installed wheel's)"
    )
    split: str = Field("train", description="split_tasks.json split trained on (paper: train, 30 tasks)")
    eval_split: str = Field("test", description="held-out split (paper: test, 20 tasks)")
    limit: int | None = Field(None, ge=1, description="keep the first N tasks of each split")
    num_turns: int = Field(30, ge=1, description="K: responses per episode (tool calls and messages each count one)")
    context_map: str = Field("think_strip", description="psi: think_strip (E.4) | identity | last_turns")
    enable_thinking: bool = Field(True, description="Qwen3 thinking mode")
    include_policy: bool = Field(True, description="put policy.md in the system prompt (with the tool schemas)")
    max_calls_per_turn: int = Field(1, ge=1, description="tool calls run per response (policy.md: one at a time)")
    max_feedback_chars: int = Field(4000, ge=16, description="a tool result or user reply is cut to this")
    eval_queries: int = Field(20, ge=1, description="tasks per in-run evaluation")
    max_context_tokens: int | None = Field(
        None, ge=1, description="longest turn context; null = backend.max_model_len - 1 when set"
    )
    max_errors: int | None = Field(10, ge=1, description="failed tool calls that end an episode, scored 0 (τ²: 10)")
    drop_overlong: bool = Field(False, description="leave out tasks whose prompt alone exceeds max_context_tokens")
    full_context_map: str | None = Field(None, description="also record contexts under this map (flat baselines)")
    user: Literal["scripted", "llm"] = Field("scripted", description="user simulator: scripted | llm")
    user_max_replies: int = Field(8, ge=1, description="the user stops after this many replies")
    user_model: str | None = Field(
        None, description="llm user: local HF model folder, or 'policy' for the agent's own model folder"
    )
    user_engine: Literal["hf", "vllm"] = Field("hf", description="llm user: the engine that plays the user")
    user_temperature: float = Field(0.0, ge=0, description="llm user: sampling temperature (0 = greedy)")
    user_max_tokens: int = Field(256, ge=1, description="llm user: tokens per user message")
    judge: Literal["none", "llm"] = Field(
        "none", description="nl_assertions judge: none (off, τ²'s default basis) | llm (reward/nl_assertion)"
    )
    judge_model: str | None = Field(None, description="llm judge: local HF model folder, or 'policy'")
    judge_engine: Literal["hf", "vllm"] = Field("hf", description="llm judge: its engine")

    def to_dict(self) -> dict:
        return self.model_dump()


def parse_airline_task(data: Any) -> AirlineTaskConfig:
    try:
        return AirlineTaskConfig.model_validate(data)
    except ValidationError as e:
        raise pydantic_error(e, "task") from None


def load_airline_tasks(task: AirlineTaskConfig, which: str = "train"):
    from rtpo.llm.airline.data import AirlineDataError, load_airline
    from rtpo.llm.airline.env import AirlineTasks

    split = task.split if which == "train" else task.eval_split
    try:
        data = load_airline(task.data_dir)
        items = data.split(split)
    except AirlineDataError as e:
        raise ConfigError(f"task.data_dir: {e}") from None
    if task.limit is not None:
        items = items[: task.limit]
    return AirlineTasks(f"airline:{split}", items)


def _engine(path: str, engine: str, temperature: float, max_tokens: int, max_model_len: int | None):
    from rtpo.llm.engines import SamplingConfig

    sampling = SamplingConfig(temperature=max(temperature, 1e-6), top_p=1.0, max_tokens=max_tokens)
    if engine == "vllm":
        from rtpo.llm.engines.vllm import VLLMEngine

        return VLLMEngine(path, sampling, seed=0, max_model_len=max_model_len)
    from rtpo.llm.engines.hf import HFEngine

    return HFEngine(path, sampling, max_model_len=max_model_len)


def make_judge(task: AirlineTaskConfig, model_dir: Any, max_model_len: int | None):
    if task.judge == "none":
        return None
    from rtpo.llm.airline.reward import LLMJudge
    from rtpo.llm.chat import load_qwen3_tokenizer

    if task.judge_model is None:
        raise ConfigError("task.judge_model: the llm judge needs a model folder (or 'policy' for the agent's model)")
    path = str(model_dir) if task.judge_model == "policy" else task.judge_model
    return LLMJudge(_engine(path, task.judge_engine, 0.0, 16, max_model_len), load_qwen3_tokenizer(path))


def make_user(task: AirlineTaskConfig, model_dir: Any, max_model_len: int | None):
    from rtpo.llm.airline.user import LLMUser, ScriptedUser

    if task.user == "scripted":
        return ScriptedUser(max_replies=task.user_max_replies)
    from rtpo.llm.chat import load_qwen3_tokenizer

    if task.user_model is None:
        raise ConfigError("task.user_model: the llm user needs a model folder (or 'policy' for the agent's model)")
    path = str(model_dir) if task.user_model == "policy" else task.user_model
    engine = _engine(path, task.user_engine, task.user_temperature, task.user_max_tokens, max_model_len)
    return LLMUser(engine, load_qwen3_tokenizer(path), max_replies=task.user_max_replies)


def airline_env_factory(task: AirlineTaskConfig, tokenizer: Any, limit: int | None, model_dir: Any, max_model_len):
    """make_env(tasks, which) for rtpo.llm.build: one user simulator shared by the train and eval envs."""
    from rtpo.llm.airline.data import load_airline
    from rtpo.llm.airline.env import AirlineEnv, AirlineTasks

    user = make_user(task, model_dir, max_model_len)
    judge = make_judge(task, model_dir, max_model_len)
    data = load_airline(task.data_dir)

    def make_env(t, which):
        try:
            env = AirlineEnv(
                data,
                t,
                tokenizer,
                user,
                context_map=task.context_map,
                num_turns=task.num_turns,
                enable_thinking=task.enable_thinking,
                include_policy=task.include_policy,
                max_calls_per_turn=task.max_calls_per_turn,
                max_feedback_chars=task.max_feedback_chars,
                max_context_tokens=limit,
                max_errors=task.max_errors,
                judge=judge,
            )
        except (KeyError, ValueError) as e:
            raise ConfigError(f"task: {' '.join(str(e).split())}") from None
        if task.full_context_map is not None:
            import functools

            from rtpo.llm.contexts import make_context_map

            psi = make_context_map(task.full_context_map)
            env.full_contexts = functools.partial(_contexts_with, env, psi)
        long = env.check_prompts()
        if long and not task.drop_overlong:
            raise ConfigError(
                f"task.max_context_tokens: {len(long)} of {len(t)} {which} tasks have prompts longer than "
                f"{limit} tokens (first: task {t[long[0][0]].id}, {long[0][1]} tokens); raise backend.max_model_len "
                "or set task.include_policy: false / task.drop_overlong: true"
            )
        if long:
            bad = {q for q, _ in long}
            kept = tuple(item for q, item in enumerate(t.items) if q not in bad)
            if not kept:
                raise ConfigError(f"task.drop_overlong: every {which} prompt is longer than {limit} tokens")
            return make_env(AirlineTasks(t.name, kept), which)
        return env

    return make_env


def _contexts_with(env, psi, episodes):
    from rtpo.core.types import Ragged

    return Ragged.from_rows([psi(e.state) for e in episodes])
