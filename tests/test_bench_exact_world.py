"""bench/bench_exact_world.py: timed seeds run one per call (each alone under the helpers' quiet.sh) and
are pooled by --merge into one report whose intervals are over every seed; the committed 4-turn and
region-chain results are internally consistent.  No run is started here: only the bench's arithmetic on
run summaries and the committed JSON are checked.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ("exact_world_k4.json", "exact_world_region6.json")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_exact_world", ROOT / "bench" / "bench_exact_world.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(seed: int, first: float, final: float, wall: float) -> dict:
    curve = [{"value_over_v_star": first, "elapsed_s": 10.0}, {"value_over_v_star": final, "elapsed_s": 700.0}]
    return {
        "seed": seed,
        "curve": curve,
        "final_value_over_v_star": final,
        "best_value_over_v_star": max(first, final),
        "first_at_0_9": curve[1] if final >= 0.9 else None,
        "v_uniform_over_v_star": 0.1,
        "process_wall_s": wall,
        "loadavg_start": [0.5, 0.5, 0.5],
        "loadavg_end": [1.5, 1.0, 0.8],
    }


def _part(bench, tmp_path: Path, name: str, runs: list[dict], overrides: list[str]) -> Path:
    path = tmp_path / name
    part = {
        "command": f"python bench/bench_exact_world.py {name}",
        "scenario": "scenarios/llm/tiny-cpu-mdp.yaml",
        "overrides": overrides,
    }
    part.update({**bench.over_seeds(runs), "loadavg_start": [0.5] * 3, "loadavg_end": [1.5] * 3})
    path.write_text(json.dumps(part))
    return path


def test_merge_pools_every_seed_of_the_separate_calls(tmp_path):
    """Three one-seed calls merge into the report a three-seed call would give: the mean and 95%
    t-interval over all three finals, every seed listed, the slowest process wall, the count of runs that
    reached 0.9.  Mutant: --merge keeping only the first JSON's runs (seeds 1, interval nan): red."""
    bench = _bench()
    runs = [_run(0, 0.10, 0.95, 800.0), _run(1, 0.12, 0.70, 850.0), _run(2, 0.09, 0.91, 820.0)]
    parts = [_part(bench, tmp_path, f"s{r['seed']}.json", [r], ["method.kl_coef=0.02"]) for r in runs]
    out = tmp_path / "merged.json"
    bench.main(["--merge", *map(str, parts), "--out", str(out)])
    merged = json.loads(out.read_text())
    finals = np.array([0.95, 0.70, 0.91])
    assert merged["seeds"] == 3 and merged["seed_list"] == [0, 1, 2], "every seed of every part is pooled"
    assert merged["final_value_over_v_star"]["mean"] == pytest.approx(finals.mean()), "mean over all seeds"
    half = 4.302652729911275 * finals.std(ddof=1) / np.sqrt(3)  # t(0.975, 2 d.o.f.)
    assert merged["final_value_over_v_star"]["ci95_half"] == pytest.approx(half), "the t-interval over 3 seeds"
    assert merged["process_wall_s_max"] == 850.0, "the slowest seed's whole process is the one to report"
    assert merged["runs_reaching_0_9"] == 2, "two of the three runs reached 0.9 V*"
    assert merged["loadavg_max_1min"] == 1.5, "the highest 1-minute load seen around any seed"
    assert merged["commands"] == [f"python bench/bench_exact_world.py s{s}.json" for s in range(3)]
    assert merged["turn_only_ceiling"]["actions_by_turn"] == [3, 2, 0, 3], "the scenario's world, blind to state"


def test_merge_refuses_parts_of_different_settings(tmp_path):
    """Seeds run with different overrides are different experiments: pooling them is refused.
    Mutant: no check (a 0.02 and a 0.05 KL run pooled silently): red."""
    bench = _bench()
    a = _part(bench, tmp_path, "a.json", [_run(0, 0.1, 0.8, 800.0)], ["method.kl_coef=0.02"])
    b = _part(bench, tmp_path, "b.json", [_run(1, 0.1, 0.8, 800.0)], ["method.kl_coef=0.05"])
    with pytest.raises(SystemExit, match="differ"):
        bench.main(["--merge", str(a), str(b), "--out", str(tmp_path / "m.json")])


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_result_is_consistent(name):
    """The committed JSON's summary agrees with its own runs: ≥ 3 seeds, the interval values are the runs'
    final value/V*, each run's whole process was timed, and the 0.9 count matches the curves.  Mutant:
    editing one run's final value without the summary (or the reverse): red."""
    result = json.loads((ROOT / "bench" / name).read_text())
    runs = result["runs"]
    assert result["seeds"] == len(runs) >= 3, "at least three seeds"
    assert result["final_value_over_v_star"]["values"] == [r["final_value_over_v_star"] for r in runs]
    assert [r["curve"][-1]["value_over_v_star"] for r in runs] == [r["final_value_over_v_star"] for r in runs]
    assert result["runs_reaching_0_9"] == sum(any(c["value_over_v_star"] >= 0.9 for c in r["curve"]) for r in runs)
    assert all(r["process_wall_s"] > r["wall_s"] > 0 for r in runs), "each run's whole process is timed"


@pytest.mark.parametrize(
    "kind, params",
    [
        ("tool_chain", {"num_turns": 4, "seed": 0}),
        ("region_chain", {"num_turns": 3, "seed": 0, "max_tau": 3, "gamma": 0.9}),
    ],
)
def test_turn_only_ceiling_is_the_best_policy_blind_to_the_state(kind, params):
    """The ceiling of a policy that reads only the turn index equals the tabular backend's exhaustive best
    deterministic policy under a ψ that maps every state of a turn to one context (an independent
    implementation), on the 4-turn tool chain (0.75 V*: what tiny-cpu-mdp's runs stall under) and on a
    discounted region chain with τ > 1.  Mutant: the ceiling's backup without γ^τ, or keeping the first
    sequence instead of the best: red."""
    from rtpo.llm.worlds import World
    from rtpo.tabular import generators
    from rtpo.tabular.solve import best_deterministic_psi_policy, solve

    mdp = getattr(generators, kind)(**params)
    v_star = solve(mdp).value
    world = World.of(mdp, v_star, "test")
    blind = best_deterministic_psi_policy(mdp, psi=tuple(np.zeros(r.shape[0], np.int64) for r in mdp.reward))
    ceiling = _bench().turn_only_ceiling(world)
    assert ceiling["value_over_v_star"] == pytest.approx(blind.value / v_star, rel=1e-12), "not the best blind policy"
    assert ceiling["value_over_v_star"] < 1.0, "reading the state pays on these chains"
