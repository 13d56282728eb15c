"""Rewards: math-verify with its own timeout off the main thread, the numeric fallback, QA token F1."""

from __future__ import annotations

import threading
import time

import pytest

from rtpo.llm.rewards import MathVerifier, exact_match, normalize_answer, numeric_equal, to_number, token_f1

try:
    import math_verify  # noqa: F401

    _HAVE_MV = True
except ImportError:
    _HAVE_MV = False
needs_mv = pytest.mark.skipif(not _HAVE_MV, reason="math-verify is not installed (pip install math-verify==0.9.0)")


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier(timeout_s=20.0)
    yield v
    v.close()


@pytest.mark.parametrize(
    "text,value",
    [
        ("42", 42),
        ("1,234", 1234),
        ("-3/4", -0.75),
        (r"\frac{3}{4}", 0.75),
        (r"\dfrac{-1}{2}", -0.5),
        ("$5$", 5),
        (r"12\%", 12),
        (r"\text{7}", 7),
        ("0.50.", 0.5),
        ("x+1", None),
        ("1/0", None),
        ("", None),
    ],
)
def test_to_number(text, value):
    got = to_number(text)
    assert (got is None) if value is None else float(got) == value


def test_numeric_equal_is_three_valued():
    assert numeric_equal("024", "24") is True
    assert numeric_equal("0.5", r"\frac{1}{2}") is True
    assert numeric_equal("7", "8") is False
    assert numeric_equal(r"\sqrt{2}", "1.414") is None


def test_missing_answer_scores_zero_without_starting_a_worker():
    v = MathVerifier()
    r = v.score(None, "3")
    assert (r.reward, r.status) == (0.0, "no_answer") and v._proc is None
    assert v.score("  ", "3").status == "no_answer"
    assert v.score("3", "3").method == "numeric" and v._proc is None  # numbers never need sympy


@needs_mv
@pytest.mark.parametrize(
    "answer,gold,reward",
    [
        ("x^2+1", "1+x^2", 1.0),
        (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", 1.0),
        ("(1,2)", "(1, 2)", 1.0),
        (r"2\pi", r"2\pi", 1.0),
        ("x^2", "x^3", 0.0),
        ("43", "42", 0.0),
        (r"5\sqrt{2}", r"\sqrt{50}", 1.0),
    ],
)
def test_math_verify_equivalence(verifier, answer, gold, reward):
    r = verifier.score(answer, gold)
    assert r.reward == reward and r.status == ("correct" if reward else "incorrect")


@needs_mv
def test_malformed_answers_never_crash(verifier):
    for bad in [r"\frac{1}{", "}}}{{{", r"\begin{matrix", "\x00\x01", "a" * 300]:
        r = verifier.score(bad, "3")
        assert r.reward == 0.0 and r.status in ("incorrect", "unparsed", "error", "timeout")
    assert verifier.score("3", "3").reward == 1.0  # still healthy afterwards


@needs_mv
def test_works_off_the_main_thread_and_times_out(verifier):
    out = []
    t = threading.Thread(target=lambda: out.append(verifier.score("y*2", "2y")))
    t.start()
    t.join(120)
    assert not t.is_alive() and out[0].reward == 1.0  # math-verify's own signal timeouts would fail here
    v = MathVerifier(timeout_s=2.0, startup_s=120.0)
    try:
        assert v.score("x+x", "2x").reward == 1.0  # warm (start-up is not counted against the timeout)
        t = threading.Thread(target=lambda: out.append(v.score("9^{9^{9^{9}}}", "3")))
        start = time.monotonic()
        t.start()
        t.join(120)
        assert not t.is_alive() and time.monotonic() - start < 120
        stuck = out[1]
        assert stuck.reward == 0.0 and stuck.status in ("timeout", "incorrect")
        if stuck.status == "timeout":
            assert v._proc is None  # the stuck worker was killed; the next call starts a fresh one
        assert v.score("z+z", "2z").reward == 1.0
    finally:
        v.close()


def test_unavailable_math_verify_falls_back_to_numbers(monkeypatch):
    import rtpo.llm.rewards as rw

    v = MathVerifier()
    monkeypatch.setattr(rw, "_WORKER", "/nonexistent/worker.py")
    assert v.score("8", "8.0").reward == 1.0
    r = v.score("7", "8")
    assert (r.reward, r.method) == (0.0, "numeric")
    assert v.score("x+1", "1+x").status == "unparsed" and v.available is False


def test_token_f1():
    assert token_f1("The Eiffel Tower", "eiffel tower") == 1.0
    assert token_f1("Paris France", "Paris") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert token_f1("yes", "no") == 0.0 and token_f1("no", "no") == 1.0
    assert token_f1("", "anything") == 0.0 and token_f1("a b c", "d e f") == 0.0
    assert token_f1("x y", "y x") == token_f1("y x", "x y") == 1.0
    assert normalize_answer("The  Cat, a dog!") == "cat dog"
    assert exact_match("the cat", "Cat") == 1.0
