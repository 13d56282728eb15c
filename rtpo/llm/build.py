"""The `llm` backend for scenario files: backend and task sections, and the builder that wires a math
tool-use environment, an engine (vLLM or HF) and the FSDP2 learner into the core's RunContext.

Importing this module registers the backend (rtpo.backends).  A tabular scenario's `method`, `budget`,
`train`, `eval` and `logging` sections work unchanged; `backend` and `task` are the LLM ones below.
`train.lr` is AdamW's learning rate (E.3: 1e-6); `train.optimizer` must be `adam` (AdamW).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rtpo.backends import BackendSpec, BuiltBackend, register_backend
from rtpo.core.methods import RunContext
from rtpo.evaluation import IN_RUN_SEED_OFFSET, EvalSplit, SampledEval, in_run_metrics
from rtpo.llm.sections import SandboxSection
from rtpo.schema import BackendConfig, ConfigError, ScenarioConfig, pydantic_error


class LLMBackendConfig(BackendConfig):
    """Model, engine and learner of an LLM run (E.3 values where the paper gives them)."""

    kind: Literal["llm"] = Field(description="language models: vLLM/HF engine + FSDP2 learner")
    model: str = Field(
        description="local HF model folder (e.g. Qwen3-8B), or 'tiny-random': a random "
        "2-layer Qwen3 with the real Qwen3 tokenizer, built locally (no download)"
    )
    model_cache: str = Field("runs/.models", description="where 'tiny-random' models are written")
    tiny_tokenizer: Literal["qwen3", "bpe512"] = Field(
        "qwen3",
        description="tiny-random only: the real Qwen3 vocab, or a 512-token BPE built offline (a random "
        "policy over it writes digits often enough for answer_parse last_integer)",
    )
    tiny_init_std: float = Field(0.02, gt=0, description="tiny-random only: init scale (larger = peakier policy)")
    engine: Literal["vllm", "hf"] = Field("vllm", description="sampler: vllm (fast) | hf (reference)")
    temperature: float = Field(0.9, gt=0, description="training sampling temperature, also the learner's (E.3: 0.9)")
    top_p: float = Field(1.0, gt=0, le=1, description="training top-p; keep 1 so old log-probs match the learner")
    max_tokens: int = Field(4096, ge=1, description="response tokens per turn (E.3: 4096)")
    eval_temperature: float = Field(0.6, ge=0, description="evaluation temperature (E.3: 0.6)")
    eval_top_p: float = Field(0.95, gt=0, le=1, description="evaluation top-p (E.3: 0.95)")
    max_model_len: int | None = Field(None, ge=16, description="engine context + response limit (null = model's)")
    block_size: int = Field(32, ge=32, description="KV block tokens; prefix caching shares full blocks (CPU: x32)")
    kv_cache_gb: float | None = Field(1.0, gt=0, description="engine KV cache memory (null = vLLM default)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM GPU memory share")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallel GPUs")
    world_size: int = Field(1, ge=1, description="FSDP2 learner ranks (processes)")
    threads_per_rank: int | None = Field(None, ge=1, description="torch threads per learner rank (CPU)")
    micro_batch_tokens: int = Field(16384, ge=1, description="tokens per learner forward pass per rank")
    grad_clip: float | None = Field(1.0, gt=0, description="max global grad norm (null = off)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (E.3: 0.01)")
    param_dtype: Literal["float32", "bfloat16"] = Field("float32", description="learner weight dtype")
    mixed_precision: Literal["bfloat16", "float16"] | None = Field(None, description="FSDP2 compute dtype (GPU)")
    engine_dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="engine dtype")
    gradient_checkpointing: bool = Field(False, description="recompute activations (long contexts)")


class FieldsSection(BaseModel):
    """`task.fields`: where a record keeps each value, when its columns differ from the layout's (rtpo.data)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    question: str | None = Field(
        None, description="column of the question (a string, or chat messages: the last user turn)"
    )
    answer: str | None = Field(
        None, description="column of the gold answer; a worked solution gives its last \\boxed{} (e.g. solution)"
    )
    id: str | None = Field(None, description="column of a unique problem id (null = the layout's, else the row number)")

    def mapping(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class LLMTaskConfig(BaseModel):
    """Math with a sandboxed Python tool: `kind` arithmetic (generated) or a benchmark layout read from `path`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    kind: str = Field(
        description="arithmetic | gsm8k | math500 | aime24 | aime25 | amc23 | oe_math | math (MATH: the answer is "
        "the solution's last \\boxed{}) | verl (RLHFDataset parquet) | generic (name the columns in task.fields)"
    )
    path: str | None = Field(
        None,
        description="local data for a layout kind: JSONL, JSON, Parquet, Arrow, or a datasets save_to_disk "
        "folder (docs/data.md)",
    )
    fields: FieldsSection = Field(
        default_factory=FieldsSection, description="column names of your file, where they differ from the layout's"
    )
    limit: int | None = Field(None, ge=1, description="keep the first N items of the file")
    eval_path: str | None = Field(None, description="held-out file for evaluation (same layout; null = the task)")
    n: int = Field(64, ge=1, description="arithmetic: number of problems")
    task_seed: int = Field(0, ge=0, description="arithmetic: generator seed")
    max_operand: int = Field(20, ge=1, description="arithmetic: largest operand")
    num_operands: int = Field(2, ge=2, description="arithmetic: operands per problem")
    num_turns: int = Field(3, ge=1, description="K, the turn horizon (E.3: 3 for math)")
    context_map: str = Field("think_strip", description="psi: think_strip (E.4) | identity | last_turns")
    enable_thinking: bool = Field(True, description="Qwen3 thinking mode")
    system: str | None = Field(None, description="optional system prompt")
    max_calls_per_turn: int = Field(2, ge=1, description="tool calls run per turn")
    eval_queries: int = Field(16, ge=1, description="problems per evaluation")
    full_context_map: str | None = Field(
        None,
        description="also record each turn's context under this map (e.g. identity = full history, "
        "thinking included) for flat baselines that train on it (grpo train_context)",
    )
    ops: list[Literal["+", "-", "*"]] = Field(
        ["+", "-", "*"], min_length=1, description="arithmetic: operators drawn from"
    )
    max_context_tokens: int | None = Field(
        None,
        ge=1,
        description="longest turn context c_k (E.3: max prompt 8192); an episode whose next context "
        "would be longer ends there (metric context_overflow); null = backend.max_model_len - 1 "
        "when that is set, else no limit",
    )
    drop_overlong: bool = Field(
        False,
        description="leave out problems whose prompt alone exceeds max_context_tokens "
        "(false: such a problem is a config error naming it)",
    )
    sandbox: SandboxSection = Field(default_factory=SandboxSection, description="limits of one tool call")
    tools: list[str | dict[str, Any]] = Field(
        ["python"], min_length=1, description="tools offered (rtpo.llm.tools registry names or {name: params})"
    )
    answer_parse: Literal["boxed", "last_integer", "last_digit"] = Field(
        "boxed",
        description="boxed: the last \\boxed{} (paper); last_integer / last_digit: lenient, for tiny "
        "random models only (without a box, the last integer / digit of the response)",
    )

    @model_validator(mode="after")
    def _check(self) -> LLMTaskConfig:
        if self.kind != "arithmetic" and self.path is None:
            raise ValueError(f"kind {self.kind!r} reads a local file: set task.path")
        return self

    def to_dict(self) -> dict:
        return self.model_dump()


def parse_task(data: Any) -> LLMTaskConfig:
    from rtpo.llm.tasks.math import LAYOUTS

    if not isinstance(data, dict):
        raise ConfigError(f"task: must be a mapping, got {data!r}")
    kind = data.get("kind")
    if kind == "airline":
        from rtpo.llm.airline.build import parse_airline_task

        return parse_airline_task(data)
    from rtpo.llm.search import QA_KINDS, parse_qa_task

    if kind in QA_KINDS:
        return parse_qa_task(data)
    valid = ["arithmetic", "airline", *QA_KINDS, *LAYOUTS.names()]
    if kind not in valid:
        raise ConfigError(f"task.kind: unknown LLM task {kind!r} (valid: {', '.join(valid)})")
    try:
        return LLMTaskConfig.model_validate(data)
    except ValidationError as e:
        raise pydantic_error(e, "task", LLMTaskConfig) from None


def load_task(task: LLMTaskConfig, which: str = "train"):
    from rtpo.llm.tasks.math import MathDataError, arithmetic_task, load_math

    if task.kind == "airline":
        from rtpo.llm.airline.build import load_airline_tasks

        return load_airline_tasks(task, which)
    from rtpo.llm.search import QA_KINDS, load_qa_task

    if task.kind in QA_KINDS:
        return load_qa_task(task, which)

    try:
        if task.kind == "arithmetic":
            seed = task.task_seed if which == "train" else task.task_seed + 1_000_003
            return arithmetic_task(
                task.n, seed, max_operand=task.max_operand, num_operands=task.num_operands, ops=tuple(task.ops)
            )
        path = task.path if which == "train" or task.eval_path is None else task.eval_path
        return load_math(path, task.kind, limit=task.limit, fields=task.fields.mapping())
    except (MathDataError, ValueError) as e:
        raise ConfigError(f"task.{'path' if task.kind != 'arithmetic' else 'kind'}: {e}") from None


def tiny_random_model(cache: str | os.PathLike, seed: int, tokenizer: str = "qwen3", init_std: float = 0.02) -> Path:
    """A random tiny Qwen3, built once per (seed, tokenizer, init) and reused: with the real Qwen3 vocab
    (151,936 rows), or with tokenizer="bpe512" the offline 512-token BPE (rtpo.llm.model.train_tiny_tokenizer)."""
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.model import TinyQwen3Spec, build_tiny_qwen3, train_tiny_tokenizer

    if tokenizer not in ("qwen3", "bpe512"):
        raise ValueError(f"tiny_random_model: tokenizer must be qwen3 or bpe512, got {tokenizer!r}")
    name = f"tiny-qwen3-seed{seed}"
    if tokenizer != "qwen3":
        name = f"tiny-{tokenizer}-seed{seed}"
    if init_std != 0.02:
        name += f"-std{init_std:g}"
    out = Path(cache) / name
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    if tokenizer == "qwen3":
        build_tiny_qwen3(
            tmp, tokenizer=load_qwen3_tokenizer(), spec=TinyQwen3Spec(vocab_size=151936), seed=seed, init_std=init_std
        )
    else:
        build_tiny_qwen3(tmp, tokenizer=train_tiny_tokenizer(512), spec=TinyQwen3Spec(), seed=seed, init_std=init_std)
    try:
        os.replace(tmp, out)  # atomic: `out` appears complete or not at all, so a reader never sees half a model
    except OSError:
        # another process (a run, or a Ray worker of this run) finished the same build meanwhile: keep its copy
        if not (out / "config.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


class TrackedSampler:
    """The engine, plus what the run needs around it: the weights it last loaded (checkpoints) and the
    time spent loading weights (the sync share of a phase)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.current: Any = None
        self.sync_seconds = 0.0
        self.syncs = 0

    def generate(self, contexts, turn, n, rng):
        return self.engine.generate(contexts, turn, n, rng)

    def load_weights(self, weights: Any) -> None:
        t0 = time.perf_counter()
        self.engine.load_weights(weights)
        self.sync_seconds += time.perf_counter() - t0
        self.syncs += 1
        self.current = weights


def context_limit(task: LLMTaskConfig, b: LLMBackendConfig) -> int | None:
    """The longest c_k a turn may start from: task.max_context_tokens, else max_model_len − 1 (room for
    at least one response token; the engine cuts longer responses to fit)."""
    if task.max_context_tokens is None:
        return None if b.max_model_len is None else b.max_model_len - 1
    if b.max_model_len is not None and task.max_context_tokens >= b.max_model_len:
        raise ConfigError(
            f"task.max_context_tokens: {task.max_context_tokens} leaves no room for a response within "
            f"backend.max_model_len={b.max_model_len}"
        )
    return task.max_context_tokens


def _check_model_dir(path: str) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ConfigError(f"backend.model: {path} is not a local HF model folder (no config.json)")
    return p


@contextlib.contextmanager
def _eval_engine(engine: Any, learner: Any, sampler: TrackedSampler, eval_sampling: Any):
    """The engine with the learner's current weights at the evaluation sampling settings; afterwards
    the sampler's own weights and settings are put back (an off-policy method may keep them stale on
    purpose)."""
    previous = sampler.current
    engine.load_weights(learner.weights())
    saved, engine.sampling = engine.sampling, eval_sampling
    try:
        yield engine
    finally:
        engine.sampling = saved
        if previous is not None:
            engine.load_weights(previous)


def sampled_eval_of(
    b: LLMBackendConfig,
    task: LLMTaskConfig,
    env: Any,
    eval_env: Any,
    engine: Any,
    learner: Any,
    sampler: TrackedSampler,
    eval_sampling: Any,
) -> SampledEval:
    """The llm backend's part of rtpo.evaluation: held-out (eval) and training problems, the engine with the
    learner's weights at eval temperature/top-p, and the settings a report records."""
    return SampledEval(
        splits={"eval": EvalSplit(eval_env, len(eval_env.task)), "train": EvalSplit(env, len(env.task))},
        policy=functools.partial(_eval_engine, engine, learner, sampler, eval_sampling),
        settings={
            "engine": b.engine,
            "temperature": eval_sampling.temperature,
            "top_p": eval_sampling.top_p,
            "max_tokens_per_turn": b.max_tokens,
            "num_turns": task.num_turns,
            "answer_parse": getattr(task, "answer_parse", None),
            "context_map": task.context_map,
        },
        default_problems=task.eval_queries,
    )


def _evaluate(sampled: SampledEval, env: Any, sampler: TrackedSampler, seed: int) -> dict[str, float]:
    """The in-run evaluation: Pass@1 and friends (rtpo.evaluation.in_run_metrics) of the learner's current
    weights on the first task.eval_queries problems of the eval split, one sample each, drawn with a
    fixed seed (the same draws every time); plus the training env's counters since the last call and
    the weight-sync time."""
    # the env's wall-clock counters (time/tools_s, time/summarize_s, time/score_s) join the run's time/ keys
    out = {(k if k.startswith("time/") else f"env/{k}"): float(v) for k, v in env.pop_metrics().items()}
    num = min(sampled.default_problems, sampled.splits["eval"].num_problems)
    out.update(in_run_metrics(sampled, np.arange(num, dtype=np.int64), seed + IN_RUN_SEED_OFFSET))
    out.update({"time/weight_sync_s": sampler.sync_seconds, "time/weight_syncs": float(sampler.syncs)})
    return out


def _model_dir(cfg: ScenarioConfig) -> Path:
    """The checked scenario's model folder; 'tiny-random' is built into backend.model_cache on first use.

    In a distributed run the driver builds first, so the workers (which call this again from the same
    scenario) find the finished folder; tiny_random_model's rename keeps concurrent builders safe anyway.
    """
    b: LLMBackendConfig = cfg.backend
    if cfg.train.optimizer != "adam":
        raise ConfigError(f"train.optimizer: the LLM learner uses AdamW ('adam'), got {cfg.train.optimizer!r}")
    if b.model == "tiny-random":
        return tiny_random_model(b.model_cache, cfg.seed, b.tiny_tokenizer, b.tiny_init_std)
    return _check_model_dir(b.model)


@dataclass(frozen=True)
class _RolloutSide:
    """What a rollout worker holds (and the driver shares): the training env, the engine, the env maker."""

    make_env: Any
    env: Any
    num_queries: int
    stop: tuple
    engine: Any


def _rollout_side(cfg: ScenarioConfig, model_dir: Path, role: str) -> _RolloutSide:
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.engines import SamplingConfig
    from rtpo.llm.env import LLMEnv

    b: LLMBackendConfig = cfg.backend
    task: LLMTaskConfig = cfg.task
    tokenizer = load_qwen3_tokenizer(str(model_dir))
    train_task = load_task(task, "train")

    limit = context_limit(task, b)
    from rtpo.llm.search import QA_KINDS, build_retriever, qa_env_kwargs

    if task.kind in QA_KINDS:  # multi-hop QA: the search tool over one retriever, F1/EM scoring
        kinds = qa_env_kwargs(task, build_retriever(task), model_dir)
    elif task.kind == "airline":
        kinds = {}  # rtpo.llm.airline builds its own environment below
    else:
        kinds = {"sandbox": task.sandbox.limits(), "tools": task.tools}

    def make_env(t, which):
        try:
            env = LLMEnv(
                t,
                tokenizer,
                **kinds,
                context_map=task.context_map,
                num_turns=task.num_turns,
                enable_thinking=task.enable_thinking,
                system=task.system,
                max_calls_per_turn=task.max_calls_per_turn,
                answer_parse=task.answer_parse,
                full_context_map=task.full_context_map,
                max_context_tokens=limit,
            )
        except (KeyError, ValueError) as e:
            raise ConfigError(f"task: {' '.join(str(e).split())}") from None
        long = env.check_prompts()
        if long and not task.drop_overlong:
            raise ConfigError(
                f"task.max_context_tokens: {len(long)} of {len(t)} {which} problems have prompts longer "
                f"than {limit} tokens (first: item {long[0][0]}, {long[0][1]} tokens); raise the limit "
                "or set task.drop_overlong: true"
            )
        if long:
            bad = {q for q, _ in long}
            kept = tuple(item for q, item in enumerate(t.items) if q not in bad)
            if not kept:
                raise ConfigError(f"task.drop_overlong: every {which} prompt is longer than {limit} tokens")
            return make_env(type(t)(t.name, kept), which)
        if env.summarizer is not None and getattr(env.summarizer, "engine", False) is None:
            env.summarizer.engine = engines[0] if engines else None
            pending.append(env)
        return env

    engines: list = []  # the engine, once built: an engine-written summary (summarize ψ) needs it
    pending: list = []

    if task.kind == "airline":  # the τ²-airline environment (rtpo.llm.airline) replaces the math one
        from rtpo.llm.airline.build import airline_env_factory

        make_env = airline_env_factory(task, tokenizer, limit, model_dir, b.max_model_len)
    env = make_env(train_task, "train")
    train_task = env.task  # without any dropped problems
    stop = tuple(sorted(env.chat.stop_ids))
    sampling = SamplingConfig(temperature=b.temperature, top_p=b.top_p, max_tokens=b.max_tokens, stop_token_ids=stop)
    if b.engine == "vllm":
        from rtpo.llm.engines.vllm import VLLMEngine

        if role == "driver" and (b.world_size > 1 or b.tensor_parallel_size > 1):
            # rank 0 of the learner owns this process's torch.distributed world: vLLM gets its own process
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        elif role == "rollout" and b.tensor_parallel_size == 1:
            # a rollout actor is a process of its own with no learner: vLLM runs in it (starts in seconds,
            # and a multiprocess engine would need a __main__ guard the actor does not have)
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

        extra: dict[str, Any] = {}
        if b.gpu_memory_utilization is not None:
            extra["gpu_memory_utilization"] = b.gpu_memory_utilization
        if b.tensor_parallel_size > 1:
            extra["tensor_parallel_size"] = b.tensor_parallel_size
        engine = VLLMEngine(
            model_dir,
            sampling,
            seed=cfg.seed,
            block_size=b.block_size,
            max_model_len=b.max_model_len,
            dtype=b.engine_dtype,
            kv_cache_gb=b.kv_cache_gb,
            **extra,
        )
    else:
        from rtpo.llm.engines.hf import HFEngine

        engine = HFEngine(model_dir, sampling, max_model_len=b.max_model_len)
    engines.append(engine)
    for e in pending:
        e.summarizer.engine = engine
    return _RolloutSide(make_env=make_env, env=env, num_queries=len(train_task), stop=stop, engine=engine)


def _learner(cfg: ScenarioConfig, model_dir: Path, role: str) -> Any:
    """The FSDP2 learner.  A trainer rank whose process group already exists (a Ray trainer actor: the
    group's size is resources.trainer_workers) builds its shard in that group; otherwise launch_learner
    spawns backend.world_size − 1 local ranks around this process (the driver's learner)."""
    import torch
    import torch.distributed as dist

    from rtpo.llm.learner import FSDPLearner, LearnerConfig, launch_learner

    b: LLMBackendConfig = cfg.backend
    kl = float(getattr(cfg.method.config, "kl_coef", 0.0) or 0.0)
    lcfg = LearnerConfig(
        lr=cfg.train.lr,
        weight_decay=b.weight_decay,
        grad_clip=b.grad_clip,
        temperature=b.temperature,
        micro_batch_tokens=b.micro_batch_tokens,
        kl_reference=kl > 0,
        param_dtype=b.param_dtype,
        mixed_precision=b.mixed_precision,
        gradient_checkpointing=b.gradient_checkpointing,
    )
    if role == "trainer" and dist.is_initialized():
        if b.threads_per_rank:
            torch.set_num_threads(b.threads_per_rank)
        return FSDPLearner(
            model_dir, lcfg, rank=dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend()
        )
    learner = launch_learner(model_dir, lcfg, world_size=b.world_size, threads_per_rank=b.threads_per_rank)
    if b.world_size > 1:
        atexit.register(learner.close)
    return learner


def build_role(cfg: ScenarioConfig, role: str) -> RunContext:
    """Only what one role of a distributed run uses (rtpo.distributed.ScenarioFactory calls this).

    rollout: the training env + engine, no learner (a rollout actor holds no optimiser or FSDP shard).
    trainer: the learner alone, in the actor's process group when one exists (see _learner).
    driver:  the full build() (the driver also evaluates).
    """
    if role == "driver":
        return build(cfg).ctx
    model_dir = _model_dir(cfg)
    rng = np.random.default_rng(cfg.seed)
    if role == "rollout":
        side = _rollout_side(cfg, model_dir, role)
        return RunContext(env=side.env, sampler=TrackedSampler(side.engine), learner=None, rng=rng)
    if role == "trainer":
        return RunContext(env=None, sampler=None, learner=_learner(cfg, model_dir, role), rng=rng)
    raise ValueError(f"build_role: unknown role {role!r} (rollout, trainer or driver)")


def build(cfg: ScenarioConfig) -> BuiltBackend:
    from rtpo.llm.engines import SamplingConfig

    b: LLMBackendConfig = cfg.backend
    task: LLMTaskConfig = cfg.task
    model_dir = _model_dir(cfg)
    side = _rollout_side(cfg, model_dir, "driver")
    env, engine = side.env, side.engine
    eval_env = side.make_env(load_task(task, "eval"), "eval")
    eval_sampling = SamplingConfig(
        temperature=b.eval_temperature, top_p=b.eval_top_p, max_tokens=b.max_tokens, stop_token_ids=side.stop
    )
    learner = _learner(cfg, model_dir, "driver")
    sampler = TrackedSampler(engine)
    rng = np.random.default_rng(cfg.seed)
    ctx = RunContext(env=env, sampler=sampler, learner=learner, rng=rng)
    sampled = sampled_eval_of(b, task, env, eval_env, engine, learner, sampler, eval_sampling)
    evaluate = functools.partial(_evaluate, sampled, env, sampler, cfg.seed)
    return BuiltBackend(
        ctx=ctx,
        evaluate=evaluate,
        sampler_state=lambda: sampler.current,
        load_sampler_state=lambda w: sampler.load_weights(w) if w is not None else None,
        num_queries=side.num_queries,
        value_key="eval/value",
        sampled_eval=sampled,
    )


def export(cfg: ScenarioConfig, weights: dict, out: Any, manifest: dict | None = None) -> Path:
    """BackendSpec.export: `weights` as a Hugging Face folder `out` with the run's model config,
    generation config and tokenizer (rtpo.llm.export.write_hf_folder)."""
    from rtpo.llm.export import write_hf_folder

    return write_hf_folder(_model_dir(cfg), weights, out, manifest)


def task_schemas() -> list[dict]:
    """JSON Schemas of the llm backend's task sections (math; airline when its module imports)."""
    out = [LLMTaskConfig.model_json_schema()]
    try:
        from rtpo.llm.airline.build import AirlineTaskConfig

        out.append(AirlineTaskConfig.model_json_schema())
    except ImportError:
        pass
    from rtpo.llm.search import QATaskConfig

    out.append(QATaskConfig.model_json_schema())
    return out


register_backend(
    "llm",
    BackendSpec(
        config=LLMBackendConfig,
        parse_task=parse_task,
        build=build,
        build_role=build_role,
        task_schemas=task_schemas,
        export=export,
    ),
)
