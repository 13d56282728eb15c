"""The scenario's `resources` section and the Ray placement group built from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class Resources:
    """How many Ray workers of each kind, and what each holds.

    rollout_workers:         Sampler + Environment actors (one per GPU or tensor-parallel group).
    gpus_per_rollout_worker: GPUs per rollout actor (= the engine's tensor-parallel size; 0 on CPU).
    trainer_workers:         ranks of the trainer's torch.distributed group; 0 = the learner runs on the driver.
    gpus_per_trainer_worker: GPUs per trainer rank (1 with NCCL; 0 = gloo on CPU).
    tool_workers:            actors of the tool / environment-call pool (0 = none).
    cpus_per_worker:         CPUs reserved per actor (fractions allowed on a small machine).
    placement_strategy:      Ray placement-group strategy over all bundles (PACK, SPREAD, STRICT_*).
    chunk_size:              boundaries (or trunk queries) per work chunk; 1 = per-boundary rng streams.
    inflight_per_worker:     chunks queued on one rollout actor at a time (1 = pure pull by idle workers).
    max_restarts:            automatic restarts of a dead rollout or tool actor before it is re-created.
    collective_backend:      torch.distributed backend of the trainer group; "auto" = nccl with GPUs, else gloo.
    weight_sync:             how weights reach the rollout workers after a phase: "object_store" (one
                             ray.put, every worker fetches it) or "collective" (trainer rank 0 broadcasts
                             over a weight group with the workers: gloo on CPU, NCCL when both sides hold
                             GPUs; needs trainer_workers >= 1; see rtpo.distributed.collective).
    weight_bucket_mb:        collective sync: largest flat buffer per broadcast call.
    """

    rollout_workers: int = 2
    gpus_per_rollout_worker: float = 0.0
    trainer_workers: int = 1
    gpus_per_trainer_worker: float = 0.0
    tool_workers: int = 0
    cpus_per_worker: float = 1.0
    placement_strategy: str = "PACK"
    chunk_size: int = 1
    inflight_per_worker: int = 1
    max_restarts: int = 3
    collective_backend: str = "auto"
    weight_sync: str = "object_store"
    weight_bucket_mb: float = 256.0

    def __post_init__(self) -> None:
        if self.rollout_workers < 1:
            raise ValueError(f"resources.rollout_workers must be >= 1, got {self.rollout_workers}")
        for name in ("trainer_workers", "tool_workers", "max_restarts"):
            if getattr(self, name) < 0:
                raise ValueError(f"resources.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("gpus_per_rollout_worker", "gpus_per_trainer_worker"):
            if getattr(self, name) < 0:
                raise ValueError(f"resources.{name} must be >= 0, got {getattr(self, name)}")
        if self.cpus_per_worker <= 0:
            raise ValueError(f"resources.cpus_per_worker must be > 0, got {self.cpus_per_worker}")
        if self.chunk_size < 1 or self.inflight_per_worker < 1:
            raise ValueError("resources.chunk_size and resources.inflight_per_worker must be >= 1")
        if self.placement_strategy not in _STRATEGIES:
            raise ValueError(
                f"resources.placement_strategy must be one of {', '.join(_STRATEGIES)}, got {self.placement_strategy!r}"
            )
        if self.collective_backend not in ("auto", "gloo", "nccl"):
            raise ValueError(
                f"resources.collective_backend must be auto, gloo or nccl, got {self.collective_backend!r}"
            )
        if self.weight_sync not in ("object_store", "collective"):
            raise ValueError(f"resources.weight_sync must be object_store or collective, got {self.weight_sync!r}")
        if self.weight_sync == "collective" and self.trainer_workers < 1:
            raise ValueError(
                "resources.weight_sync: collective needs trainer_workers >= 1 (rank 0 of the trainer "
                "group sends the weights)"
            )
        if self.weight_bucket_mb <= 0:
            raise ValueError(f"resources.weight_bucket_mb must be > 0, got {self.weight_bucket_mb}")

    @staticmethod
    def from_dict(data: dict[str, Any] | None) -> Resources:
        """Build from a config mapping; an unknown key or a wrongly typed value is a one-line error naming it."""
        data = dict(data or {})
        known = {f.name: f for f in fields(Resources)}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"resources.{key}: unknown key; valid: {', '.join(known)}")
            want = known[key].type
            ok = {
                "int": isinstance(value, int) and not isinstance(value, bool),
                "float": isinstance(value, (int, float)) and not isinstance(value, bool),
                "str": isinstance(value, str),
            }[want]
            if not ok:
                raise ValueError(f"resources.{key}: expected {want}, got {value!r}")
        return Resources(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def trainer_backend(self) -> str:
        if self.collective_backend != "auto":
            return self.collective_backend
        return "nccl" if self.gpus_per_trainer_worker > 0 else "gloo"

    @property
    def weight_sync_backend(self) -> str:
        """The weight group's backend: the trainer's, except that NCCL needs GPUs on the rollout side too."""
        if self.collective_backend != "auto":
            return self.collective_backend
        return "nccl" if self.gpus_per_trainer_worker > 0 and self.gpus_per_rollout_worker > 0 else "gloo"

    def bundles(self) -> list[dict[str, float]]:
        """Placement-group bundles in order: rollout workers, trainer ranks, tool workers."""

        def bundle(gpus: float) -> dict[str, float]:
            b = {"CPU": float(self.cpus_per_worker)}
            if gpus > 0:
                b["GPU"] = float(gpus)
            return b

        return (
            [bundle(self.gpus_per_rollout_worker) for _ in range(self.rollout_workers)]
            + [bundle(self.gpus_per_trainer_worker) for _ in range(self.trainer_workers)]
            + [bundle(0.0) for _ in range(self.tool_workers)]
        )

    def bundle_index(self, kind: str, i: int) -> int:
        start = {"rollout": 0, "trainer": self.rollout_workers, "tool": self.rollout_workers + self.trainer_workers}[
            kind
        ]
        return start + i


class Placement:
    """One placement group holding every worker's bundle; `strategy(kind, i)` pins an actor to its bundle."""

    def __init__(self, resources: Resources, timeout_s: float = 120.0) -> None:
        import ray
        from ray.util.placement_group import placement_group

        self.resources = resources
        self.group = placement_group(resources.bundles(), strategy=resources.placement_strategy)
        ready, _ = ray.wait([self.group.ready()], timeout=timeout_s)
        if not ready:
            need = resources.bundles()
            ray.util.remove_placement_group(self.group)
            raise RuntimeError(
                f"the Ray cluster cannot place the resources section ({len(need)} bundles: {need}) "
                f"within {timeout_s:.0f} s; cluster has {ray.cluster_resources()}"
            )

    def strategy(self, kind: str, i: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.resources.bundle_index(kind, i)
        )

    def remove(self) -> None:
        import ray

        ray.util.remove_placement_group(self.group)
