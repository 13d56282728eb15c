"""Exact value of a language model's policy on an exact world (rtpo.llm.worlds), by enumeration.

The decision contexts a chat episode can reach form a finite tree: a node is (turn k, MDP state s, the
chat state S_k), its children are the canonical turns (action a, successor s') of positive probability.
At each node the policy's probability of action a is the probability of a's canonical ids given the
context c_k = ψ(S_k), teacher-forced:

    π(a | c) = Π_t p_{T, top-p}(x_{a,t} | c ⊕ x_{a,<t})                       (the sampling distribution)

where p_{T, top-p} is the engine's sampling distribution at the evaluation settings: softmax(logits / T)
restricted to the nucleus (the most probable tokens whose mass first reaches top-p) and renormalised;
T = 0 is greedy (probability 1 on the argmax).  The remaining mass m(c) = 1 − Σ_a π(a | c) is the
malformed mass, which ends the episode with reward r_mal (rtpo.llm.worlds' rule).  Backward induction
over the tree (Eq. 20 with the model's policy) then gives the exact value

    V(node) = Σ_a π(a | c) [ r_k(s, a) + γ^{τ_k(s, a)} Σ_{s'} P(s' | s, a) V(child) ] + m(c) r_mal,
    V^π = Σ_{s_0} init(s_0) V(root(s_0)).

Contexts are scored in batches (`batch_tokens` padded tokens per forward pass, the pairs of one context
together); identical contexts (a map that forgets history) are scored once.  A context is run through
the model once: its KV cache is repeated for the A actions, which then run only their own tokens, so a
batch costs n·|c| + n·A·|x| token positions instead of n·A·(|c| + |x|) (the scores are the same as full
rows c ⊕ x_a, which `logprob_tensor` still builds for gradients; tests/llm/test_worlds_exact.py checks
the two agree).  `count_nodes` counts the
tree from the MDP's arrays alone, before any token is built, so a world too large to enumerate is
refused cheaply (ExactLimitError names the config key that raises the limit).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rtpo.llm.contexts import ChatState
from rtpo.llm.worlds import World, WorldEnv


class ExactLimitError(ValueError):
    """More reachable decision contexts than the configured limit."""


def count_nodes(world: World) -> np.ndarray:
    """(K,) reachable decision nodes per turn (histories of canonical turns, any policy)."""
    n = (np.asarray(world.init) > 0).astype(np.float64)
    out = [n.sum()]
    for k in range(world.num_turns - 1):
        p = world.prob[k]
        nxt = np.zeros(world.reward[k + 1].shape[0])
        live = p > 0
        s_idx, _, _ = np.nonzero(live)
        np.add.at(nxt, world.succ[k][live], n[s_idx])
        n = nxt
        out.append(n.sum())
    return np.asarray(out)


@dataclass(frozen=True)
class Tree:
    """The reachable tree, level by level.  Level k: nodes' MDP states `s[k]` and chat states; edges
    (node, action, child, probability) to level k+1; `ctx[k]`: each node's index into `contexts`."""

    s: tuple[np.ndarray, ...]
    states: tuple[tuple[ChatState, ...], ...]
    edges: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    ctx: tuple[np.ndarray, ...]
    contexts: tuple[np.ndarray, ...]
    root_weight: np.ndarray

    @property
    def num_nodes(self) -> int:
        return sum(len(x) for x in self.s)


def enumerate_tree(env: WorldEnv, limit: int | None = None, key: str = "task.exact_max_contexts") -> Tree:
    """Every reachable decision node of `env`'s world with its context ψ(S_k) (identical contexts shared)."""
    w = env.world
    counts = count_nodes(w)
    if limit is not None and counts.sum() > limit:
        raise ExactLimitError(
            f"{key}: exact evaluation of task {w.kind!r} would enumerate {int(counts.sum()):,} decision contexts, "
            f"more than {key.rsplit('.', 1)[-1]}={limit:,}; raise it, or set task.exact_fallback: sampled"
        )
    roots = np.flatnonzero(np.asarray(w.init) > 0)
    s_levels = [roots.astype(np.int64)]
    st_levels: list[tuple[ChatState, ...]] = [tuple(env.words.first_state(int(s)) for s in roots)]
    edges = []
    for k in range(w.num_turns - 1):
        en, ea, ec, ep = [], [], [], []
        ns, nst = [], []
        for i, (s, st) in enumerate(zip(s_levels[k], st_levels[k])):
            for a in range(w.num_actions):
                row = w.prob[k][s, a]
                for b in np.flatnonzero(row > 0):
                    s2 = int(w.succ[k][s, a, b])
                    en.append(i)
                    ea.append(a)
                    ec.append(len(ns))
                    ep.append(float(row[b]))
                    ns.append(s2)
                    nst.append(env.words.after(st, k, a, s2))
        edges.append(
            (np.asarray(en, np.int64), np.asarray(ea, np.int64), np.asarray(ec, np.int64), np.asarray(ep, np.float64))
        )
        s_levels.append(np.asarray(ns, np.int64))
        st_levels.append(tuple(nst))
    index: dict[bytes, int] = {}
    contexts: list[np.ndarray] = []
    ctx_levels = []
    for sts in st_levels:
        ids = np.empty(len(sts), np.int64)
        for i, st in enumerate(sts):
            c = env.psi(st)
            key_b = c.tobytes()
            if key_b not in index:
                index[key_b] = len(contexts)
                contexts.append(c)
            ids[i] = index[key_b]
        ctx_levels.append(ids)
    return Tree(
        tuple(s_levels),
        tuple(st_levels),
        tuple(edges),
        tuple(ctx_levels),
        tuple(contexts),
        np.asarray(w.init, np.float64)[roots],
    )


def policy_value(world: World, tree: Tree, pi: np.ndarray, malformed_reward: float = 0.0) -> float:
    """V^π by backward induction over the tree; pi: (num contexts, A) action probabilities (rows may sum
    to less than 1: the rest is malformed mass, which ends the episode with malformed_reward)."""
    _, vs = node_values(world, tree, pi, malformed_reward)
    return float(tree.root_weight @ vs[0])


def node_values(
    world: World, tree: Tree, pi: np.ndarray, malformed_reward: float = 0.0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per level k: Q(node, a) (n_k, A) and V(node) (n_k,) of the policy pi, by the backward induction of
    policy_value (the module docstring's recursion, kept per node)."""
    K, A = world.num_turns, world.num_actions
    pi = np.asarray(pi, dtype=np.float64)
    qs: list[np.ndarray] = [np.empty(0)] * K
    vs: list[np.ndarray] = [np.empty(0)] * K
    v_next = None
    for k in range(K - 1, -1, -1):
        s = tree.s[k]
        q = world.reward[k][s].astype(np.float64).copy()
        if k < K - 1:
            en, ea, ec, ep = tree.edges[k]
            cont = np.zeros((s.size, A))
            np.add.at(cont, (en, ea), ep * v_next[ec])
            q += (world.gamma ** world.tau[k][s].astype(np.float64)) * cont
        p = pi[tree.ctx[k]]
        qs[k] = q
        vs[k] = v_next = (p * q).sum(axis=1) + (1.0 - p.sum(axis=1)) * malformed_reward
    return qs, vs


def reach_probabilities(world: World, tree: Tree, pi: np.ndarray) -> list[np.ndarray]:
    """Per level k: the probability d_k(node) that an episode of pi reaches the node (the initial
    distribution times the policy's and the MDP's probabilities along its path; discounting is in Q)."""
    pi = np.asarray(pi, dtype=np.float64)
    d = [np.asarray(tree.root_weight, np.float64)]
    for k in range(world.num_turns - 1):
        en, ea, ec, ep = tree.edges[k]
        p = pi[tree.ctx[k]]
        nxt = np.zeros(tree.s[k + 1].size)
        np.add.at(nxt, ec, d[k][en] * p[en, ea] * ep)
        d.append(nxt)
    return d


def policy_gradient_weights(world: World, tree: Tree, pi: np.ndarray, malformed_reward: float = 0.0) -> np.ndarray:
    """∂V^π/∂π(a | c) for every context c and action a, exactly: (num contexts, A).

    V^π is multilinear in the table π(· | c) (the module docstring's recursion, with the malformed mass
    m(c) = 1 − Σ_a π(a | c) paying r_mal), so by the policy gradient theorem (Sutton et al. 2000, Thm 1,
    in its finite-horizon form)

        ∂V^π / ∂π(a | c) = Σ_{nodes n with context c} d(n) · γ^{t(n)} · (Q(n, a) − r_mal),

    with d(n) the reach probability (reach_probabilities) and Q(n, a) the action value (node_values); the
    discount up to n is already in Q of its ancestors, so for γ = 1 (every shipped world) γ^{t(n)} = 1 and
    for γ < 1 it is applied here from the τ of the path.  A context shared by several nodes (a map that
    forgets history) sums their terms, since one π(· | c) acts at all of them.  Ascending Σ_c Σ_a w·π(a|c)
    with w held fixed is exact gradient ascent on V^π for any parametrisation of π (a model's teacher-forced
    action probabilities): the yardstick of bench/bench_exact_gradient.py."""
    pi = np.asarray(pi, dtype=np.float64)
    qs, _ = node_values(world, tree, pi, malformed_reward)
    d = reach_probabilities(world, tree, pi)
    disc = [np.ones(tree.s[0].size)]
    for k in range(world.num_turns - 1):
        en, ea, ec, _ = tree.edges[k]
        nxt = np.ones(tree.s[k + 1].size)
        nxt[ec] = disc[k][en] * world.gamma ** world.tau[k][tree.s[k][en], ea].astype(np.float64)
        disc.append(nxt)
    w = np.zeros((len(tree.contexts), world.num_actions))
    for k in range(world.num_turns):
        np.add.at(w, tree.ctx[k], (d[k] * disc[k])[:, None] * (qs[k] - malformed_reward))
    return w


def sampling_logprobs(logits: Any, targets: Any, temperature: float, top_p: float) -> Any:
    """log p_{T, top-p}(target) per position (torch tensors (..., V) and (...)); -inf outside the nucleus."""
    import torch

    logits = logits.float()
    if temperature == 0:
        hit = logits.argmax(-1) == targets
        return torch.where(hit, 0.0, float("-inf"))
    log_p = torch.log_softmax(logits / temperature, dim=-1)
    lp = log_p.gather(-1, targets[..., None]).squeeze(-1)
    if top_p >= 1.0:
        return lp
    p = log_p.exp()
    # the nucleus (vLLM's rule): a token is kept when the tokens more probable than it hold less than
    # top_p; the kept mass renormalises the distribution
    p_t = p.gather(-1, targets[..., None])
    kept = (p * (p > p_t)).sum(-1) < top_p
    mass = _nucleus_mass(p, top_p)
    return torch.where(kept, lp - torch.log(mass), float("-inf"))


def _nucleus_mass(p: Any, top_p: float) -> Any:
    """The probability mass of the nucleus at each position: sorted descending, the tokens whose
    predecessors hold less than top_p."""
    import torch

    srt, _ = torch.sort(p, dim=-1, descending=True)
    before = srt.cumsum(-1) - srt
    return (srt * (before < top_p)).sum(-1)


class ExactEvaluator:
    """The exact value of a model's policy on env's world (module docstring), with its cost.

    model:          a causal LM (HF) whose weights are the policy's; `load` replaces them (a state dict).
    temperature, top_p: the evaluation sampling settings (the engine's, so the value is that policy's).
    batch_tokens:   padded tokens per forward pass.
    limit:          most decision nodes enumerated (ExactLimitError naming `key` beyond it).
    """

    def __init__(
        self,
        env: WorldEnv,
        model: Any,
        temperature: float,
        top_p: float = 1.0,
        batch_tokens: int = 16384,
        limit: int | None = None,
        key: str = "task.exact_max_contexts",
        malformed_reward: float = 0.0,
    ) -> None:
        self.env = env
        self.model = model
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.batch_tokens = int(batch_tokens)
        self.malformed_reward = float(malformed_reward)
        self.tree = enumerate_tree(env, limit, key)
        self.actions = env.words.canonical
        A = env.world.num_actions
        # the uniform policy's value (every action 1/A, no malformed mass): the tabular backend's
        # eval/v_uniform, the zero of the normalised gain (V − V_uniform)/(V* − V_uniform) in rtpo compare
        self.v_uniform = policy_value(env.world, self.tree, np.full((len(self.tree.contexts), A), 1.0 / A), 0.0)
        self.pad_id = int(getattr(getattr(model, "config", None), "pad_token_id", None) or 0)

    def action_logprobs(self, contexts: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """(num contexts, A) log π(a | c) of every context (default: the tree's) and action."""
        import torch

        contexts = self.tree.contexts if contexts is None else contexts
        A = len(self.actions)
        x_len = np.array([x.size for x in self.actions])
        r_max = int(x_len.max())
        out = np.empty((len(contexts), A))
        order = np.argsort([c.size for c in contexts], kind="stable")  # similar lengths share a batch
        was_training = getattr(self.model, "training", False)
        self.model.eval()
        try:
            with torch.no_grad():
                i = 0
                while i < len(order):
                    width = int(contexts[order[i]].size) + r_max
                    j = i + 1
                    while j < len(order) and (j - i + 1) * A * (int(contexts[order[j]].size) + r_max) <= max(
                        self.batch_tokens, A * width
                    ):
                        j += 1
                    rows = order[i:j]
                    out[rows] = self._score([contexts[r] for r in rows], x_len, r_max)
                    i = j
        finally:
            self.model.train(was_training)
        return out

    def logprob_tensor(self, contexts: Sequence[np.ndarray]) -> Any:
        """(len(contexts), A) log π(a | c) as one torch tensor with its autograd graph (one forward pass over
        every pair: for gradient ascent on small worlds, bench/bench_exact_gradient.py)."""
        r_max = max(x.size for x in self.actions)
        return self._score_tensor(list(contexts), r_max)

    def _score(self, ctxs: list[np.ndarray], x_len: np.ndarray, r_max: int) -> np.ndarray:
        """(len(ctxs), A) log π(a | c) with each context run once (module docstring): the contexts
        left-padded to a common end with a KV cache, the last position's logits predicting every action's
        first token, then the cache repeated A times and each action's tokens but its last fed after it."""
        import torch

        A = len(self.actions)
        n = len(ctxs)
        wc = max(c.size for c in ctxs)
        ids = np.full((n, wc), self.pad_id, np.int64)
        att = np.zeros((n, wc), np.int64)
        for i, c in enumerate(ctxs):
            ids[i, wc - c.size :] = c
            att[i, wc - c.size :] = 1
        attention = torch.as_tensor(att)
        position = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=torch.as_tensor(ids),
            attention_mask=attention,
            position_ids=position,
            use_cache=True,
            logits_to_keep=1,
        )
        first = out.logits[:, -1:].repeat_interleave(A, 0)  # (n·A, 1, V): predicts token 0 of each action
        tgt = np.zeros((n * A, r_max), np.int64)
        mask = np.zeros((n * A, r_max), bool)
        for a, x in enumerate(self.actions):
            tgt[a::A, : x.size] = x
            mask[a::A, : x.size] = True
        if r_max > 1:
            cache = out.past_key_values
            cache.batch_repeat_interleave(A)  # row i·A + a continues context i with action a
            feed = torch.as_tensor(np.where(mask[:, :-1], tgt[:, :-1], self.pad_id))
            cont_att = torch.cat(
                [attention.repeat_interleave(A, 0), torch.as_tensor(mask[:, :-1], dtype=torch.long)], 1
            )
            cont_pos = position[:, -1:].repeat_interleave(A, 0) + torch.arange(1, r_max)
            rest = self.model(
                input_ids=feed, attention_mask=cont_att, position_ids=cont_pos, past_key_values=cache, use_cache=False
            ).logits  # position t predicts action token t + 1
            pred = torch.cat([first, rest], 1)
        else:
            pred = first
        lp = sampling_logprobs(pred, torch.as_tensor(tgt), self.temperature, self.top_p)
        lp = torch.where(torch.as_tensor(mask), lp, 0.0)
        return lp.sum(-1).reshape(n, A).double().numpy()

    def _score_tensor(self, ctxs: list[np.ndarray], r_max: int) -> Any:
        """Left-padded rows c ⊕ x_a, each action's tokens at the last positions (its tail padded after)."""
        import torch

        A = len(self.actions)
        n = len(ctxs)
        width = max(c.size for c in ctxs) + r_max
        ids = np.full((n * A, width), self.pad_id, np.int64)
        att = np.zeros((n * A, width), np.int64)
        tgt = np.zeros((n * A, r_max), np.int64)
        mask = np.zeros((n * A, r_max), bool)
        for i, c in enumerate(ctxs):
            for a, x in enumerate(self.actions):
                row = i * A + a
                full = np.concatenate([c, x])
                lo = width - r_max - c.size  # contexts end at the same column; actions follow, right-padded
                ids[row, lo : lo + full.size] = full
                att[row, lo : lo + full.size] = 1
                tgt[row, : x.size] = x
                mask[row, : x.size] = True
        input_ids = torch.as_tensor(ids)
        attention = torch.as_tensor(att)
        position = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=position, logits_to_keep=r_max + 1
        ).logits
        # the kept positions are width - r_max - 1 .. width - 1; position width - r_max - 1 + t predicts
        # action token t
        pred = logits[:, :r_max]
        lp = sampling_logprobs(pred, torch.as_tensor(tgt), self.temperature, self.top_p)
        lp = torch.where(torch.as_tensor(mask), lp, 0.0)
        return lp.sum(-1).reshape(n, A)

    def __call__(self) -> dict[str, float]:
        """eval/value (exact), eval/v_star, eval/v_uniform, eval/value_ratio, eval/malformed_mass (the policy's probability
        of a malformed turn at the first context) and the cost: contexts, tokens, seconds."""
        t0 = time.perf_counter()
        logp = self.action_logprobs()
        pi = np.exp(logp)
        value = policy_value(self.env.world, self.tree, pi, self.malformed_reward)
        secs = time.perf_counter() - t0
        A = len(self.actions)
        tokens = sum(int(c.size) * A for c in self.tree.contexts) + len(self.tree.contexts) * int(
            sum(x.size for x in self.actions)
        )
        v_star = self.env.world.v_star
        root = self.tree.ctx[0]
        return {
            "eval/value": value,
            "eval/v_star": v_star,
            "eval/v_uniform": self.v_uniform,
            "eval/value_ratio": value / v_star if v_star else float("nan"),
            "eval/malformed_mass": float(self.tree.root_weight @ (1.0 - pi[root].sum(axis=1))),
            "eval/exact_contexts": float(len(self.tree.contexts)),
            "eval/exact_nodes": float(self.tree.num_nodes),
            "eval/exact_tokens": float(tokens),
            "time/exact_eval_s": secs,
        }


__all__ = [
    "ExactEvaluator",
    "ExactLimitError",
    "Tree",
    "count_nodes",
    "enumerate_tree",
    "node_values",
    "policy_gradient_weights",
    "policy_value",
    "reach_probabilities",
]
