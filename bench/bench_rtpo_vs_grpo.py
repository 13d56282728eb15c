"""RTPO vs GRPO wall-clock per iteration at equal rollout budget (issue 5 item 6; paper Table 15: 1.41×).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH=$PWD python bench/bench_rtpo_vs_grpo.py [--quick]

writes bench/rtpo_vs_grpo.json.  Each setting runs in one process (a child of this script): the `llm`
backend is built once by rtpo.llm.build.build from scenarios/llm/tiny-cpu.yaml (vLLM in-process, the
FSDP2 learner on one gloo rank, arithmetic with the sandboxed Python tool, think-stripped contexts), and
the real registered methods drive it through Method.begin / Method.phase exactly as the runner does.
Only thin timing proxies sit between the methods and the backend objects; they forward every call
unchanged and charge its wall time to one category:

    gen_trunk     Sampler.generate inside begin()  (RTPO trunks; GRPO's G trajectories per query)
    gen_sibling   Sampler.generate inside phase()  (RTPO's sibling continuations)
    sync_gather   Learner.weights()                (full state dict out of FSDP)
    sync_load     Sampler.load_weights()           (vLLM in-place reload, lm_head re-pack, cache reset)
    ratio_pass    Learner.logprobs()               (the §4.2 rollout/train ratio pass at θ_old)
    train         Learner.train_step()             (PPO steps, KL reference forward included)
    env           every Environment call            (reset/restore/contexts/step: chat encoding, parsing,
                                                    sandboxed tool runs, answer checks)
    other         the rest of the iteration        (rollout driver, TurnBatch assembly, estimators)

Equal budget, both ways (K turns, Q queries per iteration, RTPO with G and one trunk per query):

    (a) equal rollouts:  RTPO generates Q·(1 + (G−1)·K) trajectories when every trunk runs all K turns
        (a random model never writes a \\boxed{} answer, so they do); GRPO gets G_a = 1 + (G−1)·K
        trajectories per query, the same count.
    (b) equal tokens:    under (a) RTPO generates fewer tokens (a sibling forked at turn k runs K−k turns,
        not K), so GRPO also runs with G_b = round(RTPO tokens per query / GRPO tokens per trajectory),
        measured on the warm-up iteration.

Arms alternate in ABBA order over rounds so load drift on the shared machine hits every arm alike; the
first round is warm-up and is not reported.  Every arm starts each round from the same learner and
optimizer state (restored, untimed), so no arm trains on another's updates.  `--paths before,after`
also runs each arm with the learner's fast paths off (`before`: the code path of the head this
benchmark was written against), interleaved in the same process, for the before/after ratio.
GRPO is the normalised one (A = (R − μ)/(σ + ε), GRPOConfig.normalize=True, the paper's baseline).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = ("gen_trunk", "gen_sibling", "sync_gather", "sync_load", "ratio_pass", "train", "env", "other")

# Model settings.  qwen3-h128 is the tiny-cpu.yaml model: 2 layers of hidden 128 under the real
# 151,936-row Qwen3 vocab, so the tied lm_head (19.4 M of its 20 M parameters) and the vocab-wide
# log-softmax dominate every pass.  bpe512-h256 has the 512-token BPE and 2 layers of hidden 256
# (1.6 M parameters in the layers, 0.13 M in the embedding): the transformer layers dominate, as in a
# real model (Qwen3-1.7B: ~18 % of its parameters in the embedding), at a size 2 shared cores can run.
SETTINGS: dict[str, dict[str, Any]] = {
    "bpe512-h256": {
        "tokenizer": "bpe512",
        "spec": dict(
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
        ),
    },
    "qwen3-h128": {"tokenizer": "qwen3", "spec": dict(vocab_size=151936)},
}


class Clock:
    """Time accounting, one category at a time: wall time (acc) and this process's CPU time (cpu, all
    threads: vLLM runs in-process).  CPU time barely moves with other processes' load on the shared
    cores, wall time does, so both are reported.  `in_phase` says whether a generate is trunk or sibling;
    `rows`/`padded` count the learner's (context + response) tokens and its left-padded batch cells."""

    def __init__(self) -> None:
        self.in_phase = False
        self.reset()

    def reset(self) -> None:
        self.acc: dict[str, float] = {c: 0.0 for c in CATEGORIES}
        self.cpu: dict[str, float] = {c: 0.0 for c in CATEGORIES}
        self.learner_tokens = 0
        self.learner_cells = 0

    def count_batch(self, batch) -> None:
        lengths = batch.contexts.lengths + batch.tokens.lengths
        self.learner_tokens += int(lengths.sum())
        self.learner_cells += int(lengths.max()) * lengths.size if lengths.size else 0


class Timed:
    """Forwards attribute access to `obj`; calls to the methods in `cats` are timed into clock.acc.

    Attributes the object lacks stay missing (the rollout driver probes `run_rollout` and
    `full_contexts` with getattr, and must see exactly what it would see without the proxy)."""

    def __init__(self, obj: Any, clock: Clock, cats: dict[str, Any]) -> None:
        self._obj, self._clock, self._cats = obj, clock, cats

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._obj, name)
        cat = self._cats.get(name, self._cats.get("*"))
        if cat is None or not callable(attr):
            return attr
        clock = self._clock

        def timed(*args, **kwargs):
            c = cat(clock) if callable(cat) else cat
            if c in ("ratio_pass", "train"):
                clock.count_batch(args[0])
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return attr(*args, **kwargs)
            finally:
                clock.acc[c] += time.perf_counter() - t0
                clock.cpu[c] += time.process_time() - c0

        return timed


def _model_dir(setting: str, cache: Path, seed: int) -> Path:
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.model import TinyQwen3Spec, build_tiny_qwen3, train_tiny_tokenizer

    s = SETTINGS[setting]
    out = cache / f"bench-{setting}-seed{seed}"
    if (out / "config.json").is_file():
        return out
    tok = load_qwen3_tokenizer() if s["tokenizer"] == "qwen3" else train_tiny_tokenizer(512)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    build_tiny_qwen3(tmp, tokenizer=tok, spec=TinyQwen3Spec(**s["spec"]), seed=seed, init_std=0.02)
    if not out.exists():
        os.replace(tmp, out)
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, np.float64)
    return {
        "mean": float(a.mean()),
        "std": float(a.std(ddof=1)) if a.size > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
    }


def run_setting(args: argparse.Namespace) -> dict:
    """Child process: one backend, every arm, ABBA rounds."""
    import torch

    from rtpo.core.budget import Budget
    from rtpo.core.methods import METHODS, RunContext
    from rtpo.llm.build import build
    from rtpo.scenario.load import load_scenario

    cache = Path(args.model_cache)
    model = _model_dir(args.setting, cache, args.seed)
    overrides = [
        f"backend.model={model}",
        f"backend.max_tokens={args.max_tokens}",
        f"backend.micro_batch_tokens={args.micro_batch_tokens}",
        f"task.num_turns={args.turns}",
        "task.answer_parse=boxed",
        f"method.G={args.G}",
        f"budget.queries_per_iteration={args.queries}",
        f"task.n={max(64, args.queries * (args.rounds + 1))}",
    ]
    cfg = load_scenario(ROOT / "scenarios/llm/tiny-cpu.yaml", overrides)
    built = build(cfg)
    base = built.ctx
    K, Q, G = args.turns, args.queries, args.G
    rtpo_cls, grpo_cls = METHODS.get("rtpo"), METHODS.get("grpo")
    rtpo = rtpo_cls(cfg.method.config)
    upd = {
        f: getattr(cfg.method.config, f) for f in ("epochs", "minibatch_size", "clip_eps", "kl_coef", "log_ratio_clip")
    }
    g_a = 1 + (G - 1) * K
    learner = base.learner
    fast_default = {f: getattr(learner.cfg, f) for f in FAST_FLAGS if hasattr(learner.cfg, f)}

    def set_path(path: str) -> None:
        if not fast_default:
            return
        flags = fast_default if path == "after" else {f: False for f in fast_default}
        learner.cfg = dataclasses.replace(learner.cfg, **flags)  # one rank: the config is read per call

    clock = Clock()
    env = Timed(base.env, clock, {"*": "env"})
    sampler = Timed(
        base.sampler,
        clock,
        {"generate": lambda c: "gen_sibling" if c.in_phase else "gen_trunk", "load_weights": "sync_load"},
    )
    tlearner = Timed(learner, clock, {"weights": "sync_gather", "logprobs": "ratio_pass", "train_step": "train"})
    initial = learner.state_dict()

    def iteration(method, round_idx: int, path: str) -> dict:
        set_path(path)
        learner.load_state_dict(initial)  # every arm starts every round from the same θ and optimizer
        ctx = RunContext(
            env=env,
            sampler=sampler,
            learner=tlearner,
            rng=np.random.default_rng(args.seed + round_idx),
            budget=Budget(),
        )
        ids = (round_idx * Q + np.arange(Q)) % built.num_queries
        base.env.pop_metrics()
        clock.reset()
        clock.in_phase = False
        engine = base.sampler.engine
        loads0 = getattr(engine, "reloads", base.sampler.syncs)
        t0, c0 = time.perf_counter(), time.process_time()
        state = method.begin(ctx, ids)
        clock.in_phase = True
        phases, ratios = 0, []
        while state.pending:
            m = method.phase(ctx, state)
            phases += 1
            if "consistency/rollout_train_ratio" in m:
                ratios.append(m["consistency/rollout_train_ratio"])
        total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
        acc, cpu = dict(clock.acc), dict(clock.cpu)
        acc["other"] = total - sum(v for k, v in acc.items() if k != "other")
        cpu["other"] = total_cpu - sum(v for k, v in cpu.items() if k != "other")
        envm = base.env.pop_metrics()
        return {
            "total_s": total,
            "split_s": acc,
            "cpu_total_s": total_cpu,
            "split_cpu_s": cpu,
            "learner_tokens": clock.learner_tokens,
            "learner_padded_cells": clock.learner_cells,
            "rollouts": ctx.budget.rollouts,
            "turns": ctx.budget.turns,
            "tokens": ctx.budget.tokens,
            "phases": phases,
            "engine_loads": getattr(engine, "reloads", base.sampler.syncs) - loads0,
            "rollout_train_ratio": ratios,
            "tool_calls": float(envm.get("tool/calls", 0)),
        }

    paths = args.paths.split(",")
    arms: list[tuple[str, str, Any]] = []
    for p in paths:
        arms.append(("rtpo", p, rtpo))
        arms.append(("grpo_equal_rollouts", p, grpo_cls(grpo_cls.Config(G=g_a, normalize=True, **upd))))
    # warm-up round (not reported): also measures tokens per GRPO trajectory for the equal-token arm
    warm = {}
    for name, p, m in arms:
        warm[(name, p)] = iteration(m, 0, p)
    r_w, g_w = warm[("rtpo", paths[-1])], warm[("grpo_equal_rollouts", paths[-1])]
    g_b = max(2, int(round((r_w["tokens"] / Q) / (g_w["tokens"] / g_w["rollouts"]))))
    for p in paths:
        arms.append(("grpo_equal_tokens", p, grpo_cls(grpo_cls.Config(G=g_b, normalize=True, **upd))))
        iteration(arms[-1][2], 0, p)  # its own warm-up
    records: dict[tuple[str, str], list[dict]] = {(n, p): [] for n, p, _ in arms}
    for r in range(1, args.rounds + 1):
        order = arms if r % 2 == 1 else arms[::-1]  # ABBA: linear drift hits every arm alike
        for name, p, m in order:
            records[(name, p)].append(iteration(m, r, p))

    out: dict[str, Any] = {
        "setting": args.setting,
        "model": str(model),
        "G_rtpo": G,
        "G_grpo_equal_rollouts": g_a,
        "G_grpo_equal_tokens": g_b,
        "paths": {},
    }
    for p in paths:
        res: dict[str, Any] = {}
        for name in ("rtpo", "grpo_equal_rollouts", "grpo_equal_tokens"):
            recs = records[(name, p)]
            res[name] = {
                "iterations": len(recs),
                "total_s": _stats([x["total_s"] for x in recs]),
                "split_s_mean": {c: float(np.mean([x["split_s"][c] for x in recs])) for c in CATEGORIES},
                "cpu_total_s": _stats([x["cpu_total_s"] for x in recs]),
                "split_cpu_s_mean": {c: float(np.mean([x["split_cpu_s"][c] for x in recs])) for c in CATEGORIES},
                "learner_tokens": _stats([x["learner_tokens"] for x in recs]),
                "learner_padding_share": _stats(
                    [1 - x["learner_tokens"] / max(x["learner_padded_cells"], 1) for x in recs]
                ),
                "rollouts": _stats([x["rollouts"] for x in recs]),
                "turns": _stats([x["turns"] for x in recs]),
                "tokens": _stats([x["tokens"] for x in recs]),
                "phases": recs[0]["phases"],
                "engine_loads": _stats([x["engine_loads"] for x in recs]),
                "tool_calls": _stats([x["tool_calls"] for x in recs]),
                "rollout_train_ratio": _stats([v for x in recs for v in x["rollout_train_ratio"]]),
                "per_iteration": recs,
            }
        for name in ("grpo_equal_rollouts", "grpo_equal_tokens"):
            # per-round ratios (paired: same round, adjacent in time), then their mean and spread
            per = [a["total_s"] / b["total_s"] for a, b in zip(records[("rtpo", p)], records[(name, p)])]
            per_cpu = [a["cpu_total_s"] / b["cpu_total_s"] for a, b in zip(records[("rtpo", p)], records[(name, p)])]
            res[f"ratio_rtpo_over_{name}"] = {
                "wall_clock": _stats(per),
                "wall_clock_median": float(np.median(per)),
                "cpu_time": _stats(per_cpu),
                "wall_clock_of_means": res["rtpo"]["total_s"]["mean"] / res[name]["total_s"]["mean"],
                # best round of each arm: the least disturbed by other processes on shared cores
                "wall_clock_of_mins": res["rtpo"]["total_s"]["min"] / res[name]["total_s"]["min"],
                "cpu_time_of_mins": res["rtpo"]["cpu_total_s"]["min"] / res[name]["cpu_total_s"]["min"],
                "tokens": res["rtpo"]["tokens"]["mean"] / res[name]["tokens"]["mean"],
                "rollouts": res["rtpo"]["rollouts"]["mean"] / res[name]["rollouts"]["mean"],
                "extra_s_by_category": {
                    c: res["rtpo"]["split_s_mean"][c] - res[name]["split_s_mean"][c] for c in CATEGORIES
                },
            }
        out["paths"][p] = res
    out["torch_threads"] = torch.get_num_threads()
    return out


# learner switches that the `before` path turns off (LearnerConfig fields; absent = nothing to switch)
FAST_FLAGS = ("reuse_ratio_forward", "cache_weights")


def check_result(out: dict, rel_tol: float = 1e-6) -> list[str]:
    """The accounting a result must satisfy (no timing thresholds): every split sums to its total,
    the equal-rollout arm really generated as many rollouts as RTPO, RTPO ran K phases and its rollout/
    train ratio is 1 within engine numerics.  Returns the problems found (empty = consistent)."""
    bad: list[str] = []
    for s, r in out["settings"].items():
        K = r["config"]["K"]
        for p, res in r["paths"].items():
            for name in ("rtpo", "grpo_equal_rollouts", "grpo_equal_tokens"):
                for i, it in enumerate(res[name]["per_iteration"]):
                    for total, split in (("total_s", "split_s"), ("cpu_total_s", "split_cpu_s")):
                        if set(it[split]) != set(CATEGORIES):
                            bad.append(f"{s}/{p}/{name}[{i}]: {split} has categories {sorted(it[split])}")
                        elif abs(sum(it[split].values()) - it[total]) > rel_tol * max(it[total], 1.0):
                            bad.append(
                                f"{s}/{p}/{name}[{i}]: {split} sums to {sum(it[split].values())}, "
                                f"not {total} {it[total]}"
                            )
                    if it["split_s"]["other"] < -1e-3:
                        bad.append(f"{s}/{p}/{name}[{i}]: timed categories overlap (other < 0)")
            rt, ga = res["rtpo"]["per_iteration"], res["grpo_equal_rollouts"]["per_iteration"]
            if len(rt) != len(ga) or any(a["rollouts"] != b["rollouts"] for a, b in zip(rt, ga)):
                bad.append(
                    f"{s}/{p}: equal-rollout arm generated {[b['rollouts'] for b in ga]} rollouts, "
                    f"RTPO {[a['rollouts'] for a in rt]}"
                )
            if any(it["phases"] != K for it in rt):
                bad.append(f"{s}/{p}: RTPO ran {[it['phases'] for it in rt]} phases, not K = {K}")
            ratios = [v for it in rt for v in it["rollout_train_ratio"]]
            if not ratios or max(abs(v - 1.0) for v in ratios) > 1e-3:
                bad.append(f"{s}/{p}: RTPO rollout/train ratios {ratios} are not 1 within engine numerics")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small sizes (< 3 min): 1 query, 1 round, 8 tokens per turn, one setting, the `after` path only",
    )
    ap.add_argument("--settings", default=None, help=f"comma list of {', '.join(SETTINGS)} (default: bpe512-h256)")
    ap.add_argument("--paths", default=None, help="learner paths to compare: before,after (default) | after (quick)")
    ap.add_argument("--queries", type=int, default=None, help="queries per iteration (default 2; quick 1)")
    ap.add_argument("--G", type=int, default=3, help="RTPO group size (siblings = G−1 per boundary)")
    ap.add_argument("--turns", type=int, default=3, help="K (E.3: 3 for math)")
    ap.add_argument("--max-tokens", type=int, default=None, help="response tokens per turn (default 12; quick 8)")
    ap.add_argument("--rounds", type=int, default=None, help="measured rounds after one warm-up (default 3; quick 1)")
    ap.add_argument("--micro-batch-tokens", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-cache", default=str(ROOT / "runs/.models"))
    ap.add_argument("--out", default=str(ROOT / "bench/rtpo_vs_grpo.json"))
    ap.add_argument(
        "--append",
        action="store_true",
        help="keep the other settings already in --out (their own config and load are recorded with them)",
    )
    ap.add_argument("--setting", default=None, help=argparse.SUPPRESS)  # child: run this one setting
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.queries = args.queries or (1 if args.quick else 2)
    args.max_tokens = args.max_tokens or (8 if args.quick else 12)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.paths = args.paths or ("after" if args.quick else "before,after")

    if args.setting is not None:
        Path(args.child_out).write_text(json.dumps(run_setting(args)))
        return 0

    settings = (args.settings or "bpe512-h256").split(",")
    for s in settings:
        if s not in SETTINGS:
            ap.error(f"--settings: unknown setting {s!r} (valid: {', '.join(SETTINGS)})")
    load_before = os.getloadavg()
    results = {}
    for s in settings:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            child_out = f.name
        cmd = [
            sys.executable,
            __file__,
            "--setting",
            s,
            "--child-out",
            child_out,
            "--paths",
            args.paths,
            "--queries",
            str(args.queries),
            "--G",
            str(args.G),
            "--turns",
            str(args.turns),
            "--max-tokens",
            str(args.max_tokens),
            "--rounds",
            str(args.rounds),
            "--micro-batch-tokens",
            str(args.micro_batch_tokens),
            "--seed",
            str(args.seed),
            "--model-cache",
            args.model_cache,
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        if proc.returncode != 0:
            print(f"bench_rtpo_vs_grpo: setting {s} failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        results[s] = json.loads(Path(child_out).read_text())
        results[s]["process_wall_s"] = time.perf_counter() - t0
        results[s]["loadavg_1_5_15_before_after"] = [list(load_before), list(os.getloadavg())]
        results[s]["config"] = {
            "K": args.turns,
            "G_rtpo": args.G,
            "queries_per_iteration": args.queries,
            "max_tokens_per_turn": args.max_tokens,
            "measured_rounds": args.rounds,
            "paths": args.paths.split(","),
        }
        os.unlink(child_out)
    if args.append and Path(args.out).is_file():
        results = {**json.loads(Path(args.out).read_text())["settings"], **results}
    out = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_1_5_15_before": list(load_before),
            "loadavg_1_5_15_after": list(os.getloadavg()),
        },
        "config": {
            "quick": args.quick,
            "queries_per_iteration": args.queries,
            "G_rtpo": args.G,
            "K": args.turns,
            "trunks_per_query": 1,
            "max_tokens_per_turn": args.max_tokens,
            "measured_rounds": args.rounds,
            "warmup_rounds": 1,
            "paths": args.paths.split(","),
            "grpo": "normalised (GRPOConfig.normalize=True)",
            "scenario": "scenarios/llm/tiny-cpu.yaml (vLLM, FSDP2 1 gloo rank, kl_coef 0.02, epochs 1)",
            "order": "ABBA over rounds, one warm-up round excluded",
        },
        "categories": list(CATEGORIES),
        "settings": results,
    }
    problems = check_result(out)
    out["accounting_problems"] = problems
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for problem in problems:
        print(f"bench_rtpo_vs_grpo: accounting: {problem}", file=sys.stderr)
    for s, r in results.items():
        for p, res in r["paths"].items():
            for name in ("grpo_equal_rollouts", "grpo_equal_tokens"):
                x = res[f"ratio_rtpo_over_{name}"]
                print(
                    f"{s:12s} {p:6s} RTPO/{name}: wall {x['wall_clock']['mean']:.3f} ± {x['wall_clock']['std']:.3f}"
                    f"  cpu {x['cpu_time']['mean']:.3f} ± {x['cpu_time']['std']:.3f}  tokens {x['tokens']:.3f}  rollouts {x['rollouts']:.3f}"
                )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
