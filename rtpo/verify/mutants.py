"""Deliberately broken variants of the real code, applied by monkeypatching, to prove the claim tests can fail.

Each mutant patches names in the real modules (registry entries, RTPO's schedule hooks, the rows that
go into the loss, the loss itself, the IS weight) — never a copy of the algorithm.  `RTPO_MUTANT=<name>
pytest rtpo/verify` runs the whole suite against one (rtpo/verify/conftest.py activates it);
`rtpo verify --mutants` runs every mutant and reports which tests killed it.

`killers` names the claim tests expected to kill a mutant (the fast subset tests/test_mutants.py
runs) by their function names, which carry the claim and the equation (`test_T2a_..._eq56`); where
they live is looked up (killer_nodes), so moving a test between claim modules changes nothing here.
`modules` names the claim modules the --mutants run executes for it.

A mutant patches through the owner's own override points: a registered estimator through
`ESTIMATORS.override` (every consumer looks estimators up by name at call time), a method's hook
by setting it on the method class, and a plain core function, which its consumers imported by name,
by rebinding that name in every rtpo module (_replace_everywhere).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Undo = Callable[[], None]


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    apply: Callable[[], Undo]
    killers: tuple[str, ...]
    modules: tuple[str, ...]


MUTANTS: dict[str, Mutant] = {}


def _mutant(name: str, description: str, killers: tuple[str, ...], modules: tuple[str, ...]):
    def deco(fn: Callable[[], Undo]) -> Callable[[], Undo]:
        if name in MUTANTS:
            raise ValueError(f"mutant {name!r} registered twice")
        MUTANTS[name] = Mutant(name, description, fn, killers, modules)
        return fn

    return deco


def get(name: str) -> Mutant:
    try:
        return MUTANTS[name]
    except KeyError:
        raise KeyError(f"unknown mutant {name!r}; valid: {', '.join(sorted(MUTANTS))}") from None


# -- patching helpers ---------------------------------------------------------------------------------


def _replace_everywhere(orig: Any, new: Any) -> Undo:
    """Rebind every module-level name in rtpo.* that is `orig` to `new` (consumers imported it by name)."""
    undo: list[tuple[Any, str, Any]] = []
    for modname, mod in list(sys.modules.items()):
        if mod is None or not modname.startswith("rtpo"):
            continue
        for attr, val in list(vars(mod).items()):
            if val is orig:
                undo.append((mod, attr, val))
                setattr(mod, attr, new)

    def restore() -> None:
        for mod, attr, val in undo:
            setattr(mod, attr, val)

    return restore


def _set_attr(obj: Any, attr: str, new: Any) -> Undo:
    old = obj.__dict__[attr] if attr in obj.__dict__ else getattr(obj, attr)
    setattr(obj, attr, new)
    return lambda: setattr(obj, attr, old)


def _swap_estimator(name: str, new: Callable[[np.ndarray], np.ndarray]) -> Undo:
    """The registered estimator `name` is `new` until the returned undo runs (Registry.override)."""
    from rtpo.core import estimators

    stack = ExitStack()
    stack.enter_context(estimators.ESTIMATORS.override(name, new))
    return stack.close


def _chain(*undos: Undo) -> Undo:
    def restore() -> None:
        for u in reversed(undos):
            u()

    return restore


_ESTIMATOR_TESTS = (
    "test_T2a_sibling_coefficient_eq56",
    "test_CS1_rtpo_groups_only_siblings_of_one_boundary_eq7",
)
_EST_MODULES = ("test_t2_sibling_baseline.py", "test_cross_state.py", "test_t1_recursive_optimality.py")


# -- advantage / baseline mutants ---------------------------------------------------------------------


@_mutant(
    "cross_state_baseline",
    "the sibling baseline is the mean over every group of the batch (all boundaries)",
    _ESTIMATOR_TESTS,
    _EST_MODULES,
)
def _cross_state() -> Undo:
    def est(returns):
        r = np.asarray(returns, np.float64)
        return r - r.mean()

    return _swap_estimator("sibling_mean", est)


_TRUNK_TAIL: dict[str, Any] = {"returns": None}


@_mutant(
    "trunk_in_baseline",
    "the trunk's own return from boundary k joins the sibling baseline",
    ("test_CS1_rtpo_groups_only_siblings_of_one_boundary_eq7",),
    _EST_MODULES,
)
def _trunk_in_baseline() -> Undo:
    from rtpo.core.methods.rtpo import RTPO
    from rtpo.core.types import discounted_return

    orig_phase = RTPO.phase

    def phase(self, ctx, state):
        k = state.pending[0]
        tree = state.data.tree
        _TRUNK_TAIL["returns"] = np.array(
            [
                discounted_return(
                    tree.trunks[b.trunk].rewards[k:], tree.trunks[b.trunk].durations[k:], tree.trunks[b.trunk].gamma
                )
                for b in tree.boundaries[k]
            ]
        )
        try:
            return orig_phase(self, ctx, state)
        finally:
            _TRUNK_TAIL["returns"] = None

    def est(returns):
        r = np.asarray(returns, np.float64)
        trunk = _TRUNK_TAIL["returns"]
        if trunk is None or r.ndim != 2 or trunk.shape != (r.shape[0],):
            return r - r.mean(axis=-1, keepdims=True)
        return r - ((r.sum(axis=-1) + trunk) / (r.shape[-1] + 1))[:, None]

    return _chain(_set_attr(RTPO, "phase", phase), _swap_estimator("sibling_mean", est))


@_mutant(
    "own_return_left_out",
    "baseline = Σ_{r≠j} R_r / (G−1): own return dropped from the sum, not the count",
    (
        "test_T2a_sibling_coefficient_eq56",
        "test_T2d_two_siblings_zero_advantage_eq107",
    ),
    _EST_MODULES,
)
def _own_left_out() -> Undo:
    def est(returns):
        r = np.asarray(returns, np.float64)
        return r - (r.sum(axis=-1, keepdims=True) - r) / r.shape[-1]

    return _swap_estimator("sibling_mean", est)


@_mutant(
    "loo_as_sibling",
    "the leave-one-out estimator registered as RTPO's sibling_mean",
    ("test_T2a_sibling_coefficient_eq56",),
    _EST_MODULES,
)
def _loo_as_sibling() -> Undo:
    from rtpo.core.estimators import leave_one_out_advantage

    return _swap_estimator("sibling_mean", leave_one_out_advantage)


@_mutant("advantage_sign_flipped", "A^H_j = V̂_k − R_j", _ESTIMATOR_TESTS, _EST_MODULES)
def _sign_flip() -> Undo:
    def est(returns):
        r = np.asarray(returns, np.float64)
        return r.mean(axis=-1, keepdims=True) - r

    return _swap_estimator("sibling_mean", est)


@_mutant(
    "baseline_previous_phase",
    "the baseline is the mean return of the previous call (previous phase)",
    _ESTIMATOR_TESTS,
    _EST_MODULES,
)
def _previous_phase() -> Undo:
    memory: dict[str, Any] = {"prev": None}

    def est(returns):
        r = np.asarray(returns, np.float64)
        base = r.mean(axis=-1, keepdims=True) if memory["prev"] is None else memory["prev"]
        memory["prev"] = float(r.mean())
        return r - base

    return _swap_estimator("sibling_mean", est)


# -- loss-mask mutants ----------------------------------------------------------------------------------

_T2C = ("test_T2c_llm_gradient_only_on_turn_k_tokens_eq80",)


@_mutant(
    "loss_on_prefix",
    "the trained span is extended back over the context c_k (prompt tokens in the loss)",
    _T2C,
    ("test_t2c_gradient_support.py",),
)
def _loss_on_prefix() -> Undo:
    from rtpo.core import train
    from rtpo.core.types import Ragged, TurnBatch

    orig = train.turn_rows

    def turn_rows(trajectories, turn_offset, advantages, seq_id=None, weight=None):
        b = orig(trajectories, turn_offset, advantages, seq_id, weight)
        ctx = list(b.contexts)
        toks = Ragged.from_rows([np.concatenate([c, t]) for c, t in zip(ctx, b.tokens)], dtype=np.int64)
        old = Ragged.from_rows([np.concatenate([np.zeros(len(c)), o]) for c, o in zip(ctx, b.old_logp)])
        adv = Ragged(np.repeat(np.array([a[0] for a in b.advantages]), toks.lengths), toks.offsets)
        empty = Ragged.from_rows([np.zeros(0, np.int64) for _ in ctx], dtype=np.int64)
        return TurnBatch(empty, toks, old, adv, b.seq_id, b.weight, b.turn)

    return _replace_everywhere(orig, turn_rows)


@_mutant(
    "loss_on_continuation",
    "the trained span runs on into the continuation's later-turn tokens",
    _T2C,
    ("test_t2c_gradient_support.py",),
)
def _loss_on_continuation() -> Undo:
    from rtpo.core import train
    from rtpo.core.types import Ragged, TurnBatch

    orig = train.turn_rows

    def turn_rows(trajectories, turn_offset, advantages, seq_id=None, weight=None):
        b = orig(trajectories, turn_offset, advantages, seq_id, weight)
        rows, olds = [], []
        for t, j in zip(trajectories, np.asarray(turn_offset)):
            rows.append(np.concatenate([t.tokens[i] for i in range(int(j), t.num_turns)]))
            olds.append(np.concatenate([t.logp[i] for i in range(int(j), t.num_turns)]))
        toks = Ragged.from_rows(rows, dtype=np.int64)
        adv = Ragged(np.repeat(np.array([a[0] for a in b.advantages]), toks.lengths), toks.offsets)
        return TurnBatch(b.contexts, toks, Ragged.from_rows(olds, dtype=np.float64), adv, b.seq_id, b.weight, b.turn)

    return _replace_everywhere(orig, turn_rows)


# -- schedule mutants -------------------------------------------------------------------------------

_T3A = ("test_T3a_siblings_on_policy_weight_one_eq85",)


@_mutant(
    "no_sync",
    "no weight sync between phases (θ_old stays the trunk's θ0)",
    _T3A + ("test_MM1_rtpo_ratio_exactly_one_eq5",),
    ("test_t3_on_policy.py", "test_mismatch.py", "test_t1_recursive_optimality.py"),
)
def _no_sync() -> Undo:
    from rtpo.core.methods.rtpo import RTPO

    return _set_attr(RTPO, "should_sync", lambda self, k, state: False)


@_mutant(
    "forward_order",
    "phases run k = 0..K−1 (forward) instead of K−1..0",
    ("test_T1b_one_reverse_sweep_is_backward_induction_eq25",),
    ("test_t1_recursive_optimality.py",),
)
def _forward_order() -> Undo:
    from rtpo.core.methods.rtpo import RTPO

    orig = RTPO.begin

    def begin(self, ctx, query_ids):
        state = orig(self, ctx, query_ids)
        state.pending = sorted(state.pending)
        return state

    return _set_attr(RTPO, "begin", begin)


class _SplitSampler:
    """Samples the first (turn-k, n > 1) call with the current sampler and every later turn with θ0."""

    def __init__(self, current: Any, stale: Any) -> None:
        self.current, self.stale, self.calls = current, stale, 0

    def generate(self, contexts, turn, n, rng):
        self.calls += 1
        return (self.current if self.calls == 1 else self.stale).generate(contexts, turn, n, rng)

    def load_weights(self, weights) -> None:
        self.current.load_weights(weights)


@_mutant(
    "stale_continuations",
    "siblings' continuations after turn k come from θ0 but are treated as on-policy",
    _T3A,
    ("test_t3_on_policy.py",),
)
def _stale_continuations() -> Undo:
    from rtpo.core.methods import base as base_mod
    from rtpo.core.methods import rtpo as rtpo_mod

    orig_begin = rtpo_mod.RTPO.begin
    orig_rollout = base_mod.rollout  # what Method.rollout calls
    stale: dict[str, Any] = {"sampler": None}

    def begin(self, ctx, query_ids):
        state = orig_begin(self, ctx, query_ids)
        stale["sampler"] = copy.deepcopy(ctx.sampler)  # begin synced θ0 into the sampler
        return state

    def rollout(env, sampler, episodes, query_ids, rng, n=1, record_boundaries=False):
        if n > 1 and stale["sampler"] is not None:
            sampler = _SplitSampler(sampler, stale["sampler"])
        return orig_rollout(env, sampler, episodes, query_ids, rng, n=n, record_boundaries=record_boundaries)

    return _chain(_set_attr(rtpo_mod.RTPO, "begin", begin), _set_attr(base_mod, "rollout", rollout))


# -- importance-weight and clipping mutants ----------------------------------------------------------------


@_mutant(
    "per_token_clip_weight",
    "the trajectory IS weight is the product of per-token clipped ratios",
    ("test_IS2_core_weight_clips_the_product_eq105",),
    ("test_is_weights.py",),
)
def _per_token_clip() -> Undo:
    from rtpo.core import estimators

    orig = estimators.clamped_trajectory_weight

    def weight(logp_new, logp_old, rho_min, rho_max):
        rho = np.exp(np.asarray(logp_new, np.float64) - np.asarray(logp_old, np.float64))
        return np.prod(np.clip(rho, rho_min, rho_max), axis=-1)

    return _replace_everywhere(orig, weight)


@_mutant(
    "ratio_not_clipped",
    "the loss's clipped ratio is not clipped (trust region removed)",
    ("test_IS2_core_loss_clips_each_token_eq15",),
    ("test_is_weights.py",),
)
def _ratio_not_clipped() -> Undo:
    from rtpo.core import loss

    orig = loss.clipped_policy_loss

    def clipped_policy_loss(logp, flat, cfg, ref_logp=None):
        wide = dataclasses.replace(cfg, clip_eps=1.0 - 1e-12, clip_eps_high=1e12)
        return orig(logp, flat, wide, ref_logp)

    return _replace_everywhere(orig, clipped_policy_loss)


_DECOMPOSITION = ("test_T2b_variance_decomposition_by_enumeration_eq58",)


@_mutant(
    "bernoulli_variance_dropped",
    "the variance diagnostic takes E[r̃²] = r² for Bernoulli rewards (their p(1−p) noise vanishes)",
    _DECOMPOSITION,
    ("test_t2b_variance_decomposition.py",),
)
def _bernoulli_variance_dropped() -> Undo:
    from rtpo.tabular import diagnostic

    orig = diagnostic.reward_second_moment

    def reward_second_moment(mdp, k):
        r = np.asarray(mdp.reward[k], np.float64)
        return r * r

    return _replace_everywhere(orig, reward_second_moment)


@_mutant(
    "history_discount_dropped",
    "the variance diagnostic ignores the discount (γ = 1): a history's γ^{D_k} no longer scales its terms",
    _DECOMPOSITION,
    ("test_t2b_variance_decomposition.py",),
)
def _history_discount_dropped() -> Undo:
    from rtpo.tabular import diagnostic

    orig = diagnostic.decompose

    def decompose(mdp, pi, psi=None):
        from rtpo.tabular.mdp import TurnMDP

        undiscounted = TurnMDP(
            mdp.succ, mdp.prob, mdp.reward, mdp.tau, mdp.psi, mdp.init, mdp.num_contexts, 1.0, mdp.bernoulli_rewards
        )
        return orig(undiscounted, pi, psi)

    return _replace_everywhere(orig, decompose)


# -- the comparison methods' estimators (rtpo/verify/test_baselines.py) -----------------------------------

_BASELINES = ("test_baselines.py",)


@_mutant(
    "grpo_population_std",
    "GRPO divides by the population (n) group std whatever `std` says, not the unbiased (n − 1) one",
    ("test_BL1_grpo_normalises_by_the_unbiased_group_std_eq9",),
    _BASELINES,
)
def _grpo_population_std() -> Undo:
    from rtpo.core import estimators

    orig = estimators.group_advantage

    def group_advantage(returns, normalize=True, std="unbiased"):
        return orig(returns, normalize=normalize, std="population")

    return _replace_everywhere(orig, group_advantage)


def _patched_pair_regression(change: dict) -> Undo:
    from rtpo.core import loss

    orig = loss.pair_regression_loss

    def pair_regression_loss(logp, flat, cfg, ref_logp=None):
        return orig(logp, flat, dataclasses.replace(cfg, **change), ref_logp)

    return _replace_everywhere(orig, pair_regression_loss)


@_mutant(
    "refuel_log_ratio_clamped",
    "REFUEL's regression clamps each token's log-ratio at ±10 (REFUEL has no clamp)",
    ("test_BL2b_refuel_regression_has_no_log_ratio_clamp",),
    _BASELINES,
)
def _refuel_log_ratio_clamped() -> Undo:
    return _patched_pair_regression({"log_ratio_clip": 10.0})


@_mutant(
    "refuel_eta_ignored",
    "REFUEL regresses onto R − R′ whatever η is (η = 1)",
    ("test_BL2_refuel_pair_gradient_is_4_eta_loo_policy_gradient_at_theta_old",),
    _BASELINES,
)
def _refuel_eta_ignored() -> Undo:
    return _patched_pair_regression({"eta": 1.0})


_ADAPTIVE = ("test_BL3_adaptive_groups_are_unbiased_and_fixed_g_weighting_restores_fixed_g_eq7",)


@_mutant(
    "adaptive_weights_ignored",
    "rtpo_adaptive's fixed_g weighting weighs every row 1 (the per_group behaviour)",
    _ADAPTIVE,
    _BASELINES,
)
def _adaptive_weights_ignored() -> Undo:
    from rtpo.core.methods import rtpo_adaptive

    orig = rtpo_adaptive.group_weights

    def group_weights(estimator, sizes, fixed_n):
        return np.ones(len(sizes))

    return _replace_everywhere(orig, group_weights)


@_mutant(
    "adaptive_shrinkage_ignored",
    "rtpo_adaptive's fixed_g weighting takes c(n) = 1 (forgets the sibling mean's own-return shrinkage 1 − 1/n)",
    _ADAPTIVE,
    _BASELINES,
)
def _adaptive_shrinkage_ignored() -> Undo:
    from rtpo.core.methods import rtpo_adaptive

    orig = rtpo_adaptive.own_return_coefficient

    def own_return_coefficient(estimator, n):
        return 1.0

    return _replace_everywhere(orig, own_return_coefficient)


@_mutant(
    "arpo_tau_ignored",
    "ARPO's stochastic rule branches with probability clip(α + β·ΔH) (τ ignored), not the public code's τ",
    ("test_BL4_arpo_branches_with_the_public_codes_probability",),
    _BASELINES,
)
def _arpo_tau_ignored() -> Undo:
    from rtpo.core import estimators
    from rtpo.core.methods import arpo

    orig = arpo.branch_probability

    def branch_probability(h_now, h_init, cfg):
        return estimators.arpo_branch_probability(h_now, h_init, cfg.alpha, cfg.beta)

    return _replace_everywhere(orig, branch_probability)


def _no_shrink(fn: Any) -> None:
    """A kill needs one failing example, not a minimal one: drop Hypothesis's shrink phase for this call."""
    from hypothesis import Phase, settings

    current = getattr(fn, "_hypothesis_internal_use_settings", None)
    if current is not None:
        fn._hypothesis_internal_use_settings = settings(current, phases=[Phase.explicit, Phase.reuse, Phase.generate])


VERIFY_DIR = Path(__file__).resolve().parent


def find_claim_test(function: str) -> str:
    """The node id (rtpo/verify/<module>.py::<function>) of the claim test named `function`, found by
    reading the claim modules' source (nothing is imported); a name defined in no module, or in two,
    is a KeyError naming it."""
    pattern = re.compile(rf"^def {re.escape(function)}\(", re.M)
    where = [p for p in sorted(VERIFY_DIR.glob("test_*.py")) if pattern.search(p.read_text())]
    if len(where) != 1:
        found = ", ".join(p.name for p in where) or "no claim module"
        raise KeyError(f"claim test {function!r}: defined in {found} (expected exactly one)")
    return f"{where[0].relative_to(VERIFY_DIR.parents[1]).as_posix()}::{function}"


def killer_nodes(name: str) -> list[str]:
    """The node ids of mutant `name`'s killer tests."""
    return [find_claim_test(fn) for fn in get(name).killers]


def killed_by(name: str) -> list[str]:
    """Apply mutant `name` in this process, call each of its killer tests directly, undo the mutant, and
    return the killers that failed (raised).  The fast check of tests/test_mutants.py; `rtpo verify
    --mutants` runs whole claim modules in subprocesses instead."""
    import importlib

    modules = {}
    for node in killer_nodes(name):  # import before patching; _replace_everywhere rebinds their names
        path, _ = node.split("::")
        modules[node] = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    failed = []
    undo = activate(name)
    try:
        for node, mod in modules.items():
            fn = getattr(mod, node.split("::")[1])
            _no_shrink(fn)
            try:
                fn()
            except Exception:  # noqa: BLE001 - any failure of a claim test kills the mutant
                failed.append(node)
    finally:
        undo()
    return failed


def activate(name: str) -> Undo:
    """Apply mutant `name`; returns the function that undoes it."""
    # import everything a mutant may rebind, so consumers that imported names are patched too
    import rtpo.core.methods  # noqa: F401
    import rtpo.tabular  # noqa: F401

    return get(name).apply()


def names() -> list[str]:
    return sorted(MUTANTS)
