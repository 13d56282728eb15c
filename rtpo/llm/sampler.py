"""The sampler an llm run hands the core: the engine (vLLM or HF) plus the weights it last loaded (for
checkpoints) and the time spent loading weights; and eval_engine, the engine borrowed for an evaluation
at the learner's weights and the evaluation sampling settings.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rtpo.core.metrics import generation_metrics

_ZERO = {"s": 0.0, "tokens": 0, "responses": 0, "prefill_flops": 0.0, "decode_flops": 0.0}


class TrackedSampler:
    """The engine, plus what the run needs around it: the weights it last loaded (checkpoints), the
    time spent loading weights (the sync share of a phase) and what it generated.

    shape: the model's sizes (rtpo.llm.flops.ModelShape): each generate call also counts its model FLOPs
    (prefill + decode); None = not counted.  peak_flops: the engine's peak FLOP/s (one device's peak ×
    its tensor-parallel devices), for perf/generator_mfu; None = achieved FLOP/s only."""

    RESYNC = "resync: the learner's weights are pushed before the next sample"

    def __init__(self, engine: Any, shape: Any = None, peak_flops: float | None = None) -> None:
        self.engine = engine
        self.shape = shape
        self.peak_flops = peak_flops
        self.current: Any = None
        self.sync_seconds = 0.0
        self.syncs = 0
        self.needs_sync = False
        self._gen = dict(_ZERO)

    def generate(self, contexts, turn, n, rng):
        if self.needs_sync:  # restored from an iteration-boundary checkpoint, which kept no sampler weights
            raise RuntimeError(
                "the sampler was restored without weights (an iteration-boundary checkpoint) and a method "
                "sampled before pushing the learner's: every Method.begin must call ctx.sync() first"
            )
        t0 = time.perf_counter()
        out = self.engine.generate(contexts, turn, n, rng)
        self._gen["s"] += time.perf_counter() - t0
        self._gen["tokens"] += int(out.tokens.lengths.sum())
        self._gen["responses"] += len(out)
        if self.shape is not None:
            from rtpo.llm.flops import generation_flops

            prefill, decode = generation_flops(self.shape, contexts.lengths, out.tokens.lengths, n)
            self._gen["prefill_flops"] += prefill
            self._gen["decode_flops"] += decode
        return out

    def pop_generation_counts(self) -> dict[str, float]:
        """The summed counts since the last call (rtpo.core.protocols.CountsGeneration): seconds in the
        engine, tokens and responses generated, and (with a model shape) their model FLOPs and the peak FLOPs
        the engine time allowed; a Ray rollout worker sends them with each chunk."""
        g, self._gen = self._gen, dict(_ZERO)
        out = {"time/generate_s": g["s"], "gen/tokens": float(g["tokens"]), "gen/responses": float(g["responses"])}
        if self.shape is not None:
            out["gen/prefill_flops"], out["gen/decode_flops"] = g["prefill_flops"], g["decode_flops"]
            if self.peak_flops:
                out["gen/peak_flop_budget_s"] = self.peak_flops * g["s"]
        return out

    def pop_metrics(self) -> dict[str, float]:
        """The training rollouts' generation since the last call (rtpo.core.protocols.ReportsMetrics):
        time in the engine, tokens and responses generated, mean response length, tokens per second, and
        the generator's model FLOPs, FLOP/s and MFU (rtpo.core.metrics.generation_metrics).  Evaluation samples through eval_engine and is not counted here."""
        return generation_metrics(self.pop_generation_counts())

    def state(self) -> Any:
        """What a checkpoint stores for the sampler: the weights it last loaded (None: the model folder's)."""
        return self.current

    def load_state(self, weights: Any) -> None:
        """Restore state(), or RESYNC (an iteration-boundary checkpoint): sampling is refused until the
        next load_weights."""
        if isinstance(weights, str) and weights == self.RESYNC:
            self.needs_sync = True
        elif weights is not None:
            self.load_weights(weights)

    def normalized_entropy(self, contexts, turn):
        """ARPO's entropy signal (rtpo.core.protocols.EntropySampler), from the engine."""
        probe = getattr(self.engine, "normalized_entropy", None)
        if probe is None:
            raise TypeError(f"arpo needs an engine with normalized_entropy; {type(self.engine).__name__} has none")
        return probe(contexts, turn)

    def load_weights(self, weights: Any) -> None:
        t0 = time.perf_counter()
        self.engine.load_weights(weights)
        self.sync_seconds += time.perf_counter() - t0
        self.syncs += 1
        self.current = weights
        self.needs_sync = False


@contextlib.contextmanager
def eval_engine(engine: Any, learner: Any, sampler: TrackedSampler, eval_sampling: Any):
    """The engine with the learner's current weights at the evaluation sampling settings; afterwards
    the sampler's own weights and settings are put back (an off-policy method may keep them stale on
    purpose)."""
    previous = sampler.current
    engine.load_weights(learner.weights())
    saved, engine.sampling = engine.sampling, eval_sampling
    try:
        yield engine
    finally:
        engine.sampling = saved
        if previous is not None:
            engine.load_weights(previous)
