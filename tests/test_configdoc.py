"""Config you can read: `rtpo config show` is a valid scenario, the schema validates every shipped
scenario, docs/config.md is not stale, unknown keys get a suggestion at every level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rtpo.commands.cli import main
from rtpo.scenario import docs as configdoc
from rtpo.scenario.load import ConfigError, load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(ROOT.glob("scenarios/*/*.yaml"))


def _loadable(path: Path) -> bool:
    try:
        load_scenario(path)
        return True
    except ConfigError as e:  # an extra that is not installed (e.g. airline data) is not this test's concern
        return "not installed" in str(e) or "pip install" in str(e)


@pytest.mark.parametrize("path", [None, *SHIPPED], ids=lambda p: "default" if p is None else p.name)
def test_show_is_a_valid_scenario_equal_to_the_one_shown(path):
    try:
        cfg = load_scenario(path)
    except ConfigError as e:
        pytest.skip(f"needs an extra: {e}")
    text = configdoc.show(cfg)
    again = parse_scenario(yaml.load(text, Loader=yaml.SafeLoader))
    assert again.to_dict() == cfg.to_dict()
    assert all("#" in line for line in text.splitlines() if line.strip() and not line.startswith("#")), (
        "every key carries its meaning"
    )


def test_show_edited_and_saved_runs(tmp_path, capsys):
    assert main(["config", "show", "budget.iterations=1", "budget.queries_per_iteration=4"]) == 0
    text = capsys.readouterr().out
    edited = text.replace("  G: 8  #", "  G: 3  #").replace("  plot: true", "  plot: false")
    assert "G: 3" in edited
    f = tmp_path / "edited.yaml"
    f.write_text(edited)
    assert main(["run", str(f), "--out", str(tmp_path / "runs"), "--no-progress"]) == 0
    assert load_scenario(f).method.config.G == 3


def test_schema_validates_every_shipped_scenario_and_rejects_bad_ones():
    jsonschema = pytest.importorskip("jsonschema")
    schema = configdoc.schema()
    validator = jsonschema.Draft202012Validator(schema)
    checked = 0
    for path in SHIPPED:
        data = yaml.safe_load(path.read_text())
        kind = data["backend"]["kind"]
        if not any(v["properties"]["kind"].get("const") == kind for v in schema["properties"]["backend"]["oneOf"]):
            continue  # its backend's extra is not installed here
        errors = list(validator.iter_errors(data))
        assert not errors, (path, errors[0].message)
        checked += 1
    assert checked >= 4
    bad = yaml.safe_load((ROOT / "scenarios/tabular/default.yaml").read_text())
    bad["method"]["GG"] = 3
    assert list(validator.iter_errors(bad))
    bad = yaml.safe_load((ROOT / "scenarios/tabular/default.yaml").read_text())
    bad["budget"]["iterations"] = 0
    assert list(validator.iter_errors(bad))


def test_schema_command_prints_json(capsys):
    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "rtpo scenario"


def test_docs_config_md_is_fresh():
    """Regenerate with: python -m rtpo.scenario.docs --write docs/config.md"""
    assert (ROOT / "docs" / "config.md").read_text() == configdoc.markdown()


@pytest.mark.parametrize(
    "override,hint",
    [
        ("metod.G=3", "did you mean 'method'?"),
        ("method.GG=3", "did you mean 'G'?"),
        ("method.name=rtp", "did you mean 'rtpo'?"),
        ("task.num_action=3", "did you mean 'num_actions'?"),
        ("budget.iteratons=3", "did you mean 'iterations'?"),
        ("backend.kind=tabulr", "did you mean 'tabular'?"),
        ("train.lrr=0.1", "did you mean 'lr'?"),
    ],
)
def test_unknown_keys_get_a_suggestion_at_every_level(override, hint):
    with pytest.raises(ConfigError, match=hint.replace("?", r"\?")):
        load_scenario(None, [override])


def test_version_and_scenarios(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("rtpo 0.")
    assert main(["scenarios"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[0] == "default" and any(line.split()[0] == "tiny-cpu" for line in out)


def test_write_fails_closed_when_a_section_cannot_be_documented(tmp_path, monkeypatch, capsys):
    """Without the llm extra the LLM scenarios do not load: `--write` names which, exits 2 and leaves the
    file as it was (it once wrote the tabular part alone and said "wrote")."""
    import rtpo.scenario.load

    real = rtpo.scenario.load.load_scenario

    def no_llm(path=None, *a, **kw):
        if path is not None and "llm" in str(path):
            raise ImportError("No module named 'transformers'")
        return real(path, *a, **kw)

    monkeypatch.setattr(rtpo.scenario.load, "load_scenario", no_llm)
    target = tmp_path / "config.md"
    target.write_text("the old file\n")
    assert configdoc.main(["--write", str(target)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "cannot document scenarios/llm/tiny-cpu.yaml: ImportError: No module named 'transformers'" in err
    assert target.read_text() == "the old file\n" and sorted(p.name for p in tmp_path.iterdir()) == ["config.md"]
