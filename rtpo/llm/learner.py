"""The LLM learner: a causal LM sharded with torch FSDP2 over 1..N processes, trained with the core's loss.

Implements rtpo.core.protocols.Learner.  Every rank holds one FSDPLearner over the same model folder;
rank 0 lives in the driver process and is the only one the core talks to: each public call on rank 0
broadcasts a small command (name + TurnBatch) to the other ranks, which sit in `serve()`, and then all
ranks run the same collective step.  `launch_learner(...)` starts the N−1 worker processes (spawn)
and returns rank 0's learner; with N = 1 nothing is spawned.  Gloo on CPU, NCCL on GPUs.

Log-probs (`logprobs`, and inside `train_step`) are teacher-forced over context + response ids:
log softmax(logits / T) of each response token, with T = LearnerConfig.temperature, which must be the
engine's sampling temperature (see rtpo.llm.engines.base for the processed-log-prob convention).
Only response tokens enter the loss, so context tokens get no gradient (Eq. 80).

Data parallelism is exact: rows are dealt to ranks by whole sequences, and each rank's share of the
core loss is re-weighted so that the sum over ranks (FSDP averages gradients, hence the factor N) is
the loss of the whole batch — the sharded update equals the one-process update.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rtpo.core.loss import FlatBatch, LossConfig, policy_loss
from rtpo.core.schedule import LRSchedule, make_lr_scheduler, restore_lr
from rtpo.core.types import Ragged, TurnBatch
from rtpo.llm.lora import LoRASpec

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LearnerConfig:
    """Optimiser and numerics of the FSDP learner (E.3 defaults).

    lr, weight_decay:   AdamW (E.3: 1e-6, 0.01).
    lr_schedule:        warm-up and decay of lr by optimiser step (rtpo.core.schedule; resumed from `steps`).
    betas, eps:         AdamW moments.
    grad_clip:          max global grad norm; None = off.
    temperature:        T of the teacher-forced log-probs; must equal the engine's sampling T (E.3: 0.9).
    micro_batch_tokens: context + response tokens per forward pass per rank (memory knob; the update
                        is the same for any value).
    kl_reference:       keep a frozen copy of the initial weights for LossConfig.kl_coef > 0 (with `lora`:
                        no copy; the reference is the same model with its adapters switched off).
    lora:               train LoRA adapters (rtpo.llm.lora, peft) instead of the weights: the base stays
                        frozen, checkpoints hold the adapters and their optimiser state alone, and
                        `weights` returns the merged W₀ + (α/r)·B·A under the model folder's names.
    param_dtype:        dtype the weights are stored and trained in ("float32" on CPU).
    mixed_precision:    compute dtype under FSDP2's MixedPrecisionPolicy ("bfloat16" on GPUs); None = off.
    gradient_checkpointing: recompute activations in backward (long contexts on GPUs).
    reuse_ratio_forward: `logprobs` keeps its forward pass (with its autograd graph) when the batch is one
                        micro-batch per rank, and the next `train_step` on the same rows at the same
                        weights back-propagates through it instead of running that forward again: the
                        rollout/train ratio pass before a single-step PPO update costs no extra forward.
                        The graph held is the one the train step builds anyway (micro_batch_tokens bounds it).
    cache_weights:      `weights` returns the same snapshot while the parameters are unchanged (no second
                        gather) and tags it with the learner's version, so an engine can skip reloading
                        weights it already holds (RTPO's first phase syncs the θ its trunks ran under).
    attn_implementation: transformers' attention kernel: "sdpa" (torch's fused scaled-dot-product
                        attention: flash / memory-efficient kernels on GPUs) or "eager" (the reference).
    packing:            padding-free forward passes: a micro-batch's rows laid end to end in one sequence
                        with position ids restarting per row (transformers' packed-sequence path: a
                        block-diagonal causal mask), instead of left-padded to the longest row; the
                        log-probs are the same.  micro_batch_tokens then bounds the tensor exactly.  Off by
                        default: with torch's SDPA (no variable-length kernel) the packed row's attention is
                        one masked (T × T) product over the T tokens of the micro-batch, which on CPU costs
                        more than the padding it saves (bench/packing.json).
    compile_layers:     torch.compile each decoder layer in place (before FSDP wraps it; the parameter
                        names and state dicts are unchanged): fuses the eager model's norms, rotary and
                        activations.  Off by default: each new batch shape compiles again (GPUs).
    peak_flops:         one device's peak FLOP/s: train steps report perf/learner_mfu = achieved FLOP/s over
                        world_size × this (None: only the achieved perf/learner_flops_per_s).
    fsdp_one_rank:      wrap the model in FSDP2 even with world size 1.  Off by default: on one rank there
                        is nothing to shard, and FSDP's all-gather and reduce-scatter only copy every weight
                        and gradient on each pass (bench/llm_memory.json, learner.fsdp_one_rank_step_s).
                        Mixed precision always takes FSDP (its MixedPrecisionPolicy casts the weights).
    """

    lr: float = 1e-6
    lr_schedule: LRSchedule = LRSchedule()
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    temperature: float = 1.0
    micro_batch_tokens: int = 16384
    kl_reference: bool = False
    param_dtype: str = "float32"
    mixed_precision: str | None = None
    gradient_checkpointing: bool = False
    reuse_ratio_forward: bool = True
    cache_weights: bool = True
    attn_implementation: str = "sdpa"
    fsdp_one_rank: bool = False
    peak_flops: float | None = None
    compile_layers: bool = False
    lora: LoRASpec | None = None
    packing: bool = False

    def __post_init__(self) -> None:
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation must be 'sdpa' or 'eager', got {self.attn_implementation!r}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.micro_batch_tokens < 1:
            raise ValueError("micro_batch_tokens must be >= 1")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError("grad_clip must be > 0 or None")
        if self.param_dtype not in _DTYPES:
            raise ValueError(f"param_dtype must be one of {sorted(_DTYPES)}, got {self.param_dtype!r}")
        if self.mixed_precision is not None and self.mixed_precision not in _DTYPES:
            raise ValueError(f"mixed_precision must be one of {sorted(_DTYPES)} or None")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if isinstance(self.lr_schedule, dict):  # a config read back from a checkpoint (asdict)
            object.__setattr__(self, "lr_schedule", LRSchedule(**self.lr_schedule))
        if isinstance(self.lora, dict):
            object.__setattr__(self, "lora", LoRASpec(**self.lora))


# -- the work plan: which rows each rank runs, in which micro-batches ------------------------------


def plan_micro_batches(batch: TurnBatch, world_size: int, micro_batch_tokens: int) -> list[list[np.ndarray]]:
    """plan[rank][m] = row indices of micro-batch m on `rank`; every rank gets the same number of
    micro-batches (empty ones run a dummy pass so FSDP's collectives line up).

    Whole sequences stay together (a GSPO sequence ratio or a multi-row GRPO sequence is never cut);
    sequences go to the least-loaded rank by tokens, longest first, so the plan is deterministic.
    """
    seqs, inverse = np.unique(batch.seq_id, return_inverse=True)
    row_tokens = batch.contexts.lengths + batch.tokens.lengths
    seq_tokens = np.bincount(inverse, weights=row_tokens, minlength=seqs.size)
    load = np.zeros(world_size)
    owner = np.zeros(seqs.size, dtype=np.int64)
    for s in np.argsort(-seq_tokens, kind="stable"):
        r = int(np.argmin(load))
        owner[s] = r
        load[r] += seq_tokens[s]
    plan: list[list[np.ndarray]] = []
    for r in range(world_size):
        micro: list[np.ndarray] = []
        current: list[int] = []
        used = 0
        for s in np.flatnonzero(owner == r):
            rows = np.flatnonzero(inverse == s)
            need = int(row_tokens[rows].sum())
            if current and used + need > micro_batch_tokens:
                micro.append(np.asarray(current, dtype=np.int64))
                current, used = [], 0
            current.extend(rows.tolist())
            used += need
        if current:
            micro.append(np.asarray(current, dtype=np.int64))
        plan.append(micro)
    depth = max(1, max(len(m) for m in plan))
    for m in plan:
        m.extend([np.zeros(0, dtype=np.int64)] * (depth - len(m)))
    return plan


def forward_tokens(batch: TurnBatch, plan: list[list[np.ndarray]], packing: bool) -> tuple[int, int]:
    """(real, computed): the context + response tokens of a plan's micro-batches, and the positions
    their forward passes compute — padded: each micro-batch's rows × its longest row; packed: the real
    tokens.  Padding share = 1 − real / computed (rows of a dummy pass are not counted)."""
    lengths = batch.contexts.lengths + batch.tokens.lengths
    real = computed = 0
    for micro in plan:
        for rows in micro:
            if rows.size:
                real += int(lengths[rows].sum())
                computed += int(lengths[rows].sum()) if packing else int(rows.size * lengths[rows].max())
    return real, computed


def _detached(tree: Any, _memo: dict | None = None) -> Any:
    """A copy of every tensor in a nested state dict.  With one CPU rank the 'full' state dict
    shares storage with the live parameters and optimiser moments; a snapshot must not move with them.

    Tensors that alias one another (a tied embedding and lm_head) are copied once and stay aliased
    in the copy, so tied weights are never stored twice (nor pickled twice by torch.save)."""
    memo: dict = {} if _memo is None else _memo
    if isinstance(tree, torch.Tensor):
        key = (tree.untyped_storage().data_ptr(), tree.storage_offset(), tuple(tree.shape), tree.stride(), tree.dtype)
        if tree.numel() == 0 or key not in memo:
            memo[key] = tree.detach().clone()
        return memo[key]
    if isinstance(tree, dict):
        return {k: _detached(v, memo) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_detached(v, memo) for v in tree)
    return tree


class WeightsSnapshot(dict):
    """A full HF-named state dict plus `version`: (learner id, parameter version) of the weights it holds.

    Two snapshots with the same version hold the same values, which lets an engine skip a reload.  The
    tensors are shared by every caller until the parameters change: treat them as read-only."""

    version: tuple[str, int] | None = None


def _same_rows(a: TurnBatch, b: TurnBatch) -> bool:
    """Whether a forward pass over a and over b is the same computation (same contexts, responses, plan)."""
    if a is b:
        return True
    pairs = (
        (a.contexts.offsets, b.contexts.offsets),
        (a.tokens.offsets, b.tokens.offsets),
        (a.contexts.values, b.contexts.values),
        (a.tokens.values, b.tokens.values),
        (a.seq_id, b.seq_id),
    )
    return all(x.shape == y.shape and np.array_equal(x, y) for x, y in pairs)


@torch.no_grad()
def _entropy(log_p: torch.Tensor) -> torch.Tensor:
    """H = -sum_v p_v log p_v over the last axis of log-probs (b, n, V), one row at a time through one
    reused (n, V) buffer: no temporary of the whole (b, n, V) (a fresh vocab-sized allocation is page
    faults and zeroing on every call, ~5% of a tiny-cpu train step)."""
    out = torch.empty(log_p.shape[:-1], dtype=log_p.dtype, device=log_p.device)
    buf = torch.empty(log_p.shape[1:], dtype=log_p.dtype, device=log_p.device)
    for i in range(log_p.shape[0]):
        torch.exp(log_p[i], out=buf)
        torch.sum(buf.mul_(log_p[i]), dim=-1, out=out[i])
    return out.neg_()


def train_flops(config: Any, n_params: int, context_lengths: np.ndarray, response_lengths: np.ndarray) -> float:
    """Model FLOPs of one training step (forward + backward = 3 × forward) over rows of s = context +
    response tokens, r of them response tokens (the learner keeps r + 1 positions' logits):

        forward = Σ_rows 2·N_body·s + 2·d·V·(r + 1) + 2·L·H·d_h·s²

    N_body the parameters less the embedding (and less the lm_head when untied: its matmul is the d·V
    term), L layers, H heads of d_h, attention causal (half of 4·s²·H·d_h per layer)."""
    d, v, layers = int(config.hidden_size), int(config.vocab_size), int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or d // heads)
    tied = bool(getattr(config, "tie_word_embeddings", True))
    body = n_params - d * v * (1 if tied else 2)
    s = np.asarray(context_lengths, np.float64) + np.asarray(response_lengths, np.float64)
    r = np.asarray(response_lengths, np.float64)
    fwd = 2.0 * body * s.sum() + 2.0 * d * v * (r + 1).sum() + 2.0 * layers * heads * head_dim * (s * s).sum()
    return 3.0 * float(fwd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FSDPLearner:
    """Learner protocol over an FSDP2-sharded HF causal LM (one object per rank).

    model_path: local HF folder (config, weights, tokenizer) — the same one the engine loads.
    rank, world_size: this process's place; the process group is created here if none exists
    (world_size 1: an in-memory store; more: MASTER_ADDR/MASTER_PORT from the environment).
    device: where the model lives; None = this rank's GPU under NCCL, else the CPU.  Every tensor a
    call builds goes there (ids and masks in `_token_logp`, the loss's batch in `_flat`); what leaves
    (log-probs, metrics, weights, state dicts) comes back to the host.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        cfg: LearnerConfig = LearnerConfig(),
        rank: int = 0,
        world_size: int = 1,
        backend: str | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.model_path = str(model_path)
        self.cfg = cfg
        self.rank, self.world_size = int(rank), int(world_size)
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if self.backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", self.rank)) % max(torch.cuda.device_count(), 1)
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
        else:
            self.device = torch.device("cpu")
        if device is not None:
            self.device = torch.device(device)
        self._init_process_group()
        # objects (commands, batches) always travel over gloo, tensors over the mesh's backend
        self._ctrl = dist.new_group(backend="gloo") if self.world_size > 1 and self.backend != "gloo" else None
        self._mesh = None  # built by _shard when FSDP is used
        dtype = _DTYPES[cfg.param_dtype]

        def load():
            return AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=dtype, local_files_only=True, attn_implementation=cfg.attn_implementation
            )

        model = load()
        self.peft = None  # the PeftModel around self.model when training adapters (LearnerConfig.lora)
        if cfg.lora is not None:
            from rtpo.llm.lora import attach

            self.peft = attach(model, cfg.lora)  # in place: `model` now holds the adapters, base frozen
        self.model = self._shard(model)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.ref_model = None
        if cfg.kl_reference and self.peft is None:
            self.ref_model = self._shard(load().requires_grad_(False))
            self.ref_model.eval()
        self.opt = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
        self.sched = make_lr_scheduler(self.opt, cfg.lr_schedule)
        self.pad_id = int(self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0)
        self.vocab_size = int(self.model.config.vocab_size)
        self.steps = 0
        self._workers: list[Any] = []
        # fast-path state (LearnerConfig.reuse_ratio_forward / cache_weights): the parameter version
        # moves on every optimiser step and state load, and keys both caches
        self._uid = uuid.uuid4().hex
        self._version = 0
        self._weights_cache: WeightsSnapshot | None = None
        self._fwd_cache: tuple[int, TurnBatch, torch.Tensor, torch.Tensor] | None = None
        self._entropy: torch.Tensor | None = None  # the last _token_logp's per-token entropies (no grad)
        self._entropy_grad = False  # _token_logp's entropies carry a graph (LossConfig.entropy_coef > 0)
        self._times = {"time/logprobs_s": 0.0, "time/train_s": 0.0}

    # -- setup -----------------------------------------------------------------------------------
    def _init_process_group(self) -> None:
        if dist.is_initialized():
            if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
                raise RuntimeError(
                    f"a process group of size {dist.get_world_size()} exists; this learner needs rank "
                    f"{self.rank} of {self.world_size}"
                )
            return
        if self.world_size == 1:
            dist.init_process_group(self.backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(self.backend, rank=self.rank, world_size=self.world_size)

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """FSDP2: one unit per decoder layer, plus the root (embeddings, final norm, tied lm_head).

        One rank without mixed precision keeps the plain module (LearnerConfig.fsdp_one_rank): the
        parameter names, state dicts and DCP checkpoints are the same (a shard of one rank is the
        whole tensor), so checkpoints load across world sizes either way."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = model.to(self.device)
        if self.cfg.compile_layers:
            for layer in model.model.layers:
                layer.compile()
        if self.world_size == 1 and self.cfg.mixed_precision is None and not self.cfg.fsdp_one_rank:
            return model
        from torch.distributed.device_mesh import init_device_mesh

        if self._mesh is None:
            self._mesh = init_device_mesh(self.device.type, (self.world_size,))
        kwargs: dict[str, Any] = {"mesh": self._mesh}
        if self.cfg.mixed_precision is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=_DTYPES[self.cfg.mixed_precision], reduce_dtype=torch.float32
            )
        for layer in model.model.layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model

    # -- command fan-out: rank 0 tells the others what to run --------------------------------------
    def _broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._ctrl)
        return box[0]

    def _call(self, name: str, payload: Any = None) -> Any:
        if self.rank != 0:
            raise RuntimeError("only rank 0 drives the learner; other ranks run serve()")
        if self.world_size > 1:
            self._broadcast((name, payload))
        return getattr(self, "_do_" + name)(payload)

    def serve(self) -> None:
        """Worker ranks: run rank 0's commands until it sends 'stop'."""
        while True:
            name, payload = self._broadcast(None)
            if name == "stop":
                return
            getattr(self, "_do_" + name)(payload)

    # -- where a batch lives -------------------------------------------------------------------------
    def _flat(self, batch: TurnBatch) -> FlatBatch:
        """The one place a batch's tensors are placed: the token-level view the loss reads (old log-probs,
        advantages, weights, segment ids) on the learner's device, beside the log-probs of `_token_logp`
        (whose ids and masks go to self.device as they are built)."""
        return FlatBatch.from_batch(batch, device=self.device)

    # -- forward pass ------------------------------------------------------------------------------
    def _token_logp(
        self, model: torch.nn.Module, batch: TurnBatch, rows: np.ndarray, reference: bool = False
    ) -> torch.Tensor:
        """(N_rows_tokens,) log softmax(logits / T) of the response tokens of `rows`, in row order
        (reference: the KL reference's, whose entropies are not kept), from one forward pass over the
        rows left-padded to a rectangle (_padded_logits) or packed end to end (_packed_logits,
        LearnerConfig.packing); both give the same log-probs."""
        if rows.size == 0:  # dummy pass: same collectives as a real one, zero contribution
            ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.device)
            return model(input_ids=ids, use_cache=False).logits.sum()[None] * 0.0
        ctx = batch.contexts.take(rows)
        rsp = batch.tokens.take(rows)
        if self.cfg.packing:
            logits, target, keep = self._packed_logits(model, ctx, rsp)
        else:
            logits, target, keep = self._padded_logits(model, ctx, rsp)
        logits = logits.float() / self.cfg.temperature
        log_p = torch.log_softmax(logits, dim=-1)
        lp = log_p.gather(-1, target[..., None]).squeeze(-1)
        if not reference:  # the KL reference's entropy is not a metric: not computed
            if self._entropy_grad and torch.is_grad_enabled():  # an entropy bonus in the loss: differentiable
                self._entropy = -(log_p.exp() * log_p).sum(-1)[keep]
            else:
                self._entropy = _entropy(log_p)[keep]
        return lp[keep]  # row-major: each row's response tokens in order

    def _padded_logits(
        self, model: torch.nn.Module, ctx: Ragged, rsp: Ragged
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(b, r_max, V) logits, (b, r_max) targets and the (b, r_max) mask of real response tokens.

        Rows are left-padded so every response ends at the last position; only the last r_max + 1
        positions' logits are computed (logits_to_keep), which keeps the vocab-sized tensor small."""
        seq = Ragged.concat([ctx, rsp])  # rows 0..B-1 contexts, B..2B-1 responses
        b = len(ctx)
        lengths = ctx.lengths + rsp.lengths
        width = int(lengths.max())
        ids = np.full((b, width), self.pad_id, dtype=np.int64)
        att = np.zeros((b, width), dtype=np.int64)
        for i in range(b):
            full = np.concatenate([seq[i], seq[b + i]])
            ids[i, width - full.size :] = full
            att[i, width - full.size :] = 1
        input_ids = torch.as_tensor(ids, device=self.device)
        attention = torch.as_tensor(att, device=self.device)
        position = (attention.cumsum(-1) - 1).clamp(min=0)
        r_max = int(rsp.lengths.max())
        logits = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=position,
            logits_to_keep=r_max + 1,
            use_cache=False,  # a training pass: no KV cache (its copies cost ~3% of an H200 step, bench/gpu_check.json)
        ).logits[:, :-1]  # (b, r_max, V): predicts the last r_max
        target = torch.as_tensor(ids[:, width - r_max :], device=self.device)
        keep = torch.as_tensor(np.arange(r_max)[None, :] >= (r_max - rsp.lengths)[:, None], device=self.device)
        return logits, target, keep

    def _packed_logits(
        self, model: torch.nn.Module, ctx: Ragged, rsp: Ragged
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(1, R, V) logits, (1, R) targets and an all-true mask, R = the rows' response tokens: the rows
        laid end to end in one sequence of Σ (c_i + r_i) tokens, no padding (LearnerConfig.packing).

        The position ids restart at 0 with each row, and no attention mask is passed: transformers then
        reads the restarts as sequence boundaries (masking_utils.find_packed_sequence_indices) and builds a
        block-diagonal causal mask, so a row attends to itself alone, at the positions (rotary phases) it
        has on its own.  Logits are computed only at the positions that predict a response token
        (logits_to_keep as indices): row i's token t is predicted at start_i + c_i − 1 + t."""
        lengths = ctx.lengths + rsp.lengths
        ids = np.empty(int(lengths.sum()), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        for i in range(len(ctx)):
            c = int(ctx.lengths[i])
            ids[starts[i] : starts[i] + c] = ctx[i]
            ids[starts[i] + c : starts[i] + lengths[i]] = rsp[i]
        position = np.arange(ids.size, dtype=np.int64) - np.repeat(starts, lengths)
        row_of = np.repeat(np.arange(len(ctx)), rsp.lengths)
        t = np.arange(rsp.values.size, dtype=np.int64) - np.repeat(rsp.offsets[:-1], rsp.lengths)
        predict_at = starts[row_of] + ctx.lengths[row_of] - 1 + t
        logits = model(
            input_ids=torch.as_tensor(ids[None], device=self.device),
            position_ids=torch.as_tensor(position[None], device=self.device),
            logits_to_keep=torch.as_tensor(predict_at, device=self.device),
            use_cache=False,
        ).logits  # (1, R, V)
        target = torch.tensor(rsp.values[None], dtype=torch.long, device=self.device)  # a copy: rsp is read-only
        return logits, target, torch.ones_like(target, dtype=torch.bool)

    # -- Learner protocol ------------------------------------------------------------------------
    def logprobs(self, batch: TurnBatch) -> Ragged:
        self._check(batch)
        t0 = time.perf_counter()
        try:
            return self._call("logprobs", batch)
        finally:
            self._times["time/logprobs_s"] += time.perf_counter() - t0

    def pop_metrics(self) -> dict[str, float]:
        """Wall time in log-prob passes and train steps since the last call (ReportsMetrics): with the
        sampler's time/generate_s, the split of a phase's time/phase_s."""
        out = {k: v for k, v in self._times.items() if v}
        self._times = dict.fromkeys(self._times, 0.0)
        return out

    def _do_logprobs(self, batch: TurnBatch) -> Ragged | None:
        plan = plan_micro_batches(batch, self.world_size, self.cfg.micro_batch_tokens)
        mine = []
        self._fwd_cache = None
        # one micro-batch per rank (the same on every rank: the plan is deterministic): keep the graph
        # for a train step on these rows at these weights (LearnerConfig.reuse_ratio_forward)
        keep = self.cfg.reuse_ratio_forward and len(plan[self.rank]) == 1
        with torch.set_grad_enabled(keep):
            for rows in plan[self.rank]:
                lp = self._token_logp(self.model, batch, rows)
                if keep:
                    self._fwd_cache = (self._version, batch, lp, self._entropy)
                if rows.size:
                    mine.append((rows, lp.detach().double().cpu().numpy()))
        return self._assemble(batch, self._gather(mine))

    def _assemble(self, batch: TurnBatch, parts: list) -> Ragged | None:
        """Rank 0: every rank's (rows, token log-probs) pieces, in the batch's token order."""
        if self.rank != 0:
            return None
        out = np.zeros(batch.num_tokens, dtype=np.float64)
        offsets = batch.tokens.offsets
        for rows, lp in (p for rank_parts in parts for p in rank_parts):
            pos = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in rows])
            out[pos] = lp
        return Ragged(out, offsets)

    def ref_logprobs(self, batch: TurnBatch) -> Ragged:
        """The KL reference's teacher-forced log-probs of the response tokens (ReferenceLogprobs: a KL
        penalty in the reward, rtpo.core.kl_reward); needs kl_reference (or LoRA)."""
        self._check(batch)
        if self.ref_model is None and self.peft is None:
            raise ValueError("ref_logprobs needs a reference model: build the learner with kl_reference=True")
        t0 = time.perf_counter()
        try:
            return self._call("ref_logprobs", batch)
        finally:
            self._times["time/logprobs_s"] += time.perf_counter() - t0

    def _do_ref_logprobs(self, batch: TurnBatch) -> Ragged | None:
        plan = plan_micro_batches(batch, self.world_size, self.cfg.micro_batch_tokens)
        mine = []
        for rows in plan[self.rank]:  # an empty one is a dummy pass, in step with the other ranks' collectives
            lp = self._reference_logp(batch, rows)
            if rows.size:
                mine.append((rows, lp.double().cpu().numpy()))
        return self._assemble(batch, self._gather(mine))

    def train_step(self, batch: TurnBatch, loss: LossConfig) -> dict[str, float]:
        self._check(batch)
        if loss.kl_coef > 0 and self.ref_model is None and self.peft is None:
            raise ValueError("kl_coef > 0 needs a reference model: build the learner with kl_reference=True")
        t0 = time.perf_counter()
        try:
            return self._call("train_step", (batch, loss))
        finally:
            self._times["time/train_s"] += time.perf_counter() - t0

    def _do_train_step(self, payload: tuple[TurnBatch, LossConfig]) -> dict[str, float]:
        """Implements Eq. 6 (§3.1) through rtpo.core.loss.policy_loss (the clipped surrogate, or REFUEL's
        pair regression: a pair is one sequence, and sequences stay whole in a micro-batch), split
        exactly over ranks.

        The batch loss is −(policy objective) + β·KL − c·H.  The policy part is a mean over sequences
        (the seq-mean-* aggregations) or over tokens (token-mean), and the regularisers (KL, entropy) are
        means over tokens, so micro-batch m contributes w_m·L_m^{no reg} + (N_m/N)·(L_m − L_m^{no reg}),
        w_m = S_m/S (or N_m/N); the core loss is evaluated once per micro-batch without and once with the
        regularisers to separate them.
        """
        batch, cfg = payload
        t_start = time.perf_counter()
        plan = plan_micro_batches(batch, self.world_size, self.cfg.micro_batch_tokens)
        flat_all = self._flat(batch)
        num_seqs, num_tokens = flat_all.num_seqs, batch.num_tokens
        use_kl = cfg.kl_coef > 0
        use_ent = cfg.entropy_coef > 0
        no_kl = dataclasses.replace(cfg, kl_coef=0.0, entropy_coef=0.0)
        self._entropy_grad = use_ent
        sums: dict[str, float] = {}
        self.opt.zero_grad(set_to_none=True)
        micro = plan[self.rank]
        cached, self._fwd_cache = self._fwd_cache, None
        reuse = (
            cached is not None
            and not use_ent  # the ratio pass's entropies carry no graph
            and len(micro) == 1
            and cached[0] == self._version
            and _same_rows(cached[1], batch)
        )
        grad_sync = getattr(self.model, "set_requires_gradient_sync", None)  # FSDP only
        for m, rows in enumerate(micro):
            if grad_sync is not None:
                grad_sync(m == len(micro) - 1)
            # the ratio pass's forward at these very weights and rows is this forward: reuse its graph
            logp = cached[2] if reuse else self._token_logp(self.model, batch, rows)
            if rows.size == 0:
                (logp.sum() * 0.0).backward()
                continue
            entropy = cached[3] if reuse else self._entropy
            sub = batch.take(rows)
            flat = self._flat(sub)
            tok_share = sub.num_tokens / num_tokens
            pol_share = tok_share if cfg.aggregation == "token-mean" else flat.num_seqs / num_seqs
            ref = None
            if use_kl:
                ref = self._reference_logp(batch, rows)
            pol_loss, metrics = policy_loss(logp, flat, no_kl)
            total = pol_share * pol_loss
            if use_kl or use_ent:  # the regularisers are token means: their share is the tokens'
                full_loss, reg_metrics = policy_loss(logp, flat, cfg, ref, entropy if use_ent else None)
                total = total + tok_share * (full_loss - pol_loss)
                metrics.update({k: reg_metrics[k] for k in ("loss/kl_ref", "loss/entropy") if k in reg_metrics})
            (total * self.world_size).backward()  # FSDP averages gradients over ranks
            metrics["train/entropy"] = float(entropy.detach().double().mean())  # token mean, like the KL
            for key, v in metrics.items():
                share = pol_share if key == "loss/policy" else tok_share
                sums[key] = sums.get(key, 0.0) + share * float(v)
        self._entropy_grad = False
        grad_norm = self._clip_and_norm()
        lr = float(self.opt.param_groups[0]["lr"])  # the step's learning rate
        self.opt.step()
        self.sched.step()
        self.steps += 1
        self._version += 1
        keys = sorted(sums) if self.rank == 0 else None
        keys = self._broadcast(keys) if self.world_size > 1 else keys
        vec = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64)
        if self.world_size > 1:
            dist.all_reduce(vec, group=self._ctrl)
        out = {k: float(v) for k, v in zip(keys, vec.tolist())}
        out["train/grad_norm"] = grad_norm
        out["train/tokens"] = float(num_tokens)
        out["train/lr"] = lr
        out.update(self._perf_metrics(batch, time.perf_counter() - t_start))
        return out

    @torch.no_grad()
    def _reference_logp(self, batch: TurnBatch, rows: np.ndarray) -> torch.Tensor:
        """The KL reference's token log-probs: the frozen copy, or with LoRA the same model with its
        adapters switched off (peft's disable_adapter: the base weights, no second copy of them)."""
        if self.peft is None:
            return self._token_logp(self.ref_model, batch, rows, reference=True)
        with self.peft.disable_adapter():
            return self._token_logp(self.model, batch, rows, reference=True)

    def _perf_metrics(self, batch: TurnBatch, seconds: float) -> dict[str, float]:
        """Throughput and memory of the step just taken (this rank's process): model FLOPs of the whole
        batch (`train_flops`) per second of the step, their share of world_size × peak_flops when set,
        this process's peak resident memory and, on an accelerator, its peak allocated memory."""
        import resource

        if not hasattr(self, "_n_params"):
            self._n_params = int(sum(p.numel() for p in self.model.parameters()))
        flops = train_flops(self.model.config, self._n_params, batch.contexts.lengths, batch.tokens.lengths)
        out = {
            "perf/learner_flops": flops,
            "perf/learner_flops_per_s": flops / seconds if seconds > 0 else 0.0,
            "memory/learner_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,  # KiB on Linux
        }
        if self.cfg.peak_flops:
            out["perf/learner_mfu"] = out["perf/learner_flops_per_s"] / (self.cfg.peak_flops * self.world_size)
        if self.device.type == "cuda":
            out["memory/learner_peak_accel_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return out

    def _clip_and_norm(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    def weights(self) -> dict[str, torch.Tensor]:
        """The full HF-named state dict on CPU (rank 0; other ranks get {}), for Sampler.load_weights."""
        return self._call("weights")

    def _do_weights(self, _: Any = None) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        cache = self._weights_cache
        if self.cfg.cache_weights and cache is not None and cache.version == (self._uid, self._version):
            return cache  # unchanged parameters: every rank takes this branch together (versions move in step)
        self._weights_cache = None
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        sd = _detached(sd) if self.world_size == 1 else sd  # more ranks: already gathered copies
        if self.peft is not None:  # the merged W₀ + (α/r)·B·A under the model folder's names
            from rtpo.llm.lora import merge_weights

            sd = merge_weights(sd, self.cfg.lora.scaling)
        if not self.cfg.cache_weights:
            return sd
        snap = WeightsSnapshot(sd)
        snap.version = (self._uid, self._version)
        self._weights_cache = snap
        return snap

    def state_dict(self) -> dict:
        return self._call("state_dict")

    def _do_state_dict(self, _: Any = None) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd, optim_sd = get_state_dict(self.model, self.opt, options=opts)
        model_sd = self._trained(model_sd)
        # the KL reference is the frozen model at model_path, which every learner loads at start: a
        # checkpoint leaves it out (a fifth of the file, with AdamW's two moments per weight)
        return _detached(
            {"model": model_sd, "optim": optim_sd, "ref": None, "steps": self.steps, "config": asdict(self.cfg)}
        )

    # -- sharded checkpoints (torch.distributed.checkpoint): every rank writes its own shard ------
    def save_sharded(self, path: str | os.PathLike) -> dict:
        """Write model and optimiser state to folder `path` with torch.distributed.checkpoint: each rank
        writes the shard it holds (no full gather; `.metadata` is written last, by rank 0, once every
        shard is on disk).  Weights that alias one another (a tied lm_head and the embeddings) are stored
        once.  The frozen KL reference is left out (every learner loads it from model_path).

        Returns (rank 0) the small state that goes beside the shards: steps, config, the tied keys and
        the folder actually holding the state — an earlier folder when nothing changed since this
        learner wrote it and it lies beside `path` (the end-of-run checkpoint after the last phase's)."""
        return self._call("save_sharded", str(path))

    def _sharded_state(self) -> tuple[dict, dict, dict[str, str]]:
        """The live sharded (DTensor) model and optimiser state dicts, minus aliased weights, and the
        map dropped key -> kept key.  The tensors share storage with the parameters and moments."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        model_sd = self._trained(model_sd)
        # aliases by parameter identity (the same on every rank, unlike a shard's storage)
        first: dict[int, str] = {}
        tied: dict[str, str] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            if id(param) in first and name in model_sd:
                tied[name] = first[id(param)]
                del model_sd[name]
            first.setdefault(id(param), name)
        return model_sd, optim_sd, tied

    def _trained(self, model_sd: dict) -> dict:
        """The part of a model state dict a checkpoint holds: all of it, or with LoRA the adapters alone
        (the frozen base is the model folder's, which every learner loads at start)."""
        if self.peft is None:
            return model_sd
        from rtpo.llm.lora import is_adapter_key

        return {k: v for k, v in model_sd.items() if is_adapter_key(k)}

    def _do_save_sharded(self, path: str) -> dict:
        import torch.distributed.checkpoint as dcp

        last = getattr(self, "_last_sharded", None)
        if (
            last is not None
            and last[0] == (self._uid, self._version)
            and Path(last[1]).parent == Path(path).parent
            and (Path(last[1]) / ".metadata").is_file()
        ):
            where = last[1]  # unchanged since it was written into this checkpoint folder: reuse it
        else:
            model_sd, optim_sd, tied = self._sharded_state()
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
            where = path
            self._last_sharded = ((self._uid, self._version), path, tied)
        tied = self._last_sharded[2]
        return {
            "dir": where,
            "steps": self.steps,
            "tied": tied,
            "world_size": self.world_size,
            "config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state_dict() (full tensors; held by rank 0 and broadcast) or the sharded state a
        checkpoint read back from save_sharded ({"format": "torch-dcp", "path", ...}: every rank reads
        its own shard from the folder, under any world size)."""
        if isinstance(state, dict) and state.get("format") == "torch-dcp":
            self._call("load_sharded", {k: state[k] for k in ("path", "steps", "tied")})
            return
        # the (large) state stays on rank 0 and is broadcast tensor by tensor by torch
        self._pending_state = state
        self._call("load_state_dict", None)

    def _do_load_sharded(self, info: dict) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        model_sd, optim_sd, tied = self._sharded_state()
        if tied != info["tied"]:
            raise ValueError(f"checkpoint ties {info['tied']}, this model ties {tied}")
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=info["path"])
        set_state_dict(
            self.model,
            self.opt,
            model_state_dict=model_sd,
            optim_state_dict=optim_sd,
            options=StateDictOptions(strict=False),  # the tied keys left out are the kept ones' storage
        )
        self.steps = int(info["steps"])
        restore_lr(self.sched, self.steps)
        self._version += 1  # new parameters: cached weights and forward passes no longer hold
        self._weights_cache, self._fwd_cache = None, None

    def _do_load_state_dict(self, _: Any = None) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_state_dict,
        )

        state = getattr(self, "_pending_state", None) if self.rank == 0 else None
        self._pending_state = None
        multi = self.world_size > 1
        # with LoRA a state holds the adapters alone: the base weights it leaves out stay as loaded
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=multi, strict=self.peft is None)
        if self.rank == 0:
            model_sd, optim_sd, ref = state["model"], state["optim"], state.get("ref")
            has_ref = ref is not None
        else:
            model_sd, optim_sd, ref, has_ref = {}, {}, None, False
        has_ref = self._broadcast(has_ref) if multi else has_ref
        set_state_dict(self.model, self.opt, model_state_dict=model_sd, optim_state_dict=optim_sd, options=opts)
        if has_ref and self.ref_model is not None:
            set_model_state_dict(self.ref_model, ref if self.rank == 0 else {}, options=opts)
        steps = self._broadcast(state["steps"] if self.rank == 0 else None) if multi else state["steps"]
        self.steps = int(steps)
        restore_lr(self.sched, self.steps)
        self._version += 1  # new parameters: cached weights and forward passes no longer hold
        self._weights_cache, self._fwd_cache = None, None

    def save_pretrained(self, out_dir: str | os.PathLike) -> Path | None:
        """An HF-format model folder (config, safetensors, tokenizer, generation config) of the current
        weights, loadable by vLLM and transformers (rtpo.llm.hf_folder.write_hf_folder); rank 0 returns it."""
        weights = self.weights()
        if self.rank != 0:
            return None
        from rtpo.llm.hf_folder import write_hf_folder

        return write_hf_folder(self.model_path, weights, out_dir)

    def close(self) -> None:
        """Stop the worker ranks (rank 0) and join their processes."""
        if self.rank == 0 and self.world_size > 1 and self._workers:
            self._broadcast(("stop", None))
            for p in self._workers:
                p.join(timeout=60)
            self._workers = []

    # -- input checks ------------------------------------------------------------------------------
    def _check(self, batch: TurnBatch) -> None:
        for name, r in (("contexts", batch.contexts), ("tokens", batch.tokens)):
            v = r.values
            if v.size and (v.min() < 0 or v.max() >= self.vocab_size):
                raise ValueError(f"TurnBatch.{name} holds token ids outside [0, {self.vocab_size})")
        if np.any(batch.contexts.lengths == 0):
            raise ValueError("TurnBatch.contexts rows must hold at least one token (the response is predicted from it)")

    def _gather(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size if self.rank == 0 else None  # type: ignore[assignment]
        dist.gather_object(obj, out, dst=0, group=self._ctrl)
        return out


def _worker_main(
    rank: int,
    world_size: int,
    model_path: str,
    cfg: LearnerConfig,
    backend: str | None,
    addr: str,
    port: int,
    threads: int | None,
) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    if threads:
        torch.set_num_threads(threads)
    learner = FSDPLearner(model_path, cfg, rank=rank, world_size=world_size, backend=backend)
    try:
        learner.serve()
    finally:
        dist.destroy_process_group()


def launch_learner(
    model_path: str | os.PathLike,
    cfg: LearnerConfig = LearnerConfig(),
    world_size: int = 1,
    backend: str | None = None,
    threads_per_rank: int | None = None,
    device: str | torch.device | None = None,
) -> FSDPLearner:
    """Rank 0's learner in this (driver) process, with ranks 1..N−1 spawned as worker processes.

    Call `close()` on the result to stop the workers.  threads_per_rank bounds torch's intra-op
    threads in every rank (useful when N ranks share a few CPU cores).  device: rank 0's (FSDPLearner).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if threads_per_rank:
        torch.set_num_threads(threads_per_rank)
    if world_size == 1:
        return FSDPLearner(model_path, cfg, rank=0, world_size=1, backend=backend, device=device)
    import multiprocessing as mp

    addr, port = "127.0.0.1", _free_port()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(1, world_size):
        p = ctx.Process(
            target=_worker_main,
            args=(rank, world_size, str(model_path), cfg, backend, addr, port, threads_per_rank),
            daemon=True,
        )
        p.start()
        procs.append(p)
    learner = FSDPLearner(model_path, cfg, rank=0, world_size=world_size, backend=backend, device=device)
    learner._workers = procs
    return learner
