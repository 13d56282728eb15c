"""The rollout/train mismatch of issue #5, measured on the tiny random Qwen3 (writes bench/llm_mismatch.json).

Rollouts run under the think-stripping context map ψ (paper E.4): the engine samples turn k from
c_k = ψ(S_k), in which earlier turns have no <think>…</think>.  For the same sampled response tokens the
FSDP learner (one gloo rank, the run's learner) then computes log-probs twice, at θ = θ_old:

  (a) RTPO:  on the recorded c_k itself (what RTPO trains on, Eq. 5/18);
  (b) flat:  on the full history S_k with every earlier turn verbatim, thinking included (the identity
             map, `LLMEnv.contexts_with(episodes, "identity")`) — what a flat full-history GRPO trainer
             sees when the trajectory is one sequence but the rollouts were think-stripped.

and reports the paper's §4.2 figure, the geometric-mean ratio exp(mean_t[log π_train − log π_rollout]),
per turn and overall, for (a) and (b).

A random tiny model practically never writes <think>…</think> itself, so the thinking in earlier turns is
put there in one of two honest, stated ways (both are run):

- scripted_thinking: turns 0..k-1 of the trunk are a fixed assistant text (a <think> block with a short
  plan, one sentence, and a python tool call computing the problem; tokenized, not sampled) that goes
  through LLMEnv.step like any response, so the tool really runs in the sandbox and its result is the
  next feedback.  Turn k is sampled by the engine (G samples per boundary) and measured.  Qwen3
  thinking mode on (enable_thinking=True).
- template_empty_think: every turn is sampled by the engine, with enable_thinking=False, so the Qwen3
  template opens each generation with its empty `<think>\\n\\n</think>\\n\\n`; the raw turn keeps it (the
  identity map shows it), think_strip drops it.  The differences are only those 4–6 tokens per turn, so
  the flat mismatch is smaller here.

Turn 0 has no earlier turn, so (a) and (b) coincide there: its flat ratio is a control.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH=$PWD python bench/llm_mismatch.py [--engine vllm|hf]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from rtpo.core.types import Generation, Ragged, TurnBatch  # noqa: E402

SCRIPTED_TURN = (
    "<think>\nThe problem asks for {expr}. I should not do this in my head: let me plan. First compute it "
    "with the python tool, then read the printed value, then write the final answer in a box.\n</think>\n\n"
    "Let me compute it with python.\n<tool_call>\n"
    '{{"name": "python", "arguments": {{"code": "print({expr})"}}}}\n</tool_call>'
)


def _ratio_stats(train: np.ndarray, rollout: np.ndarray) -> dict[str, float]:
    d = train - rollout
    return {
        "ratio": float(np.exp(d.mean())) if d.size else 1.0,
        "mean_log_ratio": float(d.mean()) if d.size else 0.0,
        "abs_log_ratio": float(np.abs(d).mean()) if d.size else 0.0,
        "max_abs_log_ratio": float(np.abs(d).max()) if d.size else 0.0,
        "kl_rollout_train_k3": float(np.mean(np.exp(d) - 1.0 - d)) if d.size else 0.0,
    }


def _batch(contexts: Ragged, gen: Generation, turn: int) -> TurnBatch:
    b = len(gen)
    return TurnBatch(
        contexts=contexts,
        tokens=gen.tokens,
        old_logp=gen.logp,
        advantages=Ragged(np.zeros(gen.tokens.values.size), gen.tokens.offsets),
        seq_id=np.arange(b),
        weight=np.ones(b),
        turn=np.full(b, turn),
    )


def measure(env, engine, learner, queries: np.ndarray, turns: int, n: int, scripted: bool, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    episodes = env.reset(queries, rng)
    per_turn = []
    all_roll, all_rtpo, all_flat = [], [], []
    for k in range(turns):
        ck = env.contexts(episodes)
        full = env.contexts_with(episodes, "identity")
        turn = env.turn_index(episodes)
        gen = engine.generate(ck, turn, n, rng)  # n samples per boundary, rows grouped per context
        rep = np.repeat(np.arange(len(episodes)), n)
        ck_rep, full_rep = ck.take(rep), full.take(rep)
        keep = np.flatnonzero(gen.tokens.lengths > 0)
        gen_k = gen.take(keep)
        lp_rtpo = learner.logprobs(_batch(ck_rep.take(keep), gen_k, k)).values
        lp_flat = learner.logprobs(_batch(full_rep.take(keep), gen_k, k)).values
        roll = gen_k.logp.values
        all_roll.append(roll), all_rtpo.append(lp_rtpo), all_flat.append(lp_flat)
        per_turn.append(
            {
                "turn": k,
                "responses": int(len(gen_k)),
                "response_tokens": int(roll.size),
                "context_tokens_mean_rtpo": float(ck.lengths.mean()),
                "context_tokens_mean_full": float(full.lengths.mean()),
                "contexts_identical": bool(all(np.array_equal(ck[i], full[i]) for i in range(len(ck)))),
                "rtpo": _ratio_stats(lp_rtpo, roll),
                "flat": _ratio_stats(lp_flat, roll),
            }
        )
        if k == turns - 1:
            break
        # advance the trunk: the first sample per boundary (sampled mode) or the scripted turn
        if scripted:
            rows = [
                np.asarray(
                    env.chat.ids(SCRIPTED_TURN.format(expr=_expr(e.item.question))).tolist() + [env.chat.im_end_id],
                    dtype=np.int64,
                )
                for e in episodes
            ]
            step_gen = Generation(
                Ragged.from_rows(rows, dtype=np.int64),
                Ragged.from_rows([np.zeros(r.size) for r in rows], dtype=np.float64),
            )
        else:
            step_gen = gen.take(np.arange(len(episodes)) * n)
        episodes, out = env.step(episodes, step_gen, rng)
        alive = np.flatnonzero(~out.done)
        if alive.size == 0:
            break
        episodes = env.take(episodes, alive)
    roll, rtpo, flat = (np.concatenate(x) for x in (all_roll, all_rtpo, all_flat))
    later = [t for t in per_turn if t["turn"] > 0]
    later_roll = np.concatenate([all_roll[t["turn"]] for t in later]) if later else np.zeros(0)
    later_rtpo = np.concatenate([all_rtpo[t["turn"]] for t in later]) if later else np.zeros(0)
    later_flat = np.concatenate([all_flat[t["turn"]] for t in later]) if later else np.zeros(0)
    return {
        "per_turn": per_turn,
        "all_turns": {
            "response_tokens": int(roll.size),
            "rtpo": _ratio_stats(rtpo, roll),
            "flat": _ratio_stats(flat, roll),
        },
        "turns_ge_1": {
            "response_tokens": int(later_roll.size),
            "rtpo": _ratio_stats(later_rtpo, later_roll),
            "flat": _ratio_stats(later_flat, later_roll),
        },
        "env_metrics": {k: float(v) for k, v in env.pop_metrics().items()},
    }


def _expr(question: str) -> str:
    # 'Compute 17 * 4 - 23. Put the final answer in \\boxed{}.' -> '17 * 4 - 23'
    return question.split("Compute ", 1)[1].split(".", 1)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--samples", type=int, default=4, help="samples per boundary (G)")
    p.add_argument("--turns", type=int, default=3, help="K")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--init-std",
        type=float,
        nargs="+",
        default=[0.02, 0.2],
        help="random init scales of the tiny model, one measurement each (0.02: near-uniform "
        "policy, as tiny-cpu.yaml; 0.2: peakier, its next-token distribution depends more on "
        "the context). The engine is built once and gets each model's weights by weight sync",
    )
    p.add_argument("--model-cache", default="runs/.models")
    p.add_argument("--out", default=str(Path(__file__).with_name("llm_mismatch.json")))
    a = p.parse_args(argv)

    import torch

    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.engines import SamplingConfig
    from rtpo.llm.env import LLMEnv
    from rtpo.llm.learner import LearnerConfig, launch_learner
    from rtpo.llm.model_cache import tiny_random_model
    from rtpo.llm.tasks.math import arithmetic_task

    t0 = time.perf_counter()
    model_dir = tiny_random_model(a.model_cache, a.seed, "qwen3", a.init_std[0])
    tokenizer = load_qwen3_tokenizer(str(model_dir))
    task = arithmetic_task(max(a.queries, 8), a.seed, max_operand=20, num_operands=2)
    queries = np.arange(a.queries, dtype=np.int64)
    envs = {
        "scripted_thinking": LLMEnv(
            task, tokenizer, "think_strip", num_turns=a.turns, enable_thinking=True, max_calls_per_turn=1
        ),
        "template_empty_think": LLMEnv(
            task, tokenizer, "think_strip", num_turns=a.turns, enable_thinking=False, max_calls_per_turn=1
        ),
    }
    stop = tuple(sorted(envs["scripted_thinking"].chat.stop_ids))
    sampling = SamplingConfig(temperature=a.temperature, top_p=1.0, max_tokens=a.max_tokens, stop_token_ids=stop)
    if a.engine == "vllm":
        from rtpo.llm.engines.vllm import VLLMEngine

        engine = VLLMEngine(model_dir, sampling, seed=a.seed, block_size=32, max_model_len=2048, kv_cache_gb=0.5)
    else:
        from rtpo.llm.engines.hf import HFEngine

        engine = HFEngine(model_dir, sampling)
    results = {}
    for std in a.init_std:
        model_std = tiny_random_model(a.model_cache, a.seed, "qwen3", std)
        learner = launch_learner(model_std, LearnerConfig(temperature=a.temperature, micro_batch_tokens=8192))
        engine.load_weights(learner.weights())  # the run's weight sync; a no-op change for the first model
        for name, env in envs.items():
            results[f"init_std={std:g}/{name}"] = measure(
                env, engine, learner, queries, a.turns, a.samples, name == "scripted_thinking", a.seed
            )
    out = {
        "what": "rollout/train geometric-mean log-prob ratio exp(mean[logp_train - logp_rollout]) at theta_old; "
        "rollouts under think_strip; rtpo = learner on the recorded c_k, flat = learner on the full "
        "history (identity map) of the same boundary",
        "engine": a.engine,
        "model": f"tiny-random (2-layer Qwen3, hidden 128, real Qwen3 tokenizer, seed {a.seed}, init_std "
        f"{' and '.join(f'{s:g}' for s in a.init_std)})",
        "temperature": a.temperature,
        "max_tokens": a.max_tokens,
        "queries": a.queries,
        "samples_per_boundary": a.samples,
        "turns": a.turns,
        "results": results,
        "seconds": time.perf_counter() - t0,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.platform(),
        "command": "python bench/llm_mismatch.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    for name, r in results.items():
        print(name)
        for t in r["per_turn"]:
            print(
                f"  turn {t['turn']}: tokens {t['response_tokens']:4d}  ctx {t['context_tokens_mean_rtpo']:.0f}"
                f"/{t['context_tokens_mean_full']:.0f}  rtpo {t['rtpo']['ratio']:.6f}  flat {t['flat']['ratio']:.6f}"
            )
        print(f"  turns>=1: rtpo {r['turns_ge_1']['rtpo']['ratio']:.6f}  flat {r['turns_ge_1']['flat']['ratio']:.6f}")
    print(f"wrote {a.out} in {out['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
