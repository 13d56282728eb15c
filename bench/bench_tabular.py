"""Tabular RTPO/GRPO iterations per second at the sizes users run: rtpo's columnar path, its per-episode
path and a straight numpy reference of the same iteration, all measured in the same run, at every size;
writes bench/tabular.json.

    python bench/bench_tabular.py [--repeats 15] [--sizes default,k6_q64,k8_q256,s32768]

Sizes (A = 4, G = 8, 2 PPO epochs, Adam lr 0.3, ε = 0.2, as scenarios/tabular/default.yaml):
  default  the default scenario (`rtpo run` with no argument): tool_chain, K = 4, 32 queries;
  k6_q64   tool_chain, K = 6, 64 queries;
  k8_q256  tool_chain and region_chain (w = 0.8, deterministic reward), K = 8, 256 queries;
  s32768   a sparse random MDP with 32,768 states per turn (K = 8, 4 successors, dense rewards), 256
           queries: a table of 2²⁰ cells, where the per-phase work that grows with the table shows.
RTPO: one trunk per query, G − 1 siblings at each of its K boundaries; GRPO: G trajectories per query,
one flattened update.

The reference (`Reference` below) is the same algorithm written directly in numpy, with nothing of
rtpo's: a softmax table, sampling by inverse CDF over all live rows at once, the environment's arrays
indexed directly, advantages on (groups, n) arrays, the analytic gradient of the clipped loss of Eq. 6
(token ratio; RTPO's mean over siblings of the token mean, GRPO's token mean) and torch's Adam update
in closed form.  It draws from the random stream in exactly the order rtpo does, so after the same
iterations from the same seed its parameters equal rtpo's up to rounding (the JSON records the largest
difference; tests/test_bench_tabular.py checks it).

Timings are minimums over `repeats` rounds; each round runs one iteration of every path in alternating
order (A B C, C B A, ...) on its own copy of the stack, so ratios compare the same minutes of the same
machine.  Wall-clock ratios, and the same ratios in process CPU time (`cpu_*`, less sensitive to other
jobs on a shared machine); the JSON records the load average before and after, and `reportable`: the
load stayed at or below 4 (2 cores shared with other jobs otherwise distort the ratios).

The goal (issue 31) is columnar_over_reference ≤ 1.0 at every size; each row says whether it is met and,
where not, by how much the columnar path is slower (`over_goal_by`, a fraction of the reference's time).

The per-phase fixed cost: an iteration with one query (one trunk, G − 1 siblings per turn: almost no
samples) divided by its phases (RTPO: K, the trunk rollout counted in; GRPO: 1), for the columnar path
and the reference, timed the same interleaved way on stacks of their own.

rtpo's sampler evaluates the policy table once per weight sync (then only the turn a phase trained) and
gathers rows from it (a choice any implementation could make); the reference evaluates the softmax of the
live rows at every turn, the straightforward way, and its gradient and Adam step touch only the trained
turns' tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from rtpo.core import RunContext, methods
from rtpo.tabular import SoftmaxTable, TabularEnv, TabularLearner, TabularSampler, TurnMDP, tool_chain
from rtpo.tabular.generators import random_mdp, region_chain

HERE = Path(__file__).resolve().parent
K, A, Q, G, EPOCHS, LR = 8, 4, 256, 8, 2, 0.3
CLIP, LOG_RATIO_CLIP = 0.2, 10.0
BETA1, BETA2, ADAM_EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults
GOAL = 1.0  # issue 31: the columnar iteration at most the reference's time
BIG_STATES = 32_768


def scenarios(num_turns: int = K) -> dict[str, TurnMDP]:
    return {
        "tool_chain": tool_chain(num_turns=num_turns, num_actions=A, p_advance=0.8, seed=0),
        "region_chain": region_chain(num_turns=num_turns, num_actions=A, p_advance=0.8, seed=0, w=0.8),
    }


def sparse_random(num_states: int = BIG_STATES, num_turns: int = K) -> TurnMDP:
    """A random MDP with `num_states` states per turn, 4 successors per (s, a), identity ψ."""
    return random_mdp(0, num_turns=num_turns, num_states=num_states, num_actions=A, branching=4)


def sizes() -> dict[str, tuple[int, int, dict]]:
    """name -> (K, queries, {scenario: builder}) for every size the bench runs (module docstring)."""
    return {
        "default": (4, 32, {"tool_chain": lambda: scenarios(4)["tool_chain"]}),
        "k6_q64": (6, 64, {"tool_chain": lambda: scenarios(6)["tool_chain"]}),
        "k8_q256": (
            8,
            256,
            {"tool_chain": lambda: scenarios(8)["tool_chain"], "region_chain": lambda: scenarios(8)["region_chain"]},
        ),
        "s32768": (8, 256, {"random_sparse": sparse_random}),
    }


# -- the reference: one RTPO or GRPO iteration in plain numpy ---------------------------------------------


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


class Reference:
    """Softmax-table RTPO (Algorithm 1) or GRPO (Eq. 1, 9) on a TurnMDP, vectorised over every episode.

    States are numbered globally (turn k's states after those of turns < k), as flat tables."""

    def __init__(self, mdp: TurnMDP, params: np.ndarray, method: str, lr: float = LR) -> None:
        self.method, self.lr, self.gamma = method, lr, mdp.gamma
        self.bernoulli = mdp.bernoulli_rewards
        off = np.concatenate([[0], np.cumsum(mdp.num_states)])
        width = max(p.shape[-1] for p in mdp.prob)
        total = int(off[-1])
        self.psi = np.concatenate(mdp.psi)
        self.reward = np.concatenate(mdp.reward)
        self.tau = np.concatenate(mdp.tau).astype(np.float64)
        self.succ = np.zeros((total, mdp.num_actions, width), np.int64)
        self.cdf = np.ones((total, mdp.num_actions, width))
        self.ends = np.zeros((total, mdp.num_actions), bool)
        for k in range(mdp.num_turns):
            lo, hi, b = off[k], off[k + 1], mdp.prob[k].shape[-1]
            self.succ[lo:hi, :, :b] = mdp.succ[k] + (off[k + 1] if k + 1 < mdp.num_turns else 0)
            self.succ[lo:hi, :, b:] = self.succ[lo:hi, :, b - 1 : b]
            self.cdf[lo:hi, :, :b] = np.cumsum(mdp.prob[k], axis=-1)
            self.ends[lo:hi] = mdp.prob[k].sum(axis=-1) <= 0.0
        self.init_cdf = np.cumsum(mdp.init)
        self.num_init = mdp.num_states[0]
        self.K = mdp.num_turns
        self.theta = np.array(params, dtype=np.float64, copy=True)  # (K, C, A), the learner's
        self.m = np.zeros_like(self.theta)
        self.v = np.zeros_like(self.theta)
        self.steps = np.zeros(self.K, np.int64)  # Adam keeps one step count per turn's table

    def sample(self, theta: np.ndarray, turn: np.ndarray, state: np.ndarray, n: int, rng):
        lp = log_softmax(theta[turn, self.psi[state]])
        cdf = np.cumsum(np.exp(lp), axis=1)
        u = rng.random((lp.shape[0], n)) * cdf[:, -1:]
        a = np.minimum((cdf[:, None, :] <= u[:, :, None]).sum(axis=2), lp.shape[1] - 1)
        return a.reshape(-1), np.take_along_axis(lp, a, axis=1).reshape(-1)

    def episodes(self, turn: np.ndarray, state: np.ndarray, n: int, rng) -> dict[str, np.ndarray]:
        """Run B episodes (n of them per start at the first step) to the end under the current θ (the
        sampler's: a phase samples everything before it updates, so no copy is needed); returns the rows
        (episode, turn, context, action, logp) and each episode's return."""
        theta = self.theta
        ep = np.arange(turn.size * n)
        rows = {key: [] for key in ("ep", "turn", "ctx", "a", "logp", "state")}
        ret = np.zeros(ep.size)
        elapsed = np.zeros(ep.size)
        first = True
        while ep.size:
            a, logp = self.sample(theta, turn, state, n if first else 1, rng)
            if first and n > 1:
                turn, state = np.repeat(turn, n), np.repeat(state, n)
            first = False
            r = self.reward[state, a]
            if self.bernoulli:
                r = (rng.random(ep.size) < r).astype(np.float64)
            u = rng.random(ep.size)
            nxt = self.succ[
                state, a, np.minimum((self.cdf[state, a] <= u[:, None]).sum(axis=1), self.succ.shape[2] - 1)
            ]
            ret[ep] += r if self.gamma == 1.0 else r * self.gamma ** elapsed[ep]
            elapsed[ep] += self.tau[state, a]
            for key, val in (
                ("ep", ep),
                ("turn", turn),
                ("ctx", self.psi[state]),
                ("a", a),
                ("logp", logp),
                ("state", state),
            ):
                rows[key].append(val)
            live = ~(self.ends[state, a] | (turn >= self.K - 1))
            ep, turn, state = ep[live], turn[live] + 1, nxt[live]
        out = {key: np.concatenate(v) for key, v in rows.items()}
        out["ret"] = ret
        return out

    def update(self, turn, ctx, a, old_logp, adv, rng, num_groups: int) -> None:
        """EPOCHS full-batch steps of the clipped loss −mean_i min(ρ_i A_i, clip(ρ_i) A_i) (one token per
        row, so RTPO's mean of per-sibling token means and GRPO's token mean coincide), Adam per turn."""
        touched, slot = np.unique(turn, return_inverse=True)  # the gradient of the trained turns only
        onehot = np.eye(self.theta.shape[-1])[a]
        for _ in range(EPOCHS):
            rng.permutation(num_groups)  # the minibatch shuffle (one full batch; kept for the stream)
            lp = log_softmax(self.theta[turn, ctx])
            logp = np.take_along_axis(lp, a[:, None], axis=1)[:, 0]
            d = logp - old_logp
            ratio = np.exp(np.clip(d, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
            inside = (ratio >= 1 - CLIP) & (ratio <= 1 + CLIP)
            passes = (inside | (ratio * adv < np.clip(ratio, 1 - CLIP, 1 + CLIP) * adv)) & (np.abs(d) <= LOG_RATIO_CLIP)
            g_logp = -(adv * ratio * passes) / turn.size
            grad = np.zeros((touched.size, *self.theta.shape[1:]))
            np.add.at(grad, (slot, ctx), g_logp[:, None] * (onehot - np.exp(lp)))
            for i, k in enumerate(touched):  # torch.optim.Adam, single-tensor form
                self.steps[k] += 1
                t = self.steps[k]
                self.m[k] += (grad[i] - self.m[k]) * (1 - BETA1)
                self.v[k] = self.v[k] * BETA2 + (1 - BETA2) * (grad[i] * grad[i])
                denom = np.sqrt(self.v[k]) / (1 - BETA2**t) ** 0.5 + ADAM_EPS
                self.theta[k] += -(self.lr / (1 - BETA1**t)) * (self.m[k] / denom)

    def iteration(self, queries: int, rng) -> None:
        if self.method == "grpo":
            s0 = np.minimum(np.searchsorted(self.init_cdf, rng.random(queries * G), side="right"), self.num_init - 1)
            rows = self.episodes(np.zeros(s0.size, np.int64), s0, 1, rng)
            r = rows["ret"].reshape(-1, G)
            adv = ((r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
            order = np.argsort(rows["ep"], kind="stable")  # rtpo's rows are episode by episode
            take = {key: rows[key][order] for key in ("turn", "ctx", "a", "logp", "ep")}
            self.update(take["turn"], take["ctx"], take["a"], take["logp"], adv[take["ep"]], rng, s0.size)
            return
        s0 = np.minimum(np.searchsorted(self.init_cdf, rng.random(queries), side="right"), self.num_init - 1)
        trunk = self.episodes(np.zeros(s0.size, np.int64), s0, 1, rng)
        order = np.lexsort((trunk["turn"], trunk["ep"]))
        t_turn, t_state = trunk["turn"][order], trunk["state"][order]
        n = G - 1
        for k in range(self.K - 1, -1, -1):
            states = t_state[t_turn == k]
            if states.size == 0:
                continue
            sib = self.episodes(np.full(states.size, k, np.int64), states, n, rng)
            r = sib["ret"].reshape(-1, n)
            adv = (r - r.mean(axis=1, keepdims=True)).reshape(-1)
            first = slice(0, states.size * n)  # the first step's rows are the siblings' turn-k rows
            self.update(sib["turn"][first], sib["ctx"][first], sib["a"][first], sib["logp"][first], adv, rng, adv.size)


# -- rtpo's stacks -------------------------------------------------------------------------------------


def rtpo_stack(mdp: TurnMDP, method: str, columnar: bool, seed: int = 0, init_scale: float = 0.0):
    torch.set_num_threads(1)  # as the tabular backend's builder does
    policy = SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions, init_scale=init_scale)
    rng = np.random.default_rng(seed)
    params = policy.init_params(rng)
    ctx = RunContext(
        TabularEnv(mdp), TabularSampler(policy, params), TabularLearner(policy, params, lr=LR), rng, columnar=columnar
    )
    cls = methods.get(method)
    return ctx, cls(cls.Config(G=G, epochs=EPOCHS, clip_eps=CLIP)), params


def rtpo_iteration(ctx, method, queries: int) -> None:
    state = method.begin(ctx, np.arange(queries))
    while state.pending:
        method.phase(ctx, state)


def reference_stack(mdp: TurnMDP, method: str, seed: int = 0, init_scale: float = 0.0):
    policy = SoftmaxTable(mdp.num_turns, mdp.num_contexts, mdp.num_actions, init_scale=init_scale)
    rng = np.random.default_rng(seed)
    return Reference(mdp, policy.init_params(rng), method), rng


def _interleaved(jobs: dict, repeats: int) -> tuple[dict, dict]:
    """Minimum wall and process-CPU seconds of each job over `repeats` rounds, alternating the order."""
    best = dict.fromkeys(jobs, float("inf"))
    cpu = dict.fromkeys(jobs, float("inf"))
    names = list(jobs)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            jobs[name]()
            best[name] = min(best[name], time.perf_counter() - t0)
            cpu[name] = min(cpu[name], time.process_time() - c0)
    return best, cpu


def measure(size: str, scen: str, mdp: TurnMDP, method: str, queries: int, repeats: int) -> dict:
    """One row: the three paths at `queries` queries, then the per-phase fixed cost at one query."""
    col_ctx, col_m, _ = rtpo_stack(mdp, method, columnar=True)
    epi_ctx, epi_m, _ = rtpo_stack(mdp, method, columnar=False)
    ref, ref_rng = reference_stack(mdp, method)
    best, cpu = _interleaved(
        {
            "columnar": lambda: rtpo_iteration(col_ctx, col_m, queries),
            "per_episode": lambda: rtpo_iteration(epi_ctx, epi_m, queries),
            "reference": lambda: ref.iteration(queries, ref_rng),
        },
        repeats,
    )
    # every stack ran the same number of iterations from the same seed
    col_w, epi_w = col_ctx.learner.weights(), epi_ctx.learner.weights()
    one_ctx, one_m, _ = rtpo_stack(mdp, method, columnar=True)
    one_ref, one_rng = reference_stack(mdp, method)
    one, _ = _interleaved(
        {"columnar": lambda: rtpo_iteration(one_ctx, one_m, 1), "reference": lambda: one_ref.iteration(1, one_rng)},
        repeats,
    )
    phases = mdp.num_turns if method != "grpo" else 1
    ratio = best["columnar"] / best["reference"]
    return {
        "size": size,
        "scenario": scen,
        "method": method,
        "key": f"{size}/{scen}/{method}",
        "num_turns": mdp.num_turns,
        "states_per_turn": int(max(mdp.num_states)),
        "table_cells": int(mdp.num_turns * mdp.num_contexts * mdp.num_actions),
        "queries": queries,
        "iterations": repeats,
        "columnar_s": best["columnar"],
        "per_episode_s": best["per_episode"],
        "reference_s": best["reference"],
        "columnar_iter_per_s": 1.0 / best["columnar"],
        "per_episode_iter_per_s": 1.0 / best["per_episode"],
        "reference_iter_per_s": 1.0 / best["reference"],
        "columnar_over_reference": ratio,
        "per_episode_over_reference": best["per_episode"] / best["reference"],
        "speedup_columnar_over_per_episode": best["per_episode"] / best["columnar"],
        "cpu_columnar_over_reference": cpu["columnar"] / cpu["reference"],
        "cpu_per_episode_over_reference": cpu["per_episode"] / cpu["reference"],
        "goal_columnar_over_reference_at_most": GOAL,
        "goal_met": bool(ratio <= GOAL),
        "over_goal_by": max(0.0, ratio / GOAL - 1.0),
        "fixed_cost_per_phase_us": one["columnar"] / phases * 1e6,
        "reference_fixed_cost_per_phase_us": one["reference"] / phases * 1e6,
        "fixed_cost_over_reference": one["columnar"] / one["reference"],
        "max_abs_param_diff_columnar_vs_per_episode": float(np.abs(col_w - epi_w).max()),
        "max_abs_param_diff_columnar_vs_reference": float(np.abs(col_w - ref.theta).max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sizes", default=",".join(sizes()), help="comma-separated: " + ", ".join(sizes()))
    ap.add_argument("--out", type=Path, default=HERE / "tabular.json")
    args = ap.parse_args()
    chosen = args.sizes.split(",")
    unknown = sorted(set(chosen) - set(sizes()))
    if unknown:
        raise SystemExit(f"unknown size(s) {unknown}; valid: {', '.join(sizes())}")
    load_before = os.getloadavg()
    rows = []
    for size in chosen:
        num_turns, queries, builders = sizes()[size]
        for scen, build in builders.items():
            mdp = build()
            for method in ("rtpo", "grpo"):
                row = measure(size, scen, mdp, method, queries, args.repeats)
                rows.append(row)
                print(json.dumps(row), flush=True)
    load_after = os.getloadavg()
    out = {
        "command": "python bench/bench_tabular.py"
        + ("" if args.repeats == 15 else f" --repeats {args.repeats}")
        + ("" if chosen == list(sizes()) else f" --sizes {args.sizes}"),
        "settings": {"num_actions": A, "G": G, "epochs": EPOCHS, "lr": LR, "clip_eps": CLIP},
        "sizes": {name: {"num_turns": k, "queries": q, "scenarios": list(b)} for name, (k, q, b) in sizes().items()},
        "repeats": args.repeats,
        "goal": f"columnar_over_reference <= {GOAL} at every size (issue 31)",
        "goal_met_everywhere": all(r["goal_met"] for r in rows),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "reportable": max(load_before[0], load_after[0]) <= 4.0,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "rows": rows,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
