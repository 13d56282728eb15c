"""An rtpo plugin: importing this module registers one estimator and one method.

- estimator `sibling_trimmed_mean`: A_j = R_j − V̂ with V̂ the mean of a boundary's sibling returns after
  dropping the highest and the lowest one (Eq. 7's sibling baseline, made robust to one outlying
  return; groups of fewer than 3 keep the plain mean).
- method `rtpo_trimmed`: RTPO (Algorithm 1, the shared `ReverseTurn` iteration) whose estimator defaults
  to `sibling_trimmed_mean`; every other RTPO key (G, trunks_per_query, epochs, ...) works as for `rtpo`.

A plugin uses only rtpo's public registries; nothing in rtpo is edited.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtpo.core.estimators import ESTIMATORS
from rtpo.core.methods import register_method
from rtpo.core.methods.reverse import ReverseTurn, RTPOConfig


@ESTIMATORS.register("sibling_trimmed_mean")
def sibling_trimmed_mean_advantage(returns: np.ndarray) -> np.ndarray:
    """A_j = R_j − V̂, V̂ the mean over the last axis (one sibling group) without its largest and smallest
    member (the plain mean of Eq. 7 for groups of 1 or 2)."""
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] < 1:
        raise ValueError(f"an advantage group needs at least 1 member, got shape {r.shape}")
    if r.shape[-1] < 3:
        return r - r.mean(axis=-1, keepdims=True)
    inner = np.sort(r, axis=-1)[..., 1:-1]
    return r - inner.mean(axis=-1, keepdims=True)


@dataclass(frozen=True)
class TrimmedConfig(RTPOConfig):
    """RTPO's settings with the trimmed-mean sibling baseline.

    estimator: registered advantage estimator (default: this plugin's sibling_trimmed_mean).
    """

    estimator: str = "sibling_trimmed_mean"


@register_method("rtpo_trimmed")
class RTPOTrimmed(ReverseTurn):
    Config = TrimmedConfig
