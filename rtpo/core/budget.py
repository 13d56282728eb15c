"""Generation budget accounting: every method reports what it generated (SPEC §2.3)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Budget:
    """Running totals of generation spent by a method.

    rollouts: trajectories generated (trunks, siblings, tree expansions: each started episode counts).
    turns:    turns generated (one Sampler response each).
    tokens:   response tokens generated.
    """

    rollouts: int = 0
    turns: int = 0
    tokens: int = 0

    def charge(self, rollouts: int, turns: int, tokens: int) -> None:
        if min(rollouts, turns, tokens) < 0:
            raise ValueError("budget charges must be non-negative")
        self.rollouts += int(rollouts)
        self.turns += int(turns)
        self.tokens += int(tokens)

    def as_metrics(self) -> dict[str, int]:
        return {f"budget/{k}": v for k, v in asdict(self).items()}
