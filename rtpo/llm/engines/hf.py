"""The reference engine: sampling from a Hugging Face transformers causal LM, runs anywhere torch runs.

It implements the core's Sampler protocol with the same contract as the vLLM engine (n samples per
context, per-turn token limits, stop tokens, processed log-probs; see engines/base.py).  It decodes
all B·n rows as one left-padded batch with a KV cache, in the model's dtype on its device; slow next to
vLLM, but simple enough to serve as the ground truth in the engine tests.  On a GPU it is the fallback
sampler where vLLM is missing: each decoding step samples on the device (the device's own generator)
and only the B·n sampled ids leave it; the per-token log-probs stay there until the batch ends.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
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
from rtpo.llm.model import load_hf_model


def processed_logprobs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """log-probs of the distribution tokens are drawn from: log softmax(logits / T), then top-p.

    Top-p follows vLLM's rule (drop the smallest tokens whose cumulative mass stays <= 1 − p, always
    keep the most likely one) so both engines sample from, and record, the same distribution.
    """
    scaled = logits.float() / cfg.logprob_temperature
    if cfg.top_p < 1.0 and not cfg.greedy:
        sorted_logits, idx = scaled.sort(dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1.0 - cfg.top_p
        drop[..., -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(-1, idx, sorted_logits)
    return torch.log_softmax(scaled, dim=-1)


class HFEngine:
    """Sampler over a transformers model loaded from a local HF folder.

    model_path: folder with config.json and weights (e.g. from rtpo.llm.model.build_tiny_qwen3).
    sampling:   SamplingConfig; the model's EOS ids always stop a turn as well.
    max_model_len: context + response limit (as vLLM's); None = the model's max_position_embeddings.
    entropy_top_k, entropy_tokens, seed: ARPO's entropy probe, as the vLLM engine's.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        sampling: SamplingConfig,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        max_model_len: int | None = None,
        entropy_top_k: int = ENTROPY_TOP_K,
        entropy_tokens: int = ENTROPY_TOKENS,
        seed: int = 0,
    ) -> None:
        if entropy_top_k < 1 or entropy_tokens < 1:
            raise ValueError(f"entropy_top_k and entropy_tokens must be >= 1, got {entropy_top_k}, {entropy_tokens}")
        self.entropy_top_k, self.entropy_tokens, self.seed = int(entropy_top_k), int(entropy_tokens), int(seed)
        self.model_path = str(model_path)
        self.sampling = sampling
        self.device = torch.device(device)
        self.model = load_hf_model(model_path, dtype=dtype, device=device)
        cfg = self.model.config
        self.eos_ids = model_stop_ids(model_path)
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else (self.eos_ids or [0])[0]
        self.vocab_size = int(cfg.vocab_size)
        self.max_model_len = max_model_len or getattr(cfg, "max_position_embeddings", None)

    def _generator(self, seed: int) -> torch.Generator:
        """The sampling generator, on the model's device when that device has generators of its own (a
        GPU: multinomial there needs one; CPU runs keep the CPU generator and so their exact samples)."""
        kind = self.device.type if self.device.type in ("cuda", "xpu", "mps") else "cpu"
        return torch.Generator(device=kind).manual_seed(seed)

    @property
    def stop_ids(self) -> list[int]:
        """The model's EOS ids plus the sampling config's stop ids."""
        return sorted(set(self.eos_ids) | set(self.sampling.stop_token_ids))

    # -- Sampler protocol ------------------------------------------------------------------------
    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy a full HF-named state dict (e.g. FSDPLearner.weights()) into the model in place."""
        own = self.model.state_dict()
        unknown = [k for k in weights if k not in own]
        if unknown:
            raise KeyError(f"weights name parameters the model does not have: {unknown[:3]}")
        with torch.no_grad():
            for name, value in weights.items():
                own[name].copy_(value.to(own[name].dtype))

    @torch.no_grad()
    def generate(self, contexts: Ragged, turn: np.ndarray, n: int, rng: np.random.Generator) -> Generation:
        turn = check_request(contexts, turn, n, self.vocab_size)
        cfg = self.sampling
        rows = np.repeat(np.arange(len(contexts)), n)
        limits = torch.as_tensor(fit_to_model_len(cfg.max_tokens_for(turn), contexts.lengths, self.max_model_len)[rows])
        if rows.size == 0:
            return to_generation([], [])
        gen = self._generator(int(seeds_from(rng, 1)[0]))
        ctx = contexts.take(rows)
        dense, mask = ctx.to_dense(pad=self.pad_id)
        width = dense.shape[1]
        # left-pad so that every row's next token is at the last position
        shift = width - ctx.lengths
        ids = np.full_like(dense, self.pad_id)
        att = np.zeros_like(mask)
        for i, s in enumerate(shift):  # B·n rows, each one slice copy
            ids[i, s:] = dense[i, : width - s]
            att[i, s:] = True
        input_ids = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        attention = torch.as_tensor(att, dtype=torch.long, device=self.device)
        position = (attention.cumsum(-1) - 1).clamp(min=0)
        stop = torch.as_tensor(np.asarray(self.stop_ids, dtype=np.int64), device=self.device)
        num = rows.size
        # everything per token stays on the device: the (rows, V) distribution is sampled there, and the
        # only host read per step is the one flag that says whether every row has stopped
        dev = self.device
        longest = int(limits.max())
        limits = limits.to(dev)
        out_tokens = torch.full((num, longest), -1, dtype=torch.long, device=dev)
        out_logp = torch.zeros((num, longest), dtype=torch.float64, device=dev)
        done = torch.zeros(num, dtype=torch.bool, device=dev)
        length = torch.zeros(num, dtype=torch.long, device=dev)
        past: Any = None
        step_ids, step_pos = input_ids, position
        for t in range(longest):
            out = self.model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=step_pos,
                past_key_values=past,
                use_cache=True,
                # only the last position's logits are sampled from: without this the prefill computes a
                # (rows, context, vocab) tensor (a 2,500-token airline prompt x 151,936 rows: ~20x the time)
                logits_to_keep=1,
            )
            past = out.past_key_values
            lp = processed_logprobs(out.logits[:, -1, :], cfg)
            if cfg.greedy:
                nxt = lp.argmax(dim=-1)
            else:
                nxt = torch.multinomial(lp.exp(), 1, generator=gen).squeeze(1)
            live = ~done
            out_tokens[:, t] = torch.where(live, nxt, out_tokens[:, t])
            out_logp[:, t] = torch.where(live, lp.gather(1, nxt[:, None]).squeeze(1).double(), out_logp[:, t])
            length += live.long()
            done |= torch.isin(nxt, stop) | (length >= limits)
            if bool(done.all()):
                break
            step_ids = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)[:, None]
            step_pos = step_pos[:, -1:] + 1
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
        lens, out_tokens, out_logp = length.cpu().numpy(), out_tokens.cpu(), out_logp.cpu()
        return to_generation(
            [out_tokens[i, : lens[i]].numpy() for i in range(num)], [out_logp[i, : lens[i]].numpy() for i in range(num)]
        )

    # -- EntropySampler (ARPO's trigger) ---------------------------------------------------------
    @torch.no_grad()
    def entropy_probe(self, contexts: Ragged, turn: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """As VLLMEngine.entropy_probe: a probe response of at most `entropy_tokens` tokens per context
        (this engine's sampler, seeded with `seed`), and the (T, k) top-k processed log-probs at each
        of its positions."""
        turn = check_request(contexts, turn, 1, self.vocab_size)
        saved = self.sampling
        limits = np.minimum(saved.max_tokens_for(np.arange(int(turn.max(initial=0)) + 1)), self.entropy_tokens)
        self.sampling = dataclasses.replace(saved, max_tokens=tuple(int(m) for m in limits))
        try:
            gen = self.generate(contexts, turn, 1, np.random.default_rng(self.seed))
        finally:
            self.sampling = saved
        return [np.asarray(r, np.int64) for r in gen.tokens], self.topk_logprobs(contexts, gen.tokens)

    @torch.no_grad()
    def topk_logprobs(self, contexts: Ragged, responses: Ragged) -> list[np.ndarray]:
        """(T_i, k) the top-k processed log-probs (engines/base.py convention) at each response position."""
        out = []
        for c, r in zip(contexts, responses):
            if r.size == 0:
                out.append(np.zeros((0, self.entropy_top_k)))
                continue
            ids = torch.as_tensor(np.concatenate([c, r]), dtype=torch.long, device=self.device)[None]
            # the last r.size + 1 positions' logits (logits_to_keep), less the one after the response
            logits = self.model(input_ids=ids, logits_to_keep=r.size + 1, use_cache=False).logits[0, :-1]
            lp = processed_logprobs(logits, self.sampling)
            out.append(lp.topk(self.entropy_top_k, dim=-1).values.double().cpu().numpy())
        return out

    def normalized_entropy(self, contexts: Ragged, turn: np.ndarray) -> np.ndarray:
        """(B,) ARPO's normalised entropy at each context (engines/base.py `topk_entropy` of the probe)."""
        return topk_entropy(self.entropy_probe(contexts, turn)[1], self.vocab_size)

    # -- helpers the tests and the benchmark use ------------------------------------------------
    @torch.no_grad()
    def teacher_forced_logprobs(self, contexts: Ragged, responses: Ragged, temperature: float = 1.0) -> Ragged:
        """log softmax(logits / T) of each response token given its context, one row at a time."""
        out = []
        for c, r in zip(contexts, responses):
            ids = torch.as_tensor(np.concatenate([c, r]), dtype=torch.long, device=self.device)[None]
            logits = self.model(input_ids=ids, logits_to_keep=r.size + 1, use_cache=False).logits[0, :-1].float()
            lp = torch.log_softmax(logits / temperature, dim=-1)
            target = torch.as_tensor(np.array(r), dtype=torch.long, device=self.device)
            out.append(lp.gather(1, target[:, None]).squeeze(1).double().cpu().numpy())
        return Ragged(np.concatenate(out) if out else np.zeros(0), responses.offsets)
