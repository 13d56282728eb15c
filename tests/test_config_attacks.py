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
        (["method.G=1000000000"], "method.G"),
        (["method.trunks_per_query=1000000000"], "method.trunks_per_query"),
        (["method.name=grpo", "method.G=1000000000"], "method.G"),
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


LLM_TINY = "scenarios/llm/tiny-cpu.yaml"


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["method.G=1000000000"], "method.G"),
        (["method.trunks_per_query=1000000000"], "method.trunks_per_query"),
        (["method.name=grpo", "method.G=1000000000"], "method.G"),
        (["budget.queries_per_iteration=1000000000"], "budget.queries_per_iteration"),
    ],
)
def test_llm_group_sizes_no_machine_holds_are_refused_naming_the_key(overrides, key, monkeypatch):
    """An llm scenario with method.G=1e9 used to be accepted (and only died allocating 1e9 requests): its
    rollouts are refused at load time, naming the key that drives them.  Mutant: drop the llm backend's
    `memory` estimate and these load."""
    from pathlib import Path

    monkeypatch.delenv("RTPO_MEMORY_LIMIT_GB", raising=False)
    with pytest.raises(ConfigError) as e:
        load_scenario(Path(__file__).resolve().parents[1] / LLM_TINY, overrides)
    assert str(e.value).startswith(f"{key}: the scenario would need about"), str(e.value)


def test_every_shipped_scenario_still_loads(monkeypatch):
    """The llm memory estimate is a lower bound: no shipped scenario, full-scale ones included, is refused
    on this machine (they name their own hardware; the estimate counts sampled turns only)."""
    from pathlib import Path

    monkeypatch.delenv("RTPO_MEMORY_LIMIT_GB", raising=False)
    for path in sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*/*.yaml")):
        load_scenario(path)


def test_duplicated_keys_are_refused_naming_the_line(tmp_path):
    """PyYAML keeps the last of two equal keys silently; a scenario's second `G:` would win unseen.
    Every mapping level (a section, the top level, a nested tool mapping) is checked; `<<` merges may
    still be overridden.  Mutant: drop rtpo.scenario.schema._construct_mapping and the file loads with G=8."""
    body = "name: x\nbackend: {kind: tabular}\ntask:\n  kind: chain\nmethod:\n  name: rtpo\n  G: 4\n"
    cases = {
        body + "  G: 8\n": "at line 8: duplicated key 'G' (first at line 7)",
        body + "name: y\n": "at line 8: duplicated key 'name' (first at line 1)",
        "name: x\nname: x\n": "at line 2: duplicated key 'name' (first at line 1)",
        "a: {b: 1, b: 2}\n": "at line 1: duplicated key 'b'",
    }
    for i, (text, message) in enumerate(cases.items()):
        p = tmp_path / f"dup{i}.yaml"
        p.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_scenario(p)
        assert message in str(e.value) and str(e.value).startswith(str(p)), str(e.value)
    merged = "base: &b {G: 4, name: rtpo}\nname: x\nbackend: {kind: tabular}\ntask: {kind: tool_chain}\n"
    p = tmp_path / "merge.yaml"
    p.write_text(merged.replace("base: &b {G: 4, name: rtpo}\n", "") + "method: {G: 6, name: rtpo}\n")
    assert load_scenario(p).method.config.G == 6
    assert parse_yaml("a: &b {G: 4}\nc: {<<: *b, G: 6}\n", "x")["c"]["G"] == 6  # a merge key may be overridden


def test_a_folder_as_scenario_says_so(tmp_path):
    with pytest.raises(ConfigError, match="is a folder; give a scenario file"):
        load_scenario(tmp_path)


def test_run_takes_overrides_after_options(tmp_path):
    """`rtpo run FILE --out D key=val` (the order `rtpo compare` accepts) used to be 'unrecognized
    arguments'; an option-looking or bare leftover is still refused in one line."""
    from pathlib import Path

    scenario = str(Path(__file__).resolve().parents[1] / "scenarios" / "tabular" / "default.yaml")
    base = [sys.executable, "-m", "rtpo", "run", scenario, "--out", str(tmp_path / "r"), "--no-progress"]
    ok = subprocess.run([*base, "budget.iterations=1", "seed=3"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    (run,) = (tmp_path / "r").iterdir()
    import yaml

    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["seed"] == 3 and saved["budget"]["iterations"] == 1, saved
    for extra in (["bogus"], ["budget.iterations=1", "--bogus"]):
        bad = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unrecognized arguments" in bad.stderr


def test_llm_scenario_without_the_llm_extra_is_one_line(tmp_path):
    """In an install without the llm extra (here: its packages hidden by a sitecustomize import hook), an
    llm scenario used to end in a 22-line import traceback; now one line names the extra, exit 2, and no
    run folder is made.  Mutant: rtpo.rundir.runner calls get_backend(...).build directly and the traceback is back."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('transformers', 'tokenizers', 'safetensors', 'vllm'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Hide())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    scenario = str(root / LLM_TINY)
    for argv in (["run", scenario, "--out", str(tmp_path / "runs"), "--no-progress"], ["eval", scenario]):
        r = subprocess.run([sys.executable, "-m", "rtpo", *argv], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 2, r.stderr[-1500:]
        assert r.stderr.count("\n") == 1 and "needs the llm extra" not in r.stderr, r.stderr[-1500:]
        assert "need the llm extra (pip install 'rtpo[llm]')" in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "runs").exists()


def test_full_scale_llm_scenarios_set_the_prompt_limit_their_header_states():
    """Every shipped Qwen3 scenario's header states E.3's 8,192-token prompt limit; the math ones used to
    leave task.max_context_tokens unset (no limit but max_model_len - 1 = 12,287).  Fails before."""
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "scenarios" / "llm").glob("qwen3-*.yaml")):
        assert "8192" in path.read_text(), f"{path.name}: its header no longer states the E.3 prompt limit"
        assert load_scenario(path).task.max_context_tokens == 8192, f"{path.name}: task.max_context_tokens unset"
