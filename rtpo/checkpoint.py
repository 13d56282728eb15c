"""The run folder's layout and the checkpoint format: the one module that knows file names.

A run folder holds `config.yaml` (the resolved scenario), `metrics.jsonl` (one line per phase),
`checkpoint.pkl` (the latest checkpoint) and, once a first checkpoint exists, `checkpoint.id` (the run's
fingerprint, written once and never changed).  `rtpo run`, `--resume` and `rtpo eval` read and write
through the functions here.

Checkpoint file format (version 2): one line `RTPO-CHECKPOINT 2\\n`, one line of JSON
`{"fingerprint", "sha256", "bytes"}`, then the pickled state.  The header lets a reader refuse a file
before unpickling anything: a foreign checkpoint (another run's fingerprint), a truncated or altered one
(length or digest differ) or a file that is no checkpoint at all is a one-line error, and nothing in the
run folder is touched.  Unpickling runs only on bytes whose digest the header vouches for — a checkpoint
is trusted data of this run, never input from elsewhere.

Resume never loses what exists: when `checkpoint.id` says a checkpoint was written but `checkpoint.pkl`
is gone, resuming is refused rather than silently restarting from phase 0 over the existing metrics.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

from rtpo.schema import ConfigError, ScenarioConfig

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pkl"
CHECKPOINT_ID = "checkpoint.id"
SUMMARY = "summary.md"
SUMMARY_JSON = "summary.json"
CURVE = "learning_curve.png"
VERSION = 2
_MAGIC = b"RTPO-CHECKPOINT "
_STATE_KEYS = ("version", "learner", "sampler", "rng", "budget", "progress")


def fingerprint(cfg: ScenarioConfig) -> str:
    """Identity of a run: the hash of its resolved scenario minus the sections a resume may change
    (`budget`: extending a finished run; `logging`: how it reports).  Two runs with the same shapes but
    another seed, task, method or setting have different fingerprints."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in ("budget", "logging")}
    blob = json.dumps({"format": VERSION, "config": data}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `path` so that a crash leaves either the old file or the new one, never a torn one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_checkpoint(run_dir: Path, cfg: ScenarioConfig, state: dict[str, Any]) -> None:
    """Atomically replace the run's checkpoint with `state` (a dict with the keys of _STATE_KEYS)."""
    payload = pickle.dumps({"version": VERSION, **state}, protocol=pickle.HIGHEST_PROTOCOL)
    fp = fingerprint(cfg)
    header = {"fingerprint": fp, "sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)}
    atomic_write_bytes(
        run_dir / CHECKPOINT, _MAGIC + f"{VERSION}\n".encode() + json.dumps(header).encode() + b"\n" + payload
    )
    if not (run_dir / CHECKPOINT_ID).exists():
        atomic_write_text(run_dir / CHECKPOINT_ID, fp + "\n")


def has_checkpoint(run_dir: Path) -> bool:
    return (Path(run_dir) / CHECKPOINT).is_file()


def read_checkpoint(path: Path, cfg: ScenarioConfig | None = None) -> dict[str, Any]:
    """The state stored in checkpoint file `path`, verified before it is unpickled: a one-line
    ConfigError for anything that is not an intact checkpoint of version VERSION (and, given `cfg`, of
    that run).  Reads only; touches nothing."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_MAGIC))
            if magic != _MAGIC:
                raise ConfigError(f"{where}: not an rtpo checkpoint (or one written before format {VERSION})")
            version_line = f.readline(16)
            header_line = f.readline(4096)
            payload = f.read()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read the checkpoint ({e.strerror or e})") from None
    try:
        version = int(version_line.decode("ascii").strip())
        header = json.loads(header_line.decode("utf-8"))
        expected_fp, digest, size = str(header["fingerprint"]), str(header["sha256"]), int(header["bytes"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ConfigError(f"{where}: corrupt checkpoint header") from None
    if version != VERSION:
        raise ConfigError(f"{where}: checkpoint format {version} is not {VERSION}")
    if len(payload) != size:
        raise ConfigError(
            f"{where}: truncated or altered checkpoint ({len(payload)} bytes of state, header says {size})"
        )
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ConfigError(f"{where}: corrupt checkpoint (its state does not match the digest in its header)")
    if cfg is not None and expected_fp != fingerprint(cfg):
        raise ConfigError(
            f"{where}: the checkpoint belongs to another run (fingerprint {expected_fp[:12]}, "
            f"this run's config gives {fingerprint(cfg)[:12]})"
        )
    try:
        state = pickle.loads(payload)
    except Exception as e:  # noqa: BLE001 - the digest matched, so this is a bug or a foreign rtpo version
        raise ConfigError(f"{where}: unreadable checkpoint state ({type(e).__name__})") from None
    if not isinstance(state, dict) or any(k not in state for k in _STATE_KEYS) or state["version"] != VERSION:
        raise ConfigError(f"{where}: checkpoint state is incomplete")
    return state


def resume_state(run_dir: Path, cfg: ScenarioConfig) -> dict[str, Any] | None:
    """The latest checkpoint of run `run_dir`, or None when the run never wrote one.  Refuses (one line)
    a checkpoint of another run, a corrupt one, and a checkpoint that was written but is gone."""
    run_dir = Path(run_dir)
    if has_checkpoint(run_dir):
        state = read_checkpoint(run_dir / CHECKPOINT, cfg)
        _check_id(run_dir, cfg)
        return state
    if (run_dir / CHECKPOINT_ID).exists():
        raise ConfigError(
            f"--resume {run_dir}: {CHECKPOINT} is missing but the run wrote one ({CHECKPOINT_ID}); refusing to "
            f"restart from phase 0 over its {METRICS} (move the folder aside to start anew)"
        )
    return None


def _check_id(run_dir: Path, cfg: ScenarioConfig) -> None:
    try:
        recorded = (run_dir / CHECKPOINT_ID).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return  # a crash right after the first checkpoint can leave no id yet; the checkpoint itself matched
    if recorded != fingerprint(cfg):
        raise ConfigError(f"--resume {run_dir}: {CHECKPOINT_ID} names another run ({recorded[:12]})")


def read_metrics(run_dir: Path, limit: int | None = None) -> list[dict]:
    """The complete lines of metrics.jsonl (at most `limit`); a torn last line is ignored."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if limit is not None and len(out) >= limit:
            break
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def truncate_metrics(run_dir: Path, lines: int) -> None:
    """Keep exactly the first `lines` metric lines: the phases the checkpoint covers."""
    kept = read_metrics(run_dir, lines)
    if len(kept) < lines:
        raise ConfigError(f"--resume {run_dir}: {METRICS} has {len(kept)} lines, the checkpoint expects {lines}")
    atomic_write_text(Path(run_dir) / METRICS, "".join(json.dumps(m) + "\n" for m in kept))
