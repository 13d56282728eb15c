"""Where an llm run's model folder comes from: a local HF folder (checked), or 'tiny-random', a random
tiny Qwen3 built once per (seed, tokenizer, init scale) into a cache folder and reused (no download).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rtpo.scenario.schema import ConfigError


def tiny_random_model(cache: str | os.PathLike, seed: int, tokenizer: str = "qwen3", init_std: float = 0.02) -> Path:
    """A random tiny Qwen3, built once per (seed, tokenizer, init) and reused: with the real Qwen3 vocab
    (151,936 rows), or with tokenizer="bpe512" the offline 512-token BPE (rtpo.llm.model.train_tiny_tokenizer)."""
    from rtpo.llm.chat import load_qwen3_tokenizer
    from rtpo.llm.model import TinyQwen3Spec, build_tiny_qwen3, train_tiny_tokenizer

    if tokenizer not in ("qwen3", "bpe512", "bpe512-chat"):
        raise ValueError(f"tiny_random_model: tokenizer must be qwen3, bpe512 or bpe512-chat, got {tokenizer!r}")
    name = f"tiny-qwen3-seed{seed}"
    if tokenizer != "qwen3":
        name = f"tiny-{tokenizer}-seed{seed}"
    if init_std != 0.02:
        name += f"-std{init_std:g}"
    out = Path(cache) / name
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    if tokenizer == "qwen3":
        build_tiny_qwen3(
            tmp, tokenizer=load_qwen3_tokenizer(), spec=TinyQwen3Spec(vocab_size=151936), seed=seed, init_std=init_std
        )
    else:
        corpus = "chat" if tokenizer == "bpe512-chat" else "arithmetic"
        build_tiny_qwen3(
            tmp, tokenizer=train_tiny_tokenizer(512, corpus), spec=TinyQwen3Spec(), seed=seed, init_std=init_std
        )
    return publish_model_dir(tmp, out)


def publish_model_dir(tmp: Path, out: Path) -> Path:
    """Move the finished model folder `tmp` to `out` atomically (`out` appears complete or not at all, so a
    reader never sees half a model); if another process (a run, or a Ray worker of this run) published the
    same folder meanwhile, keep its copy and drop `tmp`.  Returns `out`."""
    try:
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_model_dir(path: str) -> Path:
    """`path` as a local HF model folder; a folder without config.json is a one-line ConfigError."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ConfigError(f"backend.model: {path} is not a local HF model folder (no config.json)")
    return p
