"""Learning-rate schedules by optimiser step: linear warm-up, then constant, linear or cosine decay.

A schedule is a pure function of the number of optimiser steps already taken, so a resumed run continues
it exactly (the learners keep their step count in their checkpoints).  Both backends' learners drive it
through torch's own scheduler (`torch.optim.lr_scheduler.LambdaLR`, stepped once after every optimiser
step); nothing here knows a backend.  Imports torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

ScheduleKind = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class LRSchedule:
    """lr(s) = lr · factor(s), s = optimiser steps already taken (0 for the first step).

    kind:          constant | linear | cosine decay after the warm-up.
    warmup_steps:  W; factor(s) = (s + 1) / W for s < W (the first step runs at lr / W, step W − 1 at lr).
    decay_steps:   D; with t = s − W, linear: 1 − (1 − m)·min(t/D, 1); cosine: m + (1 − m)·(1 + cos(π·min(t/D, 1)))/2.
                   Held at m after D steps.  Required by linear and cosine; constant ignores it.
    min_lr_ratio:  m, the factor the decay ends at.
    """

    kind: ScheduleKind = "constant"
    warmup_steps: int = 0
    decay_steps: int | None = None
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("constant", "linear", "cosine"):
            raise ValueError(f"kind must be constant, linear or cosine, got {self.kind!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.kind != "constant" and (self.decay_steps is None or self.decay_steps < 1):
            raise ValueError(f"decay_steps: a {self.kind} schedule needs decay_steps >= 1, got {self.decay_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")

    def __call__(self, step: int) -> float:
        """factor(step): the multiplier of the base learning rate for the optimiser step numbered `step`."""
        w = self.warmup_steps
        if step < w:
            return (step + 1) / w
        if self.kind == "constant":
            return 1.0
        frac = min((step - w) / self.decay_steps, 1.0)
        m = self.min_lr_ratio
        if self.kind == "linear":
            return 1.0 - (1.0 - m) * frac
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * frac))


def make_lr_scheduler(opt: torch.optim.Optimizer, schedule: LRSchedule) -> torch.optim.lr_scheduler.LambdaLR:
    """torch's LambdaLR over `opt` with `schedule` as its factor; call its `step()` after every opt.step().
    Constructing it sets each group's lr to base·factor(0)."""
    return torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def restore_lr(scheduler: torch.optim.lr_scheduler.LambdaLR, steps: int) -> None:
    """Put `scheduler` (and its optimiser's learning rates) at `steps` optimiser steps taken, as if it had
    been stepped that many times: what a resumed learner calls after loading its optimiser state."""
    scheduler.last_epoch = int(steps)
    lrs = [base * fn(int(steps)) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs
