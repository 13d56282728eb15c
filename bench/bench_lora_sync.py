"""vLLM generation with LoRA adapters on CPU: merged weights synced after each phase (what rtpo does) vs
vLLM's own LoRA support (the adapters saved each phase and passed as a LoRARequest); writes
bench/lora_sync.json.

    flock /work/bench.lock python bench/bench_lora_sync.py [--phases 8] [--prompts 24] [--n 3]

The model is tiny-cpu's (scenarios/llm/tiny-cpu.yaml: a random 2-layer Qwen3, hidden 128, the real
Qwen3 vocabulary, so the tied embeddings are 19.4 M of its 19.8 M parameters) with backend.lora's default
adapters (rank 8, α 16, q/k/v/o_proj) on a one-rank FSDP learner.  Each phase the adapters move (a
random step, untimed: the sync does not depend on how they were trained), then, for each mode in turn
(the order alternates by phase), the timed part of the phase:

  merged   learner.weights() (the full state dict with W₀ + (α/r)·B·A merged) + VLLMEngine.load_weights
           (an in-place reload of every weight) + generate;
  lora     the adapters gathered and written as a peft adapter folder (adapter_model.safetensors and
           adapter_config.json) + generate with LoRARequest(a new id per phase: vLLM loads the folder
           on the first request) on an engine built with enable_lora=True.

Both engines generate the same requests (tiny-cpu's sibling batch of a phase: `prompts` contexts of
random tokens, `n` samples each, max_tokens and temperature from the scenario) with the same per-request
seeds.  Reported per mode: median seconds per phase over the phases after the first (a warm-up for each
engine), split into sync and generate; the lora/merged ratio; as a check that both serve one policy, the
share of samples whose tokens agree between the modes and the largest log-prob difference over those.
The machine's load average is recorded: the machine is shared, and a figure taken at load > 4 is not
reportable.
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

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "llm" / "tiny-cpu.yaml"
OUT = ROOT / "bench" / "lora_sync.json"


def _save_adapters(learner, spec_cfg, folder: Path) -> None:
    """The learner's adapters as a peft adapter folder vLLM's LoRARequest loads (peft's key names:
    `base_model.model.<module>.lora_A.weight`, the adapter name dropped)."""
    from safetensors.torch import save_file

    from rtpo.llm.lora import ADAPTER, is_adapter_key

    folder.mkdir(parents=True)
    state = {}
    for name, p in learner.model.named_parameters():
        if is_adapter_key(name):
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            state["base_model.model." + name.replace("." + ADAPTER + ".", ".")] = full.detach().cpu().contiguous()
    save_file(state, str(folder / "adapter_model.safetensors"))
    spec_cfg.save_pretrained(str(folder))


def _generate(engine, prompts, params, lora_request=None):
    outs = engine.llm.generate(prompts, params, lora_request=lora_request, use_tqdm=False)
    return [
        (list(c.token_ids), [pos[t].logprob for pos, t in zip(c.logprobs, c.token_ids)])
        for o in outs
        for c in o.outputs
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=24, help="contexts per phase (tiny-cpu: (G-1)*boundaries/K*... ~24)")
    ap.add_argument("--n", type=int, default=3, help="samples per context")
    ap.add_argument("--context-len", type=int, default=64)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from rtpo.llm.build import _model_dir, learner_config
    from rtpo.llm.engines.base import SamplingConfig
    from rtpo.llm.engines.vllm import VLLMEngine
    from rtpo.llm.learner import FSDPLearner
    from rtpo.llm.lora import ADAPTER
    from rtpo.scenario.load import load_scenario

    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench_lora_sync_"))
    cfg = load_scenario(SCENARIO, ["backend.lora.enabled=true", f"backend.model_cache={work / 'models'}"])
    model_dir = _model_dir(cfg)
    b = cfg.backend
    spec = b.lora.spec(init_seed=cfg.seed)
    learner = FSDPLearner(model_dir, learner_config(cfg))
    n_params = sum(p.numel() for p in learner.model.parameters())
    n_adapter = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    engine_kw = dict(max_model_len=b.max_model_len, block_size=b.block_size, kv_cache_gb=b.kv_cache_gb)
    sampling = SamplingConfig(temperature=b.temperature, top_p=b.top_p, max_tokens=b.max_tokens)
    merged = VLLMEngine(model_dir, sampling, **engine_kw)
    lora = VLLMEngine(model_dir, sampling, **engine_kw, enable_lora=True, max_lora_rank=max(8, spec.rank), max_loras=1)

    rng = np.random.default_rng(0)
    vocab = merged.vocab_size
    prompts = [
        TokensPrompt(prompt_token_ids=[int(t) for t in rng.integers(0, vocab, args.context_len)])
        for _ in range(args.prompts)
    ]
    params = [
        SamplingParams(
            n=args.n,
            temperature=b.temperature,
            top_p=b.top_p,
            max_tokens=b.max_tokens,
            logprobs=0,
            seed=int(s),
            detokenize=False,
            ignore_eos=True,  # every sample the scenario's full length: both modes generate the same tokens' count
        )
        for s in rng.integers(0, 2**31 - 1, args.prompts)
    ]
    base_q = merged_q = learner.weights()["model.layers.0.self_attn.q_proj.weight"].clone()
    gen = torch.Generator().manual_seed(1)
    rows = {"merged": [], "lora": []}
    agree, worst = [], 0.0
    for phase in range(args.phases):
        with torch.no_grad():  # a random step of the adapters (what a train step would do to them)
            for p in learner.model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        learner._version += 1  # parameters moved outside train_step: the weights cache must not serve them
        got = {}
        for mode in ("merged", "lora") if phase % 2 == 0 else ("lora", "merged"):
            t0 = time.perf_counter()
            if mode == "merged":
                weights = learner.weights()
                merged.load_weights(weights)
                merged_q = weights["model.layers.0.self_attn.q_proj.weight"]
                t1 = time.perf_counter()
                got[mode] = _generate(merged, prompts, params)
            else:
                folder = work / f"adapter{phase}"
                _save_adapters(learner, learner.peft.peft_config[ADAPTER], folder)
                t1 = time.perf_counter()
                got[mode] = _generate(lora, prompts, params, LoRARequest(f"phase{phase}", phase + 1, str(folder)))
            t2 = time.perf_counter()
            rows[mode].append({"phase": phase, "sync_s": t1 - t0, "generate_s": t2 - t1, "total_s": t2 - t0})
        same = [(a, c) for a, c in zip(got["merged"], got["lora"]) if a[0] == c[0]]
        agree.append(len(same) / len(got["merged"]))
        for a, c in same:
            worst = max(worst, float(np.max(np.abs(np.subtract(a[1], c[1])), initial=0.0)))
        print(f"phase {phase}: " + ", ".join(f"{m} {rows[m][-1]['total_s']:.3f} s" for m in rows), flush=True)

    def summary(mode: str) -> dict:
        timed = rows[mode][1:]
        return {key: statistics.median(r[key] for r in timed) for key in ("sync_s", "generate_s", "total_s")} | {
            "phases": rows[mode]
        }

    result = {
        "command": "flock /work/bench.lock python " + " ".join(["bench/bench_lora_sync.py", *sys.argv[1:]]),
        "scenario": "scenarios/llm/tiny-cpu.yaml",
        "adapters": {"rank": spec.rank, "alpha": spec.alpha, "target_modules": list(spec.target_modules)},
        "model_params": n_params,
        "adapter_params": n_adapter,
        "prompts": args.prompts,
        "n": args.n,
        "context_len": args.context_len,
        "max_tokens": b.max_tokens,
        "merged": summary("merged"),
        "lora": summary("lora"),
        "samples_agreeing": float(np.mean(agree)),
        # > 0: the adapters moved, so the agreement above compares adapted policies, not the base twice
        "merged_q_proj_moved_max": float((merged_q - base_q).abs().max()),
        "max_logp_diff_agreeing": worst,
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "torch": torch.__version__,
    }
    import vllm

    result["vllm"] = vllm.__version__
    result["lora_over_merged"] = result["lora"]["total_s"] / result["merged"]["total_s"]
    result["loadavg_max"] = max(result["loadavg_start"][0], result["loadavg_end"][0])
    result["reportable"] = result["loadavg_max"] <= 4.0
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"merged {result['merged']['total_s']:.3f} s/phase (sync {result['merged']['sync_s']:.3f}), "
        f"lora {result['lora']['total_s']:.3f} s/phase (sync {result['lora']['sync_s']:.3f}): "
        f"lora/merged {result['lora_over_merged']:.2f}x; agreeing samples {result['samples_agreeing']:.2f}, "
        f"load {result['loadavg_start'][0]:.1f}->{result['loadavg_end'][0]:.1f}"
    )


if __name__ == "__main__":
    main()
