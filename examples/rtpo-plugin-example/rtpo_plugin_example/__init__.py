"""An rtpo plugin: importing this module registers one estimator and one method.

- estimator `sibling_median`: A_j = R_j − median_i R_i over a boundary's siblings, a baseline that one
  outlying return cannot drag (the median, not the mean, of Eq. 7's sibling group).
- method `rtpo_median`: RTPO (Algorithm 1, the shared `ReverseTurn` iteration) whose estimator defaults to
  `sibling_median`; every other RTPO key (G, trunks_per_query, epochs, ...) works as for `rtpo`.

A plugin uses only rtpo's public registries; nothing in rtpo is edited.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rtpo.core.estimators import ESTIMATORS
from rtpo.core.methods import register_method
from rtpo.core.methods.reverse import ReverseTurn, RTPOConfig


@ESTIMATORS.register("sibling_median")
def sibling_median_advantage(returns: np.ndarray) -> np.ndarray:
    """A_j = R_j − median(R) over the last axis (one sibling group), the median form of Eq. 7."""
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim == 0 or r.shape[-1] < 1:
        raise ValueError(f"an advantage group needs at least 1 member, got shape {r.shape}")
    return r - np.median(r, axis=-1, keepdims=True)


@dataclass(frozen=True)
class MedianConfig(RTPOConfig):
    """RTPO's settings with the median sibling baseline.

    estimator: registered advantage estimator (default: this plugin's sibling_median).
    """

    estimator: str = "sibling_median"


@register_method("rtpo_median")
class RTPOMedian(ReverseTurn):
    Config = MedianConfig
