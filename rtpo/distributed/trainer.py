"""The trainer worker group: N Ray actors forming one torch.distributed process group, seen as one Learner.

Every Learner call goes to all ranks at once (SPMD: each rank runs the same step on its shard) and rank
0's answer is returned — or, for a learner that rank 0 drives while the other ranks run `serve()`
(rtpo.llm's FSDPLearner), to rank 0 alone, with the serve loops started once and watched.  A group whose member dies cannot be patched with a restarted
rank, so trainer actors are not restarted: the call raises TrainerFailure, and the run resumes from its
last atomic checkpoint with a fresh group (the runner's job; see docs/distributed.md).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from rtpo.core.loss import LossConfig
from rtpo.core.types import Ragged, TurnBatch
from rtpo.distributed.pool import RemoteWeights
from rtpo.distributed.shards import build_parts


class TrainerFailure(RuntimeError):
    """A trainer rank died; the learner state since the last checkpoint is lost."""


class TrainerWorker:
    """The actor body: joins the process group, then builds the learner through the factory."""

    def __init__(self, factory: Callable[..., Any], rank: int, world_size: int) -> None:
        self.factory = factory
        self.rank = rank
        self.world_size = world_size
        self.learner = None

    def address(self) -> tuple[str, int]:
        """Rank 0's host and a free port for the rendezvous."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, host: str, port: int, backend: str) -> int:
        import torch.distributed as dist

        os.environ.update(
            MASTER_ADDR=host,
            MASTER_PORT=str(port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size)
        self.learner = build_parts(self.factory, "trainer").learner
        return os.getpid()

    def driven(self) -> bool:
        """True if the learner is driven by rank 0 alone while the other ranks run serve()
        (rtpo.llm's FSDPLearner); False for an SPMD learner that every rank calls."""
        return self.world_size > 1 and callable(getattr(self.learner, "serve", None))

    def serve(self) -> None:
        self.learner.serve()

    def call(self, name: str, *args: Any) -> Any:
        return getattr(self.learner, name)(*args)

    def put_weights(self) -> list:
        """Every rank takes part (weights() may be a collective, e.g. FSDP's full state dict); rank 0 alone
        puts them in the object store, boxed so the driver receives the ref, not the data."""
        import ray

        w = self.learner.weights()
        return [ray.put(w)] if self.rank == 0 else []

    # -- collective weight sync (rtpo.distributed.collective): rank 0 is the weight group's sender --------
    def weight_store(self, size_hint: int) -> tuple[str, int]:
        return self._weight_member().serve_store(size_hint)

    def join_weight_group(
        self, host: str, port: int, rank: int, size: int, epoch: int, backend: str, timeout_s: float
    ) -> None:
        self._weight_member().join(host, port, rank, size, epoch, backend, timeout_s)

    def cache_weights(self) -> Any:
        """Every rank computes weights() (it may be a collective); rank 0 keeps them for send_weights and
        for a fallback through the object store, and returns their layout."""
        from rtpo.distributed.collective import spec_of

        w = self.learner.weights()
        if self.rank != 0:
            return None
        self._cached = w
        return spec_of(w)

    def send_weights(self, bucket_bytes: int) -> float:
        return self._weight_member().send(self._cached, bucket_bytes)

    def put_cached_weights(self) -> list:
        import ray

        return [ray.put(self._cached)]

    def _weight_member(self):
        from rtpo.distributed.collective import WeightGroupMember

        if getattr(self, "_member", None) is None:
            self._member = WeightGroupMember()
        return self._member

    def teardown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayLearner:
    """Learner protocol over a TrainerWorker group (world_size ranks, gloo on CPU or NCCL on GPU)."""

    def __init__(
        self,
        factory: Callable[..., Any],
        world_size: int,
        *,
        backend: str = "gloo",
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        strategy: Callable[[int], Any] | None = None,
    ) -> None:
        import ray

        if world_size < 1:
            raise ValueError(f"a trainer group needs at least one rank, got {world_size}")
        self._ray = ray
        cls = ray.remote(TrainerWorker)
        self.workers = []
        for r in range(world_size):
            opts: dict[str, Any] = dict(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0)
            if strategy is not None:
                opts["scheduling_strategy"] = strategy(r)
            self.workers.append(cls.options(**opts).remote(factory, r, world_size))
        host, port = ray.get(self.workers[0].address.remote())
        self._serving: list = []
        self.pids = self._all("setup", host, port, backend, method=True)
        # a learner that rank 0 drives (the others obey its broadcasts) gets its serve loops started
        self.driven = bool(ray.get(self.workers[0].driven.remote()))
        if self.driven:
            self._serving = [w.serve.remote() for w in self.workers[1:]]

    def _all(self, name: str, *args: Any, method: bool = False, rank0: bool = False) -> list:
        """Call every rank (SPMD), or rank 0 alone when it drives (or when rank0 is set); results in rank order.

        The serve loops are watched too: a dead serving rank would leave rank 0 blocked in a collective.
        """
        if rank0:
            targets = self.workers[:1]
        else:  # (setup runs before `driven` is known, hence the order of this test)
            targets = self.workers if (method or not self.driven) else self.workers[:1]
        refs = [getattr(w, name).remote(*args) if method else w.call.remote(name, *args) for w in targets]
        pending = list(refs)
        try:
            while pending:
                done, _ = self._ray.wait(pending + self._serving, num_returns=1)
                for ref in done:
                    if ref in self._serving:
                        self._ray.get(ref)  # raises if the rank died
                        raise self._ray.exceptions.RayActorError()  # a serve loop never returns on its own
                    pending.remove(ref)
            return self._ray.get(refs)
        except self._ray.exceptions.RayActorError as e:
            raise TrainerFailure(
                f"a trainer rank died during {name!r} ({type(e).__name__}); resume the run from its last checkpoint"
            ) from None

    # -- Learner protocol ------------------------------------------------------------------------------
    def logprobs(self, batch: TurnBatch) -> Ragged:
        return self._all("logprobs", batch)[0]

    def ref_logprobs(self, batch: TurnBatch) -> Ragged:
        """The reference policy's log-probs (rtpo.core.protocols.ReferenceLogprobs), from the trainer ranks."""
        return self._all("ref_logprobs", batch)[0]

    def train_step(self, batch: TurnBatch, loss: LossConfig) -> dict[str, float]:
        return self._all("train_step", batch, loss)[0]

    def weights(self) -> Any:
        return self._all("weights")[0]

    def remote_weights(self) -> RemoteWeights:
        """Rank 0's weights as an object-store ref, for a broadcast that never passes through the driver."""
        if self.driven:
            try:
                return RemoteWeights(self._ray.get(self.workers[0].put_weights.remote())[0])
            except self._ray.exceptions.RayActorError as e:
                raise TrainerFailure(f"trainer rank 0 died during 'weights' ({type(e).__name__})") from None
        return RemoteWeights(self._all("put_weights", method=True)[0][0])

    # -- collective weight sync (driven by rtpo.distributed.collective.CollectiveWeightSync) -------------
    def weight_store(self, size_hint: int) -> tuple[str, int]:
        """Rank 0 serves the weight group's store; its (host, port)."""
        return self._all("weight_store", size_hint, method=True, rank0=True)[0]

    def prepare_broadcast(self) -> Any:
        """The current weights, computed by the ranks that must take part and kept on rank 0; their WeightSpec."""
        return self._all("cache_weights", method=True, rank0=self.driven)[0]

    def cached_remote_weights(self) -> RemoteWeights:
        """Rank 0's last prepared weights as an object-store ref (fallback and catch-up path)."""
        return RemoteWeights(self._all("put_cached_weights", method=True, rank0=True)[0][0])

    def state_dict(self) -> dict:
        return self._all("state_dict")[0]

    def load_state_dict(self, state: dict) -> None:
        self._all("load_state_dict", state)

    def shutdown(self) -> None:
        for w in self.workers:
            self._ray.kill(w, no_restart=True)
        self.workers = []
