"""The `llm` backend's wiring: the builder that puts a tool-use environment (math, QA search, airline or a
registered text environment), an engine (vLLM or HF) and the FSDP2 learner into the core's RunContext, per
role of a distributed run, plus the backend's evaluation and export hooks.

Importing this module registers the backend (rtpo.scenario.backends).  A tabular scenario's `method`, `budget`,
`train`, `eval` and `logging` sections work unchanged; `backend` and `task` are the LLM ones of
rtpo.llm.schema.  `train.lr` is AdamW's learning rate (E.3: 1e-6); `train.optimizer` must be `adam`
(AdamW).  The pieces: rtpo.llm.schema (sections), rtpo.llm.model_cache (the model folder, tiny-random
built once), rtpo.llm.sampler (the engine as the run's sampler); their names are importable from here too.
"""

from __future__ import annotations

import atexit
import collections
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rtpo.core.methods import RunContext
from rtpo.core.sampled_eval import IN_RUN_SEED_OFFSET, EvalSplit, SampledEval, in_run_metrics
from rtpo.llm.model_cache import check_model_dir, publish_model_dir, tiny_random_model
from rtpo.llm.sampler import TrackedSampler, eval_engine
from rtpo.llm.schema import (
    FieldsSection,
    LLMBackendConfig,
    LLMTaskConfig,
    context_limit,
    load_task,
    parse_task,
    task_schemas,
)
from rtpo.llm.worlds import WorldTaskConfig
from rtpo.scenario.backends import BackendSpec, BuiltBackend, PendingCounters, register_backend, rollout_memory
from rtpo.scenario.schema import ConfigError, ScenarioConfig

__all__ = [  # the moved pieces stay importable from rtpo.llm.build
    "FieldsSection",
    "LLMBackendConfig",
    "LLMTaskConfig",
    "TrackedSampler",
    "build",
    "build_role",
    "driver_learner_layout",
    "context_limit",
    "export",
    "load_task",
    "parse_task",
    "sampled_eval_of",
    "task_schemas",
    "tiny_random_model",
]


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
    """The llm backend's part of rtpo.core.sampled_eval: held-out (eval) and training problems, the engine with the
    learner's weights at eval temperature/top-p, and the settings a report records."""
    return SampledEval(
        splits={"eval": EvalSplit(eval_env, len(eval_env.task)), "train": EvalSplit(env, len(env.task))},
        policy=functools.partial(eval_engine, engine, learner, sampler, eval_sampling),
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
    """The in-run evaluation: Pass@1 and friends (rtpo.core.sampled_eval.in_run_metrics) of the learner's current
    weights on the first task.eval_queries problems of the eval split, one sample each, drawn with a
    fixed seed (the same draws every time); plus the training env's counters since the last call and
    the weight-sync time."""
    # the env's wall-clock counters (time/tools_s, time/summarize_s, time/score_s) join the run's time/ keys
    out = {(k if k.startswith("time/") else f"env/{k}"): float(v) for k, v in env.pop_metrics().items()}
    num = min(sampled.default_problems, sampled.splits["eval"].num_problems)
    out.update(in_run_metrics(sampled, np.arange(num, dtype=np.int64), seed + IN_RUN_SEED_OFFSET))
    out.update({"time/weight_sync_s": sampler.sync_seconds, "time/weight_syncs": float(sampler.syncs)})
    return out


def _pending_counters(env: Any) -> PendingCounters | None:
    """The counters the training env keeps until evaluate() pops them (every llm env holds them in a
    Counter `metrics`), for the checkpoint: a resume from a checkpoint between two evaluations logs at
    the next one what the phases before the checkpoint counted, as the unbroken run does."""
    if not isinstance(getattr(env, "metrics", None), collections.Counter):
        return None

    def load(counts: dict) -> None:
        env.metrics = collections.Counter(counts)

    return PendingCounters(state=lambda: dict(env.metrics), load=load)


def _model_dir(cfg: ScenarioConfig) -> Path:
    """The checked scenario's model folder; 'tiny-random' is built into backend.model_cache on first use.

    In a distributed run the driver builds first, so the workers (which call this again from the same
    scenario) find the finished folder; tiny_random_model's rename keeps concurrent builders safe anyway.
    """
    b: LLMBackendConfig = cfg.backend
    if cfg.train.optimizer != "adam":
        raise ConfigError(f"train.optimizer: the LLM learner uses AdamW ('adam'), got {cfg.train.optimizer!r}")
    base = _init_folder(cfg) or _base_folder(cfg)
    if b.lora.enabled:  # target modules the model lacks: refused before an engine or learner is built
        from rtpo.llm.lora import check_targets

        try:
            check_targets(base, b.lora.spec())
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if isinstance(cfg.task, WorldTaskConfig) and cfg.task.format_warmup_steps:
        return _format_warm_model(cfg, base)
    return base


def _format_warm_model(cfg: ScenarioConfig, base: Path) -> Path:
    """The model folder after task.format_warmup_steps of rtpo.llm.worlds.format_warm_start from `base`,
    built once into backend.model_cache (keyed by the base folder, the world, its chat keys, the warm-start
    keys and the seed) and reused; written to a temporary folder and renamed, as tiny_random_model does."""
    import hashlib
    import json
    import shutil

    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.model import load_hf_model
    from rtpo.llm.worlds import format_warm_start, world_env

    task: WorldTaskConfig = cfg.task
    keys = (
        "context_map",
        "system",
        "enable_thinking",
        "format_warmup_steps",
        "format_warmup_lr",
        "format_warmup_batch",
    )
    ident = {
        "base": str(base.resolve()),
        "world": task.tabular.to_dict(),
        "chat": {k: getattr(task, k) for k in keys},
        "seed": cfg.seed,
    }
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]
    out = Path(cfg.backend.model_cache) / f"{base.name}-format{task.format_warmup_steps}-{digest}"
    if (out / "config.json").is_file():
        return out
    model = load_hf_model(base)
    env = world_env(task, load_qwen3_tokenizer(str(base)))
    format_warm_start(
        model, env, task.format_warmup_steps, lr=task.format_warmup_lr, batch=task.format_warmup_batch, seed=cfg.seed
    )
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.copytree(base, tmp)
    model.save_pretrained(str(tmp), safe_serialization=True)
    return publish_model_dir(tmp, out)


@dataclass(frozen=True)
class _RolloutSide:
    """What a rollout worker holds (and the driver shares): the training env, the engine, the env maker."""

    make_env: Any
    env: Any
    num_queries: int | None
    stop: tuple
    engine: Any


def _env_maker(cfg: ScenarioConfig, model_dir: Path, run_tool: Any = None) -> tuple[Any, list, list]:
    """make_env(task, which) of the scenario, and the two lists it shares with the engine built later:
    the engine (once built) and the environments waiting for it (an engine-written summary).  run_tool:
    the python tool's code runner (default: the sandbox in this process; on Ray, the tool workers)."""
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.env import LLMEnv

    b: LLMBackendConfig = cfg.backend
    task: LLMTaskConfig = cfg.task
    tokenizer = load_qwen3_tokenizer(str(model_dir))

    limit = context_limit(task, b)
    from rtpo.llm.search import QA_KINDS, build_retriever, qa_env_kwargs

    if task.kind in QA_KINDS:  # multi-hop QA: the search tool over one retriever, F1/EM scoring
        kinds = qa_env_kwargs(task, build_retriever(task), model_dir)
    elif task.kind in ("airline", "text"):
        kinds = {}  # rtpo.llm.airline / rtpo.llm.textenv build their own environments below
    else:
        kinds = {"sandbox": task.sandbox.limits(), "tools": task.tools}
    if run_tool is not None:
        kinds["run_tool"] = run_tool

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
    elif task.kind == "text":  # a registered text environment (rtpo.llm.textenv)
        from rtpo.llm.textenv import text_env_factory

        make_env = text_env_factory(task, tokenizer, limit)
    return make_env, engines, pending


def build_env(cfg: ScenarioConfig, which: str = "train") -> Any:
    """The scenario's training (or eval) environment alone: no engine, no learner (rtpo.llm.gold writes
    demonstrations with it; an engine-written summary is not available here)."""
    make_env, _, _ = _env_maker(cfg, _model_dir(cfg))
    return make_env(load_task(cfg.task, which), which)


def _make_engine(cfg: ScenarioConfig, model_dir: Path, role: str, stop: tuple) -> Any:
    """The sampling engine (vLLM or HF) at the training settings, stopping at `stop`."""
    from rtpo.llm.engines import SamplingConfig

    b: LLMBackendConfig = cfg.backend
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
        import torch

        from rtpo.llm.engines.hf import HFEngine

        engine = HFEngine(
            model_dir,
            sampling,
            max_model_len=b.max_model_len,
            dtype=getattr(torch, b.engine_dtype),
            device=_device(b),
        )
    return engine


def _world_side(cfg: ScenarioConfig, model_dir: Path, role: str) -> _RolloutSide:
    """An exact world's rollout side (rtpo.llm.worlds): the chat environment over the task's MDP and the
    engine; backend.max_tokens must fit every action's canonical response."""
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.worlds import WorldEnv, build_world

    b: LLMBackendConfig = cfg.backend
    task: WorldTaskConfig = cfg.task
    tokenizer = load_qwen3_tokenizer(str(model_dir))
    world = build_world(task)

    def make_env(_t=None, _which=None):
        return WorldEnv(
            world,
            tokenizer,
            context_map=task.context_map,
            system=task.system,
            enable_thinking=task.enable_thinking,
            malformed_reward=task.malformed_reward,
        )

    env = make_env()
    from rtpo.llm.exact import count_nodes

    nodes = int(count_nodes(world).sum())
    if task.exact_fallback == "error" and nodes > task.exact_max_contexts:
        raise ConfigError(
            f"task.exact_max_contexts: exact evaluation of task {task.kind!r} would enumerate {nodes:,} decision "
            f"contexts, more than exact_max_contexts={task.exact_max_contexts:,}; raise it, or set "
            "task.exact_fallback: sampled (logged as eval/value_sampled)"
        )
    longest = max(x.size for x in env.words.canonical)
    if b.max_tokens < longest:
        raise ConfigError(
            f"backend.max_tokens: {b.max_tokens} tokens cannot hold an action's canonical response "
            f"({longest} tokens in this tokenizer); set it to at least {longest}"
        )
    stop = tuple(sorted(env.chat.stop_ids))
    engine = _make_engine(cfg, model_dir, role, stop)
    return _RolloutSide(make_env=make_env, env=env, num_queries=None, stop=stop, engine=engine)


def _world_evaluate(cfg, side, learner, sampler, eval_sampling, model_dir: Path):
    """(evaluate, sampled eval, value key) of an exact world: the exact value of the learner's policy at the
    evaluation settings (rtpo.llm.exact), or, when the world is too large and task.exact_fallback is
    sampled, a Monte-Carlo estimate of task.eval_queries episodes under eval/value_sampled."""
    from rtpo.llm.exact import ExactEvaluator, ExactLimitError
    from rtpo.llm.model import load_hf_model

    b: LLMBackendConfig = cfg.backend
    task: WorldTaskConfig = cfg.task
    eval_env = side.make_env()
    sampled = SampledEval(
        splits={"eval": EvalSplit(eval_env, None), "train": EvalSplit(side.make_env(), None)},
        policy=functools.partial(eval_engine, side.engine, learner, sampler, eval_sampling),
        settings={
            "engine": b.engine,
            "temperature": eval_sampling.temperature,
            "top_p": eval_sampling.top_p,
            "max_tokens_per_turn": b.max_tokens,
            "num_turns": eval_env.num_turns,
            "context_map": task.context_map,
        },
        default_problems=task.eval_queries,
    )
    env = side.env
    try:
        model = load_hf_model(model_dir)
        exact = ExactEvaluator(
            eval_env,
            model,
            b.eval_temperature,
            b.eval_top_p,
            batch_tokens=task.exact_batch_tokens,
            limit=task.exact_max_contexts,
            malformed_reward=task.malformed_reward,
        )
    except ExactLimitError as e:
        if task.exact_fallback != "sampled":
            raise ConfigError(str(e)) from None
        exact = None

    def evaluate() -> dict[str, float]:
        out = {(k if k.startswith("time/") else f"env/{k}"): float(v) for k, v in env.pop_metrics().items()}
        if exact is not None:
            missing, unexpected = model.load_state_dict(learner.weights(), strict=False)
            if unexpected or set(missing) - {"lm_head.weight"}:
                raise RuntimeError(f"exact evaluation: the learner's weights do not fit the model ({missing[:3]})")
            out.update(exact())
        else:
            ids = np.arange(task.eval_queries, dtype=np.int64)
            got = in_run_metrics(sampled, ids, cfg.seed + IN_RUN_SEED_OFFSET)
            out.update({("eval/value_sampled" if k == "eval/value" else k): v for k, v in got.items()})
            out["eval/v_star"] = eval_env.world.v_star
        out.update({"time/weight_sync_s": sampler.sync_seconds, "time/weight_syncs": float(sampler.syncs)})
        return out

    return evaluate, sampled, ("eval/value" if exact is not None else "eval/value_sampled")


def _rollout_side(cfg: ScenarioConfig, model_dir: Path, role: str, run_tool: Any = None) -> _RolloutSide:
    if isinstance(cfg.task, WorldTaskConfig):
        return _world_side(cfg, model_dir, role)
    make_env, engines, pending = _env_maker(cfg, model_dir, run_tool)
    env = make_env(load_task(cfg.task, "train"), "train")
    train_task = env.task  # without any dropped problems
    num_queries = len(train_task)
    if cfg.method.name == "sft":  # supervised fine-tuning: the demonstrations, rendered by this very env
        from rtpo.llm.sft import DemonstrationError, attach

        try:
            num_queries = len(attach(env, cfg.method.config.data))
        except DemonstrationError as e:
            raise ConfigError(f"method.data: {e}") from None
    stop = tuple(sorted(env.chat.stop_ids))
    engine = _make_engine(cfg, model_dir, role, stop)
    engines.append(engine)
    for e in pending:
        e.summarizer.engine = engine
    return _RolloutSide(make_env=make_env, env=env, num_queries=num_queries, stop=stop, engine=engine)


def _device(b: LLMBackendConfig) -> str:
    """backend.device resolved: the one setting that places the learner's model and the hf engine."""
    import torch

    if b.device != "auto":
        return b.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def learner_config(cfg: ScenarioConfig) -> Any:
    """The FSDP learner's LearnerConfig of a scenario: the same for the driver's learner and for every
    Ray trainer rank (train.lr and its schedule, the backend's numerics, a KL reference when needed)."""
    from rtpo.llm.learner import LearnerConfig

    b: LLMBackendConfig = cfg.backend
    kl = float(getattr(cfg.method.config, "kl_coef", 0.0) or 0.0)
    return LearnerConfig(
        lr=cfg.train.lr,
        lr_schedule=cfg.train.lr_schedule_config(),
        weight_decay=b.weight_decay,
        grad_clip=b.grad_clip,
        temperature=b.temperature,
        micro_batch_tokens=b.micro_batch_tokens,
        packing=b.packing,
        kl_reference=kl > 0,
        param_dtype=b.param_dtype,
        mixed_precision=b.mixed_precision,
        gradient_checkpointing=b.gradient_checkpointing,
        peak_flops=b.peak_flops,
        lora=b.lora.spec(init_seed=cfg.seed),  # every rank: the same initial adapters
    )


def _learner(cfg: ScenarioConfig, model_dir: Path, role: str) -> Any:
    """The FSDP2 learner.  A trainer rank whose process group already exists (a Ray trainer actor: the
    group's size is resources.trainer_workers) builds its shard in that group; otherwise launch_learner
    spawns backend.world_size − 1 local ranks around this process (the driver's learner)."""
    import torch
    import torch.distributed as dist

    from rtpo.llm.learner import FSDPLearner, launch_learner

    b: LLMBackendConfig = cfg.backend
    lcfg = learner_config(cfg)
    if role == "trainer" and dist.is_initialized():
        if b.threads_per_rank:
            torch.set_num_threads(b.threads_per_rank)
        return FSDPLearner(
            model_dir, lcfg, rank=dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend()
        )
    world_size, device = driver_learner_layout(cfg) if role == "driver" else (b.world_size, _device(b))
    backend = "gloo" if device != "cuda" else None  # None: NCCL on the GPUs
    learner = launch_learner(
        model_dir,
        lcfg,
        world_size=world_size,
        backend=backend,
        threads_per_rank=b.threads_per_rank,
        device=None if device == "cuda" else device,  # cuda: each rank's own GPU
    )
    if world_size > 1:
        atexit.register(learner.close)
    return learner


def driver_learner_layout(cfg: ScenarioConfig) -> tuple[int, str]:
    """(ranks, device) of the driver's learner.  On Ray with a trainer group the driver's learner never
    trains: it holds the group's weights for evaluation (rtpo.distributed.distribute), so it is one rank in
    host memory (no optimiser state is ever allocated: AdamW's is lazy) and takes none of the node's
    devices; otherwise it is the run's learner, backend.world_size ranks on backend.device."""
    b: LLMBackendConfig = cfg.backend
    trainers = (cfg.resources or {}).get("trainer_workers", 1)
    if b.distributed == "ray" and trainers > 0:
        return 1, "cpu"
    return b.world_size, _device(b)


def tool_factory(cfg: ScenarioConfig) -> Any:
    """One python-tool runner per Ray tool worker (resources.tool_workers): the sandbox, run there.  None
    when the scenario's environment runs no python code (airline and world tasks, QA without python)."""
    task = cfg.task
    if isinstance(task, WorldTaskConfig) or task.kind == "airline" or "python" not in _tool_names(task):
        return None
    from rtpo.distributed.tools import StarTool
    from rtpo.llm.sandbox import run_python

    return StarTool(run_python)


def _tool_names(task: Any) -> list[str]:
    return [t if isinstance(t, str) else next(iter(t), "") for t in (getattr(task, "tools", None) or [])]


def _tracked_sampler(cfg: ScenarioConfig, engine: Any, model_dir: Path) -> TrackedSampler:
    """The run's sampler around `engine`, counting the generator's model FLOPs from the model folder's
    config (rtpo.llm.flops) against backend.peak_flops × tensor_parallel_size (the engine's devices)."""
    import json

    from rtpo.llm.flops import ModelShape

    b: LLMBackendConfig = cfg.backend
    shape = ModelShape.from_config(json.loads((Path(model_dir) / "config.json").read_text()))
    peak = b.peak_flops * b.tensor_parallel_size if b.peak_flops else None
    return TrackedSampler(engine, shape=shape, peak_flops=peak)


def build_role(cfg: ScenarioConfig, role: str, run_tool: Any = None) -> RunContext:
    """Only what one role of a distributed run uses (rtpo.distributed.ScenarioFactory calls this).

    rollout: the training env + engine, no learner (a rollout actor holds no optimiser or FSDP shard);
             run_tool, when given, runs its python tool calls (the Ray tool workers: tool_factory).
    trainer: the learner alone, in the actor's process group when one exists (see _learner).
    driver:  the full build() (the driver also evaluates).
    """
    if role == "driver":
        return build(cfg).ctx
    model_dir = _model_dir(cfg)
    rng = np.random.default_rng(cfg.seed)
    if role == "rollout":
        side = _rollout_side(cfg, model_dir, role, run_tool)
        return RunContext(env=side.env, sampler=_tracked_sampler(cfg, side.engine, model_dir), learner=None, rng=rng)
    if role == "trainer":
        return RunContext(env=None, sampler=None, learner=_learner(cfg, model_dir, role), rng=rng)
    raise ValueError(f"build_role: unknown role {role!r} (rollout, trainer or driver)")


def _base_folder(cfg: ScenarioConfig) -> Path:
    b = cfg.backend
    if b.model == "tiny-random":
        return tiny_random_model(b.model_cache, cfg.seed, b.tiny_tokenizer, b.tiny_init_std)
    return check_model_dir(b.model)


def _init_folder(cfg: ScenarioConfig) -> Path | None:
    """The model folder backend.init resolves to (exported once from a run folder), or None."""
    if cfg.backend.init is None:
        return None
    from rtpo.llm.init import resolve_init

    return resolve_init(cfg.backend.init, _base_folder(cfg), Path(cfg.backend.model_cache))


def _inputs(cfg: ScenarioConfig) -> dict[str, str]:
    """BackendSpec.inputs: the content digest of backend.init's weights (rtpo.llm.init.content_digest)."""
    folder = _init_folder(cfg)
    if folder is None:
        return {}
    from rtpo.llm.init import content_digest

    return {"backend.init": content_digest(folder)}


def build(cfg: ScenarioConfig) -> BuiltBackend:
    from rtpo.llm.engines import SamplingConfig

    b: LLMBackendConfig = cfg.backend
    task: LLMTaskConfig = cfg.task
    model_dir = _model_dir(cfg)
    side = _rollout_side(cfg, model_dir, "driver")
    env, engine = side.env, side.engine
    eval_env = None if isinstance(task, WorldTaskConfig) else side.make_env(load_task(task, "eval"), "eval")
    eval_sampling = SamplingConfig(
        temperature=b.eval_temperature, top_p=b.eval_top_p, max_tokens=b.max_tokens, stop_token_ids=side.stop
    )
    learner = _learner(cfg, model_dir, "driver")
    sampler = _tracked_sampler(cfg, engine, model_dir)
    rng = np.random.default_rng(cfg.seed)
    ctx = RunContext(env=env, sampler=sampler, learner=learner, rng=rng)
    if isinstance(task, WorldTaskConfig):
        evaluate, sampled, value_key = _world_evaluate(cfg, side, learner, sampler, eval_sampling, model_dir)
        return BuiltBackend(
            ctx=ctx,
            evaluate=evaluate,
            sampler_state=sampler.state,
            load_sampler_state=sampler.load_state,
            sampler_state_at_boundary=lambda: TrackedSampler.RESYNC,
            counters=_pending_counters(side.env),
            num_queries=None,
            value_key=value_key,
            optimum_key="eval/v_star",
            sampled_eval=sampled,
        )
    sampled = sampled_eval_of(b, task, env, eval_env, engine, learner, sampler, eval_sampling)
    evaluate = functools.partial(_evaluate, sampled, env, sampler, cfg.seed)
    return BuiltBackend(
        ctx=ctx,
        evaluate=evaluate,
        sampler_state=sampler.state,
        load_sampler_state=sampler.load_state,
        # between iterations the checkpoint keeps no second copy of the weights: begin() pushes them anyway
        sampler_state_at_boundary=lambda: TrackedSampler.RESYNC,
        sample_log=getattr(env, "sample_log", None),
        counters=_pending_counters(env),
        num_queries=side.num_queries,
        value_key="eval/value",
        sampled_eval=sampled,
    )


def export(cfg: ScenarioConfig, weights: dict, out: Any, manifest: dict | None = None) -> Path:
    """BackendSpec.export: `weights` as a Hugging Face folder `out` with the run's model config,
    generation config and tokenizer (rtpo.llm.hf_folder.write_hf_folder)."""
    from rtpo.llm.hf_folder import write_hf_folder

    model_dir = _model_dir(cfg)
    if cfg.backend.lora.enabled:  # a LoRA run's checkpoint holds the adapters: merged into the base here
        from rtpo.llm.lora import base_weights, is_adapter_key, merge_weights

        if not weights or not all(is_adapter_key(k) for k in weights):
            raise ValueError("a LoRA run's checkpoint must hold LoRA adapters alone (backend.lora.enabled)")
        weights = merge_weights({**base_weights(model_dir), **weights}, cfg.backend.lora.spec().scaling)
    return write_hf_folder(model_dir, weights, out, manifest)


# A sampled turn keeps at least its text, token ids and log-probabilities and a few Python objects: a
# deliberately low figure, so the refusal below catches only sizes no machine holds (method.G=1e9).
_BYTES_PER_SAMPLED_TURN = 2048


def memory_estimate(cfg) -> list[tuple[str, int]]:
    """A lower bound of one iteration's sampled turns, by the key driving it (rtpo.scenario.backends.rollout_memory)."""
    return [rollout_memory(cfg, cfg.task.num_turns, _BYTES_PER_SAMPLED_TURN)]


register_backend(
    "llm",
    BackendSpec(
        config=LLMBackendConfig,
        parse_task=parse_task,
        build=build,
        build_role=build_role,
        tool_factory=tool_factory,
        task_schemas=task_schemas,
        memory=memory_estimate,
        export=export,
        inputs=_inputs,
    ),
)
