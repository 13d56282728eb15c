"""Reported spend is real spend: what `rtpo compare` reports for a run equals the rollouts in the run's own
checkpoint, and every iteration it paid for was trained and evaluated (rtpo.rundir.runner._run_loop's budget rule).

Budgets at an exact multiple of a flat method's iteration size and below one iteration are the cases
that went wrong before: the last iteration was generated, then the cap stopped the run before its
update phase, so GRPO reported 2 iterations' rollouts where 3 were spent, and below one iteration it
reported 0 rollouts and the untrained policy's value.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rtpo import compare
from rtpo.rundir.checkpoint import latest_path, read_checkpoint
from rtpo.rundir.runner import read_metrics

ROOT = Path(__file__).resolve().parents[1]

TABULAR = """
name: budget
seed: 0
backend: {kind: tabular}
task: {kind: tool_chain, num_turns: 3, num_actions: 3, seed: 1, psi: identity, policy: softmax}
method: {name: rtpo, G: 3, epochs: 1}
budget: {iterations: 2, queries_per_iteration: 4}
train: {lr: 0.2}
eval: {every: 1}
"""


def _compare(tmp_path: Path, scenario: str, methods: str, budgets: str, *overrides: str) -> dict:
    argv = [scenario, "--methods", methods, "--seeds", "1", "--workers", "1", "--out", str(tmp_path)]
    argv += ["--sweep", f"budget.max_rollouts={budgets}", *overrides]
    assert compare.main(argv) == 0
    out = next(tmp_path.glob("compare-*"))
    return {(r["sweep"], r["method"]): r for r in json.loads((out / "comparison.json").read_text())["rows"]}


def _check_row(row: dict, budget: int, per_iteration: int, phases_per_iteration: int) -> dict:
    """The row's reported spend against its run folder: checkpoint, metrics lines, summary."""
    assert not row["failed"], row["failed"]
    (seed,) = row["per_seed"]
    run_dir = Path(seed["run_dir"])
    ckpt = read_checkpoint(latest_path(run_dir))
    metrics = read_metrics(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    spent = ckpt["budget"]["rollouts"]
    iterations = max(1, budget // per_iteration)  # the whole iterations that fit, at least one
    assert spent == iterations * per_iteration
    assert seed["rollouts"] == row["rollouts"]["mean"] == summary["rollouts"] == spent
    assert seed["tokens"] == ckpt["budget"]["tokens"]
    assert metrics and metrics[-1]["budget/rollouts"] == spent  # the last paid-for rollout is in a line
    # every iteration paid for was trained: all its phases ran, and the final value is evaluated after them
    assert len(metrics) == ckpt["progress"]["global_phase"] == iterations * phases_per_iteration
    assert ckpt["progress"]["iteration"] == iterations and ckpt["progress"]["it_state"] is None
    assert "eval/value" in metrics[-1] and seed["final_value"] == metrics[-1]["eval/value"]
    return seed


@pytest.mark.parametrize(
    "method,per_iteration,phases",
    [
        ("grpo:G=4", 4 * 4, 1),  # Q · G
        ("seeupo:G=4", 4 * 4, 3),  # one batch, K per-turn phases
        ("rtpo", 4 * (1 + 2 * 3), 3),  # Q · (trunk + (G−1) · K siblings), K phases
    ],
)
def test_tabular_reported_spend_is_the_checkpoints(tmp_path, method, per_iteration, phases):
    scenario = tmp_path / "budget.yaml"
    scenario.write_text(TABULAR)
    exact, below = 3 * per_iteration, per_iteration - 1
    rows = _compare(tmp_path, str(scenario), method, f"{exact},{below}")
    _check_row(rows[(str(exact), method)], exact, per_iteration, phases)
    # below one iteration: one iteration runs, is trained, and its real (larger) spend is reported
    seed = _check_row(rows[(str(below), method)], below, per_iteration, phases)
    assert seed["rollouts"] > below
    md = next(tmp_path.glob("compare-*/comparison.md")).read_text()
    assert f"- {method} at budget.max_rollouts={below}: {per_iteration} rollouts > {below}" in md
    assert f"={exact}: " not in md  # the exact budget is not over


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers (HF engine, learner)")
def test_llm_reported_spend_is_the_checkpoints(tmp_path):
    """The same on the llm backend: a tiny random Qwen3 from config, the HF engine, the real learner;
    GRPO with G = 2 on 2 queries is 4 rollouts and one phase per iteration."""
    rows = _compare(
        tmp_path,
        str(ROOT / "scenarios" / "llm" / "tiny-cpu-learn.yaml"),
        "grpo:G=2",
        "4,3",
        "backend.engine=hf",
        "budget.queries_per_iteration=2",
        "task.n=4",
        "task.eval_queries=2",
        f"backend.model_cache={tmp_path / 'models'}",
    )
    _check_row(rows[("4", "grpo:G=2")], 4, 4, 1)
    seed = _check_row(rows[("3", "grpo:G=2")], 3, 4, 1)
    assert seed["rollouts"] == 4


def test_equal_token_budget(tmp_path):
    """budget.max_tokens: every method runs until it has generated T response tokens (checked at iteration
    boundaries), reports that spend from its checkpoint, and the table says the budget is in tokens."""
    scenario = tmp_path / "budget.yaml"
    scenario.write_text(TABULAR)
    T = 200
    argv = [str(scenario), "--methods", "rtpo,grpo:G=4", "--seeds", "1", "--workers", "1", "--out", str(tmp_path)]
    assert compare.main([*argv, f"budget.max_tokens={T}"]) == 0
    out = next(tmp_path.glob("compare-*"))
    payload = json.loads((out / "comparison.json").read_text())
    assert payload["budget_unit"] == "tokens" and payload["budgets"] == {"None": T}
    for row in payload["rows"]:
        (seed,) = row["per_seed"]
        run_dir = Path(seed["run_dir"])
        ckpt = read_checkpoint(latest_path(run_dir))
        metrics = read_metrics(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["stopped_by"] == "max_tokens"
        assert seed["tokens"] == ckpt["budget"]["tokens"] == metrics[-1]["budget/tokens"] >= T
        # the iteration before the last had not spent T (stopped at the first boundary past it)
        last_iter = metrics[-1]["iteration"]
        before = [m["budget/tokens"] for m in metrics if m["iteration"] < last_iter]
        assert not before or before[-1] < T
    md = (out / "comparison.md").read_text()
    assert f"Equal token budget per run (SPEC §2.3): {T} tokens" in md
    by = {r["method"]: r for r in payload["rows"]}
    # RTPO's siblings start mid-episode: at equal tokens it gets more rollouts than GRPO
    assert by["rtpo"]["rollouts"]["mean"] > by["grpo:G=4"]["rollouts"]["mean"]
