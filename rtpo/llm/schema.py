"""The `llm` backend's scenario sections: `backend` (LLMBackendConfig) and the math `task` section
(LLMTaskConfig), the dispatch of `task.kind` to the math, QA-search, airline and text-environment task sections
(parse_task, load_task, task_schemas) and context_limit, the longest turn context the two allow.

Schema only: nothing here builds an engine, a learner or an environment (that is rtpo.llm.build).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rtpo.llm.sections import LoRASection, SandboxSection
from rtpo.scenario.schema import BackendConfig, ConfigError, pydantic_error


class LLMBackendConfig(BackendConfig):
    """Model, engine and learner of an LLM run (E.3 values where the paper gives them)."""

    kind: Literal["llm"] = Field(description="language models: vLLM/HF engine + FSDP2 learner")
    model: str = Field(
        description="local HF model folder (e.g. Qwen3-8B), or 'tiny-random': a random "
        "2-layer Qwen3 with the real Qwen3 tokenizer, built locally (no download)"
    )
    init: str | None = Field(
        None,
        description="start from these weights instead of backend.model's: a run folder (its latest "
        "checkpoint, e.g. an SFT warm start; exported once into model_cache) or an exported HF folder; "
        "same architecture and tokenizer as backend.model (rtpo.llm.init)",
    )
    model_cache: str = Field("runs/.models", description="where 'tiny-random' models (and init exports) are written")
    tiny_tokenizer: Literal["qwen3", "bpe512", "bpe512-chat"] = Field(
        "qwen3",
        description="tiny-random only: the real Qwen3 vocab, or a 512-token BPE built offline (a random "
        "policy over it writes digits often enough for answer_parse last_integer); bpe512-chat: one "
        "whose merges also cover the exact worlds' tool calls and observations (short canonical actions)",
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
    packing: bool = Field(
        False,
        description="padding-free learner passes: a micro-batch's rows packed into one sequence with per-row "
        "position ids (block-diagonal causal mask), same log-probs; off by default: on CPU, where SDPA has no "
        "variable-length kernel and attends over the whole packed row, it pays only where padding is large "
        "(2.6x tokens/s at the paper's lengths, 51% padding; 0.72-0.92x on tiny-cpu's batches; bench/packing.json)",
    )
    grad_clip: float | None = Field(1.0, gt=0, description="max global grad norm (null = off)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (E.3: 0.01)")
    param_dtype: Literal["float32", "bfloat16"] = Field("float32", description="learner weight dtype")
    mixed_precision: Literal["bfloat16", "float16"] | None = Field(None, description="FSDP2 compute dtype (GPU)")
    engine_dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="engine dtype")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the learner and the hf engine run (auto: cuda when torch sees a GPU)"
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations (long contexts)")
    lora: LoRASection = Field(default_factory=LoRASection, description="LoRA adapters (peft) instead of full training")
    peak_flops: float | None = Field(
        None,
        gt=0,
        description="one device's peak FLOP/s (e.g. 989e12: H200 dense bf16): train steps report the learner's "
        "perf/learner_mfu against it (x world_size), rollout phases the generator's perf/generator_mfu (x "
        "tensor_parallel_size); null = only the achieved perf/learner_flops_per_s and perf/generator_flops_per_s",
    )
    hardware: str | None = Field(
        None,
        description="accelerator rtpo run checks the workers' memory against before starting (rtpo.plan: "
        "H100-80GB, H200, A100-80GB, A100-40GB, L40S, cpu, or a YAML file); null = this machine",
    )


class FieldsSection(BaseModel):
    """`task.fields`: where a record keeps each value, when its columns differ from the layout's (rtpo.llm.data_files)."""

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
        ["python"],
        min_length=1,
        description="tools offered (rtpo.llm.tools registry names or {name: params}); "
        "{mcp: {command, args, env, cwd, tools, prefix, startup_timeout_s, call_timeout_s, max_output_chars, "
        "max_restarts}} offers every tool of a Model Context Protocol stdio server (docs/tools.md)",
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
    from rtpo.llm.worlds import parse_world_task, provider_of, world_kinds

    if not isinstance(data, dict):
        raise ConfigError(f"task: must be a mapping, got {data!r}")
    kind = data.get("kind")
    if provider_of(kind) is not None:  # an exact world (rtpo.llm.worlds): a tabular task kind as a chat
        return parse_world_task(data)
    if kind == "airline":
        from rtpo.llm.airline.build import parse_airline_task

        return parse_airline_task(data)
    if kind == "text":  # a text environment registered by a plugin (rtpo.llm.textenv)
        from rtpo.llm.textenv import parse_text_task

        return parse_text_task(data)
    from rtpo.llm.search import QA_KINDS, parse_qa_task

    if kind in QA_KINDS:
        return parse_qa_task(data)
    valid = ["arithmetic", "airline", "text", *QA_KINDS, *LAYOUTS.names(), *world_kinds()]
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
    if task.kind == "text":
        from rtpo.llm.textenv import load_text_items

        return load_text_items(task, which)
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


def task_schemas() -> list[dict]:
    """JSON Schemas of the llm backend's task sections (math; airline when its module imports)."""
    out = [LLMTaskConfig.model_json_schema()]
    try:
        from rtpo.llm.airline.build import AirlineTaskConfig

        out.append(AirlineTaskConfig.model_json_schema())
    except ImportError:
        pass
    from rtpo.llm.search import QATaskConfig
    from rtpo.llm.textenv import TextTaskConfig
    from rtpo.llm.worlds import WorldTaskConfig

    out.append(TextTaskConfig.model_json_schema())

    out.append(QATaskConfig.model_json_schema())
    world = WorldTaskConfig.model_json_schema()
    world["properties"].pop("tabular", None)  # the tabular task's own keys (its schemas list them)
    world["additionalProperties"] = True
    world.pop("required", None)
    out.append(world)
    return out


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
