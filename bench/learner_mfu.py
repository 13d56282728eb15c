"""The learner's train step against a plain torch loop on the same batch: achieved FLOP/s and their ratio.

    python bench/learner_mfu.py                       # CPU proxy -> bench/learner_mfu.json
    (bench/gpu_check.py calls `measure` on CUDA with the 0.6B Qwen3 shape, bf16, SDPA)

Both sides run the same model folder (random weights, attention through torch SDPA), the same rows
(equal-length context + response, so no padding), the same micro-batches and the same update: a
forward pass keeping the logits of the response positions, log softmax(logits / T) of the response
tokens, the clipped PPO surrogate, backward, gradient clipping, AdamW.  The learner is
rtpo.llm.learner.FSDPLearner.train_step (on CUDA: FSDP2 with MixedPrecisionPolicy(bf16) over NCCL,
world size 1); the plain loop is the model itself, under torch.autocast(bf16) on CUDA (fp32 master
weights, like FSDP's policy) and in fp32 on the CPU.  `ratio` = learner seconds / plain seconds per
step (medians): the learner's overhead, 1.0 = none.

FLOPs per step (`step_flops`, the model FLOPs of the useful tokens, 3 × forward):
  forward = 2 · N_body · T  +  2 · d · V · R  +  2 · L · H · d_h · Σ_rows s²   (causal: half of 4·s²)
with N_body the parameters less the embedding, T all tokens, R the response tokens plus one per row
(the positions whose logits are kept), s a row's length.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def synthetic_batch(vocab: int, rows: int, ctx_len: int, rsp_len: int, seed: int = 0):
    """A TurnBatch of `rows` equal-length rows (random ids, log-probs near log(1/V), advantages ±1)."""
    from rtpo.core.types import Ragged, TurnBatch

    rng = np.random.default_rng(seed)
    ctx = rng.integers(0, vocab, size=(rows, ctx_len), dtype=np.int64)
    rsp = rng.integers(0, vocab, size=(rows, rsp_len), dtype=np.int64)
    off_c = np.arange(rows + 1, dtype=np.int64) * ctx_len
    off_r = np.arange(rows + 1, dtype=np.int64) * rsp_len
    old = -np.log(vocab) + 0.01 * rng.standard_normal(rows * rsp_len)
    adv = np.repeat(np.where(np.arange(rows) % 2 == 0, 1.0, -1.0), rsp_len)
    return TurnBatch(
        contexts=Ragged(ctx.reshape(-1), off_c),
        tokens=Ragged(rsp.reshape(-1), off_r),
        old_logp=Ragged(old, off_r),
        advantages=Ragged(adv, off_r),
        seq_id=np.arange(rows, dtype=np.int64),
        weight=np.ones(rows),
        turn=np.zeros(rows, dtype=np.int64),
    )


def step_flops(config, rows: int, ctx_len: int, rsp_len: int, n_params: int) -> float:
    """Model FLOPs of one training step on `rows` rows (the module docstring's formula)."""
    d, v, layers = int(config.hidden_size), int(config.vocab_size), int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or d // heads)
    body = n_params - d * v  # the (tied) embedding is a lookup; the lm_head matmul is counted on its own
    s = ctx_len + rsp_len
    fwd = 2.0 * body * rows * s + 2.0 * d * v * rows * (rsp_len + 1) + 2.0 * layers * heads * head_dim * rows * s * s
    return 3.0 * fwd


def _plain_loop(
    model_dir: Path,
    batch,
    device,
    mixed_precision: str | None,
    micro_rows: int,
    temperature: float,
    compile_layers: bool = False,
):
    """A closure running one plain-torch update of `batch` (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True, attn_implementation="sdpa"
    ).to(device)
    model.train()
    if compile_layers:
        for layer in model.model.layers:
            layer.compile()
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01, fused=fused)
    rows = len(batch)
    ctx_len = int(batch.contexts.lengths[0])
    rsp_len = int(batch.tokens.lengths[0])
    ids = torch.as_tensor(
        np.concatenate([batch.contexts.values.reshape(rows, ctx_len), batch.tokens.values.reshape(rows, rsp_len)], 1),
        device=device,
    )
    old = torch.tensor(batch.old_logp.values.reshape(rows, rsp_len), dtype=torch.float32).to(device)
    adv = torch.tensor(batch.advantages.values.reshape(rows, rsp_len), dtype=torch.float32).to(device)
    amp = mixed_precision is not None and device.type == "cuda"
    dtype = getattr(torch, mixed_precision) if amp else torch.float32

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for lo in range(0, rows, micro_rows):
            sl = slice(lo, min(rows, lo + micro_rows))
            with torch.autocast(device.type, dtype=dtype, enabled=amp):
                logits = model(input_ids=ids[sl], logits_to_keep=rsp_len + 1, use_cache=False).logits[:, :-1]
            logp = torch.log_softmax(logits.float() / temperature, -1)
            lp = logp.gather(-1, ids[sl, ctx_len:, None]).squeeze(-1)
            ratio = torch.exp(lp - old[sl])
            surr = torch.minimum(ratio * adv[sl], ratio.clamp(0.8, 1.2) * adv[sl])
            loss = -surr.mean(-1).sum() / rows
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return model, step


def _time(step, sync, warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        step()
    sync()
    out = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def measure(
    model_dir: Path,
    rows: int,
    ctx_len: int,
    rsp_len: int,
    device: str = "cpu",
    mixed_precision: str | None = None,
    micro_batch_tokens: int = 16384,
    warmup: int = 1,
    steps: int = 3,
    peak_tflops: float | None = None,
    compile_layers: bool = False,
) -> dict:
    """Time FSDPLearner.train_step and the plain loop on one synthetic batch; see the module docstring."""
    import torch

    from rtpo.core.loss import LossConfig
    from rtpo.llm.learner import FSDPLearner, LearnerConfig

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    temperature = 1.0
    lcfg = LearnerConfig(
        lr=1e-6,
        temperature=temperature,
        micro_batch_tokens=micro_batch_tokens,
        mixed_precision=mixed_precision if dev.type == "cuda" else None,
        reuse_ratio_forward=False,
        compile_layers=compile_layers,
    )
    learner = FSDPLearner(model_dir, lcfg, backend="nccl" if dev.type == "cuda" else "gloo")
    n_params = sum(p.numel() for p in learner.model.parameters())
    config = learner.model.config
    batch = synthetic_batch(int(config.vocab_size), rows, ctx_len, rsp_len)
    loss = LossConfig(clip_eps=0.2)
    micro_rows = max(1, micro_batch_tokens // (ctx_len + rsp_len))
    model, plain = _plain_loop(model_dir, batch, dev, mixed_precision, micro_rows, temperature, compile_layers)
    # interleaved (learner, plain, learner, ...): a load swing on a shared machine hits both alike
    learner_s, plain_s = [], []

    def learn() -> None:
        learner.train_step(batch, loss)

    for i in range(warmup + steps):
        a = _time(learn, sync, 0, 1)
        b = _time(plain, sync, 0, 1)
        if i >= warmup:
            learner_s += a
            plain_s += b
    backend, shards = learner.backend, learner.world_size
    fsdp = hasattr(learner.model, "set_requires_gradient_sync")
    peak_mem = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    flops = step_flops(config, rows, ctx_len, rsp_len, n_params)
    lt, pt = statistics.median(learner_s), statistics.median(plain_s)
    out = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or "cpu"),
        "parameters": n_params,
        "rows": rows,
        "context_tokens": ctx_len,
        "response_tokens": rsp_len,
        "tokens_per_step": rows * (ctx_len + rsp_len),
        "micro_batch_tokens": micro_batch_tokens,
        "learner": {
            "backend": backend,
            "fsdp": fsdp,
            "world_size": shards,
            "mixed_precision": lcfg.mixed_precision,
            "attn_implementation": lcfg.attn_implementation,
            "compile_layers": compile_layers,
        },
        "step_flops": flops,
        "peak_memory_bytes": peak_mem,
        "learner_step_s": learner_s,
        "plain_step_s": plain_s,
        "learner_tflops": flops / lt / 1e12,
        "plain_tflops": flops / pt / 1e12,
        "ratio": lt / pt,
        # the same overhead from the interleaved pairs: a load swing hits a pair's two steps alike, so the
        # per-pair ratio is the robust figure on a shared machine (median and a bootstrap 95% interval)
        **paired_ratio(learner_s, plain_s),
        "peak_tflops": peak_tflops,
        "learner_mfu": flops / lt / (peak_tflops * 1e12) if peak_tflops else None,
        "plain_mfu": flops / pt / (peak_tflops * 1e12) if peak_tflops else None,
    }
    return out


def paired_ratio(learner_s: list[float], plain_s: list[float], draws: int = 4000, seed: int = 0) -> dict:
    """Median of learner/plain over interleaved pairs, with a percentile-bootstrap 95% interval."""
    r = np.asarray(learner_s) / np.asarray(plain_s)
    rng = np.random.default_rng(seed)
    boot = np.median(r[rng.integers(0, len(r), size=(draws, len(r)))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"paired_ratio_median": float(np.median(r)), "paired_ratio_ci95": [float(lo), float(hi)], "pairs": len(r)}


def _kind(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "sm90_xmma", "addmm", "aten::mm", "aten::bmm", "matmul")):
        return "matmul"
    if any(k in n for k in ("flash", "fmha", "attention", "efficient")):
        return "attention"
    if any(k in n for k in ("nccl", "all_gather", "reduce_scatter")):
        return "communication"
    if any(k in n for k in ("memcpy", "memset", "copy_")):
        return "copies"
    return "elementwise/reductions"


def profile_step(fn, sync, device_type: str, top: int = 12) -> dict:
    """torch.profiler over one call of `fn` (warm): kernel time by kind and the top kernels, and the
    share of the wall time the device was busy (kernels' summed time / wall; on CPU, aten ops')."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device_type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - t0
    rows = []
    for e in prof.key_averages():
        if cuda and e.device_type != DeviceType.CUDA:
            continue
        if not cuda and not e.key.startswith("aten::"):
            continue
        t = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6
        if t > 0:
            rows.append((e.key, int(e.count), t))
    busy = sum(t for _, _, t in rows)
    kinds: dict[str, float] = {}
    for name, _, t in rows:
        kinds[_kind(name)] = kinds.get(_kind(name), 0.0) + t
    rows.sort(key=lambda r: -r[2])
    return {
        "wall_s": wall,
        "busy_s": busy,
        "busy_share": busy / wall if wall else None,
        "by_kind_s": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "top": [{"name": n[:120], "calls": c, "s": t, "share_of_busy": t / busy} for n, c, t in rows[:top]],
    }


def profile_learner(model_dir: Path, rows: int, ctx_len: int, rsp_len: int, device: str, mixed_precision):
    """One warm FSDPLearner.train_step under the profiler (`profile_step`), the batch of `measure`."""
    import torch

    from rtpo.core.loss import LossConfig
    from rtpo.llm.learner import FSDPLearner, LearnerConfig

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    lcfg = LearnerConfig(
        lr=1e-6, mixed_precision=mixed_precision if dev.type == "cuda" else None, reuse_ratio_forward=False
    )
    learner = FSDPLearner(model_dir, lcfg, backend="nccl" if dev.type == "cuda" else "gloo")
    batch = synthetic_batch(int(learner.model.config.vocab_size), rows, ctx_len, rsp_len)
    loss = LossConfig(clip_eps=0.2)
    learner.train_step(batch, loss)
    return profile_step(lambda: learner.train_step(batch, loss), sync, dev.type)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "learner_mfu.json")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=96)
    ap.add_argument("--response", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    import torch

    from rtpo.llm.model import TinyQwen3Spec, build_tiny_qwen3

    load_start = os.getloadavg()
    torch.manual_seed(0)
    spec = TinyQwen3Spec(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_qwen3(Path(tmp) / "model", spec=spec)
        got = measure(model_dir, args.rows, args.context, args.response, steps=args.steps)
    out = {
        "command": "python bench/learner_mfu.py",
        "what": "FSDPLearner.train_step vs a plain torch loop on the same batch (CPU proxy, fp32, SDPA)",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loadavg_start": load_start,
        "loadavg": os.getloadavg(),
        **got,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    keys = ("ratio", "paired_ratio_median", "paired_ratio_ci95", "learner_tflops", "plain_tflops", "tokens_per_step")
    print(json.dumps({k: out[k] for k in keys}))
    return out


if __name__ == "__main__":
    main()
