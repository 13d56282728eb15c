"""Launch recipes rendered from the 2×8 scenario (rtpo.commands.launch): the SLURM script passes bash's
syntax check and asks for the nodes and GPUs the scenario's placement group needs; the KubeRay RayJob
validates against the structure of the ray.io/v1 RayJob fields it uses (sbatch --test-only and a cluster
are not available here) and holds the same GPUs.

Mutants: nodes = gpus // gpus_per_node − 1, or worker replicas = nodes, turn the GPU totals red; an
unbalanced quote in the script turns the bash -n check red.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from rtpo.commands.launch import cluster_shape, main, render_rayjob, render_slurm
from rtpo.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "scenarios/llm/qwen3-8b-2x8.yaml"
QTY = {"type": "string", "pattern": r"^[0-9]+(Gi|Mi)?$"}
CONTAINER = {
    "type": "object",
    "required": ["name", "image", "resources"],
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string", "minLength": 1},
        "resources": {
            "type": "object",
            "properties": {
                "limits": {"type": "object", "additionalProperties": QTY},
                "requests": {"type": "object", "additionalProperties": QTY},
            },
        },
    },
}
GROUP = {
    "type": "object",
    "required": ["rayStartParams", "template"],
    "properties": {
        "rayStartParams": {"type": "object", "additionalProperties": {"type": "string"}},
        "template": {
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["containers"],
                    "properties": {"containers": {"type": "array", "minItems": 1, "items": CONTAINER}},
                }
            },
        },
        "groupName": {"type": "string"},
        "replicas": {"type": "integer", "minimum": 0},
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
    },
}
RAYJOB = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayJob"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"}},
        },
        "spec": {
            "type": "object",
            "required": ["entrypoint", "rayClusterSpec"],
            "additionalProperties": False,
            "properties": {
                "entrypoint": {"type": "string"},
                "shutdownAfterJobFinishes": {"type": "boolean"},
                "rayClusterSpec": {
                    "type": "object",
                    "required": ["headGroupSpec"],
                    "additionalProperties": False,
                    "properties": {
                        "headGroupSpec": GROUP,
                        "workerGroupSpecs": {
                            "type": "array",
                            "items": {**GROUP, "required": [*GROUP["required"], "groupName", "replicas"]},
                        },
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def cfg():
    return load_scenario(str(ROOT / SCENARIO))


def _scenario_gpus(cfg) -> int:
    """The placement group's GPUs plus the driver's evaluation engine (tensor_parallel_size GPUs on the head
    node, outside the group: rtpo.llm.build role driver)."""
    r = cfg.resources
    placed = r["rollout_workers"] * r["gpus_per_rollout_worker"] + r["trainer_workers"] * r["gpus_per_trainer_worker"]
    return int(placed + cfg.backend.tensor_parallel_size)


def test_slurm_script_is_valid_bash_and_asks_for_the_scenarios_gpus(cfg, tmp_path):
    text = render_slurm(cfg, SCENARIO)
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, f"bash -n: {res.stderr}"
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", text, re.M))
    assert int(directives["nodes"]) == 2
    assert int(directives["nodes"]) * int(directives["gpus-per-node"]) == _scenario_gpus(cfg) == 16
    assert text.rstrip().endswith(f"rtpo run {SCENARIO}"), "the head node runs the scenario"
    assert text.count("ray start") == 2 and "--head" in text
    # the head's Ray gets GPUs 0-6, the driver (its evaluation engine) the eighth: nothing shared
    head = re.search(r"ray start --head.*?--num-gpus=(\d+)", text, re.S)
    assert head and int(head.group(1)) == 7, "the head node must keep the driver's GPU out of Ray's hands"
    assert "CUDA_VISIBLE_DEVICES=7 RAY_ADDRESS=" in text, "the driver must run on the GPU Ray does not hand out"


def test_rayjob_validates_and_holds_the_scenarios_gpus(cfg):
    doc = yaml.safe_load(yaml.safe_dump(render_rayjob(cfg, SCENARIO, "registry.example/rtpo:1")))
    jsonschema.validate(doc, RAYJOB)
    spec = doc["spec"]["rayClusterSpec"]

    def gpus(group):
        return int(group["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0))

    total = gpus(spec["headGroupSpec"]) + sum(g["replicas"] * gpus(g) for g in spec.get("workerGroupSpecs", []))
    assert total == _scenario_gpus(cfg), f"RayJob holds {total} GPUs, the scenario needs {_scenario_gpus(cfg)}"
    assert doc["spec"]["entrypoint"] == f"CUDA_VISIBLE_DEVICES=7 rtpo run {SCENARIO}"
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "7", "the driver's GPU stays out of Ray's hands"


def test_cpu_ray_scenario_and_a_non_ray_one(capsys):
    tiny = load_scenario(str(ROOT / "scenarios/llm/tiny-cpu-ray.yaml"))
    shape = cluster_shape(tiny)
    assert shape.gpus == 0 and shape.nodes == 1
    jsonschema.validate(render_rayjob(tiny, "x.yaml", "img"), RAYJOB)
    assert main(["slurm", str(ROOT / "scenarios/llm/tiny-cpu.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: backend.distributed is 'none'") and "\n" not in err
