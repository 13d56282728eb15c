"""Multi-node Ray on one machine: placement across nodes from the `resources` section, and whole nodes
lost during a rollout phase, a weight sync and a trainer step (slow tier; tests/distributed/_multinode.py
runs the cluster in a child process, so its Ray session never meets the single-node one of the other
distributed tests, and this process can check afterwards that nothing of it survived).

What the design promises (docs/distributed.md, Failures) and these tests check:
- PACK over 2-GPU nodes puts the two 1-GPU rollout workers on one node and the two 1-GPU trainer ranks
  on another, nothing on the (CPU-less) head; every actor runs on the node its bundle was placed on.
- A rollout node lost mid-phase or mid-sync: Ray re-places the lost bundles on a standby node and restarts
  the actors there; a chunk lost in flight runs again with its own rng stream (a task sent to an actor
  that is restarting waits for it): the run goes on, identical to the undisturbed run.
- The trainer's node lost: the run stops with TrainerFailure after its last checkpoint (the step issued as
  the node goes down may still finish, its processes outlive the raylet briefly; the next trainer call
  fails); resuming ends
  with exactly the metric lines (no line missing or repeated, the same rollout counts) and final value
  of the undisturbed run.

Mutants these are meant to catch (not run: one run of this module takes ~6 min on the loaded 2-core
machine): in PullPool._map, dropping `queue.appendleft(c)` (a chunk lost in flight is never re-run);
giving a re-run chunk a fresh rng key in ShardedSampler (the lines differ); not checkpointing the sampler
weights in the runner (the resumed run differs).  The defect it did catch: Ray's OwnerDiedError escaping
the runner's checkpoint when the trainer's node took the workers' weights with it (now a TrainerFailure,
rtpo.distributed.runner).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")

from tests.distributed.conftest import ray_processes  # noqa: E402

pytestmark = pytest.mark.slow
CHILD = Path(__file__).with_name("_multinode.py")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("multinode") / "report.json"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(out)], cwd=root, env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, f"the multi-node child failed:\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def test_placement_follows_the_resources_section(report):
    p = report["placement"]
    assert p["driver"] == "head" and "GPU" not in p["nodes"]["head"] and "CPU" not in p["nodes"]["head"], p
    # bundles in order: rollout 0, rollout 1, trainer 0, trainer 1 (Resources.bundles)
    bundles = [p["bundles"][str(i)] for i in range(4)]
    assert p["rollout"] == bundles[:2] and p["trainer"] == bundles[2:], f"actors not on their bundles' nodes: {p}"
    assert len(set(p["rollout"])) == 1 and len(set(p["trainer"])) == 1, f"PACK keeps each kind on one node: {p}"
    assert p["rollout"][0] != p["trainer"][0], f"four 1-GPU bundles cannot share one 2-GPU node: {p}"
    for node in set(bundles):
        assert p["nodes"][node].get("GPU") == 2.0, f"{node} is not a 2-GPU worker node: {p['nodes'][node]}"


def test_tool_workers_are_placed_on_their_bundles_nodes(report):
    """The 2x8 layouts' third kind of worker: tool actors get bundles after the rollout and trainer ones
    (Resources.bundles) and run where those were placed; the pool answers from them."""
    t = report["tool_layout"]
    bundles = [t["bundles"][str(i)] for i in range(6)]
    assert t["rollout"] == bundles[:2] and t["trainer"] == bundles[2:4], f"actors not on their bundles: {t}"
    assert t["tool"] == bundles[4:], f"tool actors not on their bundles' nodes: {t}"
    assert set(bundles) <= set(report["nodes_left"]), f"a bundle on a lost node: {t}"
    assert t["tool_answers"] == [-3, 4]


def test_three_whole_nodes_were_lost_where_intended(report):
    events = report["events"]
    assert [e["during"] for e in events] == ["rollout", "sync", "train_step"], events
    p = report["placement"]
    assert events[0]["node"] == p["rollout"][0], "the first loss takes the rollout workers' node"
    assert events[2]["node"] == p["trainer"][0], "the last loss takes the trainer's node"
    assert len({e["node"] for e in events}) == 3, f"three different nodes: {events}"
    assert len(report["nodes_left"]) == 2, report["nodes_left"]


def test_rollout_losses_are_rerun_and_the_trainer_loss_resumes(report):
    assert report["failure"] and "resume the run" in report["failure"], report["failure"]
    want = report["reference"]
    lost = [e["phase_lines"] for e in report["events"]]
    assert report["lines_before_resume"] < want["phases_done"], "the trainer loss must stop the first run early"
    assert report["lines_before_resume"] >= lost[2], "the trainer loss stops the run after its last checkpoint"
    assert lost[0] < lost[1] < lost[2], f"the losses fall in different phases of the run: {report['events']}"


def test_results_identical_to_the_undisturbed_run(report):
    got, want = report["resumed"], report["reference"]
    assert got["phases_done"] == want["phases_done"] == 8
    assert len(got["lines"]) == len(want["lines"]), "a metric line is missing or repeated"
    for i, (a, b) in enumerate(zip(want["lines"], got["lines"])):
        assert a == b, f"metric line {i} differs from the undisturbed run: {a} != {b}"
    assert got["rollouts"] == want["rollouts"], "a rollout was lost or counted twice"
    assert got["final_value"] == want["final_value"]


def test_nothing_of_ray_is_left(report):
    left = ray_processes(report["session_dir"])
    assert not left, f"Ray processes of the multi-node session survived: {left}"
