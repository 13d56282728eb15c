"""`rtpo export RUN [--iter N] OUT`: a run's policy as a standalone model folder.

An llm run's checkpoint (the latest, or `ckpt/iter_N` with --iter N) becomes a Hugging Face folder
(safetensors, config, tokenizer, generation config; rtpo.llm.hf_folder) that transformers and vLLM load
like any model.  The checkpoint is verified first exactly as `--resume` verifies it (format, digest,
this run's fingerprint), so a foreign, truncated or altered checkpoint is refused and nothing is written.

Tabular runs are refused: their policy is a table of logits that only this package reads, and the run's
checkpoint already is its compact, self-describing form (`rtpo eval RUN` evaluates it).

    rtpo export RUN OUT               the latest checkpoint
    rtpo export RUN --iter 3 OUT      the checkpoint after iteration 3 (one of logging.keep_last)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rtpo.rundir import checkpoint
from rtpo.scenario.backends import get_backend
from rtpo.scenario.load import ConfigError, load_scenario


def export_run(run: str | Path, out: str | Path, iteration: int | None = None) -> Path:
    """Write the policy of run folder `run` (its latest checkpoint, or the one after `iteration`
    iterations) to `out`, a new folder; returns it.  Every bad input is a one-line ConfigError."""
    run, out = Path(run), Path(out)
    if not (run / checkpoint.CONFIG).is_file():
        raise ConfigError(f"{run}: not a run folder (no {checkpoint.CONFIG})")
    cfg = load_scenario(run / checkpoint.CONFIG)
    spec = get_backend(cfg.backend.kind)
    if spec.export is None:
        raise ConfigError(
            f"{run}: a {cfg.backend.kind} run has no model to export (export writes Hugging Face folders of "
            "llm runs; a tabular policy is its checkpoint: rtpo eval RUN)"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not an empty folder (export writes a new model folder)")
    if iteration is not None:
        path = checkpoint.iteration_path(run, iteration)
    else:
        path = checkpoint.latest_path(run)
        if path is None or not path.is_file():
            raise ConfigError(f"{run}: no checkpoint to export (the run wrote none, or its latest is missing)")
    state = checkpoint.read_checkpoint(path, cfg)
    checkpoint.check_id(run, cfg)
    weights = checkpoint.model_weights(path, state)
    prog = state["progress"]
    manifest: dict[str, Any] = {
        "run": str(run.resolve()),
        "checkpoint": str(path.parent.relative_to(run)) if path.parent != run else path.name,
        "fingerprint": checkpoint.fingerprint(cfg),
        "iterations_done": prog["iteration"],
        "global_phase": prog["global_phase"],
        "scenario": cfg.name,
        "method": cfg.method.name,
        "seed": cfg.seed,
    }
    try:
        return Path(spec.export(cfg, weights, out, manifest))
    except ValueError as e:
        raise ConfigError(f"{path}: {' '.join(str(e).split())}") from None
