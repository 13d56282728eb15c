"""Experiment trackers: every sink is fed the one metrics record that feeds metrics.jsonl.

`logging.trackers: [jsonl, tensorboard]` names registered trackers.  `jsonl` is the run folder's own
metrics.jsonl (always written: resume and `rtpo eval` read it); every other tracker receives exactly the
same record per phase, under the same keys (grouped by prefix: `eval/value`, `loss/clipfrac`, ...), and the
resolved scenario once as hyperparameters.  A tracker is a class with `open(run_dir, config)`,
`log(record, step)` and `close()`, registered by name; its package is an optional extra imported lazily.
A resumed run opens its trackers with `first_step` = the first phase after its checkpoint: a tracker
drops what it was given for that step and later ones by the killed process (TensorBoard: `purge_step`),
so no phase is shown twice.

Built in: `tensorboard` (event files under RUN/tensorboard/, the `tensorboard` extra).  Not built: W&B,
MLflow and trackio (their clients would change pinned packages of the vLLM stack here; a plugin registers
them the same way).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rtpo.core.registry import Registry


class Tracker:
    """Base of a tracker: override what it needs."""

    def open(self, run_dir: Path, config: dict[str, Any], first_step: int = 1) -> None:  # noqa: B027
        pass

    def log(self, record: dict[str, Any], step: int) -> None:  # noqa: B027 - optional hook
        pass

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


TRACKERS: Registry[type[Tracker]] = Registry("tracker")


@TRACKERS.register("jsonl")
class JsonlTracker(Tracker):
    """metrics.jsonl itself: written by the runner for every run (it is what resume reads)."""


def _flat(prefix: str, data: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(data, dict):
        for k, v in data.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = data if isinstance(data, (int, float, str, bool)) else json.dumps(data, default=str)
    return out


@TRACKERS.register("tensorboard")
class TensorBoardTracker(Tracker):
    """Scalars per phase (step = global phase) and the resolved scenario once (text + hparams)."""

    def open(self, run_dir: Path, config: dict[str, Any], first_step: int = 1) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise RuntimeError(
                "logging.trackers: tensorboard needs the tensorboard extra (pip install tensorboard)"
            ) from e
        import yaml

        # purge_step: readers discard events at steps >= first_step written before this point (a killed
        # process logged phases its checkpoint does not cover; the resumed run logs them again)
        resumed = first_step > 1
        self.writer = SummaryWriter(
            log_dir=str(Path(run_dir) / "tensorboard"), purge_step=first_step if resumed else None
        )
        if resumed:
            return  # the scenario went in once, when the run started
        self.writer.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)
        hparams = {k: v for k, v in _flat("", config, {}).items() if isinstance(v, (int, float, str, bool))}
        self.writer.add_hparams(hparams, {}, run_name=".")

    def log(self, record: dict[str, Any], step: int) -> None:
        for key, value in record.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_trackers(
    names: tuple[str, ...] | list[str], run_dir: Path, config: dict[str, Any], first_step: int = 1
) -> list[Tracker]:
    out = []
    for name in names:
        tracker = TRACKERS.get(name)()
        tracker.open(run_dir, config, first_step)
        out.append(tracker)
    return out
