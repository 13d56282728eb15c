"""What one iteration of an llm scenario generates, trains, holds in memory and costs in time, from the
resolved scenario alone (docs/plan.md has every formula and the validation).

Counts are exact functions of the config and two episode-shape assumptions (`Assumptions.reach`, the
probability an episode takes its next turn, and `fill`, the share of max_tokens a response uses); with
both at 1 (the default) they are the upper bounds the scenario files' batch arithmetic states.
Memory is per worker (each learner rank, each engine, the driver's copies) and per device; time is a
roofline estimate: generation bound by memory bandwidth per decode step, prefill and training by
FLOP/s at the hardware's efficiencies, weight syncs by the link, plus fixed per-step overheads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rtpo.plan.hardware import GB, Hardware
from rtpo.plan.shapes import ModelShape
from rtpo.scenario.schema import ConfigError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
VLLM_MAX_NUM_SEQS = 256  # vLLM's default cap on sequences decoded together
VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's gpu_memory_utilization when the scenario leaves it null
VLLM_ACTIVATION_GB = 1.0  # vLLM's profiled activation peak + CUDA graphs, held outside the KV cache (GPU)
LOGIT_COPIES = 3  # fp32 vocab-sized tensors per kept position: scaled logits, log-softmax, their gradient


class DoesNotFit(ConfigError):
    """A worker's memory exceeds its device's: the one-line message names the worker and the amounts."""


@dataclass(frozen=True)
class Assumptions:
    """Episode shape the counts and times depend on (the config bounds them; a run measures them).

    reach:         probability that an episode goes on to its next turn (1 = every episode uses all K).
    fill:          share of backend.max_tokens a response uses (1 = every response hits the limit).
    prompt_tokens: tokens of a first-turn context (question, system prompt, tool schemas).
    tool_tokens:   tokens a turn adds to the next context besides the response (tool output, feedback).
    think_share:   share of a response the context map drops from later contexts (think_strip).
    """

    reach: float = 1.0
    fill: float = 1.0
    prompt_tokens: int = 256
    tool_tokens: int = 64
    think_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.reach <= 1 or not 0 < self.fill <= 1 or not 0 <= self.think_share <= 1:
            raise ConfigError("plan assumptions: reach and fill must be in (0, 1], think_share in [0, 1]")
        if self.prompt_tokens < 1 or self.tool_tokens < 0:
            raise ConfigError("plan assumptions: prompt_tokens must be >= 1 and tool_tokens >= 0")

    @staticmethod
    def parse(items: list[str] | tuple[str, ...]) -> Assumptions:
        """`key=value` strings (the CLI's --assume) -> Assumptions; an unknown key is a one-line error."""
        known = {f: type(getattr(Assumptions(), f)) for f in asdict(Assumptions())}
        out: dict[str, Any] = {}
        for item in items:
            key, sep, value = str(item).partition("=")
            if not sep or key not in known:
                raise ConfigError(f"--assume {item!r}: expected KEY=VALUE with KEY one of {', '.join(known)}")
            try:
                out[key] = known[key](float(value)) if known[key] is int else float(value)
            except ValueError:
                raise ConfigError(f"--assume {item!r}: {value!r} is not a number") from None
        return Assumptions(**out)


@dataclass(frozen=True)
class PhasePlan:
    """One phase of an iteration (RTPO: the trunk rollout, then turn K-1 down to 0; a flat method: one).

    trunks, siblings: episodes started (RTPO's kinds; a flat method's are all `trunks`).
    boundaries:       turn-k boundary states forked from (RTPO phases).
    turns:            responses generated; generated_tokens: their tokens.
    trained_rows:     rows in the loss; trained_tokens: their response tokens (what the loss averages).
    learner_tokens:   context + response tokens the learner's forward passes read per epoch.
    syncs:            weight transfers to the engines (a sync of unchanged weights is skipped).
    *_s:              the time estimate's parts.
    """

    name: str
    trunks: float
    siblings: float
    boundaries: float
    turns: float
    generated_tokens: float
    trained_rows: float
    trained_tokens: float
    learner_tokens: float
    syncs: int
    generate_s: float = 0.0
    prefill_s: float = 0.0
    train_s: float = 0.0
    sync_s: float = 0.0
    overhead_s: float = 0.0

    @property
    def rollouts(self) -> float:
        return self.trunks + self.siblings

    @property
    def time_s(self) -> float:
        return self.generate_s + self.prefill_s + self.train_s + self.sync_s + self.overhead_s


@dataclass(frozen=True)
class WorkerMemory:
    """Bytes one worker holds on one device, item by item."""

    worker: str
    device: str
    items: tuple[tuple[str, float], ...]

    @property
    def total(self) -> float:
        return float(sum(v for _, v in self.items))


@dataclass(frozen=True)
class DeviceMemory:
    """Every worker sharing one device (or the host, on a cpu entry) against its capacity."""

    device: str
    workers: tuple[WorkerMemory, ...]
    capacity: float

    @property
    def total(self) -> float:
        return float(sum(w.total for w in self.workers))

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


@dataclass(frozen=True)
class Plan:
    scenario: str
    method: str
    hardware: Hardware
    shape: ModelShape
    assumptions: Assumptions
    iterations: int
    phases: tuple[PhasePlan, ...]
    workers: tuple[WorkerMemory, ...]
    devices: tuple[DeviceMemory, ...]
    devices_needed: int
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    def iteration(self) -> dict[str, float]:
        """Totals of one iteration (every PhasePlan count and time summed)."""
        keys = ("trunks", "siblings", "boundaries", "turns", "generated_tokens", "trained_rows", "trained_tokens")
        out = {k: float(sum(getattr(p, k) for p in self.phases)) for k in keys}
        out["rollouts"] = out["trunks"] + out["siblings"]
        out["syncs"] = float(sum(p.syncs for p in self.phases))
        for k in ("generate_s", "prefill_s", "train_s", "sync_s", "overhead_s", "time_s"):
            out[k] = float(sum(getattr(p, k) for p in self.phases))
        return out

    def worst(self) -> DeviceMemory:
        return max(self.devices, key=lambda d: d.total / d.capacity)

    def refusal(self) -> str | None:
        """The one-line reason the scenario will not fit, naming the worker and the amounts; None if it fits."""
        over = [d for d in self.devices if not d.fits]
        if not over:
            return None
        d = max(over, key=lambda d: d.total - d.capacity)
        big = max(d.workers, key=lambda w: w.total)
        parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in big.items if v >= 0.05 * GB) or "…"
        others = (
            f" with {len(d.workers) - 1} other worker(s) ({(d.total - big.total) / GB:.1f} GB)"
            if len(d.workers) > 1
            else ""
        )
        return (
            f"{self.scenario} does not fit on {self.hardware.name}: {d.device} needs {d.total / GB:.1f} GB > "
            f"{d.capacity / GB:.1f} GB — {big.worker} holds {big.total / GB:.1f} GB ({parts} GB){others}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "method": self.method,
            "hardware": self.hardware.to_dict(),
            "model": {**asdict(self.shape), "params": self.shape.params},
            "assumptions": asdict(self.assumptions),
            "iterations": self.iterations,
            "phases": [{**asdict(p), "rollouts": p.rollouts, "time_s": p.time_s} for p in self.phases],
            "iteration": self.iteration(),
            "run_s": self.iteration()["time_s"] * self.iterations,
            "workers": [
                {"worker": w.worker, "device": w.device, "items": dict(w.items), "total": w.total} for w in self.workers
            ],
            "devices": [
                {"device": d.device, "total": d.total, "capacity": d.capacity, "fits": d.fits} for d in self.devices
            ],
            "devices_needed": self.devices_needed,
            "fits": self.fits,
            "refusal": self.refusal(),
            "notes": list(self.notes),
        }


# -- counts -----------------------------------------------------------------------------------------
def _turns(reach: float, n: int) -> float:
    """Expected responses of an episode with n turns available: sum_{j<n} reach^j."""
    return float(sum(reach**j for j in range(n)))


def _context(a: Assumptions, max_tokens: int, k: int, limit: int | None) -> float:
    """Tokens of the turn-k context c_k: the prompt plus k earlier turns (kept response + tool tokens)."""
    c = a.prompt_tokens + k * (a.fill * max_tokens * (1 - a.think_share) + a.tool_tokens)
    return float(min(c, limit) if limit is not None else c)


@dataclass(frozen=True)
class _Setting:
    K: int
    max_tokens: int
    limit: int | None
    a: Assumptions


def _episodes(s: _Setting, n: float, first_turn: int) -> tuple[float, float, list[tuple[float, float]]]:
    """n episodes starting at turn `first_turn`: (turns, tokens, [(active episodes, context) per turn])."""
    per_turn = []
    for j in range(s.K - first_turn):
        per_turn.append((n * s.a.reach**j, _context(s.a, s.max_tokens, first_turn + j, s.limit)))
    turns = sum(x for x, _ in per_turn)
    return turns, turns * s.a.fill * s.max_tokens, per_turn


def count_phases(cfg, K: int, limit: int | None, a: Assumptions) -> tuple[list[PhasePlan], list[list]]:
    """Per-phase counts of one iteration of cfg's method, and each phase's (active, context) per turn."""
    from rtpo.core.methods.flat import GroupRelative
    from rtpo.core.methods.reverse import ReverseTurn

    method = cfg.method.build()
    mc = cfg.method.config
    q = cfg.budget.queries_per_iteration
    s = _Setting(K, cfg.backend.max_tokens, limit, a)
    resp = a.fill * s.max_tokens
    phases: list[PhasePlan] = []
    shapes: list[list] = []
    epochs = getattr(mc, "epochs", 1)
    if isinstance(method, ReverseTurn):
        n_t = q * mc.trunks_per_query
        turns, tokens, per = _episodes(s, n_t, 0)
        phases.append(PhasePlan("trunks", n_t, 0.0, 0.0, turns, tokens, 0.0, 0.0, 0.0, syncs=1))
        shapes.append(per)
        for k in range(K - 1, -1, -1):
            b = n_t * a.reach**k
            sib = (mc.G - 1) * b
            turns, tokens, per = _episodes(s, sib, k)
            ctx = _context(a, s.max_tokens, k, limit)
            # the first reverse phase syncs the θ its trunks ran under: the engine skips that reload
            syncs = 0 if k == K - 1 else 1
            phases.append(
                PhasePlan(f"turn {k}", 0.0, sib, b, turns, tokens, sib, sib * resp, sib * (ctx + resp) * epochs, syncs)
            )
            shapes.append(per)
        return phases, shapes
    if isinstance(method, GroupRelative):
        n = q * method.group_size()
    else:
        n = q * float(method.rollouts_per_query(K) or 1)
    turns, tokens, per = _episodes(s, n, 0)
    learner = sum(x * (c + resp) for x, c in per) * epochs
    phases.append(PhasePlan("update", n, 0.0, 0.0, turns, tokens, turns, tokens, learner, syncs=1))
    shapes.append(per)
    return phases, shapes


# -- memory -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Where the workers of a scenario sit (rtpo.llm.build, rtpo.distributed)."""

    engines: int  # rollout engines
    tp: int  # devices per engine
    ranks: int  # learner ranks that train
    ranks_on_devices: bool  # trainer ranks hold accelerators (else the host's memory)
    distributed: str
    tool_workers: int


def layout(cfg) -> Layout:
    b = cfg.backend
    if b.distributed == "ray":
        from rtpo.distributed.resources import Resources

        try:
            r = Resources.from_dict(cfg.resources)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        tp = max(1, int(math.ceil(r.gpus_per_rollout_worker)))
        ranks = r.trainer_workers or b.world_size
        return Layout(r.rollout_workers, tp, ranks, r.gpus_per_trainer_worker > 0, "ray", r.tool_workers)
    return Layout(1, b.tensor_parallel_size, b.world_size, True, b.distributed, 0)


def learner_memory(cfg, shape: ModelShape, ranks: int, micro_tokens: float, resp_tokens: float) -> list:
    """One learner rank's items (bytes): sharded weights, gradients, AdamW moments and KL reference;
    FSDP2's gathered units; activations of one micro-batch; the vocab-sized log-prob tensors."""
    b = cfg.backend
    pb = DTYPE_BYTES[b.param_dtype]
    compute = b.mixed_precision or b.param_dtype
    cb = DTYPE_BYTES[compute]
    p = shape.params
    kl = getattr(cfg.method.config, "kl_coef", 0.0) > 0
    fsdp = ranks > 1 or b.mixed_precision is not None
    items = [
        ("weights", p * pb / ranks),
        ("grads", p * pb / ranks),
        ("adamw", 2 * p * pb / ranks),
    ]
    if kl:
        items.append(("kl_reference", p * pb / ranks))
    if fsdp:  # the root unit stays gathered; two layers at a time (current + prefetch), plus a layer's grads
        items.append(("fsdp_gathered", (shape.root_params + 2 * shape.layer_params) * cb + shape.layer_params * 4))
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    full_layer = cb * (4 * h + 3 * q + 4 * kv + 4 * i)  # saved tensors of one layer per token
    if b.gradient_checkpointing:
        act = micro_tokens * (shape.layers * cb * h + full_layer)
    else:
        act = micro_tokens * shape.layers * full_layer
    items.append(("activations", act))
    items.append(("logits", resp_tokens * shape.vocab * 4 * LOGIT_COPIES))
    return items


def engine_memory(cfg, shape: ModelShape, hw: Hardware, tp: int) -> tuple[list, float]:
    """One device of an engine: (items, KV-cache tokens it holds).  On a gpu entry with
    gpu_memory_utilization u the engine claims u of the device, weights and activations first, the rest
    KV cache; with kv_cache_gb the cache is that size."""
    b = cfg.backend
    eb = DTYPE_BYTES[b.engine_dtype]
    weights = shape.params * eb / tp
    items = [("weights", weights)]
    if hw.kind == "gpu" and b.kv_cache_gb is None:
        u = b.gpu_memory_utilization or VLLM_DEFAULT_UTILIZATION
        act = VLLM_ACTIVATION_GB * GB
        kv = u * hw.memory_bytes - weights - act - hw.runtime_overhead_gb * GB
        items += [("activations", act), ("kv_cache", kv)]
    else:
        kv = (b.kv_cache_gb if b.kv_cache_gb is not None else 4.0) * 2**30
        items.append(("kv_cache", kv))
    if hw.kind == "gpu":
        items.append(("runtime", hw.runtime_overhead_gb * GB))
    return items, max(kv, 0.0) / (shape.kv_bytes_per_token(eb) / tp)


def _micro(cfg, phases: list[PhasePlan], ranks: int) -> tuple[float, float]:
    """(tokens, response tokens) of the largest micro-batch: whole rows up to micro_batch_tokens."""
    mb = cfg.backend.micro_batch_tokens
    worst = (0.0, 0.0)
    for p in phases:
        if p.trained_rows <= 0:
            continue
        row = p.learner_tokens / p.trained_rows / max(1, getattr(cfg.method.config, "epochs", 1))
        resp = p.trained_tokens / p.trained_rows
        per_rank = math.ceil(p.trained_rows / ranks)
        rows = max(1, min(per_rank, int(mb // row) if row <= mb else 1))
        cand = (rows * row, rows * resp)
        worst = max(worst, cand)
    return worst


# -- time -------------------------------------------------------------------------------------------
def _generation_time(
    per_turn: list, shape: ModelShape, hw: Hardware, lay: Layout, eb: int, kv_tokens: float, cfg, a: Assumptions
) -> tuple[float, float, float]:
    """(decode s, prefill s, turn overhead s) of a phase whose turn j has per_turn[j] = (episodes, context)."""
    bw = hw.mem_bw_gbs * GB * hw.decode_efficiency * lay.tp
    flops = hw.peak_flops(cfg.backend.engine_dtype) * lay.tp
    resp = a.fill * cfg.backend.max_tokens
    decode = prefill = over = 0.0
    for active, ctx in per_turn:
        if active <= 0:
            continue
        per_engine = active / lay.engines
        avg_len = ctx + resp / 2
        batch = max(1.0, min(per_engine, VLLM_MAX_NUM_SEQS, kv_tokens / max(avg_len + resp / 2, 1.0)))
        waves = math.ceil(per_engine / batch - 1e-9)
        step = max(
            (shape.params * eb + batch * avg_len * shape.kv_bytes_per_token(eb)) / bw,
            2 * shape.matmul_params * batch / (flops * hw.prefill_efficiency),
        )
        # a turn with fewer than one expected episode runs with probability <= that expectation
        happens = min(1.0, active)
        decode += happens * waves * resp * (step + hw.step_overhead_s)
        # prefill: every context token through the layers, the lm_head at each sequence's last position
        pre_flops = per_engine * (ctx * 2 * shape.body_params + 2 * shape.head_params)
        prefill += happens * pre_flops / (flops * hw.prefill_efficiency)
        over += happens * hw.turn_overhead_s
    return decode, prefill, over


def _train_time(p: PhasePlan, cfg, shape: ModelShape, hw: Hardware, ranks: int) -> tuple[float, float]:
    """(train s, micro-batch overhead s): forward+backward (+ recompute with checkpointing, + the KL
    reference's and the ratio pass's forwards) at train_efficiency of the compute dtype's peak."""
    if p.trained_rows <= 0:
        return 0.0, 0.0
    b = cfg.backend
    mc = cfg.method.config
    epochs = getattr(mc, "epochs", 1)
    row = p.learner_tokens / p.trained_rows / epochs
    resp_share = p.trained_tokens / p.trained_rows / row  # logits only at response positions (logits_to_keep)
    attn = 2 * 2 * shape.layers * shape.q_dim * row / 2  # QK^T and AV over the causal half of the row
    fwd = 2 * shape.body_params + attn + 2 * shape.head_params * resp_share  # FLOPs per token of one forward
    passes = 3 + (1 if b.gradient_checkpointing else 0)  # forward + backward (2x), + the recompute
    per_rank_tokens = p.learner_tokens / ranks
    micro = max(1, math.ceil(per_rank_tokens / epochs / b.micro_batch_tokens))
    extra = 0.0
    if micro > 1:  # the rollout/train ratio pass is reused only when a rank's batch is one micro-batch
        extra += 1
    if getattr(mc, "kl_coef", 0.0) > 0:
        extra += 1
    flops = per_rank_tokens * fwd * passes + per_rank_tokens / epochs * fwd * extra
    rate = hw.peak_flops(b.mixed_precision or b.param_dtype) * hw.train_efficiency
    opt_bytes = 2 * 4 * shape.params * DTYPE_BYTES[b.param_dtype] / ranks  # AdamW reads and writes 4 tensors
    optimizer = epochs * opt_bytes / (hw.mem_bw_gbs * GB)
    return flops / rate + optimizer, epochs * micro * hw.train_step_overhead_s


def _one_node(
    workers: list, devices: list, eng_items: list, rank_items: list, tp: int, ranks: int, cap: float, who: str
) -> None:
    """Devices of one node's engine and learner, as rtpo.llm.build places them: the engine's tp devices are
    shared with learner ranks 0..tp-1, further ranks get their own."""
    start = len(devices)
    for d in range(max(ranks, tp)):
        here = []
        if d < tp:
            here.append(WorkerMemory(f"{who}engine" + (f" (tp {d})" if tp > 1 else ""), "gpu", tuple(eng_items)))
        if d < ranks:
            here.append(WorkerMemory(f"{who}learner rank {d}", "gpu", tuple(rank_items)))
        workers.extend(here)
        name = f"gpu {start + d}" + (f" ({who.strip()})" if who else "")
        devices.append(DeviceMemory(name, tuple(here), cap))


def plan(cfg, hardware: str | Hardware | None = None, assumptions: Assumptions | None = None) -> Plan:
    """The plan of a resolved llm scenario (ScenarioConfig) on `hardware` (a table name, a file, a
    Hardware, or None: this machine)."""
    from rtpo.llm.schema import context_limit
    from rtpo.plan import hardware as hwmod
    from rtpo.plan.shapes import resolve

    if cfg.backend.kind != "llm":
        raise ConfigError(f"rtpo plan sizes llm scenarios; {cfg.name} has backend.kind {cfg.backend.kind!r}")
    hw = hwmod.get(hardware if hardware is not None else getattr(cfg.backend, "hardware", None))
    a = assumptions or Assumptions()
    b = cfg.backend
    shape = resolve(b.model, b.tiny_tokenizer)
    K = cfg.task.num_turns
    try:
        limit = context_limit(cfg.task, b) if hasattr(cfg.task, "max_context_tokens") else b.max_model_len
    except ConfigError:
        limit = b.max_model_len
    lay = layout(cfg)
    phases, shapes = count_phases(cfg, K, limit, a)
    notes: list[str] = []

    # memory: the workers
    micro_tokens, micro_resp = _micro(cfg, phases, lay.ranks)
    rank_items = learner_memory(cfg, shape, lay.ranks, micro_tokens, micro_resp)
    if hw.kind == "gpu" and lay.ranks_on_devices:
        rank_items.append(("runtime", hw.runtime_overhead_gb * GB))
    eng_items, kv_tokens = engine_memory(cfg, shape, hw, lay.tp)
    eng_dev = "gpu" if hw.kind == "gpu" else "host"
    workers: list[WorkerMemory] = []
    devices: list[DeviceMemory] = []
    eb = DTYPE_BYTES[b.engine_dtype]
    if hw.kind == "cpu":  # one host: every process of the run shares its memory
        for e in range(lay.engines):
            workers.append(WorkerMemory(f"engine {e}", "host", tuple(eng_items)))
        for r in range(lay.ranks):
            workers.append(WorkerMemory(f"learner rank {r}", "host", tuple(rank_items)))
        if lay.distributed == "ray":  # the driver keeps its own engine and learner for evaluation
            drv = learner_memory(cfg, shape, b.world_size, micro_tokens, micro_resp)
            for r in range(b.world_size):
                workers.append(WorkerMemory(f"driver learner rank {r}", "host", tuple(drv)))
            workers.append(WorkerMemory("driver engine", "host", tuple(eng_items)))
        devices.append(DeviceMemory("host", tuple(workers), hw.memory_bytes))
        needed = 1
    elif lay.distributed == "ray":
        for e in range(lay.engines):
            for t in range(lay.tp):
                w = WorkerMemory(
                    f"rollout worker {e}" + (f" (tp {t})" if lay.tp > 1 else ""), eng_dev, tuple(eng_items)
                )
                workers.append(w)
                devices.append(DeviceMemory(f"gpu {len(devices)} ({w.worker})", (w,), hw.memory_bytes))
        for r in range(lay.ranks):
            w = WorkerMemory(f"trainer rank {r}", "gpu" if lay.ranks_on_devices else "host", tuple(rank_items))
            workers.append(w)
            if lay.ranks_on_devices:
                devices.append(DeviceMemory(f"gpu {len(devices)} ({w.worker})", (w,), hw.memory_bytes))
        # the driver builds its own engine for evaluation (rtpo.llm.build, role driver) on its node's devices,
        # outside the placement group, and a one-rank learner in host memory that only holds the trainer
        # group's weights for it (rtpo.llm.build.driver_learner_layout): counted here
        placed = len(devices)
        for t in range(lay.tp):
            w = WorkerMemory("driver engine" + (f" (tp {t})" if lay.tp > 1 else ""), eng_dev, tuple(eng_items))
            workers.append(w)
            devices.append(DeviceMemory(f"gpu {len(devices)} ({w.worker})", (w,), hw.memory_bytes))
        weights = [item for item in learner_memory(cfg, shape, 1, micro_tokens, micro_resp) if item[0] == "weights"]
        workers.append(WorkerMemory("driver learner (weights for evaluation)", "host", tuple(weights)))
        needed = len(devices)
        notes.append(
            f"{needed - placed} of the {needed} devices are the driver's evaluation engine (rtpo.llm.build role "
            "driver): outside the placement group, on the node the driver runs on; its learner holds the "
            "trainer group's weights in host memory"
        )
    else:  # one node: the engine's tp devices are shared with learner ranks 0..tp-1
        _one_node(workers, devices, eng_items, rank_items, lay.tp, lay.ranks, hw.memory_bytes, "")
        needed = len(devices)
    if kv_tokens < (b.max_model_len or 0):
        notes.append(
            f"the engine's KV cache holds {kv_tokens:.0f} tokens, fewer than one sequence of max_model_len "
            f"{b.max_model_len}: vLLM refuses to start"
        )

    # time
    timed = []
    for p, per in zip(phases, shapes):
        dec, pre, over = _generation_time(per, shape, hw, lay, eb, kv_tokens, cfg, a)
        tr, tr_over = _train_time(p, cfg, shape, hw, lay.ranks)
        sync = p.syncs * (shape.params * eb / (hw.link_gbs * GB) + hw.sync_overhead_s)
        timed.append(replace(p, generate_s=dec, prefill_s=pre, train_s=tr, sync_s=sync, overhead_s=over + tr_over))
    iters = cfg.budget.iterations
    per_iter = sum(p.rollouts for p in timed)
    if cfg.budget.max_rollouts is not None and per_iter > 0:
        iters = min(iters, math.ceil(cfg.budget.max_rollouts / per_iter))
    return Plan(
        scenario=cfg.name,
        method=cfg.method.name,
        hardware=hw,
        shape=shape,
        assumptions=a,
        iterations=iters,
        phases=tuple(timed),
        workers=tuple(workers),
        devices=tuple(devices),
        devices_needed=needed,
        notes=tuple(notes),
    )
