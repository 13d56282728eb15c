"""Padding-free learner batches (LearnerConfig.packing) against left-padded ones: the learner's tokens/s and
padding share on the tiny scenario's batches and on a synthetic batch with the paper's lengths.

    flock /work/bench.lock python bench/bench_packing.py        # -> bench/packing.json

What is timed: a phase's learner work on one batch, the ratio pass (`logprobs`) then the train step
(`train_step`, which reuses the ratio pass's forward when the batch is one micro-batch), by one
FSDPLearner on one CPU rank; padded and packed learners alternate per round (ABAB), each round running
every batch once; tokens/s = the batches' context + response tokens over the median round's seconds.
Padding share = 1 − real tokens / positions the forward passes compute (rtpo.llm.learner.forward_tokens).

Batches:
  tiny-cpu      the train-step batches of one iteration of scenarios/llm/tiny-cpu.yaml (random tiny Qwen3,
                real tokenizer, K = 3) under RTPO (G = 3) and GRPO (G = 1 + (G − 1)·K = 7, equal rollouts),
                sampled by the HF engine (the same lengths vLLM would give in distribution; no vLLM start).
  paper         a synthetic GRPO batch of 64 episodes × K = 3 turns with the paper's lengths scaled by
                1/SCALE: per-turn responses log-normal with mean 1,688.8 tokens (Table 8: RTPO's average
                response length) and σ = 1, cut at 4,096 (E.3's per-turn limit); prompts log-normal with
                mean 300, cut at 8,192 (E.3's prompt limit); turn k's context = prompt + the k earlier
                responses.  Scaled so a CPU step takes seconds (padding share does not depend on the scale;
                attention's share of the FLOPs shrinks with it).

Why packing can be slower here: torch's SDPA has no variable-length kernel, so a packed micro-batch's
attention is one (T × T) product under a block-diagonal mask over all T of its tokens, where the padded
one is b products of (w × w), b·w ≈ T / (1 − padding share): packing trades padding for attention over
the other rows' keys (masked, but computed), plus transformers' building of that mask.  GPU flash-attention
kernels (varlen) skip the masked blocks; there packing saves the padding outright.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCALE = 8
PAPER = {"response_mean": 1688.8, "response_max": 4096, "prompt_mean": 300.0, "prompt_max": 8192, "sigma": 1.0}


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int, cap: float) -> np.ndarray:
    """Log-normal draws with the given mean (μ = ln mean − σ²/2), rounded, in [1, cap]."""
    x = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size)
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


def paper_batch(vocab: int, episodes: int = 64, turns: int = 3, scale: int = SCALE, seed: int = 0):
    """The synthetic GRPO batch of the module docstring: one row per (episode, turn), one sequence per
    episode (GRPO's seq-mean over whole trajectories), advantages ±1 per episode."""
    from rtpo.core.types import Ragged, TurnBatch

    rng = np.random.default_rng(seed)
    p = PAPER
    rsp = _lognormal(rng, p["response_mean"] / scale, p["sigma"], episodes * turns, p["response_max"] // scale)
    prompt = _lognormal(rng, p["prompt_mean"] / scale, p["sigma"], episodes, p["prompt_max"] // scale)
    rsp = rsp.reshape(episodes, turns)
    ctx = prompt[:, None] + np.concatenate([np.zeros((episodes, 1), np.int64), np.cumsum(rsp, 1)[:, :-1]], 1)
    ctx_r = Ragged.from_rows([rng.integers(0, vocab, n) for n in ctx.reshape(-1)], dtype=np.int64)
    rsp_r = Ragged.from_rows([rng.integers(0, vocab, n) for n in rsp.reshape(-1)], dtype=np.int64)
    n = rsp_r.values.size
    adv = np.repeat(np.where(np.arange(episodes) % 2 == 0, 1.0, -1.0), turns)
    return TurnBatch(
        contexts=ctx_r,
        tokens=rsp_r,
        old_logp=Ragged(-np.log(vocab) + 0.01 * rng.standard_normal(n), rsp_r.offsets),
        advantages=Ragged(np.repeat(adv, rsp_r.lengths), rsp_r.offsets),
        seq_id=np.repeat(np.arange(episodes), turns),
        weight=np.ones(episodes * turns),
        turn=np.tile(np.arange(turns), episodes),
    )


def tiny_batches(seed: int) -> dict[str, list]:
    """The (batch, loss) pairs the learner trains on in one iteration of tiny-cpu, under RTPO and GRPO."""
    from rtpo.core.budget import Budget
    from rtpo.core.methods import METHODS, RunContext
    from rtpo.llm.build import build
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(ROOT / "scenarios/llm/tiny-cpu.yaml", ["backend.engine=hf"])
    built = build(cfg)
    learner = built.ctx.learner
    k, g = cfg.task.num_turns, cfg.method.config.G
    out: dict[str, list] = {}
    for name, override in (("rtpo", {}), ("grpo", {"G": 1 + (g - 1) * k})):
        recorded: list = []
        step = learner.train_step

        def record(batch, loss, _step=step, _rec=recorded):
            _rec.append((batch, loss))
            return _step(batch, loss)

        learner.train_step = record
        method = METHODS.get(name)(METHODS.get(name).Config(**{**_fields(cfg.method.config, name), **override}))
        ctx = RunContext(
            env=built.ctx.env,
            sampler=built.ctx.sampler,
            learner=learner,
            rng=np.random.default_rng(seed),
            budget=Budget(),
        )
        state = method.begin(ctx, np.arange(cfg.budget.queries_per_iteration))
        while state.pending:
            method.phase(ctx, state)
        learner.train_step = step
        out[name] = recorded
    return out, cfg


def _fields(config, name: str) -> dict:
    """The scenario's method settings that the other method's config also has."""
    import dataclasses

    from rtpo.core.methods import METHODS

    target = {f.name for f in dataclasses.fields(METHODS.get(name).Config)}
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name in target}


def measure(model_dir, batches: list, micro_batch_tokens: int, rounds: int, kl: bool) -> dict:
    """Tokens/s and padding share of padded and packed learners over `batches` (module docstring)."""
    from rtpo.llm.learner import FSDPLearner, LearnerConfig, forward_tokens, plan_micro_batches

    base = {"temperature": 0.9, "micro_batch_tokens": micro_batch_tokens, "kl_reference": kl}
    learners = {
        "padded": FSDPLearner(model_dir, LearnerConfig(packing=False, **base)),
        "packed": FSDPLearner(model_dir, LearnerConfig(packing=True, **base)),
    }
    tokens = sum(int((b.contexts.lengths + b.tokens.lengths).sum()) for b, _ in batches)
    out: dict = {"batches": len(batches), "rows": sum(len(b) for b, _ in batches), "tokens": tokens}
    for name in learners:
        real = computed = 0
        for b, _ in batches:
            r, c = forward_tokens(b, plan_micro_batches(b, 1, micro_batch_tokens), packing=name == "packed")
            real, computed = real + r, computed + c
        out[name] = {"computed_positions": computed, "padding_share": 1 - real / computed, "round_s": []}

    def run(learner) -> float:
        t0 = time.perf_counter()
        for b, loss in batches:
            learner.logprobs(b)
            learner.train_step(b, loss)
        return time.perf_counter() - t0

    for learner in learners.values():  # warm-up: first-call allocations, mask-building code paths
        run(learner)
    for r in range(rounds):
        order = ("padded", "packed") if r % 2 == 0 else ("packed", "padded")
        for name in order:
            out[name]["round_s"].append(run(learners[name]))
    for name in learners:
        med = statistics.median(out[name]["round_s"])
        out[name]["median_s"] = med
        out[name]["tokens_per_s"] = tokens / med
    out["packed_over_padded_tokens_per_s"] = out["packed"]["tokens_per_s"] / out["padded"]["tokens_per_s"]
    per_round = [a / b for a, b in zip(out["padded"]["round_s"], out["packed"]["round_s"])]
    out["packed_over_padded_per_round"] = per_round
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=int, default=SCALE, help="paper lengths divided by this")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--out", default=str(HERE / "packing.json"))
    args = ap.parse_args(argv)
    import torch

    from rtpo.core.loss import LossConfig
    from rtpo.llm.build import _model_dir

    load_before = os.getloadavg()
    t0 = time.time()
    tiny, cfg = tiny_batches(args.seed)
    model_dir = _model_dir(cfg)
    micro = cfg.backend.micro_batch_tokens
    kl = cfg.method.config.kl_coef > 0
    results = {name: measure(model_dir, batches, micro, args.rounds, kl) for name, batches in tiny.items()}
    vocab = int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    paper = paper_batch(vocab, episodes=args.episodes, scale=args.scale, seed=args.seed)
    results["paper_grpo"] = measure(model_dir, [(paper, LossConfig())], micro, args.rounds, kl=False)
    out = {
        "command": "flock /work/bench.lock python bench/bench_packing.py " + " ".join(argv or sys.argv[1:]),
        "description": __doc__.split("\n\n")[0],
        "settings": {
            "scenario": "scenarios/llm/tiny-cpu.yaml (backend.engine=hf)",
            "micro_batch_tokens": micro,
            "paper_lengths": PAPER,
            "paper_scale": args.scale,
            "episodes": args.episodes,
            "rounds": args.rounds,
            "seed": args.seed,
        },
        "results": results,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.time() - t0,
    }
    out["reportable"] = max(out["loadavg_before"][0], out["loadavg_after"][0]) <= 4.0
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for name, r in results.items():
        print(
            f"{name}: padding {r['padded']['padding_share']:.0%} -> {r['packed']['padding_share']:.0%}, "
            f"tokens/s {r['padded']['tokens_per_s']:.0f} -> {r['packed']['tokens_per_s']:.0f} "
            f"({r['packed_over_padded_tokens_per_s']:.2f}x)"
        )
    print(f"load {out['loadavg_before']} -> {out['loadavg_after']}; reportable: {out['reportable']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
