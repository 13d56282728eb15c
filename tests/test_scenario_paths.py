"""Relative paths in a scenario file resolve against the file's folder, not the current folder
(rtpo.scenario.paths): the same file loaded from the repository, from another folder, through its
shipped name and through `rtpo compare` / `rtpo.train`'s readers names the same absolute files; a
relative path on the command line is the current folder's; a missing file is one line naming the key
and the resolved path.  Mutant: resolving against Path.cwd() instead of the file's folder turns
test_file_paths_do_not_depend_on_the_current_folder red.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rtpo.scenario.load import ConfigError, load_scenario

ROOT = Path(__file__).resolve().parents[1]
MATH_SFT = ROOT / "scenarios" / "llm" / "tiny-cpu-math-sft.yaml"
GOLD = ROOT / "scenarios" / "llm" / "data" / "math-gold.jsonl"

pytest.importorskip("pydantic")


def _scenario(folder: Path, name: str = "s.yaml", **paths: str) -> Path:
    init, corpus = paths.get("init", "null"), paths.get("corpus", "null")
    lines = [
        "name: p",
        f"backend: {{kind: llm, model: tiny-random, init: {init}}}",
        f"task: {{kind: multihop, retriever: {{kind: bm25, corpus: {corpus}}}}}",
        f"method: {{name: sft, data: {paths['data']}}}",
    ]
    f = folder / name
    f.write_text("\n".join(lines) + "\n")
    return f


@pytest.fixture
def layout(tmp_path: Path) -> dict:
    """tmp/proj/scen/s.yaml naming ../data/d.jsonl, ../data/c.jsonl and ../init; tmp/elsewhere/ to run from."""
    proj = tmp_path / "proj"
    (proj / "scen").mkdir(parents=True)
    (proj / "data").mkdir()
    (proj / "init").mkdir()
    for name in ("d.jsonl", "c.jsonl"):
        (proj / "data" / name).write_text("{}\n")
    f = _scenario(proj / "scen", data="../data/d.jsonl", corpus="../data/c.jsonl", init="../init")
    (tmp_path / "elsewhere").mkdir()
    return {"proj": proj, "file": f, "elsewhere": tmp_path / "elsewhere"}


def _paths(cfg) -> tuple[str, str, str]:
    return cfg.method.config.data, cfg.task.retriever.corpus, cfg.backend.init


def test_file_paths_do_not_depend_on_the_current_folder(layout, monkeypatch):
    proj = layout["proj"]
    want = (str(proj / "data" / "d.jsonl"), str(proj / "data" / "c.jsonl"), str(proj / "init"))
    monkeypatch.chdir(proj)
    assert _paths(load_scenario("scen/s.yaml")) == want, "from the project folder: relative to the file's folder"
    monkeypatch.chdir(layout["elsewhere"])
    assert _paths(load_scenario("../proj/scen/s.yaml")) == want, "from another folder: the same files"
    monkeypatch.chdir(proj / "scen")
    assert _paths(load_scenario("s.yaml")) == want, "from the file's own folder: the same files"


def test_the_other_scenario_readers_resolve_the_same_way(layout, monkeypatch):
    from rtpo.commands.api import resolve
    from rtpo.compare.jobs import _scenario_data

    monkeypatch.chdir(layout["elsewhere"])
    rel = "../proj/scen/s.yaml"
    want = _paths(load_scenario(rel))
    data, _ = _scenario_data(rel)
    assert (data["method"]["data"], data["task"]["retriever"]["corpus"], data["backend"]["init"]) == want, "compare"
    assert _paths(resolve(rel)) == want, "rtpo.train / rtpo.resolve"


def test_command_line_paths_are_the_current_folders(layout, monkeypatch):
    monkeypatch.chdir(layout["proj"] / "data")
    cfg = load_scenario(layout["file"], ["method.data=c.jsonl"])
    assert cfg.method.config.data == str(layout["proj"] / "data" / "c.jsonl"), "an override is cwd-relative"
    assert cfg.backend.model == "tiny-random", "a name that is not a path is left alone"


def test_a_missing_file_is_one_line_naming_key_and_resolved_path(layout, monkeypatch):
    monkeypatch.chdir(layout["elsewhere"])
    f = _scenario(layout["proj"] / "scen", "missing.yaml", data="../data/nothing.jsonl")
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    msg = str(e.value)
    want = f"method.data: {layout['proj'] / 'data' / 'nothing.jsonl'} does not exist"
    assert "\n" not in msg and msg.startswith(want), f"the key and the resolved path, in one line: {msg}"
    with pytest.raises(ConfigError) as e:
        load_scenario(layout["file"], ["backend.init=missing"])
    assert str(e.value).startswith(f"backend.init: {layout['elsewhere'] / 'missing'} does not exist"), str(e.value)


def test_shipped_sft_scenario_by_file_and_by_name_reads_the_shipped_gold(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # not the repository
    by_file = load_scenario(MATH_SFT).method.config.data
    by_name = load_scenario("tiny-cpu-math-sft").method.config.data
    assert Path(by_file).read_bytes() == GOLD.read_bytes(), by_file
    assert Path(by_name).read_bytes() == GOLD.read_bytes(), f"the shipped copy (package data) reads {by_name}"
