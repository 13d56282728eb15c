"""A Hugging Face model folder from learner weights: what `rtpo export` and `logging.hf_export_every` write.

    OUT/
        config.json, generation_config.json     the run's model folder's (architecture, eos/pad ids)
        model.safetensors                       the policy's weights; a tied lm_head is stored once
        tokenizer.json, tokenizer_config.json   the run's tokenizer (with its chat template)
        rtpo_export.json                        where the weights come from (run, iteration, phase)

The folder loads with `transformers.AutoModelForCausalLM.from_pretrained(OUT)` and with `vllm.LLM(OUT)`
like any model folder.  It appears complete or not at all: everything is written into a sibling
temporary folder that is renamed to OUT at the end.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

MANIFEST = "rtpo_export.json"


def _dtype_of(weights: dict[str, Any]):
    import torch

    for v in weights.values():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.dtype
    return torch.float32


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty folder (export writes a new model folder)")


def write_hf_folder(
    model_dir: str | os.PathLike, weights: dict[str, Any], out: str | os.PathLike, manifest=None
) -> Path:
    """Write `weights` (a full HF-named state dict, e.g. FSDPLearner.weights() or a checkpoint's
    learner model state) as an HF folder `out`, with the config, generation config and tokenizer of
    `model_dir` (the folder the run started from).  Weights the model ties (lm_head = embeddings) may be
    given once or twice; they are saved once.  ValueError (one line) when `out` is not new or the weights
    do not fit the architecture."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from rtpo.llm.model import load_tokenizer

    out = Path(out)
    _check_out(out)
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    dtype = _dtype_of(weights)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    expected = dict(model.state_dict())
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise ValueError(f"the weights do not fit {model_dir}: unknown tensors {extra[:3]}")
    for k, v in weights.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise ValueError(
                f"the weights do not fit {model_dir}: {k} has shape {tuple(v.shape)}, "
                f"the model {tuple(expected[k].shape)}"
            )
    model.load_state_dict({k: v.detach().to("cpu") for k, v in weights.items()}, strict=False, assign=True)
    model.tie_weights()
    missing = [k for k, v in model.state_dict().items() if v.is_meta]
    if missing:
        raise ValueError(f"the weights lack {len(missing)} tensors of {model_dir} (first: {missing[0]})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        try:
            GenerationConfig.from_pretrained(str(model_dir), local_files_only=True).save_pretrained(str(tmp))
        except OSError:
            pass  # a model folder without generation_config.json: transformers and vLLM use the config's ids
        load_tokenizer(model_dir).save_pretrained(str(tmp))
        if manifest is not None:
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        _check_out(out)
        if out.exists():
            out.rmdir()  # empty (checked): os.replace needs the name free for a folder
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
