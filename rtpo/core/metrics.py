"""What every producer of the metrics record shares: which keys are wall-clock, and the generation figures.

The record metrics.jsonl (and every tracker) gets per phase holds two kinds of values.  Most are a function
of the scenario and its seed: a resumed run, a fork, an in-memory run or a sharded run reproduces them.  The
others measure the machine: seconds (`time/*`, `ray/rollout_s`, ...), rates per second (`gen/tokens_per_s`),
throughput and memory (`perf/*`, `memory/*`)
and how Ray's pull scheduling spread the tasks (`ray/tasks_per_worker_max`/`_min`).  `wall_clock(key)` is
the one declaration of the second kind; a comparison of two runs for exactness drops those keys
(`reproducible(record)`) and nothing else.

`generation_metrics(counts)` turns a sampler's summed generation counts (seconds in the engine, tokens and
responses generated) into the record's `time/generate_s` and `gen/*` keys, the same way whether the counts
come from the one sampler of an in-process run or are summed over Ray's rollout workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# time/*: seconds; perf/* and memory/*: the machine's throughput and memory (the learner's FLOP/s, MFU,
# peak resident and accelerator memory)
WALL_CLOCK_PREFIXES = ("time/", "perf/", "memory/")
# seconds and rates per second under any prefix: gen/tokens_per_s, ray/weight_sync_s, ray/rollout_s, ...
WALL_CLOCK_SUFFIXES = ("_s",)
# which worker pulled how many tasks depends on timing, not on the seed
SCHEDULING_KEYS = frozenset({"ray/tasks_per_worker_max", "ray/tasks_per_worker_min"})


def wall_clock(key: str) -> bool:
    """True for a metric key whose value depends on the machine's clock or on scheduling, not on the seed."""
    return key.startswith(WALL_CLOCK_PREFIXES) or key.endswith(WALL_CLOCK_SUFFIXES) or key in SCHEDULING_KEYS


def reproducible(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record without its wall-clock keys: what two runs of the same scenario and seed must agree on."""
    return {k: v for k, v in record.items() if not wall_clock(k)}


# gen/prefill_flops, gen/decode_flops: the engine's model FLOPs (rtpo.llm.flops); gen/peak_flop_budget_s:
# Σ peak FLOP/s × engine seconds, so that MFU summed over Ray's workers is Σ FLOPs / Σ (peak · seconds)
GENERATION_COUNTS = (
    "time/generate_s",
    "gen/tokens",
    "gen/responses",
    "gen/prefill_flops",
    "gen/decode_flops",
    "gen/peak_flop_budget_s",
)


def generation_metrics(counts: Mapping[str, float]) -> dict[str, float]:
    """Summed generation counts (GENERATION_COUNTS) -> the record's generation keys: time in the engine,
    tokens and responses, mean response length (tokens per response) and tokens per second of engine
    time (over Ray's workers: the summed engine seconds, so a per-engine rate).  Nothing when nothing
    was generated.

    Where the sampler counts model FLOPs (rtpo.llm.flops): perf/generator_flops (prefill + decode),
    perf/generator_prefill_flops, perf/generator_flops_per_s (per second of engine time, like
    gen/tokens_per_s) and, where a peak is configured, perf/generator_mfu = Σ FLOPs / Σ (peak · seconds)."""
    responses = float(counts.get("gen/responses", 0.0))
    if not responses:
        return {}
    seconds, tokens = float(counts.get("time/generate_s", 0.0)), float(counts.get("gen/tokens", 0.0))
    out = {
        "time/generate_s": seconds,
        "gen/tokens": tokens,
        "gen/responses": responses,
        "gen/response_len_mean": tokens / responses,
        "gen/tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
    }
    prefill, decode = float(counts.get("gen/prefill_flops", 0.0)), float(counts.get("gen/decode_flops", 0.0))
    if prefill or decode:
        out["perf/generator_flops"] = prefill + decode
        out["perf/generator_prefill_flops"] = prefill
        out["perf/generator_flops_per_s"] = (prefill + decode) / seconds if seconds > 0 else float("nan")
        budget = float(counts.get("gen/peak_flop_budget_s", 0.0))
        if budget > 0:
            out["perf/generator_mfu"] = (prefill + decode) / budget
    return out
