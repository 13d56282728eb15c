"""`rtpo plan` against what can be measured: the tiny CPU runs here and the paper's figures; writes
bench/plan.json (docs/plan.md's validation table reads it).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH=$PWD python bench/bench_plan.py [--skip-runs]

1. cpu: this machine's fp32 matmul FLOP/s (torch, 2 threads) and copy bandwidth are measured first, and
   the share of that peak a plain torch training loop reaches on tiny-cpu's own model (bench/learner_mfu.py's
   plain loop: forward keeping the response logits, log-softmax, clipped surrogate, backward, AdamW; one
   micro-batch of backend.micro_batch_tokens in rows of the GRPO plan's mean row length, FLOPs by that
   bench's formula) becomes the entry's train_efficiency -- on a GPU that share is the assumed MFU, here it
   is measured, and it is not rtpo's learner.  The plan then uses the table's `cpu` entry with those three
   figures (its overheads stay the table's).  Each
   run (`rtpo run scenarios/llm/tiny-cpu.yaml`, RTPO and GRPO with G = 7, the same rollouts per query)
   goes in a fresh process that reports its peak RSS; a second process that only imports what a run
   imports (torch, transformers, vLLM, rtpo's llm backend) gives the runtime's own RSS, which the plan
   does not model.  Compared per iteration: generated and trained tokens (exact: a random model's
   responses always hit max_tokens and every trunk uses all K turns), the time of an iteration without
   its evaluation, and peak RSS above the import baseline against the plan's host total.
2. paper: Table 15 (Qwen3-1.7B, 4 A100s, airline: RTPO uses 1.400x GRPO's training-generation tokens and
   1.413x its wall time).  The episode-shape assumption `reach` is set so that the plan's RTPO/GRPO token
   ratio on scenarios/llm/qwen3-1.7b-airline.yaml (GRPO with E.3's 16 chains) is the paper's 1.400; the
   plan's wall-time ratio at that reach is then a prediction of the 1.413 (prompt 4,200 tokens as the
   scenario file states, responses at max_tokens; the JSON also gives the ratio if responses fill 0.5,
   0.25 or 0.1 of max_tokens, reach refitted each time).  And the 8 x 80 GB Qwen3-8B
   setting (E.1): the plan of scenarios/llm/qwen3-8b-8gpu.yaml on A100-80GB must fit, on A100-40GB not.

The machine is shared: the JSON records the load average before and after; CPU times measured under
load are slower than the plan, whose figures are for an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TINY = ROOT / "scenarios" / "llm" / "tiny-cpu.yaml"
AIRLINE = ROOT / "scenarios" / "llm" / "qwen3-1.7b-airline.yaml"
QWEN8 = ROOT / "scenarios" / "llm" / "qwen3-8b-8gpu.yaml"
RUNS = {"rtpo": [], "grpo": ["method.name=grpo", "method.G=7"]}  # 7 = 1 + (G - 1) K rollouts per query
PAPER_TOKENS, PAPER_WALL = 1.400, 1.413  # Table 15 / G.4: training-generation tokens and wall time
AIRLINE_PROMPT = 4200  # policy.md + 14 tool schemas (qwen3-1.7b-airline.yaml's context note)


def _peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def child_baseline() -> dict:
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import vllm  # noqa: F401

    import rtpo.llm.build  # noqa: F401
    import rtpo.llm.engines.vllm  # noqa: F401
    import rtpo.llm.learner  # noqa: F401

    return {"peak_rss_bytes": _peak_rss()}


def child_run(out: str, overrides: list[str]) -> dict:
    from rtpo.commands.cli import main

    rc = main(["run", str(TINY), *overrides, "--out", out, "--no-progress"])
    if rc:
        raise SystemExit(f"rtpo run exited {rc}")
    return {"peak_rss_bytes": _peak_rss()}


def _child(kind: str, *args: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, __file__, "--child", kind, "--result", f.name, *args]
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        return json.loads(Path(f.name).read_text())


def calibrate() -> dict:
    """fp32 matmul FLOP/s at 2 torch threads, and a large copy's bandwidth (read + write); then the plain
    training loop's FLOP/s on tiny-cpu's model (train_probe)."""
    import numpy as np
    import torch

    torch.set_num_threads(2)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(10):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    flops = 2 * 1024**3 / best
    src = np.ones(2**25, np.float64)  # 256 MB
    dst = np.empty_like(src)
    bw = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        bw = min(bw, time.perf_counter() - t)
    out = {"fp32_flops": flops, "copy_bytes_per_s": 2 * src.nbytes / bw}
    probe = train_probe()
    return out | {"train_probe": probe, "train_efficiency": probe["flops_per_s"] / flops}


def train_probe(steps: int = 5) -> dict:
    """FLOP/s of a plain torch training step (bench/learner_mfu.py's plain loop, not rtpo's learner) on
    tiny-cpu's model: one micro-batch of backend.micro_batch_tokens in rows as long as the GRPO run's mean
    learner row in the plan, with max_tokens response tokens each; the fastest of `steps` after a warm-up."""
    import torch

    sys.path.insert(0, str(HERE))
    import learner_mfu

    from rtpo.llm.model_cache import tiny_random_model
    from rtpo.plan import plan
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(TINY, RUNS["grpo"])
    trained = [p for p in plan(cfg, "cpu").phases if p.trained_rows > 0]
    row = round(sum(p.learner_tokens for p in trained) / sum(p.trained_rows for p in trained))
    rsp = cfg.backend.max_tokens
    rows = max(1, cfg.backend.micro_batch_tokens // row)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_random_model(tmp, cfg.seed, cfg.backend.tiny_tokenizer)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        batch = learner_mfu.synthetic_batch(vocab, rows, row - rsp, rsp)
        model, step = learner_mfu._plain_loop(model_dir, batch, torch.device("cpu"), None, rows, 1.0)
        times = learner_mfu._time(step, lambda: None, 1, steps)
        n_params = sum(p.numel() for p in model.parameters())
        flops = learner_mfu.step_flops(model.config, rows, row - rsp, rsp, n_params)
    return {
        "rows": rows,
        "row_tokens": row,
        "response_tokens": rsp,
        "step_flops": flops,
        "step_s": times,
        "flops_per_s": flops / min(times),
    }


def _iterations(run_dir: Path) -> list[dict]:
    """Per iteration: generated tokens, rollouts, seconds without evaluation (from metrics.jsonl)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    out, prev_tok, prev_roll, prev_t = [], 0, 0, 0.0
    for i in sorted({r["iteration"] for r in rows}):
        last = [r for r in rows if r["iteration"] == i][-1]
        evals = sum(r.get("time/eval_s", 0.0) for r in rows if r["iteration"] == i)
        mine = [r for r in rows if r["iteration"] == i]
        out.append(
            {
                "generated_tokens": last["budget/tokens"] - prev_tok,
                "rollouts": last["budget/rollouts"] - prev_roll,
                "time_s": last["time/elapsed_s"] - prev_t - evals,
                # the parts as the phase lines report them (generation timed by the sampler, training
                # and the ratio pass by the learner)
                "generate_s": sum(r.get("time/generate_s", 0.0) for r in mine),
                "train_s": sum(r.get("time/train_s", 0.0) + r.get("time/logprobs_s", 0.0) for r in mine),
            }
        )
        prev_tok, prev_roll, prev_t = last["budget/tokens"], last["budget/rollouts"], last["time/elapsed_s"]
    return out


def cpu_runs(hw) -> dict:
    from rtpo.plan import plan
    from rtpo.scenario.load import load_scenario

    base = _child("baseline")["peak_rss_bytes"]
    out: dict = {"import_baseline_rss_bytes": base}
    for name, overrides in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            res = _child("run", tmp, *overrides)
            run_dir = next(Path(tmp).iterdir())
            its = _iterations(run_dir)
        p = plan(load_scenario(TINY, overrides), hw)
        it = p.iteration()
        measured_s = min(x["time_s"] for x in its[1:] or its)  # the first iteration also warms up
        out[name] = {
            "overrides": overrides,
            "measured": {"iterations": its, "peak_rss_bytes": res["peak_rss_bytes"]},
            "predicted": {
                "generated_tokens": it["generated_tokens"],
                "rollouts": it["rollouts"],
                "time_s": it["time_s"],
                "generate_s": it["generate_s"] + it["prefill_s"],
                "train_s": it["train_s"],
                "host_bytes": p.devices[0].total,
            },
            "tokens_exact": all(x["generated_tokens"] == it["generated_tokens"] for x in its),
            "rollouts_exact": all(x["rollouts"] == it["rollouts"] for x in its),
            "time_measured_over_predicted": measured_s / it["time_s"],
            "memory_measured_over_predicted": (res["peak_rss_bytes"] - base) / p.devices[0].total,
        }
    out["rtpo_over_grpo_time"] = {
        "measured": min(x["time_s"] for x in out["rtpo"]["measured"]["iterations"][1:])
        / min(x["time_s"] for x in out["grpo"]["measured"]["iterations"][1:]),
        "predicted": out["rtpo"]["predicted"]["time_s"] / out["grpo"]["predicted"]["time_s"],
    }
    return out


def paper() -> dict:
    from rtpo.plan import Assumptions, plan
    from rtpo.scenario.load import load_scenario

    rtpo = load_scenario(AIRLINE)
    grpo = load_scenario(AIRLINE, ["method.name=grpo", "method.G=16"])

    def ratios(reach: float, fill: float = 1.0) -> tuple[float, float]:
        a = Assumptions(reach=reach, fill=fill, prompt_tokens=AIRLINE_PROMPT)
        r, g = plan(rtpo, "A100-80GB", a).iteration(), plan(grpo, "A100-80GB", a).iteration()
        return r["generated_tokens"] / g["generated_tokens"], r["time_s"] / g["time_s"]

    def fit(fill: float) -> float:
        lo, hi = 1e-3, 1.0  # the token ratio rises with reach (more boundaries, longer siblings)
        if ratios(hi, fill)[0] < PAPER_TOKENS or ratios(lo, fill)[0] > PAPER_TOKENS:
            raise SystemExit("no reach in (0, 1] gives the paper's token ratio")
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ratios(mid, fill)[0] < PAPER_TOKENS else (lo, mid)
        return (lo + hi) / 2

    reach = fit(1.0)
    tok, wall = ratios(reach)
    sensitivity = {f"fill_{f:g}".replace(".", "_"): ratios(fit(f), f)[1] for f in (0.5, 0.25, 0.1)}
    fit80 = plan(load_scenario(QWEN8), "A100-80GB")
    fit40 = plan(load_scenario(QWEN8), "A100-40GB")
    return {
        "table15": {
            "scenario": str(AIRLINE.relative_to(ROOT)),
            "grpo": "method.name=grpo method.G=16 (E.3: 16 chains per prompt)",
            "hardware": "A100-80GB",
            "reach_fitted_to_tokens": reach,
            "tokens_ratio": {"paper": PAPER_TOKENS, "plan": tok},
            "prompt_tokens": AIRLINE_PROMPT,
            "wall_ratio": {"paper": PAPER_WALL, "plan": wall, "plan_over_paper": wall / PAPER_WALL},
            "wall_ratio_if_fill": sensitivity,
        },
        "qwen3_8b_8x80gb": {
            "scenario": str(QWEN8.relative_to(ROOT)),
            "A100-80GB": {"fits": fit80.fits, "fullest_gb": fit80.worst().total / 1e9, "device": fit80.worst().device},
            "A100-40GB": {"fits": fit40.fits, "fullest_gb": fit40.worst().total / 1e9, "refusal": fit40.refusal()},
            "per_rank_state_gb": sum(
                v for k, v in dict(fit80.workers[1].items).items() if k in ("weights", "grads", "adamw")
            )
            / 1e9,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", choices=["baseline", "run", "calibrate"])
    ap.add_argument("--result")
    ap.add_argument("--skip-runs", action="store_true", help="paper checks only (no CPU runs)")
    ap.add_argument("rest", nargs="*")
    ns = ap.parse_args()
    if ns.child:
        if ns.child == "calibrate":
            res = calibrate()
        else:
            res = child_baseline() if ns.child == "baseline" else child_run(ns.rest[0], ns.rest[1:])
        Path(ns.result).write_text(json.dumps(res))
        return
    from rtpo.plan.hardware import TABLE

    load_before = os.getloadavg()
    # in a child: Linux keeps a process's peak RSS across fork and exec, and the later children's peak RSS
    # is what the memory check reads, so the parent stays small
    cal = _child("calibrate")
    hw = replace(
        TABLE["cpu"],
        fp32_tflops=cal["fp32_flops"] / 1e12,
        mem_bw_gbs=cal["copy_bytes_per_s"] / 1e9,
        train_efficiency=cal["train_efficiency"],
    )
    out = {
        "command": "VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONPATH=$PWD python bench/bench_plan.py",
        "cpu_count": os.cpu_count(),
        "loadavg_before": load_before,
        "calibration": cal,
        "paper": paper(),
    }
    if not ns.skip_runs:
        out["cpu"] = {"loadavg_before": load_before, "calibration": cal, **cpu_runs(hw)}
        out["cpu"]["loadavg_after"] = os.getloadavg()
    out["loadavg_after"] = os.getloadavg()
    path = HERE / "plan.json"
    if ns.skip_runs and path.is_file():  # keep the last CPU runs
        old = json.loads(path.read_text())
        if "cpu" in old:
            out["cpu"] = old["cpu"]
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "cpu"}, indent=1))


if __name__ == "__main__":
    main()
