"""The knowledge-reasoning family (paper §4, E.3): multi-hop QA with a search tool, as a scenario's `task`.

`task.kind` names the data: hotpotqa | 2wiki | searchr1 (a local file in that official layout, read by
rtpo.llm.tasks.qa) or multihop (a seeded two-hop task generated locally and written in the HotpotQA
format, for CPU runs and tests).  `task.tools` lists the tools offered (default [search]; [python,
search] adds the sandboxed Python tool).  `task.retriever` says where passages come from: BM25 over a
corpus file (`corpus`; when null, the corpus is built from the data files' own context paragraphs and
cached beside the generated data) or a Search-R1-style HTTP server (`url`).  The reward is F1 (or EM)
with HotpotQA's normalisation; both are logged (answer/f1, answer/em), with search calls and retrieval
recall of the gold supporting titles (tool/search/*).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rtpo.llm.sections import SandboxSection
from rtpo.scenario.schema import ConfigError, pydantic_error

QA_KINDS = ("hotpotqa", "2wiki", "searchr1", "multihop")


class RetrieverSection(BaseModel):
    """`task.retriever`: BM25 over a local corpus, or a Search-R1 / verl retrieval server."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
    kind: Literal["bm25", "http"] = Field("bm25", description="bm25 (in process, bm25s) | http (a /retrieve server)")
    corpus: str | None = Field(
        None,
        description="bm25: corpus JSONL {id, title, text} (or Search-R1's {id, contents}); null = built from "
        "the data files' context paragraphs",
    )
    cache_dir: str | None = Field(None, description="bm25: where indexes are cached (null = beside the corpus)")
    k1: float = Field(1.5, gt=0, description="bm25: term-frequency saturation")
    b: float = Field(0.75, ge=0, le=1, description="bm25: length normalisation")
    url: str | None = Field(None, description="http: the endpoint, e.g. http://127.0.0.1:8000/retrieve")
    timeout_s: float = Field(10.0, gt=0, le=600, description="http: total seconds per attempt, connection to last byte")
    retries: int = Field(2, ge=0, le=10, description="http: further attempts after a failure (backoff doubles)")
    backoff_s: float = Field(0.5, ge=0, le=60, description="http: first backoff")
    max_response_bytes: int = Field(
        16 << 20, ge=1024, le=1 << 31, description="http: a larger answer is a failed attempt"
    )
    topk: int = Field(3, ge=1, le=50, description="passages per search call (Search-R1: 3)")
    max_query_chars: int = Field(500, ge=1, le=100_000, description="longer queries are refused (feedback)")
    max_passage_chars: int = Field(600, ge=1, le=100_000, description="each passage's text is cut to this")
    max_title_chars: int = Field(200, ge=1, le=10_000, description="each passage's title is cut to this")

    @model_validator(mode="after")
    def _check(self) -> RetrieverSection:
        if self.kind == "http" and not self.url:
            raise ValueError("kind http needs url (the server's /retrieve endpoint)")
        if self.url is not None and not (self.url.startswith(("http://", "https://")) and len(self.url) > 8):
            raise ValueError(f"url must be an http:// or https:// endpoint, got {self.url[:80]!r}")
        return self


class JudgeSection(BaseModel):
    """`task.judge`: the LLM-as-judge scorer (rtpo.llm.judge), used when task.reward is judge."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)
    model: str = Field(
        "initial",
        description="local HF folder of the judge (the paper: a 72B instruct model), or initial: a frozen "
        "copy of the run's starting model (plumbing tests)",
    )
    engine: Literal["hf", "vllm"] = Field("hf", description="the judge's engine (greedy decoding)")
    max_tokens: int = Field(16, ge=1, le=4096, description="verdict tokens (one word is asked for)")
    enable_thinking: bool = Field(False, description="let a Qwen3 judge think before its verdict")
    fallback: Literal["f1", "em", "zero"] = Field("f1", description="reward when the verdict is not yes/no")
    max_chars: int = Field(1000, ge=1, description="question, golds and answer are each cut to this")
    kv_cache_gb: float = Field(1.0, gt=0, description="vllm judge: KV cache memory")


class QATaskConfig(BaseModel):
    """Multi-hop QA with a search tool (HotpotQA, 2WikiMultiHopQA, Search-R1 data, or generated)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    kind: Literal["hotpotqa", "2wiki", "searchr1", "multihop"] = Field(
        description="the data layout (rtpo.llm.tasks.qa), or multihop: generated two-hop questions"
    )
    path: str | None = Field(None, description="local data file (JSON list / JSONL / Parquet) for a layout kind")
    eval_path: str | None = Field(None, description="held-out file (same layout; null = the training file)")
    limit: int | None = Field(None, ge=1, description="keep the first N items of each file")
    n: int = Field(64, ge=1, description="multihop: training questions")
    eval_n: int = Field(32, ge=1, description="multihop: held-out questions")
    task_seed: int = Field(0, ge=0, description="multihop: generator seed")
    distractors: int = Field(8, ge=0, description="multihop: distractor paragraphs per question")
    data_dir: str = Field("runs/.data", description="where generated data, built corpora and indexes go")
    prompt: str | None = Field(None, description="user-message template with {question} (null = the default)")
    tools: list[str | dict[str, Any]] = Field(["search"], description="tools offered: [search], [python, search]")
    retriever: RetrieverSection = Field(default_factory=RetrieverSection, description="where passages come from")
    reward: Literal["f1", "em", "judge"] = Field(
        "f1", description="the training reward: f1 | em | judge (an LLM judge, task.judge); f1 and em are logged"
    )
    judge: JudgeSection | None = Field(None, description="the LLM judge's model and engine (reward: judge)")
    num_turns: int = Field(6, ge=1, description="K, the turn horizon (E.3: 6 for search)")
    context_map: str | dict[str, Any] = Field(
        "think_strip", description="psi: think_strip | identity | last_turns | summarize ({summarize: {m: 1}})"
    )
    enable_thinking: bool = Field(True, description="Qwen3 thinking mode")
    system: str | None = Field(None, description="optional system prompt")
    max_calls_per_turn: int = Field(2, ge=1, description="tool calls run per turn")
    eval_queries: int = Field(16, ge=1, description="questions per evaluation")
    full_context_map: str | dict[str, Any] | None = Field(
        None, description="also record contexts under this map (e.g. identity) for flat baselines' train_context"
    )
    max_context_tokens: int | None = Field(
        None, ge=1, description="longest turn context c_k (E.3: 8192); null = backend.max_model_len - 1 if set"
    )
    drop_overlong: bool = Field(False, description="leave out questions whose prompt exceeds max_context_tokens")
    answer_parse: Literal["boxed", "answer_tag"] = Field(
        "boxed", description="boxed: the last \\boxed{}; answer_tag: also Search-R1's <answer>...</answer>"
    )
    sandbox: SandboxSection = Field(
        default_factory=SandboxSection, description="limits of the python tool, when listed"
    )

    @model_validator(mode="after")
    def _check(self) -> QATaskConfig:
        if self.kind != "multihop" and self.path is None:
            raise ValueError(f"kind {self.kind!r} reads a local file: set task.path")
        if self.reward == "judge" and self.judge is None:
            raise ValueError("reward judge needs task.judge (e.g. judge: {model: /path/to/judge})")
        if self.prompt is not None and "{question}" not in self.prompt:
            raise ValueError("prompt must contain {question}")
        return self

    def to_dict(self) -> dict:
        return self.model_dump()


def parse_qa_task(data: dict) -> QATaskConfig:
    try:
        cfg = QATaskConfig.model_validate(data)
    except ValidationError as e:
        raise pydantic_error(e, "task") from None
    return cfg


def _multihop_paths(task: QATaskConfig) -> tuple[Path, Path]:
    from rtpo.llm.tasks.qa import write_multihop

    root = Path(task.data_dir)
    train = root / f"multihop-n{task.n}-d{task.distractors}-seed{task.task_seed}.json"
    held = root / f"multihop-n{task.eval_n}-d{task.distractors}-seed{task.task_seed + 1_000_003}.json"
    if not train.is_file():
        write_multihop(train, task.n, task.task_seed, task.distractors)
    if not held.is_file():
        write_multihop(held, task.eval_n, task.task_seed + 1_000_003, task.distractors)
    return train, held


def load_qa_task(task: QATaskConfig, which: str = "train"):
    """The QA items of a split ('train' or 'eval')."""
    from rtpo.llm.tasks.qa import DEFAULT_PROMPT, QADataError, load_qa

    try:
        if task.kind == "multihop":
            train, held = _multihop_paths(task)
            path, layout = (train if which == "train" else held), "hotpotqa"
        else:
            path = task.path if which == "train" or task.eval_path is None else task.eval_path
            layout = task.kind
        return load_qa(path, layout, limit=task.limit, prompt=task.prompt or DEFAULT_PROMPT)
    except (QADataError, ValueError) as e:
        raise ConfigError(f"task.{'path' if task.kind != 'multihop' else 'kind'}: {e}") from None


def build_retriever(task: QATaskConfig):
    """The retriever of a QA scenario (one per process; the search tools of train and eval share it)."""
    from rtpo.llm.retrieval import BM25Retriever, CorpusError, HTTPRetriever
    from rtpo.llm.tasks.qa import QADataError, corpus_from_contexts

    r = task.retriever
    if r.kind == "http":
        try:
            return HTTPRetriever(
                r.url, timeout_s=r.timeout_s, retries=r.retries, backoff_s=r.backoff_s,
                max_response_bytes=r.max_response_bytes,
            )  # fmt: skip
        except ValueError as e:
            raise ConfigError(f"task.retriever.url: {e}") from None
    corpus = r.corpus
    try:
        if corpus is None:
            tasks = [load_qa_task(task, "train"), load_qa_task(task, "eval")]
            key = hashlib.sha256("|".join(sorted({t.name for t in tasks})).encode())
            for t in tasks:
                for item in t:
                    key.update(item.id.encode())
            out = Path(task.data_dir) / f"corpus-{task.kind}-{key.hexdigest()[:16]}.jsonl"
            corpus = str(out if out.is_file() else corpus_from_contexts(tasks, out))
        cache = r.cache_dir or os.path.join(task.data_dir, "index")
        key = "task.retriever.cache_dir" if r.cache_dir else "task.data_dir"
        for above in (Path(cache), *Path(cache).parents):
            if above.exists() and not above.is_dir():
                raise ConfigError(f"{key}: {above} is a file, not a folder for the BM25 index")
    except (CorpusError, QADataError) as e:
        raise ConfigError(f"task.retriever.corpus: {e}") from None
    try:
        return BM25Retriever(corpus, cache_dir=cache, k1=r.k1, b=r.b)
    except CorpusError as e:
        raise ConfigError(f"task.retriever.corpus: {e}") from None
    except OSError as e:  # the cache folder cannot be created or written
        raise ConfigError(f"{key}: cannot write the BM25 index there ({e.strerror or e})") from None


def build_judge(judge: JudgeSection, model_dir: Any):
    """The judge scorer of a QA scenario: a frozen engine at greedy settings over the judge model's own
    tokenizer (`initial` = the run's starting model folder, loaded separately, so training never moves it)."""
    from pathlib import Path

    from rtpo.llm.chat import Qwen3Chat, load_qwen3_tokenizer
    from rtpo.llm.engines import SamplingConfig
    from rtpo.llm.judge import JudgeScorer

    path = Path(model_dir) if judge.model == "initial" else Path(judge.model)
    if not (path / "config.json").is_file():
        raise ConfigError(f"task.judge.model: {str(path)!r} is not a local HF model folder (no config.json)")
    chat = Qwen3Chat(load_qwen3_tokenizer(str(path)), tools=None, enable_thinking=judge.enable_thinking)
    sampling = SamplingConfig(temperature=0.0, max_tokens=judge.max_tokens, stop_token_ids=tuple(chat.stop_ids))
    if judge.engine == "vllm":
        from rtpo.llm.engines.vllm import VLLMEngine

        engine = VLLMEngine(path, sampling, seed=0, kv_cache_gb=judge.kv_cache_gb)
    else:
        from rtpo.llm.engines.hf import HFEngine

        engine = HFEngine(path, sampling)
    return JudgeScorer(engine, chat, fallback=judge.fallback, max_chars=judge.max_chars)


def qa_env_kwargs(task: QATaskConfig, retriever: Any, model_dir: Any = None) -> dict:
    """The LLMEnv arguments that make it a QA environment: its tools (search bound to `retriever`) and
    its scorer (F1/EM, or the LLM judge: `model_dir` is the run's model folder, for judge.model initial)."""
    from rtpo.llm.rewards import QAScorer
    from rtpo.llm.tools.search import SearchTool

    r = task.retriever
    tools = []
    for t in task.tools:
        if t == "search":
            tools.append(SearchTool(retriever, r.topk, r.max_query_chars, r.max_passage_chars, r.max_title_chars))
        else:
            tools.append(t)
    if task.reward == "judge":
        assert task.judge is not None  # the config's validator requires it
        scorer: Any = build_judge(task.judge, model_dir)
    else:
        scorer = QAScorer(task.reward)
    return {"tools": tools, "verifier": scorer, "sandbox": task.sandbox.limits()}


__all__ = [
    "QA_KINDS",
    "JudgeSection",
    "QATaskConfig",
    "RetrieverSection",
    "build_judge",
    "build_retriever",
    "load_qa_task",
    "parse_qa_task",
    "qa_env_kwargs",
]
