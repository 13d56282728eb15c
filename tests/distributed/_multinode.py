"""A real multi-node Ray cluster on this machine, and whole-node losses during a run (run as a child
process by test_multinode.py, so its Ray session never meets the suite's single-node one).

    PYTHONPATH=$PWD python tests/distributed/_multinode.py OUT.json

Cluster (ray.cluster_utils.Cluster): a head node with no CPUs (the driver's node: nothing is placed
there) and worker nodes a..e, each its own raylet and object store with 2 CPUs and 2 GPUs.  The GPUs are
logical resources (no CUDA here): Ray schedules and places by them exactly as on a GPU node, which is
what the test checks; the tabular workers never touch a device.  The scenario is the tabular default
with the layout of scenarios/llm/qwen3-8b-2x8.yaml in miniature: two 1-GPU rollout workers and two
1-GPU trainer ranks in one placement group, PACK (so each kind fills one node, three stand by).

One `rtpo run` (rtpo.rundir.runner.run_scenario) loses three whole nodes (SIGKILL of raylet, object store and
workers): the rollout workers' node as the 3rd chunk of the 1st sibling rollout goes out, the node they
were re-placed on as the 3rd weight sync begins, and the trainer's node as the 12th train step is issued
(iteration 1).  The run stops with TrainerFailure after its last checkpoint and `run_scenario(resume=...)`
finishes it.  The report holds where every actor ran (before the first loss), the losses, and the metric
lines of the resumed run and of the in-process `sharded` run (the same per-boundary rng streams, no Ray),
which the design makes identical.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

import rtpo.rundir.runner as runner
from rtpo.distributed import TrainerFailure
from rtpo.distributed.pool import RayRolloutPool
from rtpo.distributed.trainer import RayLearner
from rtpo.scenario.load import load_scenario

NODE = {"num_cpus": 2, "num_gpus": 2}
NODES = ("a", "b", "c", "d", "e")  # two hold the layout, three stand by for the three losses
LAYOUT = {
    "rollout_workers": 2,
    "gpus_per_rollout_worker": 1,
    "trainer_workers": 2,
    "gpus_per_trainer_worker": 1,
    "collective_backend": "gloo",  # logical GPUs: no NCCL
    "cpus_per_worker": 0.5,
    "placement_strategy": "PACK",
    "max_restarts": 2,
}
BASE = ["budget.iterations=2", "budget.queries_per_iteration=6", "method.G=4", "logging.plot=false"]
HEAD = {
    "num_cpus": 0,
    "include_dashboard": False,
    # notice a dead raylet within ~2 s (the default waits 5 missed checks of 3 s)
    "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
}


def scenario(mode: str, address: str | None = None):
    over = [*BASE, f"backend.distributed={mode}"]
    if mode == "ray":
        over += [f"backend.address={address}", *(f"resources.{k}={v}" for k, v in LAYOUT.items())]
    return load_scenario(None, over)


def summary(result) -> dict:
    keys = ("iteration", "phase/turn", "budget/rollouts", "budget/turns", "return/mean", "eval/value")
    return {
        "final_value": result.summary["final_value"],
        "rollouts": result.summary["rollouts"],
        "phases_done": result.summary["phases_done"],
        "lines": [{k: m.get(k) for k in keys} for m in result.metrics],
        "worker_failures": sum(m.get("ray/worker_failures", 0.0) for m in result.metrics),
        "workers_recreated": sum(m.get("ray/workers_recreated", 0.0) for m in result.metrics),
    }


def node_of(actor, timeout_s: float = 180.0) -> str:
    """The node an actor runs on, asked inside it (an actor Ray is still restarting is waited for)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=60)
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _started(add, attempts: int = 3):
    """Ray waits a fixed 30 s for a new raylet to register; on a machine loaded by other work that can
    pass, so a node start is tried up to three times (as rtpo.distributed.init_ray does for a local one)."""
    for attempt in range(1, attempts + 1):
        try:
            return add()
        except Exception as e:  # ray raises a bare Exception for this timeout
            if attempt == attempts or "timed out during startup" not in str(e):
                raise


class Harness:
    """The cluster, the node names, and patches that kill a node from inside the driver's own calls."""

    def __init__(self) -> None:
        self.cluster = Cluster()
        _started(lambda: self.cluster.add_node(**HEAD))
        self.nodes = {name: _started(lambda: self.cluster.add_node(**NODE)) for name in NODES}
        self.cluster.wait_for_nodes()
        self.patches: list = []
        self.ctx = None  # the run's RayRunContext (recorded by the distribute patch)
        self.events: list[dict] = []
        self.placement: dict = {}

    def name_of(self, node_id: str) -> str:
        for name, node in self.nodes.items():
            if node.node_id == node_id:
                return name
        return "head" if node_id == self.cluster.head_node.node_id else node_id

    def live_node_of(self, actor, timeout_s: float = 180.0) -> str:
        """The name of the live node an actor runs on.  An actor on a node killed earlier can still answer
        for a moment (the driver calls it directly, and its process outlives the raylet briefly, longer on a
        loaded machine): such an answer is waited out until Ray has restarted the actor on a live node."""
        deadline = time.monotonic() + timeout_s
        while True:
            name = self.name_of(node_of(actor, timeout_s))
            if name in self.nodes:
                return name
            if time.monotonic() > deadline:
                raise RuntimeError(f"actor still on a lost node ({name}) after {timeout_s:.0f} s")
            time.sleep(0.2)

    def kill(self, name: str, during: str) -> None:
        """SIGKILL a whole node: its raylet, object store and every worker process on it."""
        self.events.append({"during": during, "node": name, "phase_lines": len(self.lines())})
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def lines(self) -> list:
        return runner.read_metrics(self.run_dir) if getattr(self, "run_dir", None) else []

    def patch(self, owner, attr, wrapper) -> None:
        original = getattr(owner, attr)
        self.patches.append((owner, attr, original))
        setattr(owner, attr, wrapper(original))

    def unpatch(self) -> None:
        while self.patches:
            owner, attr, original = self.patches.pop()
            setattr(owner, attr, original)

    def record_placement(self) -> None:
        ctx = self.ctx
        table = ray.util.placement_group_table(ctx.placement.group)
        self.placement = {
            "bundles": {int(i): self.name_of(n) for i, n in table["bundles_to_node_id"].items()},
            "rollout": [self.name_of(node_of(w)) for w in ctx.pool.workers],
            "trainer": [self.name_of(node_of(w)) for w in ctx.learner.workers],
            "driver": self.name_of(ray.get_runtime_context().get_node_id()),
            "nodes": {self.name_of(n["NodeID"]): n["Resources"] for n in ray.nodes() if n["Alive"]},
        }

    def tool_layout(self) -> dict:
        """The layout again on the two nodes left, with two tool workers: every actor (rollout, trainer,
        tool) runs on the node its bundle was placed on, and the tool pool answers."""
        import operator

        from rtpo.distributed import PoolTool, StarTool, wrap_with_ray
        from rtpo.distributed.examples import TabularToolChain

        layout = {**LAYOUT, "tool_workers": 2}
        ctx = wrap_with_ray(
            TabularToolChain(num_turns=2, num_actions=2),
            layout,
            self.cluster.address,
            tool_factory=StarTool(operator.neg),
        )
        try:
            table = ray.util.placement_group_table(ctx.placement.group)
            bundles = {int(i): self.name_of(n) for i, n in table["bundles_to_node_id"].items()}
            return {
                "bundles": bundles,
                "rollout": [self.name_of(node_of(w)) for w in ctx.pool.workers],
                "trainer": [self.name_of(node_of(w)) for w in ctx.learner.workers],
                "tool": [self.name_of(node_of(w)) for w in ctx.tools.workers],
                "tool_answers": [PoolTool(ctx.tools)(x) for x in (3, -4)],
            }
        finally:
            ctx.shutdown()

    def install(self) -> None:
        """Kill the rollout workers' node as the 3rd chunk of the 2nd rollout call goes out, the (new)
        rollout node as the 3rd weight sync begins (iteration 0), and the trainer's node as the 12th train step is
        issued (iteration 1; 4 phases x 2 epochs per iteration)."""
        import rtpo.distributed.runner as runner_mod

        counts = {"rollout_calls": 0, "syncs": 0, "steps": 0}

        def wrap_distribute(original):
            def distribute(*a, **kw):
                built = original(*a, **kw)
                self.ctx = built.ctx
                return built

            return distribute

        def wrap_run_chunks(original):
            def run_chunks(pool, chunks):
                counts["rollout_calls"] += 1
                if counts["rollout_calls"] == 1 and not self.placement:
                    self.record_placement()
                if counts["rollout_calls"] != 2:
                    return original(pool, chunks)
                inner = pool._map

                def _map(n, submit, lock=None):
                    sent = [0]

                    def killing_submit(w, c):
                        sent[0] += 1
                        if sent[0] == 3:
                            self.kill(self.live_node_of(pool.workers[0]), "rollout")
                        return submit(w, c)

                    return inner(n, killing_submit, lock)

                pool._map = _map
                try:
                    return original(pool, chunks)
                finally:
                    del pool._map

            return run_chunks

        def wrap_load(original):
            def load_weights(pool, weights):
                counts["syncs"] += 1
                if counts["syncs"] == 3:
                    self.kill(self.live_node_of(pool.workers[0]), "sync")
                return original(pool, weights)

            return load_weights

        def wrap_step(original):
            def train_step(learner, batch, loss):
                counts["steps"] += 1
                if counts["steps"] == 12:
                    self.kill(self.live_node_of(learner.workers[0]), "train_step")
                return original(learner, batch, loss)

            return train_step

        self.patch(runner_mod, "distribute", wrap_distribute)
        self.patch(RayRolloutPool, "run_chunks", wrap_run_chunks)
        self.patch(RayRolloutPool, "load_weights", wrap_load)
        self.patch(RayLearner, "train_step", wrap_step)


def main() -> None:
    out = Path(sys.argv[1])
    tmp = out.parent / "runs"
    t0 = time.perf_counter()
    report: dict = {
        "reference": summary(runner.run_scenario(scenario("sharded"), out_root=tmp / "ref", progress=False))
    }
    report["reference_s"] = time.perf_counter() - t0
    h = Harness()
    report["session_dir"] = h.cluster.head_node.get_session_dir_path()
    report["cluster_s"] = time.perf_counter() - t0 - report["reference_s"]
    try:
        h.install()
        failure = None
        try:
            # the run folder is known once it exists: the kill records read its metric lines from there
            cfg = scenario("ray", h.cluster.address)
            original_new = runner._new_run_dir

            def new_run_dir(*a, **kw):
                h.run_dir = original_new(*a, **kw)
                return h.run_dir

            runner._new_run_dir = new_run_dir
            runner.run_scenario(cfg, out_root=tmp / "ray", progress=False)
        except TrainerFailure as e:
            failure = str(e)
        finally:
            runner._new_run_dir = original_new
            h.unpatch()
        report["failure"] = failure
        report["lines_before_resume"] = len(runner.read_metrics(h.run_dir))
        report["first_run_s"] = time.perf_counter() - t0
        resumed = runner.run_scenario(None, resume=h.run_dir, progress=False)
        report["resumed"] = summary(resumed)
        report["placement"] = h.placement
        report["events"] = h.events
        report["nodes_left"] = sorted(h.nodes)
        report["tool_layout"] = h.tool_layout()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        h.cluster.shutdown()
    report["seconds"] = time.perf_counter() - t0
    out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
