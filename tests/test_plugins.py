"""Plugins (rtpo.scenario.plugins): a user's registered names work in `rtpo run`, `rtpo eval` of the run folder,
`--resume` and `rtpo compare`, whether the plugin comes by `--plugin MODULE` (recorded in config.yaml)
or as an installed distribution's `rtpo.plugins` entry point; a plugin that cannot load is one line, exit 2.

The journeys run the real command in fresh processes, so each step must find the plugin on its own (an
`rtpo eval` of a run folder knows nothing the `rtpo run` process imported)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rtpo.scenario import plugins
from rtpo.scenario.load import ConfigError, default_scenario_text, load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rtpo-plugin-example"
SMALL = ["budget.iterations=2", "budget.queries_per_iteration=8"]


def _rtpo(args: list[str], cwd: Path, pythonpath: list[Path], **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath), **env}
    full_env.pop(plugins.DISABLE_ENV, None)
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "rtpo", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300
    )


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _only_run(out: Path) -> Path:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def _run_eval_resume(tmp_path: Path, pythonpath: list[Path], plugin_args: list[str]) -> Path:
    """`rtpo run` -> `rtpo eval` of the run folder -> `rtpo run --resume`, each a fresh process."""
    args = ["run", *plugin_args, "method.name=rtpo_trimmed", *SMALL, "--out", "runs", "--no-progress"]
    _ok(_rtpo(args, tmp_path, pythonpath))
    run = _only_run(tmp_path / "runs")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["method"]["name"] == "rtpo_trimmed" and cfg["method"]["estimator"] == "sibling_trimmed_mean"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2 * 4  # 2 iterations x K=4 phases

    _ok(_rtpo(["eval", str(run)], tmp_path, pythonpath))
    report = json.loads((run / "eval.json").read_text())
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert report["method"] == "rtpo_trimmed"
    assert report["exact"]["eval/value"] == pytest.approx(last["eval/value"], rel=1e-12)  # the trained policy

    _ok(_rtpo(["run", "--resume", str(run), "budget.iterations=3", "--no-progress"], tmp_path, pythonpath))
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3 * 4
    assert yaml.safe_load((run / "config.yaml").read_text())["budget"]["iterations"] == 3
    return run


def _compare(tmp_path: Path, pythonpath: list[Path], args: list[str]) -> Path:
    """`rtpo compare` of the plugin's method; returns its one run folder."""
    cmd = ["compare", *args, "--methods", "rtpo_trimmed", "--seeds", "1", "--workers", "1", *SMALL, "--out", "cmp"]
    _ok(_rtpo(cmd, tmp_path, pythonpath))
    (folder,) = (tmp_path / "cmp").iterdir()
    (row,) = json.loads((folder / "comparison.json").read_text())["rows"]
    assert (
        row["method"] == "rtpo_trimmed"
        and row["failed"] == []
        and row["settings"]["estimator"] == "sibling_trimmed_mean"
    )
    (run,) = [p for p in (folder / "runs").rglob("config.yaml")]
    return run.parent


@pytest.mark.slow  # fresh processes through run, eval and resume: 16 s
def test_plugin_flag_through_run_eval_resume(tmp_path):
    run = _run_eval_resume(tmp_path, [ROOT, EXAMPLE], ["--plugin", "rtpo_plugin_example"])
    assert yaml.safe_load((run / "config.yaml").read_text())["plugins"] == ["rtpo_plugin_example"]


@pytest.mark.slow  # fresh compare processes: 10 s
def test_plugin_flag_in_compare_and_missing_plugin_is_one_line(tmp_path):
    run = _compare(tmp_path, [ROOT, EXAMPLE], ["--plugin", "rtpo_plugin_example"])
    assert yaml.safe_load((run / "config.yaml").read_text())["plugins"] == ["rtpo_plugin_example"]
    # the run folder where the plugin is not importable: one line naming it, exit 2, nothing touched
    before = (run / "metrics.jsonl").read_text()
    for args in (["eval", str(run)], ["run", "--resume", str(run), "budget.iterations=4"]):
        bad = _rtpo(args, tmp_path, [ROOT])
        assert bad.returncode == 2, bad.stderr
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and "'rtpo_plugin_example'" in lines[0] and "cannot be imported" in lines[0], lines
    assert (run / "metrics.jsonl").read_text() == before


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory) -> Path:
    """The example package installed for real (pip, no network, into a target folder)."""
    tmp = tmp_path_factory.mktemp("plugin-install")
    src = tmp / "src"
    shutil.copytree(EXAMPLE, src)  # setuptools writes build files into the source tree: not into the repo
    site = tmp / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    proc = subprocess.run([*pip, "--target", str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (ep,) = site.glob("rtpo_plugin_example-*.dist-info/entry_points.txt")
    assert "[rtpo.plugins]" in ep.read_text()
    return site


@pytest.mark.slow  # pip-installs the example, then fresh processes: 14 s
def test_entry_point_through_run_eval_resume_needs_no_flag(tmp_path, installed_example):
    """The entry point loads in every process, so nothing is recorded and no flag is needed."""
    run = _run_eval_resume(tmp_path, [ROOT, installed_example], [])
    assert "plugins" not in yaml.safe_load((run / "config.yaml").read_text())


@pytest.mark.slow  # fresh compare processes on the installed example: 9 s
def test_entry_point_in_compare_and_switched_off(tmp_path, installed_example):
    _compare(tmp_path, [ROOT, installed_example], [])
    off = _rtpo(
        ["run", "method.name=rtpo_trimmed", *SMALL], tmp_path, [ROOT, installed_example], **{plugins.DISABLE_ENV: "1"}
    )
    assert off.returncode == 2 and "unknown method 'rtpo_trimmed'" in off.stderr
    assert "a plugin's method needs --plugin MODULE" in off.stderr and off.stderr.count("\n") == 1


# -- in-process: names, errors, recording -------------------------------------------------------------
@pytest.fixture
def example_on_path(monkeypatch):
    """The example importable in this process; its registrations and import are undone afterwards (so
    other tests' registries and a later fresh import are unaffected)."""
    from rtpo.core.estimators import ESTIMATORS
    from rtpo.core.methods import METHODS
    from rtpo.tabular.tasks import TASKS

    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setattr(plugins, "_loaded", dict(plugins._loaded))
    with ESTIMATORS.temporary(), METHODS.temporary(), TASKS.temporary():
        yield
    for name in [m for m in sys.modules if m == "rtpo_plugin_example" or m.startswith("rtpo_plugin_example.")]:
        del sys.modules[name]


def test_compare_records_the_scenarios_plugins_in_every_job(tmp_path, example_on_path):
    from rtpo import compare

    (tmp_path / "plug.yaml").write_text(default_scenario_text() + "plugins: [rtpo_plugin_example]\n")
    jobs, _ = compare.build_jobs(str(tmp_path / "plug.yaml"), ["rtpo", "rtpo_trimmed"], 1, [], None, tmp_path)
    assert [j.data["plugins"] for j in jobs] == [["rtpo_plugin_example"]] * 2
    assert [parse_scenario(j.data).method.config.estimator for j in jobs] == ["sibling_mean", "sibling_trimmed_mean"]
    jobs, _ = compare.build_jobs(None, ["rtpo_trimmed"], 1, [], None, tmp_path, plugins=["rtpo_plugin_example"])
    assert jobs[0].data["plugins"] == ["rtpo_plugin_example"]


@pytest.mark.parametrize(
    "value, message",
    [
        ("not a module", "plugins[0]: must be an importable module name"),
        ([3], "plugins[0]: must be an importable module name"),
        ({"a": 1}, "plugins: must be a list of module names"),
    ],
)
def test_bad_plugin_names_are_one_line(value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plugins.check_names(value)


def test_plugin_that_fails_is_named(tmp_path, monkeypatch):
    (tmp_path / "s2016_raises.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    (tmp_path / "s2016_takes_rtpo.py").write_text(
        "from rtpo.core.methods import register_method\n"
        "from rtpo.core.methods.rtpo import RTPO\n"
        "register_method('rtpo')(RTPO)\n"
    )
    (tmp_path / "s2016_bad_import.py").write_text("import s2016_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "s2016_raises": "plugin 's2016_raises' failed to import: RuntimeError: boom second line",
        "s2016_takes_rtpo": "plugin 's2016_takes_rtpo' failed to import: ValueError: method 'rtpo' is already registered",
        "s2016_bad_import": "plugin 's2016_bad_import' failed to import: ModuleNotFoundError",
        "s2016_absent": "plugin 's2016_absent' cannot be imported: no module named 's2016_absent'",
    }
    for name, message in cases.items():
        with pytest.raises(ConfigError) as e:
            load_scenario(None, plugins=[name])
        assert message in str(e.value) and "\n" not in str(e.value)
        assert name not in plugins.loaded()


def test_plugin_that_exits_or_registers_then_raises_leaves_nothing(tmp_path, monkeypatch):
    """sys.exit at import is a one-line ConfigError (not the end of the process), and a plugin that
    registers a method, an estimator and a backend and then raises leaves none of them registered: the
    next scenario naming them is told the name is unknown, and the real entries they replaced are back.
    Mutant: without rtpo.core.registry.rollback_failed_import the method 's27_half' stays valid."""
    from rtpo.core.estimators import ESTIMATORS
    from rtpo.core.methods import METHODS
    from rtpo.scenario.backends import BACKENDS

    (tmp_path / "s27_exits.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "s27_half.py").write_text(
        "from rtpo.scenario.backends import BACKENDS, BackendSpec, register_backend\n"
        "from rtpo.core.estimators import ESTIMATORS\n"
        "from rtpo.core.methods import METHODS, register_method\n"
        "from rtpo.core.methods.rtpo import RTPO\n"
        "class Half(RTPO):\n    pass\n"
        "register_method('s27_half')(Half)\n"
        "def est(*a, **k):\n    return 0\n"
        "ESTIMATORS.register('s27_est')(est)\n"
        "register_backend('s27_backend', BackendSpec(config=None, parse_task=None, build=None))\n"
        "METHODS._items['grpo'] = Half  # replaces a built-in entry, then fails\n"
        "raise RuntimeError('after registering')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    grpo = METHODS.get("grpo")
    for name, message in {
        "s27_exits": "plugin 's27_exits' failed to import: SystemExit: 3",
        "s27_half": "plugin 's27_half' failed to import: RuntimeError: after registering",
    }.items():
        with pytest.raises(ConfigError) as e:
            load_scenario(None, plugins=[name])
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
        assert name not in plugins.loaded() and name not in sys.modules
    left = [n for n in ("s27_half",) if n in METHODS] + [n for n in ("s27_est",) if n in ESTIMATORS]
    left += [n for n in ("s27_backend",) if n in BACKENDS]
    assert left == [], f"a plugin whose import raised left {left} registered"
    assert METHODS.get("grpo") is grpo, "the built-in entry the failed plugin replaced was not put back"
    with pytest.raises(ConfigError, match="unknown method 's27_half'"):
        load_scenario(None, ["method.name=s27_half"])
    proc = _rtpo(["run", "--plugin", "s27_exits", "--out", "runs", "--no-progress"], tmp_path, [ROOT, tmp_path])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_plugins_are_recorded_and_round_trip(example_on_path):
    cfg = load_scenario(None, ["method.name=rtpo_trimmed"], plugins=["rtpo_plugin_example"])
    assert cfg.plugins == ("rtpo_plugin_example",)
    data = cfg.to_dict()
    assert list(data)[:3] == ["name", "seed", "plugins"]
    assert parse_scenario(yaml.safe_load(cfg.to_yaml())) == cfg
    assert cfg.method.config.estimator == "sibling_trimmed_mean"
    # a scenario without plugins keeps its old config.yaml (and checkpoint fingerprint): no empty key
    assert "plugins" not in load_scenario(None).to_dict()


def test_entry_points_load_once_and_fail_by_name(tmp_path, monkeypatch):
    """A tmp dist-info on sys.path is an installed distribution to importlib.metadata."""
    dist = tmp_path / "s2016_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: s2016-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rtpo.plugins]\ncounter = s2016_ep:register\n")
    (tmp_path / "s2016_ep.py").write_text("CALLS = []\ndef register():\n    CALLS.append(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_entry_points_done", False)
    monkeypatch.setattr(plugins, "_loaded", dict(plugins._loaded))
    plugins.load()
    plugins.load()
    import s2016_ep

    assert s2016_ep.CALLS == [1]
    assert plugins.loaded()["s2016_ep:register"] == "entry point counter = s2016_ep:register"

    (dist / "entry_points.txt").write_text("[rtpo.plugins]\nbroken = s2016_ep_missing\n")
    monkeypatch.setattr(plugins, "_entry_points_done", False)
    with pytest.raises(ConfigError, match=r"plugin 'broken' \(rtpo.plugins entry point broken = s2016_ep_missing\)"):
        plugins.load()
    monkeypatch.setenv(plugins.DISABLE_ENV, "1")
    monkeypatch.setattr(plugins, "_entry_points_done", False)
    plugins.load()  # switched off: the broken entry point is not even looked at


def test_a_plugin_task_and_method_through_the_python_api(tmp_path, monkeypatch, example_on_path):
    """The plugin's tabular task and method in rtpo.train: the exact optimum of the lock is 1, and the
    scenario records the plugin."""
    import rtpo

    monkeypatch.chdir(tmp_path)
    scenario = {
        "name": "lock",
        "backend": {"kind": "tabular"},
        "task": {"kind": "combination_lock", "num_turns": 3, "num_actions": 3},
        "method": {"name": "rtpo_trimmed", "G": 4},
        "budget": {"iterations": 3, "queries_per_iteration": 8},
    }
    res = rtpo.train(scenario, plugins=["rtpo_plugin_example"])
    assert (
        res.config.plugins == ("rtpo_plugin_example",) and res.config.method.config.estimator == "sibling_trimmed_mean"
    )
    assert res.summary["optimum"] == 1.0 and 0 < res.summary["final_value"] <= 1.0
    assert list(tmp_path.iterdir()) == []


_EVERY_REGISTRY = (
    "from rtpo.core.estimators import ESTIMATORS, sibling_advantage\n"
    "from rtpo.core.methods import register_method\n"
    "from rtpo.core.methods.rtpo import RTPO\n"
    "from rtpo.tabular.tasks import TASKS\n"
    "from rtpo.llm.tasks.math import TASK_BUILDERS, arithmetic_task\n"
    "from rtpo.llm.textenv import register_text_env\n"
    "from rtpo.llm.tools.function import register_function\n"
    "register_method('p27_method')(type('M', (RTPO,), {}))\n"
    "ESTIMATORS.register('p27_estimator')(sibling_advantage)  # a function of rtpo under a new name\n"
    "TASKS.register('p27_tabular')(TASKS.get('random'))  # an instance of rtpo's\n"
    "TASK_BUILDERS.register('p27_llm_task')(arithmetic_task)\n"
    "register_text_env('p27_text_env')(type('E', (), {}))\n"
    "def p27_tool(x: int) -> str:\n    'A tool.'\n    return str(x)\n"
    "register_function(p27_tool)  # registers a lambda of rtpo.llm.tools.function\n"
)
_CHECK = """
import json, sys
from rtpo.core import registry
from rtpo.scenario import plugins
from rtpo.scenario.schema import ConfigError
out = {}
for name in sys.argv[1:]:
    try:
        plugins.load_module(name)
        out[name] = "loaded"
    except ConfigError as e:
        out[name] = str(e)
import rtpo.llm.tools, rtpo.llm.textenv, rtpo.tabular.tasks, rtpo.llm.tasks.math  # noqa: E401
out["left"] = sorted(f"{r.kind} {n}" for r in list(registry._ALL) for n in r._items if n.startswith("p27"))
out["builtins"] = sorted(f"{r.kind} {n}" for r in list(registry._ALL) for n in r._items if n in ("python", "arithmetic", "random", "rtpo"))
from rtpo.scenario.plugins import _load_entry_point
class EP:
    value = "p27_ep:register"
    def load(self):
        import p27_ep
        return p27_ep.register
try:
    _load_entry_point(EP())
except RuntimeError as e:
    out["entry point"] = str(e)
out["left after entry point"] = sorted(f"{r.kind} {n}" for r in list(registry._ALL) for n in r._items if n.startswith("p27"))
print(json.dumps(out))
"""


def test_a_failed_plugin_leaves_nothing_in_any_registry_even_one_its_import_created(tmp_path):
    """In a fresh interpreter (so the tool, text-environment, tabular and llm task registries do not exist
    yet and the plugin's import creates them), plugins that register in every registry — through the
    helpers (register_function's lambda is rtpo's, an estimator registered is rtpo's own function) — and
    then raise, call sys.exit, or fail in a helper module of their package after it registered: each is
    one line and leaves nothing registered, while the built-ins those imports registered stay; so does an
    entry point's callable that registers and raises.  Before: 15 of the three plugins' 18 names stayed (the
    rollback saw only registries that existed before the import, and kept an entry whose object's module
    was imported: rtpo's own function, register_function's lambda).  Mutant: that rollback (main before
    this test) turns it red; so does judging journaled entries by their object's module."""
    (tmp_path / "p27_raises.py").write_text(_EVERY_REGISTRY + "raise RuntimeError('after registering')\n")
    (tmp_path / "p27_exits.py").write_text(_EVERY_REGISTRY.replace("p27_", "p27x_") + "import sys\nsys.exit(3)\n")
    pkg = tmp_path / "p27pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text(_EVERY_REGISTRY.replace("p27_", "p27h_"))
    (pkg / "plugin.py").write_text("import p27pkg.helpers\nraise ImportError('later')\n")
    (tmp_path / "p27_ep.py").write_text(
        "def register():\n    "
        + _EVERY_REGISTRY.replace("p27_", "p27e_").replace("\n", "\n    ")
        + "raise RuntimeError('callable failed')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK, "p27_raises", "p27_exits", "p27pkg.plugin"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["p27_raises"] == "plugins: plugin 'p27_raises' failed to import: RuntimeError: after registering"
    assert out["p27_exits"] == "plugins: plugin 'p27_exits' failed to import: SystemExit: 3"
    assert out["p27pkg.plugin"] == "plugins: plugin 'p27pkg.plugin' failed to import: ImportError: later"
    assert out["left"] == [], f"failed plugins left {out['left']} registered"
    assert out["builtins"] == [
        "method rtpo",
        "tabular task random",
        "task arithmetic",
        "tool python",
    ], out["builtins"]
    assert out["entry point"] == "callable failed"
    assert out["left after entry point"] == [], f"a failed entry point left {out['left after entry point']} registered"
    cli = _rtpo(["run", "--plugin", "p27_raises", "--out", "runs", "--no-progress"], tmp_path, [ROOT, tmp_path])
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "after registering" in cli.stderr, cli.stderr
