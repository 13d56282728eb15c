"""rtpo.core.metrics: the one declaration of which record keys are wall-clock, and the generation figures
that a one-process sampler and Ray's summed rollout workers both report."""

from __future__ import annotations

import math

import pytest

from rtpo.core.metrics import generation_metrics, reproducible, wall_clock

WALL_CLOCK = [
    "time/phase_s",
    "time/elapsed_s",
    "time/generate_s",
    "time/weight_syncs",
    "gen/tokens_per_s",
    "ray/rollout_s",
    "ray/weight_sync_s",
    "ray/weight_load_max_s",
    "ray/sync_total_s",
    "ray/weight_broadcast_s",
    "ray/tasks_per_worker_max",
    "ray/tasks_per_worker_min",
]
SEEDED = [
    "gen/tokens",
    "gen/responses",
    "gen/response_len_mean",
    "ray/tasks",
    "ray/weight_syncs",
    "ray/worker_failures",
    "eval/value",
    "eval/pass@1",
    "loss/clipfrac",
    "budget/rollouts",
    "train/steps",
    "samples/turn_2",
    "global_phase",
]


@pytest.mark.parametrize("key", WALL_CLOCK)
def test_seconds_rates_and_scheduling_are_wall_clock(key):
    assert wall_clock(key)


@pytest.mark.parametrize("key", SEEDED)
def test_what_the_seed_decides_is_not(key):
    assert not wall_clock(key)


def test_reproducible_drops_exactly_the_wall_clock_keys():
    record = {k: 1.0 for k in WALL_CLOCK + SEEDED}
    assert set(reproducible(record)) == set(SEEDED)


def test_generation_metrics_of_summed_worker_counts_are_one_samplers():
    a = {"time/generate_s": 2.0, "gen/tokens": 30.0, "gen/responses": 4.0}
    b = {"time/generate_s": 1.0, "gen/tokens": 6.0, "gen/responses": 2.0}
    summed = {k: a[k] + b[k] for k in a}
    got = generation_metrics(summed)
    assert got == {
        "time/generate_s": 3.0,
        "gen/tokens": 36.0,
        "gen/responses": 6.0,
        "gen/response_len_mean": 6.0,
        "gen/tokens_per_s": 12.0,
    }
    assert generation_metrics({"time/generate_s": 0.5, "gen/tokens": 0.0, "gen/responses": 0.0}) == {}
    assert math.isnan(generation_metrics({"gen/tokens": 3.0, "gen/responses": 1.0})["gen/tokens_per_s"])
