"""`rtpo plan` and the memory check of `rtpo run` (rtpo.plan): counts against the methods' own bounds and
the scenario files' arithmetic, FSDP2's 16 bytes per parameter, KV-cache sizing, refusals that name the
worker before anything starts, user hardware files, and a plan for every shipped llm scenario.

Mutants that turn these red: G instead of G - 1 siblings per boundary in count_phases (counts tests);
dropping `/ ranks` from the AdamW item in learner_memory (the FSDP2 test); skipping check_fits in
rtpo.rundir.runner.run_scenario (the refusal test of `rtpo run`); `reach**k` -> `reach**(k + 1)` (the reach test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rtpo.commands.cli import main
from rtpo.plan import Assumptions, DoesNotFit, check_fits, plan
from rtpo.plan.hardware import GB
from rtpo.plan.shapes import KNOWN
from rtpo.scenario.load import ConfigError, load_scenario

ROOT = Path(__file__).resolve().parents[1]
LLM = sorted((ROOT / "scenarios" / "llm").glob("*.yaml"))
FULL = [p for p in LLM if not p.stem.startswith("tiny")]


def _cfg(name: str, *overrides: str):
    return load_scenario(ROOT / "scenarios" / "llm" / f"{name}.yaml", list(overrides))


def test_tiny_cpu_counts_are_the_scenario_files_arithmetic():
    it = plan(_cfg("tiny-cpu"), "cpu").iteration()
    # tiny-cpu.yaml: trunks 4, boundaries 12, siblings 24, rollouts 28, each phase trains 8 rows of 24 tokens
    got = {k: it[k] for k in ("trunks", "boundaries", "siblings", "rollouts", "trained_rows", "trained_tokens")}
    assert got == {
        "trunks": 4,
        "boundaries": 12,
        "siblings": 24,
        "rollouts": 28,
        "trained_rows": 24,
        "trained_tokens": 24 * 24,
    }, f"the plan's upper bounds differ from tiny-cpu.yaml's batch arithmetic: {got}"
    # every trunk runs K = 3 turns, a sibling from turn k runs K - k: 4*3 + 8*(1+2+3) = 60 responses of 24
    assert it["turns"] == 60 and it["generated_tokens"] == 60 * 24, it


@pytest.mark.parametrize("name", ["qwen3-8b-8gpu", "qwen3-1.7b-airline", "qwen3-8b-search-2x8", "tiny-cpu"])
def test_rollouts_equal_the_methods_own_upper_bound(name):
    cfg = _cfg(name)
    p = plan(cfg, "H100-80GB")
    bound = cfg.method.build().rollouts_per_query(cfg.task.num_turns) * cfg.budget.queries_per_iteration
    assert p.iteration()["rollouts"] == bound, f"{name}: plan {p.iteration()['rollouts']} != method bound {bound}"


def test_grpo_is_one_phase_of_G_full_episodes():
    cfg = _cfg("tiny-cpu", "method.name=grpo", "method.G=4")
    p = plan(cfg, "cpu")
    assert [ph.name for ph in p.phases] == ["update"], p.phases
    it = p.iteration()
    assert it["rollouts"] == 16 and it["turns"] == 48 and it["trained_tokens"] == 48 * 24, it
    assert it["syncs"] == 1


def test_reach_thins_the_boundaries_geometrically():
    a = Assumptions(reach=0.5, fill=0.5)
    p = plan(_cfg("tiny-cpu"), "cpu", a)
    bounds = {ph.name: ph.boundaries for ph in p.phases if ph.name.startswith("turn")}
    assert bounds == {"turn 2": 1.0, "turn 1": 2.0, "turn 0": 4.0}, f"4 trunks x 0.5^k expected, got {bounds}"
    assert p.iteration()["generated_tokens"] == pytest.approx(p.iteration()["turns"] * 12)


def test_fsdp2_holds_16_bytes_per_parameter_over_the_ranks():
    """docs/distributed.md's figure: Qwen3-8B fp32 master + grads + two AdamW moments = 16 B/param, 16.4 GB
    per rank over 8 (the KL reference adds 4 B/param more when kl_coef > 0)."""
    p = plan(_cfg("qwen3-8b-2x8"), "H100-80GB")
    rank = next(w for w in p.workers if w.worker == "trainer rank 0")
    items = dict(rank.items)
    state = items["weights"] + items["grads"] + items["adamw"]
    assert state == pytest.approx(16 * KNOWN["Qwen3-8B"].params / 8), items
    assert state / GB == pytest.approx(16.4, abs=0.05)
    assert items["kl_reference"] == pytest.approx(4 * KNOWN["Qwen3-8B"].params / 8)
    assert 8.1e9 < KNOWN["Qwen3-8B"].params < 8.3e9, "Qwen3-8B has 8.2 B parameters"


def test_kv_cache_fills_the_engines_share():
    """On a GPU the engine claims gpu_memory_utilization of the device: weights, activations, runtime,
    and the rest KV cache; with kv_cache_gb the cache is that size."""
    p = plan(_cfg("qwen3-8b-8gpu"), "A100-80GB")
    eng = dict(next(w for w in p.workers if w.worker.startswith("engine")).items)
    assert sum(eng.values()) == pytest.approx(0.40 * 80 * GB), eng
    tiny = dict(next(w for w in plan(_cfg("tiny-cpu"), "cpu").workers if w.worker.startswith("engine")).items)
    assert tiny["kv_cache"] == 0.5 * 2**30


def test_plan_refuses_naming_worker_and_amount():
    p = plan(_cfg("qwen3-8b-8gpu"), "A100-40GB")
    assert not p.fits
    reason = p.refusal()
    assert "learner rank 0" in reason and "> 40.0 GB" in reason and "A100-40GB" in reason, reason
    with pytest.raises(DoesNotFit, match="learner rank 0"):
        check_fits(_cfg("qwen3-8b-8gpu"), "A100-40GB")
    assert check_fits(_cfg("qwen3-8b-8gpu"), "A100-80GB").fits


def test_rtpo_run_refuses_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "runs"
    rc = main(["run", str(ROOT / "scenarios/llm/qwen3-8b-8gpu.yaml"), "backend.hardware=A100-40GB", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "does not fit on A100-40GB" in err and "learner rank 0" in err, err
    assert len(err.strip().splitlines()) == 1, f"one line expected: {err!r}"
    assert not out.exists() or not any(out.iterdir()), "a refused run must leave no run folder"


@pytest.mark.parametrize("path", FULL, ids=lambda p: p.stem)
def test_every_full_scale_scenario_plans_and_fits_80gb(path, capsys):
    rc = main(["plan", str(path), "--hardware", "A100-80GB"])
    out = capsys.readouterr().out
    assert rc == 0, f"{path.name} does not fit on A100-80GB:\n{out}"
    for line in ("per phase of one iteration:", "iteration", "memory per worker", "fits"):
        assert line in out, f"{path.name}: {line!r} missing from the plan:\n{out}"


def test_user_hardware_file(tmp_path, capsys):
    f = tmp_path / "mygpu.yaml"
    f.write_text("memory_gb: 24\nbf16_tflops: 100\nfp32_tflops: 20\nmem_bw_gbs: 900\nlink_gbs: 25\n")
    rc = main(["plan", str(ROOT / "scenarios/llm/qwen3-8b-8gpu.yaml"), "--hardware", str(f)])
    out = capsys.readouterr().out
    assert rc == 3 and "does not fit on mygpu" in out, out
    bad = tmp_path / "bad.yaml"
    bad.write_text("memory_gb: 24\nflops: 3\n")
    rc = main(["plan", str(ROOT / "scenarios/llm/tiny-cpu.yaml"), "--hardware", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown field 'flops'" in err and len(err.strip().splitlines()) == 1, err


def test_bad_inputs_are_one_line_errors(capsys):
    assert main(["plan", str(ROOT / "scenarios/llm/tiny-cpu.yaml"), "--hardware", "TPU-v9"]) == 2
    assert "unknown" in capsys.readouterr().err
    assert main(["plan", str(ROOT / "scenarios/llm/tiny-cpu.yaml"), "--assume", "reach=2"]) == 2
    assert "reach" in capsys.readouterr().err
    assert main(["plan", str(ROOT / "scenarios/tabular/default.yaml")]) == 2
    assert "llm scenarios" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="backend.model"):
        plan(_cfg("qwen3-8b-8gpu", "backend.model=/nowhere/mystery-model"), "H100")


def test_json_output(capsys):
    import json

    assert main(["plan", str(ROOT / "scenarios/llm/qwen3-8b-2x8.yaml"), "--hardware", "H200", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["devices_needed"] == 16 and d["fits"] and d["iteration"]["rollouts"] == 1792, d["iteration"]


def test_the_ray_driver_holds_the_trainer_groups_weights_in_host_memory_and_the_plan_counts_its_engine():
    """On Ray with a trainer group the driver's learner only holds weights for evaluation: one rank on the
    host, so it takes none of the node's GPUs; its evaluation engine does take tensor_parallel_size GPUs,
    which the plan counts (16 = 7 rollout + 8 trainer + 1 driver for the 2x8 file).  Mutants: the driver's
    learner built with backend.world_size ranks on the device, or the driver's engine left out of the count."""
    from rtpo.llm.build import driver_learner_layout

    cfg = _cfg("qwen3-8b-2x8")
    assert driver_learner_layout(cfg) == (1, "cpu")
    alone = load_scenario(
        str(ROOT / "scenarios/llm/qwen3-8b-2x8.yaml"),
        ["resources.trainer_workers=0", "resources.weight_sync=object_store"],
    )
    assert driver_learner_layout(alone)[0] == alone.backend.world_size, "without a trainer group it trains"
    p = plan(cfg, "H100-80GB")
    driver = [d for d in p.devices if "driver" in d.device]
    assert len(driver) == cfg.backend.tensor_parallel_size == 1 and p.devices_needed == 16, [
        d.device for d in p.devices
    ]
    assert any(w.worker.startswith("driver learner") and w.device == "host" for w in p.workers)
