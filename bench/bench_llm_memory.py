"""LLM memory and learner overhead on the tiny-cpu stack, each against a floor measured in the same run;
writes bench/llm_memory.json.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python bench/bench_llm_memory.py [--rounds 5]

Every measurement runs in a fresh Python process, which reports its own peak resident set size
(getrusage ru_maxrss, the high-water mark of the whole process):

1. run:   `rtpo run scenarios/llm/tiny-cpu.yaml` in process (vLLM in process, the FSDP2 learner on one
          gloo rank, the KL reference, 2 iterations, evaluation, checkpoints).
2. floor: what that run cannot do without, and nothing else: the same vLLM engine (same model folder,
          KV cache, block size, max_model_len), the HF model, a KL-reference copy of it and AdamW with
          its two moments, after one real optimiser step (so gradients and moments exist).
3. learner: FSDPLearner.train_step (world size 1) against a plain torch loop over the unsharded HF
          model (one left-padded forward, logits for the response positions only, the same core loss,
          global-norm clipping, AdamW) on one
          batch of tiny-cpu's phase shape (8 rows, contexts of 60-140 tokens, responses of 24),
          interleaved rounds, minimum per side; no vLLM in that process.  The same learner wrapped in
          FSDP2 on its one rank (LearnerConfig.fsdp_one_rank) is timed beside them: what skipping
          FSDP's single-rank all-gather and reduce-scatter copies saves.

run_over_floor is the issue's peak-RSS ratio (target ≤ 1.25), learner_over_plain its step-time ratio
(target ≤ 1.05).  The JSON records the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu.yaml"


def _peak_rss_bytes() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _model_dir():
    from rtpo.llm.build import _model_dir as model_dir
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(SCENARIO)
    return cfg, model_dir(cfg)


def child_run(out: str) -> dict:
    from rtpo.commands.cli import main

    try:
        rc = main(["run", str(SCENARIO), "--out", out])
    except SystemExit as e:  # a failing run must not look like a measurement
        rc = e.code if isinstance(e.code, int) else 1
    if rc:
        raise SystemExit(f"rtpo run exited {rc}")
    return {"rc": rc, "peak_rss_bytes": _peak_rss_bytes()}


def _plain_step(model, ref_model, opt, batch, loss, temperature: float, grad_clip: float | None) -> None:
    """One plain-torch step, written the efficient way: every row left-padded into one forward over the
    unsharded model, logits only for the response positions (logits_to_keep), the core loss, global-norm
    clipping, AdamW."""
    import numpy as np
    import torch

    from rtpo.core.loss import FlatBatch, policy_loss

    rows = [np.concatenate([c, r]) for c, r in zip(batch.contexts, batch.tokens)]
    width = max(x.size for x in rows)
    ids = np.zeros((len(rows), width), np.int64)
    att = np.zeros((len(rows), width), np.int64)
    for i, x in enumerate(rows):
        ids[i, width - x.size :], att[i, width - x.size :] = x, 1
    r_len = batch.tokens.lengths
    r_max = int(r_len.max())
    input_ids, attention = torch.as_tensor(ids), torch.as_tensor(att)
    position = (attention.cumsum(-1) - 1).clamp(min=0)
    target = torch.as_tensor(ids[:, width - r_max :])
    keep = torch.as_tensor(np.arange(r_max)[None, :] >= (r_max - r_len)[:, None])

    def token_logp(m):
        logits = m(input_ids=input_ids, attention_mask=attention, position_ids=position, logits_to_keep=r_max + 1)
        lp = torch.log_softmax(logits.logits[:, :-1].float() / temperature, dim=-1)
        return lp.gather(-1, target[..., None]).squeeze(-1)[keep]

    ref = None
    if ref_model is not None:
        with torch.no_grad():
            ref = token_logp(ref_model)
    value, _ = policy_loss(token_logp(model), FlatBatch.from_batch(batch), loss, ref)
    opt.zero_grad(set_to_none=True)
    value.backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()


def _phase_batch(vocab: int, seed: int = 0):
    import numpy as np

    from rtpo.core.types import Ragged, TurnBatch

    rng = np.random.default_rng(seed)
    ctx = Ragged.from_rows([rng.integers(9, vocab, int(m)) for m in rng.integers(60, 140, 8)], dtype=np.int64)
    rsp = Ragged.from_rows([rng.integers(9, vocab, 24) for _ in range(8)], dtype=np.int64)
    b = len(ctx)
    return TurnBatch(
        contexts=ctx,
        tokens=rsp,
        old_logp=Ragged(np.full(rsp.values.size, -11.0), rsp.offsets),
        advantages=Ragged(np.repeat(rng.normal(size=b), rsp.lengths), rsp.offsets),
        seq_id=np.arange(b),
        weight=np.ones(b),
        turn=np.zeros(b),
    )


def _settings(cfg):
    return cfg.method.config.loss(), cfg.backend, cfg.train


def child_floor() -> dict:
    import torch

    from rtpo.llm.engines import SamplingConfig
    from rtpo.llm.engines.vllm import VLLMEngine
    from rtpo.llm.model import load_hf_model

    torch.set_num_threads(1)
    cfg, model_dir = _model_dir()
    loss, b, train = _settings(cfg)
    engine = VLLMEngine(
        model_dir,
        SamplingConfig(temperature=b.temperature, top_p=b.top_p, max_tokens=b.max_tokens),
        seed=cfg.seed,
        block_size=b.block_size,
        max_model_len=b.max_model_len,
        dtype=b.engine_dtype,
        kv_cache_gb=b.kv_cache_gb,
    )
    model = load_hf_model(model_dir).train()
    ref_model = load_hf_model(model_dir).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=b.weight_decay)
    batch = _phase_batch(int(model.config.vocab_size))
    _plain_step(model, ref_model, opt, batch, loss, b.temperature, b.grad_clip)
    del engine
    return {"peak_rss_bytes": _peak_rss_bytes()}


def child_train_memory(kind: str) -> dict:
    """Peak RSS of the training side alone (no vLLM): the FSDP2 learner ("learner") or the plain model,
    KL reference and AdamW ("plain"), after two optimiser steps and, for the learner, one weight sync."""
    import torch

    torch.set_num_threads(1)
    cfg, model_dir = _model_dir()
    loss, b, train = _settings(cfg)
    if kind == "learner":
        learner = _fsdp_learner(model_dir, loss, b, train)
        batch = _phase_batch(int(learner.vocab_size))
        for _ in range(2):
            learner.train_step(batch, loss)
        learner.weights()
    else:
        from rtpo.llm.model import load_hf_model

        model = load_hf_model(model_dir).train()
        ref_model = load_hf_model(model_dir).requires_grad_(False) if loss.kl_coef > 0 else None
        opt = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=b.weight_decay)
        batch = _phase_batch(int(model.config.vocab_size))
        for _ in range(2):
            _plain_step(model, ref_model, opt, batch, loss, b.temperature, b.grad_clip)
    return {"peak_rss_bytes": _peak_rss_bytes()}


def _fsdp_learner(model_dir, loss, b, train, fsdp_one_rank: bool = False):
    from rtpo.llm.learner import FSDPLearner, LearnerConfig

    lcfg = LearnerConfig(
        lr=train.lr,
        weight_decay=b.weight_decay,
        grad_clip=b.grad_clip,
        temperature=b.temperature,
        micro_batch_tokens=b.micro_batch_tokens,
        kl_reference=loss.kl_coef > 0,
        param_dtype=b.param_dtype,
        mixed_precision=b.mixed_precision,
        gradient_checkpointing=b.gradient_checkpointing,
        fsdp_one_rank=fsdp_one_rank,
    )
    return FSDPLearner(model_dir, lcfg)


def child_learner(rounds: int) -> dict:
    import torch

    from rtpo.llm.model import load_hf_model

    torch.set_num_threads(1)
    cfg, model_dir = _model_dir()
    loss, b, train = _settings(cfg)
    learner = _fsdp_learner(model_dir, loss, b, train)
    fsdp = _fsdp_learner(model_dir, loss, b, train, fsdp_one_rank=True)  # what one rank saves by skipping FSDP
    model = load_hf_model(model_dir).train()
    ref_model = load_hf_model(model_dir).requires_grad_(False) if loss.kl_coef > 0 else None
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=b.weight_decay)
    batch = _phase_batch(int(model.config.vocab_size))
    jobs = {
        "learner": lambda: learner.train_step(batch, loss),
        "fsdp_one_rank": lambda: fsdp.train_step(batch, loss),
        "plain": lambda: _plain_step(model, ref_model, opt, batch, loss, b.temperature, b.grad_clip),
    }
    for job in jobs.values():  # warm-up
        job()
    best = dict.fromkeys(jobs, float("inf"))
    for r in range(rounds):
        for name in list(jobs) if r % 2 == 0 else list(jobs)[::-1]:
            t0 = time.perf_counter()
            jobs[name]()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {
        "learner_step_s": best["learner"],
        "plain_step_s": best["plain"],
        "fsdp_one_rank_step_s": best["fsdp_one_rank"],
        "fsdp_one_rank_over_plain": best["fsdp_one_rank"] / best["plain"],
    }


def _spawn(kind: str, *args: str) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"bench_llm_memory: the {kind} measurement failed (exit {proc.returncode})")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "llm_memory.json")
    ap.add_argument("--child", choices=["run", "floor", "learner", "train_memory"], help=argparse.SUPPRESS)
    ap.add_argument("--child-arg", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.child == "run":
            res = child_run(args.child_arg)
        elif args.child == "floor":
            res = child_floor()
        elif args.child == "train_memory":
            res = child_train_memory(args.child_arg)
        else:
            res = child_learner(args.rounds)
        print(json.dumps(res), flush=True)
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        run = _spawn("run", "--child-arg", tmp)
    floor = _spawn("floor")
    learner = _spawn("learner", "--rounds", str(args.rounds))
    train_mem = {kind: _spawn("train_memory", "--child-arg", kind)["peak_rss_bytes"] for kind in ("learner", "plain")}
    out = {
        "command": "VLLM_ENABLE_V1_MULTIPROCESSING=0 python bench/bench_llm_memory.py",
        "scenario": str(SCENARIO.relative_to(ROOT)),
        "rounds": args.rounds,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "memory": {
            "run_peak_rss_bytes": run["peak_rss_bytes"],
            "floor_peak_rss_bytes": floor["peak_rss_bytes"],
            "run_over_floor": run["peak_rss_bytes"] / floor["peak_rss_bytes"],
            # the training side alone (no vLLM): the FSDP2 learner against the plain model + reference + AdamW
            "learner_peak_rss_bytes": train_mem["learner"],
            "plain_train_peak_rss_bytes": train_mem["plain"],
            "learner_over_plain": train_mem["learner"] / train_mem["plain"],
        },
        "learner": {**learner, "learner_over_plain": learner["learner_step_s"] / learner["plain_step_s"]},
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
