"""Learning benchmark of an exact world on the llm backend: scenarios/llm/tiny-cpu-mdp.yaml (the default
scenario's 4-turn tool chain as a chat, a tiny Qwen3 on CPU, format warm start then RTPO; --scenario picks
another exact-world scenario, e.g. tiny-cpu-mdp-region6) with the exact value of the model's policy after
every evaluation (rtpo.llm.exact).  Writes bench/exact_world.json:

  curve:            one row per evaluation: iteration, rollouts, elapsed seconds, eval/value, value / V*,
                    the malformed mass at the first context, and the evaluation's own cost (contexts,
                    tokens, seconds);
  v_star:           the MDP's optimum (the tabular solver's); v_uniform_over_v_star: the uniform policy's
                    exact value over V* (where the format warm start leaves the model);
  first_at_0_9:     the first evaluation whose value / V* ≥ 0.9 (null when none did);
  exact_eval_share: seconds in exact evaluation over the run's wall seconds;
  process_wall_s:   (runs made here) the whole `rtpo run` process, start to exit: building the tiny model,
                    the format warm start (unless backend.model_cache already holds it), the vLLM engine,
                    training and evaluation; startup_s = process_wall_s − wall_s (the run's own clock starts
                    at its first phase), first_at_0_9_process_s = startup_s + that evaluation's elapsed_s;
  turn_only_ceiling: (--seeds, --seed, --merge) the best value / V* of a policy that reads only the turn index, not the
                    state (its actions by turn): a run that stays below it may not have learned to read
                    the state at all;
  by_state:         (--by-state) the final policy per turn k and MDP state s: the probability d_k(s) that an
                    episode reaches s, and π(best | s), the reach-weighted probability of the action with the
                    highest Q under the policy itself (rtpo.llm.exact's exact values): where the policy falls
                    short of V*, this says at which states;
  loadavg_start / loadavg_end: os.getloadavg() around the run — the machine is shared, so every second
                    here is measured under that load and is a speed figure only where the load stayed low
                    (a timed run goes through the helpers' quiet.sh, which pauses the other jobs).

Usage: python bench/bench_exact_world.py [--scenario YAML] [--run RUN_DIR | --seeds N | --seed S ...] [key=value ...]
       python bench/bench_exact_world.py --merge A.json B.json ... --out OUT.json
  without --run: runs the scenario (with the overrides) into a temporary folder first;
  --run RUN_DIR: reads a finished (or partial) run folder of that scenario instead;
  --seeds N:     runs seeds 0..N-1 (each its own tiny model and warm start) and reports value / V* at the
                 first evaluation, at the end, and their difference, each with a 95% t-interval over seeds;
  --seed S:      (repeatable) runs these seeds instead of 0..N-1 (one timed seed per call, then --merge);
  --by-state:    after each run, export its final policy and add by_state (after the run's timing);
  --merge:       combines the per-seed JSONs of earlier --seed/--seeds calls (same scenario and overrides)
                 into one report with the intervals over all their runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu-mdp.yaml"


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def summarise(run_dir: Path, scenario: Path = SCENARIO) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [
        {
            "iteration": r.get("iteration"),
            "rollouts": r.get("budget/rollouts"),
            "elapsed_s": r.get("time/elapsed_s"),
            "value": r["eval/value"],
            "value_over_v_star": r["eval/value_ratio"],
            "malformed_mass": r.get("eval/malformed_mass"),
            "contexts": r.get("eval/exact_contexts"),
            "tokens": r.get("eval/exact_tokens"),
            "seconds": r.get("time/exact_eval_s"),
        }
        for r in rows
        if "eval/value" in r
    ]
    v_star = next((r["eval/v_star"] for r in rows if "eval/v_star" in r), None)
    v_uniform = next((r["eval/v_uniform"] for r in rows if "eval/v_uniform" in r), None)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    wall = summary.get("wall_s") or (rows[-1].get("time/elapsed_s") if rows else None)
    first = next((c for c in curve if c["value_over_v_star"] >= 0.9), None)
    return {
        "scenario": _rel(scenario),
        "seed": summary.get("seed"),
        "run_finished": bool(summary),
        "v_star": v_star,
        "v_uniform_over_v_star": v_uniform / v_star if v_uniform is not None and v_star else None,
        "final_value": curve[-1]["value"] if curve else None,
        "final_value_over_v_star": curve[-1]["value_over_v_star"] if curve else None,
        "best_value_over_v_star": max((c["value_over_v_star"] for c in curve), default=None),
        "first_at_0_9": first,
        "wall_s": wall,
        "exact_eval_share": (sum(c["seconds"] or 0.0 for c in curve) / wall) if wall else None,
        "curve": curve,
    }


def by_state(run_dir: Path) -> list[dict]:
    """The run's final policy, exactly, per turn k and MDP state s (module docstring: by_state)."""
    from rtpo.commands.export import export_run
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.exact import ExactEvaluator, node_values, reach_probabilities
    from rtpo.llm.model import load_hf_model
    from rtpo.llm.worlds import world_env
    from rtpo.rundir import checkpoint
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(run_dir / checkpoint.CONFIG)
    with tempfile.TemporaryDirectory(prefix="rtpo-by-state-") as tmp:
        model_dir = export_run(run_dir, Path(tmp) / "policy")
        env = world_env(cfg.task, load_qwen3_tokenizer(str(model_dir)))
        ev = ExactEvaluator(env, load_hf_model(model_dir), cfg.backend.eval_temperature, cfg.backend.eval_top_p)
        pi = np.exp(ev.action_logprobs())
    tree, world = ev.tree, env.world
    d = reach_probabilities(world, tree, pi)
    qs, _ = node_values(world, tree, pi, cfg.task.malformed_reward)
    out = []
    for k in range(world.num_turns):
        p = pi[tree.ctx[k]]
        best = qs[k].argmax(axis=1)
        p_best = p[np.arange(best.size), best]
        for s in np.unique(tree.s[k]):
            m = tree.s[k] == s
            reach = float(d[k][m].sum())
            if reach > 0:
                out.append(
                    {
                        "turn": k,
                        "state": int(s),
                        "reach": reach,
                        "pi_best": float(d[k][m] @ p_best[m] / reach),
                        "best": int(np.bincount(best[m], weights=d[k][m]).argmax()),
                        "pi": [float(x) for x in d[k][m] @ p[m] / reach],
                    }
                )
    return out


def turn_only_ceiling(world) -> dict:
    """The best policy that reads the turn index k and nothing else (the same action in every state of a
    turn), over every such deterministic policy (A^K of them), valued exactly by backward induction: a
    policy that ignores the state cannot exceed it, so a run above it has learned to read the state."""
    K, A = world.num_turns, world.num_actions
    best_value, best_seq = -np.inf, None
    for code in range(A**K):
        seq = [(code // A**k) % A for k in range(K)]
        v = None
        for k in range(K - 1, -1, -1):
            q = world.reward[k][:, seq[k]].astype(np.float64)
            if k < K - 1:
                q = q + (world.gamma ** world.tau[k][:, seq[k]]) * (
                    world.prob[k][:, seq[k]] * v[world.succ[k][:, seq[k]]]
                ).sum(axis=-1)
            v = q
        value = float(np.asarray(world.init, np.float64) @ v)
        if value > best_value:
            best_value, best_seq = value, seq
    return {"value_over_v_star": best_value / world.v_star, "actions_by_turn": best_seq}


def _world(scenario: Path, overrides: list[str]):
    from rtpo.llm.worlds import build_world
    from rtpo.scenario.load import load_scenario

    return build_world(load_scenario(str(scenario), overrides).task)


def _run(scenario: Path, overrides: list[str], states: bool = False) -> dict:
    """One `rtpo run` of the scenario in a temporary folder, summarised, with the process's own wall time
    and the load around it."""
    out_root = Path(tempfile.mkdtemp(prefix="rtpo-exact-world-"))
    cmd = [sys.executable, "-m", "rtpo", "run", str(scenario), *overrides, "--out", str(out_root), "--no-progress"]
    load_start = list(os.getloadavg())
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    process_wall = time.perf_counter() - t0
    (run_dir,) = [p for p in out_root.iterdir() if p.is_dir()]
    out = summarise(run_dir, scenario)
    startup = process_wall - out["wall_s"] if out["wall_s"] is not None else None
    first = out["first_at_0_9"]
    out.update(
        {
            "run_dir": str(run_dir),
            "process_wall_s": process_wall,
            "startup_s": startup,
            "first_at_0_9_process_s": first["elapsed_s"] + startup if first and startup is not None else None,
            "loadavg_start": load_start,
            "loadavg_end": list(os.getloadavg()),
        }
    )
    if states:
        out["by_state"] = by_state(run_dir)
    return out


def _interval(xs: list[float]) -> dict:
    """Mean and its 95% t-interval half-width over seeds (scipy's t quantile)."""
    from scipy import stats

    a = np.asarray(xs, dtype=np.float64)
    half = float(stats.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")
    return {"mean": float(a.mean()), "ci95_half": half, "values": [float(x) for x in a]}


def over_seeds(runs: list[dict]) -> dict:
    """value / V* after the first evaluation, at the end and their difference, each with its 95% interval
    over the runs (one per seed), the process wall times and how many runs reached 0.9 V* at all."""
    walls = [r["process_wall_s"] for r in runs if r.get("process_wall_s") is not None]
    return {
        "seeds": len(runs),
        "seed_list": [r.get("seed") for r in runs],
        "v_uniform_over_v_star": next(
            (r["v_uniform_over_v_star"] for r in runs if r.get("v_uniform_over_v_star")), None
        ),
        "first_eval_value_over_v_star": _interval([r["curve"][0]["value_over_v_star"] for r in runs]),
        "final_value_over_v_star": _interval([r["final_value_over_v_star"] for r in runs]),
        "gain": _interval([r["final_value_over_v_star"] - r["curve"][0]["value_over_v_star"] for r in runs]),
        "best_value_over_v_star": _interval([r["best_value_over_v_star"] for r in runs]),
        "runs_reaching_0_9": sum(r["first_at_0_9"] is not None for r in runs),
        "process_wall_s_max": max(walls) if walls else None,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", type=Path, default=SCENARIO, help="the exact-world scenario file")
    ap.add_argument("--run", type=Path, default=None, help="read this run folder instead of running")
    ap.add_argument("--seeds", type=int, default=None, help="run seeds 0..N-1 (seed=s) and report intervals")
    ap.add_argument("--seed", type=int, action="append", default=None, help="run this seed (repeatable)")
    ap.add_argument("--by-state", action="store_true", help="add the final policy per turn and state")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, help="combine these per-seed bench JSONs")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "exact_world.json")
    ap.add_argument("--loadavg-start", default=None, help="with --run: the load recorded when it started (a,b,c)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    load_start = [float(x) for x in args.loadavg_start.split(",")] if args.loadavg_start else list(os.getloadavg())
    command = " ".join(["python bench/bench_exact_world.py", *(sys.argv[1:] if argv is None else argv)])
    if args.merge is not None:
        parts = [json.loads(p.read_text()) for p in args.merge]
        if len({(p["scenario"], tuple(p["overrides"])) for p in parts}) != 1:
            raise SystemExit("--merge: the JSONs differ in scenario or overrides")
        runs = [r for p in parts for r in p["runs"]]
        result = {
            "command": command,
            "commands": [p["command"] for p in parts],
            "scenario": parts[0]["scenario"],
            "overrides": parts[0]["overrides"],
            **over_seeds(runs),
        }
        load_start = parts[0]["loadavg_start"]
        result.update({"loadavg_start": load_start, "loadavg_end": parts[-1]["loadavg_end"]})
        result["loadavg_max_1min"] = max(x for r in runs for x in (r["loadavg_start"][0], r["loadavg_end"][0]))
        result["cpus"] = os.cpu_count()
        result["turn_only_ceiling"] = turn_only_ceiling(_world(ROOT / result["scenario"], result["overrides"]))
    else:
        seeds = args.seed if args.seed is not None else (range(args.seeds) if args.seeds is not None else None)
        if seeds is not None:
            ceiling = turn_only_ceiling(_world(args.scenario, args.overrides))  # before the runs: fails fast
            runs = [_run(args.scenario, [*args.overrides, f"seed={s}"], args.by_state) for s in seeds]
            result = {
                "command": command,
                "scenario": _rel(args.scenario),
                "overrides": args.overrides,
                **over_seeds(runs),
                "turn_only_ceiling": ceiling,
            }
        elif args.run is not None:
            result = {"command": command, **summarise(args.run, args.scenario)}
            if args.by_state:
                result["by_state"] = by_state(args.run)
        else:
            result = {"command": command, **_run(args.scenario, args.overrides, args.by_state)}
        result.update({"loadavg_start": load_start, "loadavg_end": list(os.getloadavg()), "cpus": os.cpu_count()})
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "runs")}, indent=2))


if __name__ == "__main__":
    main()
