"""Exact policy-gradient ascent on an exact world: the yardstick for the llm backend's RL (issue 25).

On scenarios/llm/tiny-cpu-mdp.yaml (the default scenario's 4-turn tool chain as a chat, the tiny Qwen3
after its format warm start) this ascends the exact value V^π of the model's policy with the exact
gradient: every reachable decision context is scored teacher-forced (rtpo.llm.exact.ExactEvaluator.
logprob_tensor), rtpo.llm.exact.policy_gradient_weights gives ∂V/∂π(a|c) from the enumerated tree, and
Adam steps on −Σ_c Σ_a w(c, a)·π(a | c) with w held fixed (so its gradient is −∇_θ V^π exactly).  No
sampling is involved: the curve is what the model and the optimiser can do with a perfect gradient, the
ceiling a sampled RL run (bench/bench_exact_world.py) is measured against, step for step.

Writes bench/exact_gradient.json: for each learning rate, value / V* and the malformed mass (mean over
contexts and at the first context) every `--every` optimiser steps.  Figures are per step, not per
second: the machine's load does not change them (it is recorded anyway).

Usage: python bench/bench_exact_gradient.py [--lr 5e-4 1e-3] [--steps 40] [--every 4] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu-mdp.yaml"


def ascend(cfg, model_dir: Path, lr: float, steps: int, every: int, seed: int) -> list[dict]:
    import torch

    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.exact import ExactEvaluator, policy_gradient_weights, policy_value
    from rtpo.llm.model import load_hf_model
    from rtpo.llm.worlds import world_env

    task = cfg.task
    env = world_env(task, load_qwen3_tokenizer(str(model_dir)))
    torch.manual_seed(seed)
    model = load_hf_model(model_dir)
    for p in model.parameters():
        p.requires_grad_(True)
    ev = ExactEvaluator(env, model, cfg.backend.eval_temperature, cfg.backend.eval_top_p)
    tree, world = ev.tree, env.world
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    curve = []
    t0 = time.perf_counter()
    for step in range(steps + 1):
        lp = ev.logprob_tensor(tree.contexts)
        pi = lp.detach().double().exp().numpy()
        if step % every == 0 or step == steps:
            value = policy_value(world, tree, pi, task.malformed_reward)
            curve.append(
                {
                    "step": step,
                    "value_over_v_star": value / world.v_star,
                    "malformed_mass_mean": float(1.0 - pi.sum(axis=1).mean()),
                    "malformed_mass_first": float(tree.root_weight @ (1.0 - pi[tree.ctx[0]].sum(axis=1))),
                    "elapsed_s": time.perf_counter() - t0,
                }
            )
            print(json.dumps({"lr": lr, **curve[-1]}), flush=True)
        if step == steps:
            break
        w = policy_gradient_weights(world, tree, pi, task.malformed_reward)
        loss = -(torch.as_tensor(w, dtype=lp.dtype) * lp.exp()).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return curve


def main(argv: list[str] | None = None) -> None:
    from rtpo.llm.build import _model_dir
    from rtpo.scenario.load import load_scenario

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lr", type=float, nargs="+", default=[5e-4, 1e-3])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "exact_gradient.json")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    load_start = list(os.getloadavg())
    cfg = load_scenario(str(SCENARIO), args.overrides)
    model_dir = _model_dir(cfg)  # the format warm start, built (and cached) as rtpo run builds it
    out = {
        "command": " ".join(["python bench/bench_exact_gradient.py", *(sys.argv[1:] if argv is None else argv)]),
        "scenario": "scenarios/llm/tiny-cpu-mdp.yaml",
        "overrides": args.overrides,
        "what": "Adam on the exact gradient of the model's exact value (no sampling): value/V* per optimiser step",
        "steps": args.steps,
        "loadavg_start": load_start,
        "runs": {f"{lr:.0e}": ascend(cfg, model_dir, lr, args.steps, args.every, cfg.seed) for lr in args.lr},
    }
    out["loadavg_end"] = list(os.getloadavg())
    for lr, curve in out["runs"].items():
        first = next((c["step"] for c in curve if c["value_over_v_star"] >= 0.9), None)
        out.setdefault("first_step_at_0_9", {})[lr] = first
        out.setdefault("final_value_over_v_star", {})[lr] = curve[-1]["value_over_v_star"]
        out.setdefault("peak_malformed_mass_mean", {})[lr] = max(c["malformed_mass_mean"] for c in curve)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
