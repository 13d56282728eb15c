"""Weight broadcast over a collective: trainer rank 0 → every rollout worker, without the object store.

`resources.weight_sync: collective` puts trainer rank 0 (weight-group rank 0) and the rollout workers
(ranks 1..W) in a process group of their own — gloo on CPU, NCCL when both sides hold GPUs — built
directly from a TCPStore served by rank 0, so it never touches the trainer's FSDP default group or the
process group an in-process vLLM creates.  A sync is one `broadcast` per bucket: the weights are
flattened per dtype into buckets of at most `bucket_mb`, so a 16 GB model is a few dozen calls, not
one per tensor and not one copy per receiver through the object store.

Failures: a rollout worker that dies breaks the group.  The sync that notices it falls back to the
object store for that version (rank 0 kept the weights it was broadcasting), the pool revives the
worker as usual, and the next sync forms the group again under a new epoch (same store, new prefix).
A worker revived mid-phase catches up from the object store too (`WeightCache.put`), so a re-run
chunk always sees exactly the weights of its version.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# -- weights as leaves ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    """One array of a weights object: its key (None for a bare array), shape, dtype, and array kind."""

    key: str | None
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    numpy: bool  # True: the sampler takes numpy (tabular); False: torch tensors (LLM state dicts)


@dataclass(frozen=True)
class WeightSpec:
    """The layout of a weights object, so receivers can allocate before the data arrives."""

    leaves: tuple[Leaf, ...]
    mapping: bool  # a {name: array} dict, or one bare array


def _as_tensor(x: Any):
    import torch

    return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x


def spec_of(weights: Any) -> WeightSpec:
    """The WeightSpec of a {name: tensor/ndarray} mapping or of one ndarray/tensor."""
    import torch

    if isinstance(weights, Mapping):
        items, mapping = list(weights.items()), True
    elif isinstance(weights, (np.ndarray, torch.Tensor)):
        items, mapping = [(None, weights)], False
    else:
        raise TypeError(f"collective weight sync sends a mapping of arrays or one array, got {type(weights).__name__}")
    leaves = []
    for key, value in items:
        if not isinstance(value, (np.ndarray, torch.Tensor)):
            raise TypeError(f"weight {key!r} is a {type(value).__name__}, not an array")
        t = _as_tensor(value)
        leaves.append(Leaf(key, tuple(t.shape), str(t.dtype).removeprefix("torch."), isinstance(value, np.ndarray)))
    return WeightSpec(tuple(leaves), mapping)


def buckets(spec: WeightSpec, bucket_bytes: int) -> list[tuple[str, list[int]]]:
    """Leaves grouped by dtype into buckets of at most bucket_bytes (a larger leaf gets its own bucket):
    [(dtype, [leaf index, ...]), ...], the order both sides iterate in."""
    import torch

    out: list[tuple[str, list[int]]] = []
    by_dtype: dict[str, list[int]] = {}
    for i, leaf in enumerate(spec.leaves):
        by_dtype.setdefault(leaf.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        size = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        cur: list[int] = []
        cur_bytes = 0
        for i in idx:
            n = int(np.prod(spec.leaves[i].shape)) * size
            if cur and cur_bytes + n > bucket_bytes:
                out.append((dtype, cur))
                cur, cur_bytes = [], 0
            cur.append(i)
            cur_bytes += n
        if cur:
            out.append((dtype, cur))
    return out


# -- the group -----------------------------------------------------------------------------------------


def _broadcast(pg: Any, tensor: Any) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([tensor], opts).wait()


class WeightGroupMember:
    """One member's side of the weight group (rank 0 sends, the others receive).

    Rank 0 also serves the TCPStore every epoch's group meets at; `address()` gives it to the driver.
    """

    def __init__(self) -> None:
        self._store: Any = None
        self._pg: Any = None
        self._epoch = -1

    def serve_store(self, size_hint: int) -> tuple[str, int]:
        """Rank 0: start the store on a free port (once) and return (host, port)."""
        import socket

        import torch.distributed as dist

        if self._store is None:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            self._store = dist.TCPStore(
                "0.0.0.0", port, size_hint, True, timeout=datetime.timedelta(seconds=300), wait_for_workers=False
            )
            self._address = (_node_ip(), port)
        return self._address

    def join(self, host: str, port: int, rank: int, size: int, epoch: int, backend: str, timeout_s: float) -> None:
        """Form (or re-form) the group of `epoch`; blocks until all `size` members have joined."""
        import torch.distributed as dist

        if self._pg is not None:
            self.leave()
        store = self._store
        if store is None:
            store = dist.TCPStore(host, port, size, False, timeout=datetime.timedelta(seconds=timeout_s))
        prefixed = dist.PrefixStore(f"rtpo-weights-{epoch}", store)
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "nccl":
            self._pg = dist.ProcessGroupNCCL(prefixed, rank, size, dist.ProcessGroupNCCL.Options())
        elif backend == "gloo":
            self._pg = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
        else:
            raise ValueError(f"weight sync backend must be gloo or nccl, got {backend!r}")
        self._client = store  # keep a client store alive as long as its group
        self._rank, self._epoch, self._backend = rank, epoch, backend

    def leave(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            try:
                pg.shutdown()
            except Exception:  # a broken group may refuse a clean shutdown; it is dropped either way
                pass

    def _device(self):
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self._backend == "nccl" else torch.device("cpu")

    def send(self, weights: Any, bucket_bytes: int) -> float:
        """Rank 0: broadcast `weights` (any spec_of-able object); returns the seconds spent."""
        import torch

        t0 = time.perf_counter()
        spec = spec_of(weights)
        tensors = list(weights.values()) if spec.mapping else [weights]
        for dtype, idx in buckets(spec, bucket_bytes):
            flat = torch.cat([_as_tensor(tensors[i]).reshape(-1) for i in idx]).to(self._device())
            if flat.dtype != getattr(torch, dtype):
                raise TypeError(f"bucket dtype {flat.dtype} differs from the spec's {dtype}")
            _broadcast(self._pg, flat)
        return time.perf_counter() - t0

    def receive(self, spec: WeightSpec, bucket_bytes: int) -> Any:
        """Ranks 1..: receive a weights object laid out as `spec` (numpy leaves come back as numpy)."""
        import torch

        out: list[Any] = [None] * len(spec.leaves)
        for dtype, idx in buckets(spec, bucket_bytes):
            sizes = [int(np.prod(spec.leaves[i].shape)) for i in idx]
            flat = torch.empty(sum(sizes), dtype=getattr(torch, dtype), device=self._device())
            _broadcast(self._pg, flat)
            for i, part in zip(idx, torch.split(flat, sizes)):
                leaf = spec.leaves[i]
                t = part.view(leaf.shape)
                out[i] = t.cpu().numpy().copy() if leaf.numpy else t.clone()
        if not spec.mapping:
            return out[0]
        return {leaf.key: value for leaf, value in zip(spec.leaves, out)}


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (unit tests of the group itself)
        return "127.0.0.1"


# -- the driver's side -----------------------------------------------------------------------------------


class CollectiveWeightSync:
    """Driver-side orchestration of the weight group between a RayLearner and a RayRolloutPool.

    sync(): trainer rank 0 computes the weights (its FSDP peers take part as the learner requires) and
    broadcasts them; every rollout worker receives and loads them, all concurrently.  Metrics:
    ray/weight_sync_s (whole sync), ray/weight_broadcast_s (rank 0's sending time), ray/weight_group_forms,
    ray/weight_sync_fallbacks (syncs that went through the object store after a failure).
    """

    def __init__(
        self, learner: Any, pool: Any, backend: str = "gloo", bucket_mb: float = 256.0, timeout_s: float = 120.0
    ) -> None:
        import ray

        self._ray = ray
        self.learner, self.pool = learner, pool
        self.backend = backend
        self.bucket_bytes = max(1, int(bucket_mb * 2**20))
        self.timeout_s = timeout_s
        self.epoch = -1
        self.formed = False
        self._failures_at_form = 0
        self.address = learner.weight_store(len(pool.workers) + 1)

    def _form(self) -> None:
        self.epoch += 1
        size = len(self.pool.workers) + 1
        host, port = self.address
        refs = [
            self.learner.workers[0].join_weight_group.remote(
                host, port, 0, size, self.epoch, self.backend, self.timeout_s
            )
        ]
        refs += [
            w.join_weight_group.remote(host, port, i + 1, size, self.epoch, self.backend, self.timeout_s)
            for i, w in enumerate(self.pool.workers)
        ]
        self._ray.get(refs)
        self.formed = True
        self._failures_at_form = self.pool.failures
        self.pool._add("ray/weight_group_forms", 1.0)

    def sync(self) -> None:
        """Send the learner's current weights to every rollout worker as the pool's next version."""
        pool, rex = self.pool, self._ray.exceptions
        t0 = time.perf_counter()
        version = pool.version + 1
        try:
            # a worker that died since the group formed was replaced by a process outside it: re-form first
            if not self.formed or pool.failures != self._failures_at_form:
                self._form()
            spec = self.learner.prepare_broadcast()
            sent = self.learner.workers[0].send_weights.remote(self.bucket_bytes)
            got = [w.receive_weights.remote(version, spec, self.bucket_bytes) for w in pool.workers]
            broadcast_s = self._ray.get(sent)
            self._ray.get(got)
        except (rex.RayActorError, rex.RayTaskError, rex.GetTimeoutError):
            # a member died or the group broke: this version goes through the object store (rank 0 still
            # holds the weights it was sending), dead workers are revived, the group re-forms next time
            self.formed = False
            pool._add("ray/weight_sync_fallbacks", 1.0)
            pool.load_weights(self.learner.cached_remote_weights())
            pool._add("ray/weight_sync_s", time.perf_counter() - t0)
            return
        pool.set_version(version, provider=self.learner.cached_remote_weights)
        pool._add("ray/weight_syncs", 1.0)
        pool._add("ray/weight_sync_s", time.perf_counter() - t0)
        pool._add("ray/weight_broadcast_s", float(broadcast_s))
