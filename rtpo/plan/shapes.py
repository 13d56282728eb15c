"""The shape of the scenario's model, without loading it: its config.json when the folder exists, the
tiny-random spec for `tiny-random`, else the Qwen3 size its name states (the published configs)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rtpo.scenario.schema import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Qwen3 layout: GQA attention with q/k norms, SwiGLU MLP)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """q, k, v, o projections, q/k norms, the SwiGLU MLP's three matrices, two RMSNorms."""
        h = self.hidden
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 2 * self.head_dim
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def root_params(self) -> int:
        """Embeddings, the final norm and an untied lm_head (FSDP2's root unit)."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    @property
    def matmul_params(self) -> int:
        """Parameters a token's forward multiplies by (the embedding lookup is not a matmul; lm_head is)."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    @property
    def body_params(self) -> int:
        """Parameters of the decoder layers: what every token of a forward pass multiplies by."""
        return self.layers * self.layer_params

    @property
    def head_params(self) -> int:
        """The lm_head's: paid only at positions whose logits are computed."""
        return self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


def _qwen3(name: str, h: int, layers: int, heads: int, inter: int, tied: bool) -> ModelShape:
    return ModelShape(name, h, layers, heads, 8, 128, inter, 151936, tied)


# The published Qwen3 dense configs (config.json of each Hugging Face release).
KNOWN: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _qwen3("Qwen3-0.6B", 1024, 28, 16, 3072, True),
        _qwen3("Qwen3-1.7B", 2048, 28, 16, 6144, True),
        _qwen3("Qwen3-4B", 2560, 36, 32, 9728, True),
        _qwen3("Qwen3-8B", 4096, 36, 32, 12288, False),
        _qwen3("Qwen3-14B", 5120, 40, 40, 17408, False),
        _qwen3("Qwen3-32B", 5120, 64, 64, 25600, False),
    )
}


def from_hf_config(cfg: dict, name: str) -> ModelShape:
    try:
        heads = int(cfg["num_attention_heads"])
        h = int(cfg["hidden_size"])
        return ModelShape(
            name=name,
            hidden=h,
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or h // heads),
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{name}: config.json lacks a decoder shape field ({e})") from None


def _tiny(tokenizer: str) -> ModelShape:
    from rtpo.llm.model import TinyQwen3Spec

    s = TinyQwen3Spec()
    vocab = 151936 if tokenizer == "qwen3" else 512  # rtpo.llm.model_cache: the two tiny builds
    return ModelShape(
        f"tiny-random ({tokenizer})",
        s.hidden_size,
        s.num_hidden_layers,
        s.num_attention_heads,
        s.num_key_value_heads,
        s.head_dim,
        s.intermediate_size,
        vocab,
        s.tie_word_embeddings,
    )


def resolve(model: str, tiny_tokenizer: str = "qwen3") -> ModelShape:
    """backend.model -> its shape.  A folder with config.json is read; `tiny-random` is the spec
    rtpo.llm.model builds; otherwise a name ending in a Qwen3 size (e.g. /path/to/Qwen3-8B)."""
    if model == "tiny-random":
        return _tiny(tiny_tokenizer)
    path = Path(model)
    if (path / "config.json").is_file():
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"backend.model: {path / 'config.json'} is unreadable ({e})") from None
        if isinstance(cfg.get("text_config"), dict):
            cfg = cfg["text_config"]
        return from_hf_config(cfg, path.name)
    m = re.search(r"qwen3-(\d+(?:\.\d+)?)b", path.name.lower())
    if m:
        key = f"Qwen3-{m.group(1)}B"
        if key in KNOWN:
            return KNOWN[key]
    raise ConfigError(
        f"backend.model: {model!r} has no config.json here and names no known size "
        f"({', '.join(KNOWN)}); the plan needs the model's shape"
    )
