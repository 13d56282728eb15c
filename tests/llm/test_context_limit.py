"""The context limit of an LLM scenario (task.max_context_tokens, E.3's max prompt): prompts that cannot
fit are a one-line config error naming the first one, or are dropped on request; the limit defaults to
backend.max_model_len − 1 and may not leave a response no room."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from rtpo.scenario.backends import get_backend  # noqa: E402
from rtpo.scenario.load import ConfigError, load_scenario  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "llm" / "tiny-cpu.yaml"


def _cfg(tmp_path, *extra):
    return load_scenario(
        SCENARIO,
        [
            "backend.engine=hf",
            "backend.tiny_tokenizer=bpe512",
            "task.n=12",
            f"backend.model_cache={tmp_path / 'models'}",
            *extra,
        ],
    )


def _prompt_lengths(tmp_path):
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.env import LLMEnv
    from rtpo.llm.model_cache import tiny_random_model
    from rtpo.llm.schema import load_task

    cfg = _cfg(tmp_path)
    tok = load_qwen3_tokenizer(str(tiny_random_model(cfg.backend.model_cache, cfg.seed, "bpe512")))
    env = LLMEnv(
        load_task(cfg.task), tok, num_turns=3, enable_thinking=False, max_calls_per_turn=1, max_context_tokens=1
    )
    return sorted(n for _, n in env.check_prompts())


def test_overlong_prompts_are_named_or_dropped(tmp_path):
    lengths = _prompt_lengths(tmp_path)
    assert len(lengths) == 12 and lengths[0] < lengths[-1]  # generated problems differ in length
    cut = lengths[len(lengths) // 2]
    keep = sum(n <= cut for n in lengths)
    with pytest.raises(
        ConfigError,
        match=rf"^task.max_context_tokens: {12 - keep} of 12 train problems have prompts "
        rf"longer than {cut} tokens \(first: item \d+, \d+ tokens\)",
    ):
        get_backend("llm").build(_cfg(tmp_path, f"task.max_context_tokens={cut}"))
    built = get_backend("llm").build(_cfg(tmp_path, f"task.max_context_tokens={cut}", "task.drop_overlong=true"))
    assert built.num_queries == keep
    env = built.ctx.env
    assert env.contexts(env.reset(np.arange(keep), built.ctx.rng)).lengths.max() <= cut


def test_the_limit_leaves_room_for_a_response(tmp_path):
    from rtpo.llm.schema import context_limit

    cfg = _cfg(tmp_path, "backend.max_model_len=256")
    assert context_limit(cfg.task, cfg.backend) == 255
    unbounded = _cfg(tmp_path, "backend.max_model_len=null")
    assert context_limit(unbounded.task, unbounded.backend) is None
    with pytest.raises(
        ConfigError,
        match="^task.max_context_tokens: 256 leaves no room for a response within backend.max_model_len=256",
    ):
        bad = _cfg(tmp_path, "backend.max_model_len=256", "task.max_context_tokens=256")
        context_limit(bad.task, bad.backend)
