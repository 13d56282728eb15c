"""Launch recipes for a Ray scenario on a cluster: a SLURM batch script and a KubeRay RayJob manifest,
both rendered from the scenario's `resources` section (so the node count and the GPUs per node are the
ones the scenario's placement group will ask for).

    python -m rtpo.commands.launch slurm scenarios/llm/qwen3-8b-2x8.yaml [--gpus-per-node 8] > job.sbatch
    python -m rtpo.commands.launch kuberay scenarios/llm/qwen3-8b-2x8.yaml --image IMAGE > rayjob.yaml

Both start one Ray node per machine (the head on the first), then run `rtpo run SCENARIO` on the head,
which joins the cluster (`backend.address: auto`).  Imports the scenario loader and the Resources layout; no Ray.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class ClusterShape:
    """What a scenario's placement group needs: GPUs and CPUs in all, and the nodes they fill."""

    gpus: int
    cpus: int
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    driver_gpus: int = 0  # of `gpus`: the driver's own (its evaluation engine), kept out of Ray's hands

    @property
    def head_ray_gpus(self) -> int:
        """The GPUs the head node offers Ray: its GPUs less the driver's (Ray hands out ids 0..n−1 of a
        node started with --num-gpus=n, so the driver takes the last ones)."""
        return self.gpus_per_node - self.driver_gpus

    @property
    def driver_devices(self) -> str:
        """CUDA_VISIBLE_DEVICES of the driver process on the head node."""
        return ",".join(str(i) for i in range(self.head_ray_gpus, self.gpus_per_node))


def cluster_shape(cfg: Any, gpus_per_node: int = 8) -> ClusterShape:
    """Nodes of `gpus_per_node` GPUs holding every rollout, trainer and tool actor of cfg.resources, the
    driver's CPU and, for an llm scenario, the driver's evaluation engine (backend.tensor_parallel_size GPUs
    on the head node, outside the placement group: rtpo.llm.build role driver; rtpo plan counts them too),
    as rtpo.distributed.resources.Resources lays out its bundles."""
    from rtpo.distributed.resources import Resources

    if cfg.backend.distributed != "ray":
        raise ValueError(f"backend.distributed is {cfg.backend.distributed!r}: a launch recipe is for Ray runs")
    r = Resources.from_dict(cfg.resources)
    placed = math.ceil(r.rollout_workers * r.gpus_per_rollout_worker + r.trainer_workers * r.gpus_per_trainer_worker)
    driver = int(getattr(cfg.backend, "tensor_parallel_size", 1) or 1) if placed and cfg.backend.kind == "llm" else 0
    gpus = placed + driver
    if driver > gpus_per_node:
        raise ValueError(f"the driver's engine needs {driver} GPUs, more than a node's {gpus_per_node}")
    actors = r.rollout_workers + r.trainer_workers + r.tool_workers
    cpus = math.ceil(actors * r.cpus_per_worker) + 1  # + the driver
    nodes = max(1, math.ceil(gpus / gpus_per_node)) if gpus else 1
    return ClusterShape(
        gpus, cpus, nodes, min(gpus_per_node, gpus) if gpus else 0, math.ceil(cpus / nodes), driver_gpus=driver
    )


def render_slurm(cfg: Any, scenario: str, gpus_per_node: int = 8, overrides: tuple[str, ...] = ()) -> str:
    """A SLURM batch script: one task per node, the Ray head on the first node, workers on the rest, then
    `rtpo run` on the head node."""
    s = cluster_shape(cfg, gpus_per_node)
    run = " ".join(shlex.quote(a) for a in ("rtpo", "run", scenario, *overrides))
    gpu_line = f"#SBATCH --gpus-per-node={s.gpus_per_node}\n" if s.gpus_per_node else ""
    driver_env = (
        f"# the driver's evaluation engine: the head node's GPU(s) Ray does not hand out\n"
        f"CUDA_VISIBLE_DEVICES={s.driver_devices} "
        if s.driver_gpus
        else ""
    )
    return f"""#!/bin/bash
#SBATCH --job-name={shlex.quote(cfg.name)}
#SBATCH --nodes={s.nodes}
#SBATCH --ntasks-per-node=1
{gpu_line}#SBATCH --cpus-per-task={s.cpus_per_node}
#SBATCH --exclusive
# rendered by rtpo.commands.launch from {scenario}: {s.gpus} GPUs, {s.cpus} CPUs in all
set -euo pipefail
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head=${{nodes[0]}}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{{print $1}}')
port=6379
srun --nodes=1 --ntasks=1 -w "$head" ray start --head --node-ip-address="$head_ip" --port=$port \\
  --num-cpus={s.cpus_per_node} --num-gpus={s.head_ray_gpus} --block &
sleep 20
for node in "${{nodes[@]:1}}"; do
  srun --nodes=1 --ntasks=1 -w "$node" ray start --address="$head_ip:$port" \\
    --num-cpus={s.cpus_per_node} --num-gpus={s.gpus_per_node} --block &
done
sleep 20
{driver_env}RAY_ADDRESS="$head_ip:$port" srun --overlap --nodes=1 --ntasks=1 -w "$head" {run}
"""


def render_rayjob(cfg: Any, scenario: str, image: str, gpus_per_node: int = 8, overrides: tuple[str, ...] = ()) -> dict:
    """A KubeRay RayJob (ray.io/v1): a head pod and nodes − 1 worker pods, each with the node's GPUs and
    CPUs; the entrypoint runs the scenario on the cluster and the cluster goes away after it."""
    s = cluster_shape(cfg, gpus_per_node)

    def pod(ray_params: dict) -> dict:
        limits = {"cpu": str(s.cpus_per_node), "memory": "64Gi"}
        if s.gpus_per_node:
            limits["nvidia.com/gpu"] = str(s.gpus_per_node)
        return {
            "rayStartParams": ray_params,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "ray", "image": image, "resources": {"limits": limits, "requests": dict(limits)}}
                    ]
                }
            },
        }

    entry = " ".join(shlex.quote(a) for a in ("rtpo", "run", scenario, *overrides))
    if s.driver_gpus:  # the driver's evaluation engine: the head pod's GPU(s) Ray does not hand out
        entry = f"CUDA_VISIBLE_DEVICES={s.driver_devices} {entry}"
    head = {"dashboard-host": "0.0.0.0"}
    if s.gpus_per_node:
        head["num-gpus"] = str(s.head_ray_gpus)
    spec: dict = {
        "entrypoint": entry,
        "shutdownAfterJobFinishes": True,
        "rayClusterSpec": {"headGroupSpec": pod(head)},
    }
    if s.nodes > 1:
        worker = pod({})
        worker.update({"groupName": "gpu-workers", "replicas": s.nodes - 1, "minReplicas": s.nodes - 1})
        worker["maxReplicas"] = s.nodes - 1
        spec["rayClusterSpec"]["workerGroupSpecs"] = [worker]
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": _k8s_name(cfg.name)}, "spec": spec}


def _k8s_name(name: str) -> str:
    """A DNS-1123 label from a scenario name (lower case, [a-z0-9-], at most 63 characters)."""
    out = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return (out or "rtpo")[:63].rstrip("-")


def main(argv: list[str] | None = None) -> int:
    from rtpo.scenario.load import ConfigError, load_scenario

    ap = argparse.ArgumentParser(prog="python -m rtpo.commands.launch", description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("slurm", "kuberay"))
    ap.add_argument("scenario")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, passed on to rtpo run")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--image", default="rtpo:latest", help="container image (kuberay)")
    args = ap.parse_args(argv)
    try:
        cfg = load_scenario(args.scenario, args.overrides)
        if args.kind == "slurm":
            sys.stdout.write(render_slurm(cfg, args.scenario, args.gpus_per_node, tuple(args.overrides)))
        else:
            doc = render_rayjob(cfg, args.scenario, args.image, args.gpus_per_node, tuple(args.overrides))
            sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
