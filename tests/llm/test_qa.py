"""QA tasks and scoring: loaders for the official layouts (errors name file and record), the generated
multi-hop task, and F1/EM against hand-worked values of the official HotpotQA definitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rtpo.llm.rewards import QAScorer, exact_match, token_f1
from rtpo.llm.tasks.qa import QADataError, corpus_from_contexts, load_qa, write_multihop

PAIRS = json.loads((Path(__file__).parents[1] / "fixtures" / "qa" / "hotpot_scoring_pairs.json").read_text())["pairs"]


@pytest.mark.parametrize("pair", PAIRS, ids=[p["why"] for p in PAIRS])
def test_f1_and_em_agree_with_the_official_definitions(pair):
    assert token_f1(pair["pred"], pair["gold"]) == pytest.approx(pair["f1"], abs=1e-12)
    assert exact_match(pair["pred"], pair["gold"]) == pair["em"]


def test_scorer_takes_the_best_gold_and_reports_both_metrics():
    s = QAScorer("f1")
    r = s.score("NYC", ("New York City", "NYC"))
    assert (r.reward, r.status, r.metrics) == (1.0, "correct", {"f1": 1.0, "em": 1.0})
    r = s.score("Barack Obama", ("Obama",))
    assert r.reward == pytest.approx(2 / 3) and r.status == "incorrect" and r.metrics["em"] == 0.0
    assert QAScorer("em").score("Barack Obama", "Obama").reward == 0.0
    none = s.score(None, ("x",))
    assert (none.reward, none.status) == (0.0, "no_answer")
    with pytest.raises(ValueError, match="f1 or em"):
        QAScorer("bleu")


def _hotpot(path: Path, records) -> Path:
    path.write_text(json.dumps(records))
    return path


GOOD = {
    "_id": "5a8b57f25542995d1e6f1371",
    "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
    "answer": "yes",
    "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
    "context": [
        ["Scott Derrickson", ["Scott Derrickson is an American director. ", "He lives in LA."]],
        ["Ed Wood", ["Edward Wood was an American filmmaker."]],
    ],
    "type": "comparison",
    "level": "hard",
}


def test_hotpotqa_layout_reads_answer_titles_and_paragraphs(tmp_path):
    t = load_qa(_hotpot(tmp_path / "dev.json", [GOOD]), "hotpotqa")
    (item,) = t.items
    assert item.id == GOOD["_id"] and item.answer == ("yes",) and item.raw_question == GOOD["question"]
    assert item.titles == ("Scott Derrickson", "Ed Wood")
    assert item.paragraphs[0] == ("Scott Derrickson", "Scott Derrickson is an American director. He lives in LA.")
    assert GOOD["question"] in item.question and "\\boxed{...}" in item.question


def test_2wiki_and_searchr1_layouts(tmp_path):
    wiki = dict(GOOD, _id="w1", answer="American", answer_aliases=["USA"], evidences=[["a", "b", "c"]])
    t = load_qa(_hotpot(tmp_path / "2wiki.json", [wiki]), "2wiki")
    assert t[0].answer == ("American", "USA")
    lines = [
        {"id": "train_0", "question": "who wrote x?", "golden_answers": ["A", "B"], "data_source": "nq"},
        {"id": "train_1", "question": "q2", "reward_model": {"ground_truth": {"target": ["C"]}}},
    ]
    p = tmp_path / "sr1.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    t = load_qa(p, "searchr1")
    assert [i.answer for i in t] == [("A", "B"), ("C",)] and t[0].titles == ()


def test_searchr1_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"id": ["a", "b"], "question": ["q1", "q2"], "golden_answers": [["x"], ["y", "z"]]})
    pq.write_table(table, tmp_path / "train.parquet")
    t = load_qa(tmp_path / "train.parquet", "searchr1")
    assert [i.answer for i in t] == [("x",), ("y", "z")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "invalid JSON"),
        ('{"a": 1}', "must hold a list"),
        ("[]", "no records"),
        (json.dumps([dict(GOOD, answer=None)]), "missing field 'answer'"),
        (json.dumps([{k: v for k, v in GOOD.items() if k != "question"}]), "missing field 'question'"),
        (json.dumps([GOOD, GOOD]), "duplicate id"),
        (json.dumps([dict(GOOD, context=[["t"]])]), "context\\[0\\]"),
        (json.dumps([dict(GOOD, supporting_facts="x")]), "supporting_facts"),
        (json.dumps([dict(GOOD, answer="  ")]), "no non-empty gold answer"),
        (json.dumps([5]), "expected a JSON object"),
    ],
)
def test_bad_files_are_one_line_errors_naming_file_and_record(tmp_path, content, message):
    p = tmp_path / "bad.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(QADataError, match=message) as e:
        load_qa(p, "hotpotqa")
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_generated_multihop_is_official_format_and_deterministic(tmp_path):
    a = write_multihop(tmp_path / "a.json", 10, seed=3)
    b = write_multihop(tmp_path / "b.json", 10, seed=3)
    assert a.read_bytes() == b.read_bytes()
    recs = json.loads(a.read_text())
    assert set(recs[0]) == {"_id", "question", "answer", "supporting_facts", "context", "type", "level"}
    t = load_qa(a, "hotpotqa")
    for item in t:
        assert len(item.paragraphs) == 10 and set(item.titles) <= {p[0] for p in item.paragraphs}
    corpus = corpus_from_contexts([t], tmp_path / "corpus.jsonl")
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert len({r["title"] for r in rows}) == len(rows) and all(set(r) == {"id", "title", "text"} for r in rows)
