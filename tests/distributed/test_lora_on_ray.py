"""A LoRA run of an LLM scenario on a local Ray cluster (2 HF rollout actors, a 2-rank gloo FSDP2 trainer
group training adapters, scenarios/llm/tiny-cpu-ray.yaml) logs what the in-process run with the same
per-boundary streams logs (`backend.distributed: sharded`, the reference every Ray run must equal,
tests/distributed/test_llm_on_ray.py).

Every learner of the Ray run (the driver's, each trainer rank) builds its adapters in its own process, so
they start from one set of adapters only if the adapters' initialisation is a function of the run's seed
and not of what each process's RNG drew before.  A run whose ranks started from different adapters trains
other weights: its rollouts after the first sync and its loss metrics differ from the sharded run's.

Mutant: removing `torch.default_generator.manual_seed(spec.init_seed)` from rtpo.llm.lora.attach turns
test_lora_run_on_ray_logs_what_the_in_process_run_logs red.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the distributed extra (ray) is not installed")
pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
pytest.importorskip("rtpo.llm.env", reason="the LLM backend (rtpo.llm) is not on this branch")

from rtpo.core.metrics import wall_clock  # noqa: E402
from rtpo.rundir.runner import run_scenario  # noqa: E402
from rtpo.scenario.load import load_scenario  # noqa: E402

pytestmark = pytest.mark.slow  # a Ray cluster with 4 actors and two runs

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "llm" / "tiny-cpu-ray.yaml"
LORA = [
    "enabled=true",
    "rank=4",
    "alpha=8.0",
    "target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
]
# what test_llm_on_ray allows between a 2-rank gloo group and one process (summation order of the
# reduce-scatter, 1 vs 2 torch threads): sampled tokens and returns identical, numbers within METRIC_ATOL
EXACT_KEYS = ("phase/", "trunk/", "return/", "adv/", "train/tokens", "train/steps", "gen/tokens", "gen/responses")
NUMERIC_KEYS = ("loss/", "consistency/", "train/grad_norm", "eval/")
METRIC_ATOL = 1e-5


def _cfg(models: Path, mode: str):
    return load_scenario(
        SCENARIO,
        [
            f"backend.model_cache={models}",
            f"backend.distributed={mode}",
            "budget.iterations=1",
            *("backend.lora." + o for o in LORA),
        ],
    )


def test_lora_run_on_ray_logs_what_the_in_process_run_logs(ray_cluster, tmp_path):
    models = tmp_path / "models"
    want = run_scenario(_cfg(models, "sharded"), out_root=tmp_path / "sharded", progress=False)
    got = run_scenario(_cfg(models, "ray"), out_root=tmp_path / "ray", progress=False)
    assert any(m.get("train/grad_norm", 0) > 0 for m in want.metrics), "no adapter was trained"
    assert len(got.metrics) == len(want.metrics) > 0
    worst = 0.0
    for i, (a, b) in enumerate(zip(want.metrics, got.metrics)):
        exact = {k for k in a if k.startswith(EXACT_KEYS) and not wall_clock(k)}
        numeric = {k for k in a if k.startswith(NUMERIC_KEYS) and not wall_clock(k)}
        assert exact | numeric, f"record {i} has none of the compared keys"
        assert exact <= set(b) and numeric <= set(b), (
            f"record {i}: keys {sorted((exact | numeric) - set(b))} not on Ray"
        )
        for k in sorted(exact):
            assert b[k] == a[k], f"record {i}: {k} {b[k]} on Ray, {a[k]} in process"
        for k in sorted(numeric):
            worst = max(worst, abs(b[k] - a[k]))
            assert b[k] == pytest.approx(a[k], rel=0, abs=METRIC_ATOL), (
                f"record {i}: {k} {b[k]} on Ray, {a[k]} in process"
            )
    print(f"\nLoRA ray vs sharded: worst metric difference {worst:.2e} over {len(want.metrics)} records")
