"""Attack class "bad configuration is one line, never a traceback, never a NaN run".

Non-finite numbers anywhere, sizes the machine cannot hold, YAML alias bombs and values too large to
print: each is a ConfigError of one line naming the key, found before anything is allocated or run.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rtpo.scenario.load import MAX_SCENARIO_NODES, ConfigError, load_scenario, parse_scenario, parse_yaml

NON_FINITE = [".nan", ".inf", "-.inf", ".NaN", ".Inf"]
# a float key in every section that has one, and in the method's own Config dataclass
FLOAT_KEYS = ["train.lr", "eval.target", "method.clip_eps", "method.kl_coef", "task.p_advance", "task.init_scale"]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", NON_FINITE)
def test_non_finite_numbers_are_refused_everywhere(key, value):
    with pytest.raises(ConfigError) as e:
        load_scenario(None, [f"{key}={value}"])
    msg = str(e.value)
    assert msg.startswith(f"{key}: must be a finite number") and "\n" not in msg


def test_non_finite_numbers_in_files_and_python_data(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(
        "name: x\nbackend: {kind: tabular}\ntask: {kind: tool_chain}\nmethod: {name: rtpo, clip_eps_high: .nan}\n"
    )
    with pytest.raises(ConfigError, match=r"^method\.clip_eps_high: must be a finite number"):
        load_scenario(p)
    data = {"name": "x", "backend": {"kind": "tabular"}, "task": {"kind": "tool_chain"}, "method": {"name": "rtpo"}}
    data["train"] = {"lr": float("inf")}
    with pytest.raises(ConfigError, match=r"^train\.lr: must be a finite number"):
        parse_scenario(data)


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_at_once(tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(_alias_bomb())  # 9^9 ≈ 3.9e8 values once expanded
    start = time.monotonic()
    with pytest.raises(ConfigError, match=f"expands to more than {MAX_SCENARIO_NODES:,} values"):
        load_scenario(p)
    assert time.monotonic() - start < 5  # counted per shared node, never expanded (generous for 2 busy cores)


def test_bomb_inside_a_real_key_and_deep_nesting():
    bomb = _alias_bomb() + "name: x\nbackend: {kind: tabular}\ntask: {kind: tool_chain, seed: *a8}\n"
    with pytest.raises(ConfigError):
        parse_yaml(bomb, "s.yaml")
    deep = "a: " + "[" * 5000 + "]" * 5000
    with pytest.raises(ConfigError, match="nested"):
        parse_yaml(deep, "deep.yaml")


def test_error_messages_stay_short_whatever_the_value():
    huge = 10**4000
    data = {"name": "x", "backend": {"kind": "tabular"}, "task": {"kind": "tool_chain"}, "method": {"name": "rtpo"}}
    data["method"]["clip_eps"] = "y" * 10**6
    with pytest.raises(ConfigError) as e:
        parse_scenario(data)
    assert len(str(e.value)) < 300
    data["method"]["clip_eps"] = 0.2
    data["seed"] = [huge] * 10**5
    with pytest.raises(ConfigError) as e:
        parse_scenario(data)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["task.num_actions=1000000000"], "task.num_actions"),
        (["task.num_turns=64", "task.num_actions=100000"], "task.num_actions"),
        (["budget.queries_per_iteration=1000000000"], "budget.queries_per_iteration"),
        (["task.num_states=100000000", "task.num_actions=8", "task.branching=8"], "task.num_states"),
    ],
)
def test_sizes_the_machine_cannot_hold_are_refused_before_allocating(overrides, key, monkeypatch, tmp_path):
    monkeypatch.delenv("RTPO_MEMORY_LIMIT_GB", raising=False)
    path = None
    if "num_states" in overrides[0]:
        path = tmp_path / "random.yaml"
        path.write_text("name: r\nbackend: {kind: tabular}\ntask: {kind: random}\nmethod: {name: rtpo}\n")
    with pytest.raises(ConfigError) as e:
        load_scenario(path, overrides)
    assert str(e.value).startswith(f"{key}: the scenario would need about")


def test_memory_limit_is_the_machines_unless_overridden(monkeypatch):
    monkeypatch.setenv("RTPO_MEMORY_LIMIT_GB", "0.000001")
    with pytest.raises(ConfigError, match="would need about"):
        load_scenario(None)
    monkeypatch.setenv("RTPO_MEMORY_LIMIT_GB", "1")
    load_scenario(None)  # the default scenario needs a few MB


@pytest.mark.parametrize("argv", [["train.lr=.inf"], ["task.num_actions=1000000000"], ["method.kl_coef=.nan"]])
def test_cli_exits_2_with_one_line(argv, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rtpo", "run", *argv, "--out", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())  # nothing was started
