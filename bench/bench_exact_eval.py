"""What exact evaluation (rtpo.llm.exact) costs: contexts scored per second against a plain batched
transformers forward over the same (context, action) pairs, and its share of a run's wall (issue 31, goal 4).

    python bench/bench_exact_eval.py            # -> bench/exact_eval.json  (run it alone: it is a timing)

1. Scoring, on scenarios/llm/tiny-cpu-mdp.yaml's world and model (the 4-turn tool chain, the random tiny
   Qwen3 over bpe512-chat; the weights do not change the cost).  Three ways of getting log π(a | c) for
   every enumerated context and action, interleaved round by round so that a load swing hits all alike:
   - `evaluator`: ExactEvaluator.action_logprobs, each context run once and its KV cache repeated for
     the actions (what every evaluation runs);
   - `plain`: the yardstick, a plain batched forward of the model over the full rows c ⊕ x_a that a user
     would write (left-padded rows built beforehand and not timed, logits kept only at the action
     positions, no log-softmax, no value): the same pairs, nothing else;
   - `full_rows`: the evaluator's former scoring of full rows (ExactEvaluator.logprob_tensor under
     no_grad), for the before/after.
   Reported: contexts per second of each (median of the rounds) and evaluator / plain as a speed ratio
   (> 1: the evaluator scores faster than the yardstick, because it runs each context once, not A times;
   the token positions each processes are in the JSON).
2. Share of the wall: `rtpo run` of tiny-cpu-mdp with its default eval.every for a few iterations; the
   exact evaluations' seconds (time/exact_eval_s) over the run's elapsed seconds after its warm start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu-mdp.yaml"


def scoring(rounds: int) -> dict:
    import numpy as np
    import torch

    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.exact import ExactEvaluator
    from rtpo.llm.model import load_hf_model
    from rtpo.llm.model_cache import tiny_random_model
    from rtpo.llm.worlds import world_env
    from rtpo.scenario.load import load_scenario

    torch.set_num_threads(2)
    cfg = load_scenario(str(SCENARIO), [])
    b = cfg.backend
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_random_model(tmp, cfg.seed, b.tiny_tokenizer, b.tiny_init_std)
        env = world_env(cfg.task, load_qwen3_tokenizer(str(model_dir)))
        model = load_hf_model(model_dir)
    ev = ExactEvaluator(env, model, b.eval_temperature, b.eval_top_p, batch_tokens=cfg.task.exact_batch_tokens)
    ctxs = ev.tree.contexts
    A = len(ev.actions)
    r_max = max(x.size for x in ev.actions)
    # the yardstick's batches: full rows, grouped as the evaluator groups contexts (similar lengths)
    order = np.argsort([c.size for c in ctxs], kind="stable")
    per = max(1, ev.batch_tokens // (A * (int(ctxs[order[-1]].size) + r_max)))
    batches = []
    for lo in range(0, len(order), per):
        group = [ctxs[i] for i in order[lo : lo + per]]
        width = max(c.size for c in group) + r_max
        ids = np.full((len(group) * A, width), ev.pad_id, np.int64)
        att = np.zeros_like(ids)
        for i, c in enumerate(group):
            for a, x in enumerate(ev.actions):
                full = np.concatenate([c, x])
                lo_col = width - r_max - c.size
                ids[i * A + a, lo_col : lo_col + full.size] = full
                att[i * A + a, lo_col : lo_col + full.size] = 1
        att_t = torch.as_tensor(att)
        batches.append((torch.as_tensor(ids), att_t, (att_t.cumsum(-1) - 1).clamp(min=0)))

    def plain() -> None:
        with torch.no_grad():
            for ids, att, pos in batches:
                model(input_ids=ids, attention_mask=att, position_ids=pos, logits_to_keep=r_max + 1)

    def evaluator() -> None:
        ev.action_logprobs()

    def full_rows() -> None:
        with torch.no_grad():
            for lo in range(0, len(order), per):
                ev.logprob_tensor([ctxs[i] for i in order[lo : lo + per]])

    model.eval()
    fns = {"evaluator": evaluator, "plain": plain, "full_rows": full_rows}
    for f in fns.values():  # warm-up
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    n = len(ctxs)
    ctx_tokens = int(sum(c.size for c in ctxs))
    act_tokens = int(sum(x.size for x in ev.actions))
    out = {
        "contexts": n,
        "actions": A,
        "context_tokens": ctx_tokens,
        "batches": len(batches),
        "token_positions": {  # what each forward processes, padding excluded
            "evaluator": ctx_tokens + n * act_tokens - n * A,  # each context once, each action but its last token
            "plain": A * ctx_tokens + n * act_tokens,
            "full_rows": A * ctx_tokens + n * act_tokens,
        },
        "seconds": times,
        "contexts_per_s": {k: n / statistics.median(v) for k, v in times.items()},
    }
    out["evaluator_over_plain_speed"] = out["contexts_per_s"]["evaluator"] / out["contexts_per_s"]["plain"]
    out["full_rows_over_plain_speed"] = out["contexts_per_s"]["full_rows"] / out["contexts_per_s"]["plain"]
    out["evaluator_over_full_rows_speed"] = out["contexts_per_s"]["evaluator"] / out["contexts_per_s"]["full_rows"]
    return out


def share(iterations: int) -> dict:
    """A short tiny-cpu-mdp run at its default eval.every: exact evaluation seconds / elapsed seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "rtpo", "run", str(SCENARIO), f"budget.iterations={iterations}"]
        cmd += [f"backend.model_cache={tmp}/models", "--out", tmp, "--no-progress"]
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)}
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        run = next(p for p in Path(tmp).iterdir() if (p / "metrics.jsonl").is_file())
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [r["time/exact_eval_s"] for r in rows if "time/exact_eval_s" in r]
    elapsed = max(r.get("time/elapsed_s", 0.0) for r in rows)
    from rtpo.scenario.load import load_scenario

    every = load_scenario(str(SCENARIO), []).eval.every
    return {
        "iterations": iterations,
        "evaluations": len(evals),
        "exact_eval_s": evals,
        "elapsed_s": elapsed,
        "eval_share": sum(evals) / elapsed,
        "eval_every_phases": every,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "exact_eval.json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    load_start = list(os.getloadavg())
    out = {
        "command": "VLLM_ENABLE_V1_MULTIPROCESSING=0 python bench/bench_exact_eval.py",
        "scenario": "scenarios/llm/tiny-cpu-mdp.yaml",
        "cpu_count": os.cpu_count(),
        "loadavg_start": load_start,
        "scoring": scoring(args.rounds),
        "run": share(args.iterations),
    }
    out["loadavg_end"] = list(os.getloadavg())
    out["reportable"] = max(out["loadavg_start"][0], out["loadavg_end"][0]) <= 4
    out["goals"] = {
        "speed_vs_plain_at_least_0_8": out["scoring"]["evaluator_over_plain_speed"] >= 0.8,
        "share_of_wall_at_most_0_25": out["run"]["eval_share"] <= 0.25,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    s = out["scoring"]
    print(
        f"evaluator {s['contexts_per_s']['evaluator']:.0f} contexts/s, plain {s['contexts_per_s']['plain']:.0f}, "
        f"former full rows {s['contexts_per_s']['full_rows']:.0f}: evaluator/plain "
        f"{s['evaluator_over_plain_speed']:.2f}x; eval share of wall {out['run']['eval_share']:.3f} "
        f"(load {load_start[0]:.1f} -> {out['loadavg_end'][0]:.1f})"
    )


if __name__ == "__main__":
    main()
