"""LoRA adapters on the learner's causal LM, through the `peft` library (the `lora` extra).

Owns: LoRASpec (the learner's adapter settings), `attach` (peft's LoRA layers injected into a loaded HF
model, base weights frozen), `merge_weights` (an adapted state dict as the plain HF state dict a vLLM or
transformers model loads), `check_targets` (the configured target modules against the model's linear
layers, before anything is built) and the adapter-key test `is_adapter_key`.
May import: torch, peft, transformers, safetensors; nothing else of rtpo.

A LoRA layer computes h = W₀x + (α/r)·B·A·x (Hu et al. 2021, Eq. 3, with peft's scaling α/r), A (r×k)
random and B (d×r) zero at the start, so the adapted model starts as the base model exactly.  Only A and
B train; the base W₀ stays the weights loaded from the model folder, which is why checkpoints hold the
adapters alone and the KL reference is the same model with its adapters switched off.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

ADAPTER = "default"  # peft's adapter name
_LORA_KEY = re.compile(r"\.lora_(A|B)\." + ADAPTER + r"\.weight$")


@dataclass(frozen=True)
class LoRASpec:
    """Adapters of the FSDP learner (LearnerConfig.lora).

    rank:           r, the inner dimension of B·A.
    alpha:          α; the update is scaled by α/r.
    dropout:        dropout on the adapters' input in training passes (0 = none: learner passes are then
                    deterministic, as the ratio pass against the engine's log-probs assumes).
    target_modules: the linear layers that get an adapter, by their last name (q_proj, v_proj, ...).
    init_seed:      seed of the adapters' random A (the run's seed): every rank of an FSDP group and every
                    Ray trainer actor draws the same initial adapters, whatever its RNG did before.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    init_seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if self.rank < 1:
            raise ValueError(f"lora rank must be >= 1, got {self.rank}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("lora target_modules must name at least one module")

    @property
    def scaling(self) -> float:
        """α/r, the factor of B·A (peft's LoraLayer.scaling without rsLoRA)."""
        return float(self.alpha) / float(self.rank)


def is_adapter_key(name: str) -> bool:
    """Whether a state-dict key is a LoRA A or B matrix (what adapters-only checkpoints hold)."""
    return _LORA_KEY.search(name) is not None


def linear_names(model: Any) -> set[str]:
    """The last names of the model's torch.nn.Linear layers (what target_modules may name)."""
    import torch

    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name}


def check_targets(model_dir: str | os.PathLike, spec: LoRASpec) -> None:
    """Refuse target modules the model does not have, in one line naming backend.lora.target_modules,
    from the model's config alone (the model is built on the meta device: no weights are read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    have = linear_names(model)
    unknown = sorted(set(spec.target_modules) - have)
    if unknown:
        raise ValueError(
            f"backend.lora.target_modules: {unknown} are not linear layers of this model (it has {sorted(have)})"
        )


def attach(model: Any, spec: LoRASpec) -> Any:
    """Inject peft LoRA layers into HF model `model` in place, freeze everything but the adapters, and
    return the PeftModel around it (its `disable_adapter()` gives the base model).  `model` keeps its
    class, its module tree (each target wrapped as `<name>.base_layer` beside `lora_A`/`lora_B`) and
    its forward, so FSDP2 shards it exactly as it shards the plain model.

    A is drawn from the CPU generator seeded with spec.init_seed alone (the caller's RNG state is restored
    afterwards): each FSDP2 rank shards its own unsharded copy of the adapters, so ranks whose global RNG
    had drawn differently before would otherwise start from different shards of different adapters."""
    import torch
    from peft import LoraConfig, get_peft_model

    unknown = sorted(set(spec.target_modules) - linear_names(model))
    if unknown:
        raise ValueError(f"backend.lora.target_modules: {unknown} are not linear layers of this model")
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        bias="none",
        init_lora_weights=True,  # A Kaiming-uniform, B = 0: the adapted model starts as the base model
    )
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("attach LoRA adapters to a model on the CPU (their seeded initialisation draws there)")
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(spec.init_seed)
        # the adapters in the base weights' dtype (peft would cast them to float32): one dtype per FSDP2 unit
        return get_peft_model(model, config, adapter_name=ADAPTER, autocast_adapter_dtype=False)


def merge_weights(state: dict[str, Any], scaling: float) -> dict[str, Any]:
    """The plain HF state dict of an adapted model: W = W₀ + (α/r)·B·A for each adapted layer (Eq. 3).

    `state` holds base weights under either name (`x.base_layer.weight`, as the adapted model names
    them, or `x.weight`, as the model folder does) and the adapters as `x.lora_A.default.weight` /
    `x.lora_B.default.weight`.  The result has only the model folder's names; the input is not changed."""
    import torch

    out: dict[str, Any] = {}
    lora: dict[str, dict[str, Any]] = {}
    for key, value in state.items():
        m = _LORA_KEY.search(key)
        if m:
            lora.setdefault(key[: m.start()], {})[m.group(1)] = value
        else:
            out[key.replace(".base_layer.", ".")] = value
    for prefix, ab in lora.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"adapter {prefix} has lora_{''.join(sorted(ab))} only")
        key = prefix + ".weight"
        if key not in out:
            raise ValueError(f"adapter {prefix} has no base weight {key}")
        base = out[key]
        delta = (ab["B"].to(torch.float32) @ ab["A"].to(torch.float32)) * scaling
        out[key] = (base.to(torch.float32) + delta).to(base.dtype)
    return out


def base_weights(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The model folder's weights (its safetensors files), for merging adapters read from a checkpoint."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no safetensors weights to merge the adapters into")
    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


__all__ = ["LoRASpec", "attach", "base_weights", "check_targets", "is_adapter_key", "linear_names", "merge_weights"]
