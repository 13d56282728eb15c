"""QA data and scoring read the official files as their own scorers and loaders do.

- 2WikiMultiHopQA's sentences carry no separating space (HotpotQA's do): a paragraph is never
  `designer.She`, and HotpotQA's stay byte-identical to "".join.
- `\\boxed{\\text{Delhi}}` scores as the official scorer scores the extracted words `Delhi`.
- a wiki-18 title in quotes keeps its own quotes (only the enclosing pair goes).
- supporting_facts without a sentence id, and a NaN/Infinity gold answer, are one-line loader errors
  naming file, record and field.
- the generations log writes the gold answers as JSON strings, not a tuple's repr.

Mutants: "".join for 2wiki, no qa_answer_text in QAScorer, strip('"') in _split_contents, or the old
supporting_facts check each turn one test red.
"""

from __future__ import annotations

import json

import pytest

from rtpo.llm.rewards import QAScorer, qa_answer_text
from rtpo.llm.tasks.qa import QADataError, load_qa


def _write(tmp_path, records, name="data.json"):
    path = tmp_path / name
    path.write_text(json.dumps(records) if not isinstance(records, str) else records)
    return path


def _wiki2(**over):
    rec = {
        "_id": "w1",
        "type": "compositional",
        "question": "Who designed it?",
        "answer": "Ann",
        "context": [["Ann Lee", ["Ann Lee was a designer.", "She was born in Delhi.", " Spaced already."]]],
        "supporting_facts": [["Ann Lee", 0], ["Ann Lee", 1]],
        "evidences": [],
    }
    rec.update(over)
    return rec


def test_2wiki_sentences_are_separated_and_hotpotqa_ones_kept(tmp_path):
    task = load_qa(_write(tmp_path, [_wiki2()]), "2wiki")
    (title, text) = task[0].paragraphs[0]
    assert text == "Ann Lee was a designer. She was born in Delhi. Spaced already.", text
    hot = dict(_wiki2(), context=[["Ann Lee", ["Ann Lee was a designer.", " She was born in Delhi."]]])
    (_, text) = load_qa(_write(tmp_path, [hot], "hot.json"), "hotpotqa")[0].paragraphs[0]
    assert text == "Ann Lee was a designer. She was born in Delhi.", "HotpotQA's sentences are concatenated as is"


@pytest.mark.parametrize(
    "answer,gold,f1",
    [
        ("\\text{Delhi}", "Delhi", 1.0),
        ("\\textbf{New \\text{Delhi}}", "New Delhi", 1.0),
        ("\\mathrm{Paris}\\,\\text{France}", "Paris France", 1.0),
        ("\\text {Delhi}", "delhi", 1.0),
        ("Delhi", "Delhi", 1.0),
        ("\\text{Mumbai}", "Delhi", 0.0),
    ],
)
def test_latex_text_wrappers_score_like_the_extracted_words(answer, gold, f1):
    r = QAScorer("f1").score(answer, (gold,))
    assert r.reward == f1 and r.metrics["em"] == f1, f"{answer!r} vs {gold!r}: {r}"


def test_qa_answer_text_leaves_plain_answers_alone():
    for s in ["1994", "Ed Wood (film)", "A & B", "x_1 {a}"]:
        assert qa_answer_text(s) == s


def test_a_quoted_wiki18_title_keeps_its_quotes():
    from rtpo.llm.retrieval import _split_contents

    assert _split_contents('""Weird Al" Yankovic"\ntext') == ('"Weird Al" Yankovic', "text")
    assert _split_contents('"Paris"\nParis is ...') == ("Paris", "Paris is ...")
    assert _split_contents('"Hello"" (song)"\nx') == ('Hello"" (song)', "x")
    assert _split_contents("No quotes\nx") == ("No quotes", "x")


@pytest.mark.parametrize(
    "facts",
    [
        [["Ann Lee"]],
        [["Ann Lee", None]],
        [["Ann Lee", "0"]],
        [["Ann Lee", True]],
        [["Ann Lee", -1]],
        [["Ann Lee", 0, 1]],
    ],
)
def test_supporting_facts_need_a_sentence_id(tmp_path, facts):
    path = _write(tmp_path, [_wiki2(supporting_facts=facts)])
    with pytest.raises(QADataError) as err:
        load_qa(path, "2wiki")
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "supporting_facts[0]" in msg and "sentence id" in msg, msg


@pytest.mark.parametrize("gold", ["NaN", "Infinity", "-Infinity", '["Ann", NaN]'])
def test_a_non_finite_gold_is_refused(tmp_path, gold):
    rec = json.dumps(_wiki2()).replace('"answer": "Ann"', f'"answer": {gold}')
    path = _write(tmp_path, "[" + rec + "]")
    with pytest.raises(QADataError) as err:
        load_qa(path, "2wiki")
    assert "\n" not in str(err.value) and str(path) in str(err.value) and "'answer'" in str(err.value), err.value


def test_generations_log_writes_gold_answers_as_json_strings():
    from rtpo.llm.env import _gold

    assert _gold(("Ann", "Ann Lee")) == ["Ann", "Ann Lee"]
    assert _gold("55") == "55"
    assert json.loads(json.dumps(_gold(("Ann",)))) == ["Ann"]
