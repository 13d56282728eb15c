"""`backend.init`: the weights an llm run starts from, when they are not `backend.model`'s own: the run
folder of an earlier run (an SFT warm start, rtpo.core.methods.sft) or a Hugging Face folder `rtpo export`
or `logging.hf_export_every` wrote.

A run folder's latest checkpoint is exported once (as `rtpo export` does) into
`backend.model_cache/init-<digest>/`, the digest covering the run folder and its checkpoint, so a later
checkpoint of the same run gives a new folder and a repeated start reuses the old one.  The folder found
becomes the run's model folder for the engine, the learner and the KL reference alike (the reference is
the warm start, not the random model).  Its architecture and tokenizer must be `backend.model`'s.

`content_digest` of the folder a run starts from is recorded in the run's provenance
(BuiltBackend.inputs), and `rtpo run --resume` refuses a run whose init changed since it started (a
run folder that trained on, an HF folder overwritten): the resumed run would not be the one begun.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from rtpo.llm.model_cache import publish_model_dir
from rtpo.scenario.schema import ConfigError

# the config.json keys that make two models the same architecture and vocabulary
_SAME = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")


def _config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"backend.init: {folder}/config.json cannot be read ({e})") from None


def _check_same(init: Path, base: Path) -> None:
    a, b = _config(init), _config(base)
    for key in _SAME:
        if a.get(key) != b.get(key):
            raise ConfigError(
                f"backend.init: {init} has {key}={a.get(key)!r} but backend.model has {b.get(key)!r} "
                "(the warm start must be the same architecture and tokenizer)"
            )
    tok = [p for p in ("tokenizer.json",) if (base / p).is_file()]
    for name in tok:
        if not (init / name).is_file() or (init / name).read_bytes() != (base / name).read_bytes():
            raise ConfigError(f"backend.init: {init}/{name} is not backend.model's tokenizer")


def _export(run: Path, latest: Path, base: Path, out: Path) -> None:
    """The run's checkpoint `latest`, verified as a resume verifies it, as an HF folder `out` with base's
    config and tokenizer (what `rtpo export` writes)."""
    from rtpo.llm.hf_folder import write_hf_folder
    from rtpo.rundir import checkpoint

    state = checkpoint.read_checkpoint(latest)
    weights = checkpoint.model_weights(latest, state)
    manifest = {"run": str(run.resolve()), "checkpoint": str(latest.parent.relative_to(run)), "init": True}
    try:
        write_hf_folder(base, weights, out, manifest)
    except ValueError as e:
        raise ConfigError(f"backend.init: {latest}: {' '.join(str(e).split())}") from None


def resolve_init(init: str, base: Path, cache: Path) -> Path:
    """The model folder a run with `backend.init: init` starts from (see the module docstring)."""
    from rtpo.rundir import checkpoint

    p = Path(init)
    if (p / "config.json").is_file():
        _check_same(p, base)
        return p
    if not (p / checkpoint.CONFIG).is_file():
        raise ConfigError(f"backend.init: {init} is neither a run folder ({checkpoint.CONFIG}) nor an HF model folder")
    latest = checkpoint.latest_path(p)
    if latest is None or not latest.is_file():
        raise ConfigError(f"backend.init: {init} has no checkpoint to start from")
    digest = hashlib.sha256(str(p.resolve()).encode() + b"\0" + latest.read_bytes()).hexdigest()[:16]
    out = cache / f"init-{digest}"
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        _export(p, latest, base, tmp)
        publish_model_dir(tmp, out)
    _check_same(out, base)
    return out


def content_digest(folder: Path) -> str:
    """sha256 of a model folder's files (names and bytes, in name order), its rtpo_export.json manifest
    left out: that names where the weights came from, not what they are."""
    from rtpo.llm.hf_folder import MANIFEST

    h = hashlib.sha256()
    for f in sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name != MANIFEST):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()
