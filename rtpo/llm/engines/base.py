"""What both LLM engines share: the sampling settings, per-turn limits and the assembly of a Generation.

Log-probability convention (both engines, and the learner): the log-prob recorded for a sampled token
is the *processed* one, log softmax(logits / T) restricted and renormalised to the top-p nucleus, i.e.
the log-probability under the distribution the token was actually drawn from.  With top_p = 1 (the
training setting) this is exactly log softmax(logits / T), which is what `FSDPLearner.logprobs`
computes with the same T, so π_old and π_θ are evaluated on the same scale and the PPO ratio is 1 at
θ = θ_old up to engine numerics.  The *raw* log-prob (vLLM's default `raw_logprobs`) is
log softmax(logits) at T = 1: it is not the sampling distribution when T ≠ 1 and would bias every
ratio by a token-dependent factor.  Greedy decoding (T = 0) records log softmax(logits), T = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rtpo.core.types import Generation, Ragged


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings of an engine.

    temperature:    T; 0 = greedy.  E.3: 0.9 for training, 0.6 for evaluation.
    top_p:          nucleus mass; 1 = off (training: keep 1 so old log-probs match the learner's).
    max_tokens:     response-token limit per turn: one int for every turn, or a tuple indexed by the
                    turn k (turns past the end use the last entry).  E.3: 4096.
    stop_token_ids: tokens that end a turn besides the model's EOS (e.g. </tool_call>); the stop token
                    is part of the response (it is generated, so it is trained on).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | tuple[int, ...] = 64
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        limits = self.max_tokens if isinstance(self.max_tokens, tuple) else (self.max_tokens,)
        if not limits or any(int(m) < 1 for m in limits):
            raise ValueError(f"max_tokens must be >= 1 for every turn, got {self.max_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    def max_tokens_for(self, turn: np.ndarray) -> np.ndarray:
        """(B,) the token limit of each row's turn."""
        turn = np.asarray(turn, dtype=np.int64)
        if not isinstance(self.max_tokens, tuple):
            return np.full(turn.shape, int(self.max_tokens), dtype=np.int64)
        table = np.asarray(self.max_tokens, dtype=np.int64)
        return table[np.clip(turn, 0, table.size - 1)]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """The T the recorded log-probs (and the learner's) use: T, or 1 for greedy decoding."""
        return 1.0 if self.greedy else float(self.temperature)


# ARPO's entropy signal (Dong et al. 2025, §3.2; their public rollout code's settings): the top-10
# log-probs of each of the first 20 tokens a response generates.
ENTROPY_TOKENS = 20
ENTROPY_TOP_K = 10


def topk_entropy(topk_logprobs: Sequence[np.ndarray], vocab_size: int) -> np.ndarray:
    """ARPO's normalised entropy of each row (Dong et al. 2025, §3.2: H = −Σ_j p_j log p_j over the first
    tokens of a response, normalised): rows[i] is a (T_i, k) array of the top-k log-probs at each of the
    row's first T_i generated positions; H_i = Σ_t Σ_j −p_{t,j} log p_{t,j} / log|V|, the top-k mass
    only (as their code, which sums over the returned entries of the first 20 positions and divides by
    log|V|).  Masked entries (−inf, e.g. outside a top-p nucleus) contribute 0; an empty row gives 0."""
    out = np.zeros(len(topk_logprobs))
    for i, lp in enumerate(topk_logprobs):
        lp = np.asarray(lp, dtype=np.float64)
        finite = np.isfinite(lp)
        out[i] = float(-(np.exp(lp[finite]) * lp[finite]).sum())
    return out / np.log(vocab_size)


def fit_to_model_len(limits: np.ndarray, context_lengths: np.ndarray, max_model_len: int | None) -> np.ndarray:
    """Per-row response limits cut so that context + response fits the engine's max_model_len.

    A cut response ends unfinished, which the environment counts as a truncated turn; a context that
    leaves no room at all is the environment's to prevent (LLMEnv max_context_tokens), so it is a
    one-line error here rather than the engine's own failure deep inside a batch.
    """
    limits = np.asarray(limits, dtype=np.int64)
    if max_model_len is None:
        return limits
    room = int(max_model_len) - np.asarray(context_lengths, dtype=np.int64)
    if room.size and room.min() < 1:
        i = int(room.argmin())
        raise ValueError(
            f"context {i} has {int(context_lengths[i])} tokens, no room for a response within "
            f"max_model_len={max_model_len}: set task.max_context_tokens below backend.max_model_len"
        )
    return np.minimum(limits, room)


def check_request(contexts: Ragged, turn: np.ndarray, n: int, vocab_size: int) -> np.ndarray:
    """Validate a generate() request; returns turn as (B,) int64.  One-line errors name the problem."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    turn = np.asarray(turn, dtype=np.int64).reshape(-1)
    if turn.shape != (len(contexts),):
        raise ValueError(f"turn must have one entry per context ({len(contexts)}), got shape {turn.shape}")
    if np.any(contexts.lengths == 0):
        raise ValueError("every context must hold at least one token")
    ids = contexts.values
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"context token ids must lie in [0, {vocab_size}), got [{ids.min()}, {ids.max()}]")
    return turn


def to_generation(token_rows: Sequence[Sequence[int]], logp_rows: Sequence[Sequence[float]]) -> Generation:
    """Rows of response ids and their log-probs -> Generation (int64 / float64 Ragged)."""
    tokens = Ragged.from_rows([np.asarray(r, dtype=np.int64) for r in token_rows], dtype=np.int64)
    logp = Ragged.from_rows([np.asarray(r, dtype=np.float64) for r in logp_rows], dtype=np.float64)
    return Generation(tokens, Ragged(logp.values, tokens.offsets))


def seeds_from(rng: np.random.Generator, count: int) -> np.ndarray:
    """Per-request seeds drawn from the caller's rng, so a run's samples depend only on its seed."""
    return rng.integers(0, 2**31 - 1, size=count, dtype=np.int64)


def model_stop_ids(model_path) -> list[int]:
    """The EOS ids of a model folder: config.json's and generation_config.json's, merged.

    Both engines stop on exactly this set (plus SamplingConfig.stop_token_ids), so they agree on
    where a turn ends.
    """
    import json
    from pathlib import Path

    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_path) / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                ids.update([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    return sorted(ids)
