"""Rewards: math answers by math-verify (with our own timeout) or exact numeric comparison; QA token F1.

`MathVerifier.score(answer, gold)` never raises: a malformed, missing or pathological answer is reward 0
with a status naming why (the environment counts statuses as metrics).  math-verify runs in a worker
process, so the timeout is enforced by killing it — it works from any thread, unlike math-verify's
own signal.alarm timeouts, which are switched off (see `_verify_worker.py`).
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import string
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol, runtime_checkable

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_verify_worker.py")
STATUSES = ("correct", "incorrect", "no_answer", "unparsed", "timeout", "error")


@dataclass(frozen=True)
class RewardResult:
    """reward in [0, 1]; status in STATUSES; method: 'math_verify' or 'numeric' (what decided it)."""

    reward: float
    status: str
    method: str


# ---------------------------------------------------------------- exact numeric fallback

_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{(-?[0-9.]+)\}\{(-?[0-9.]+)\}$")


def to_number(text: str | None) -> Fraction | None:
    """An exact number from a short answer string ('1,234', '-3/4', '\\frac{3}{4}', '12\\%', '$5$'), else None."""
    if text is None:
        return None
    s = _TEXT_RE.sub(r"\1", str(text)).strip()
    s = s.replace("$", "").replace("\\!", "").replace("\\,", "").replace("{,}", "").replace(" ", "")
    s = s.replace("\\%", "").replace("%", "").rstrip(".")
    if s.startswith("\\boxed{") and s.endswith("}"):
        s = s[len("\\boxed{") : -1]
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    m = _FRAC_RE.match(s)
    try:
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d+(\.\d+)?(/-?\d+(\.\d+)?)?|-?\.\d+", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def numeric_equal(answer: str | None, gold: str | None) -> bool | None:
    """True/False when both sides are plain numbers, None when either is not (cannot decide).

    Both sides are exact rationals (to_number), so they are compared exactly: no float tolerance can
    make 1234567891 equal 1234567890, and no float conversion can overflow on a 400-digit integer.
    """
    a, g = to_number(answer), to_number(gold)
    if a is None or g is None:
        return None
    return a == g


# ---------------------------------------------------------------- math-verify in a worker process


class MathVerifier:
    """math-verify with a hard per-call timeout, usable from any thread.

    timeout_s:   per answer; past it the worker is killed (restarted on the next call) and the answer
                 scores 0 with status 'timeout' unless the numeric comparison decides it.
    startup_s:   allowed for the worker's first import of math-verify (sympy is slow to import).
    """

    def __init__(self, timeout_s: float = 5.0, startup_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self.startup_s = startup_s
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.available: bool | None = None  # None until the worker first answered
        self.unavailable_reason: str | None = None

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        hello = self._readline(self.startup_s)
        info = json.loads(hello) if hello else {"ready": False, "error": "worker did not start in time"}
        self.available = bool(info.get("ready"))
        if not self.available:
            self.unavailable_reason = info.get("error")
            self.close()

    def _readline(self, timeout: float) -> str | None:
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self._proc.stdout.readline()
        return line or None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout):
                if f:
                    f.close()
            self._proc = None

    def __del__(self) -> None:  # the worker never outlives its verifier
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _math_verify(self, answer: str, gold: str) -> tuple[str, bool]:
        """('ok'|'timeout'|'error'|'unavailable', correct)."""
        with self._lock:
            if self.available is False:
                return "unavailable", False
            if self._proc is None:
                self._start()
                if not self.available:
                    return "unavailable", False
            assert self._proc is not None and self._proc.stdin is not None
            req = {"pred": f"\\boxed{{{answer}}}", "gold": f"${gold}$"}
            try:
                self._proc.stdin.write(json.dumps(req) + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self.close()
                return "error", False
            line = self._readline(self.timeout_s)
            if line is None:
                self.close()  # stuck (or dead): kill it; the next call starts a fresh one
                return "timeout", False
            reply = json.loads(line)
            if "error" in reply:
                return "error", False
            if not reply.get("pred_parsed"):
                return "unparsed", False
            return "ok", bool(reply["ok"])

    def score(self, answer: str | None, gold: str) -> RewardResult:
        """Reward of one extracted answer (the last \\boxed{} contents) against the gold answer."""
        if answer is None or not str(answer).strip():
            return RewardResult(0.0, "no_answer", "none")
        numeric = numeric_equal(answer, gold)
        if numeric is not None:  # both sides are exact numbers: exact comparison decides, sympy's tolerance may not
            return RewardResult(1.0, "correct", "numeric") if numeric else RewardResult(0.0, "incorrect", "numeric")
        outcome, correct = self._math_verify(str(answer), str(gold))
        if outcome == "ok":
            return RewardResult(1.0 if correct else 0.0, "correct" if correct else "incorrect", "math_verify")
        status = {"timeout": "timeout", "unparsed": "unparsed", "error": "error"}.get(outcome, "unparsed")
        return RewardResult(0.0, status, "none")


_DEFAULT: MathVerifier | None = None
_DEFAULT_LOCK = threading.Lock()


def default_verifier() -> MathVerifier:
    """One process-wide verifier (one worker process), created on first use."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = MathVerifier()
        return _DEFAULT


def math_reward(answer: str | None, gold: str, verifier: MathVerifier | None = None) -> RewardResult:
    return (verifier or default_verifier()).score(answer, gold)


# ---------------------------------------------------------------- answer extraction options

# How an environment finds the answer in a response.  "boxed" (the default, the paper's) takes the last
# \\boxed{} only.  "last_integer" is a deliberately lenient option for tiny random models: when no
# \\boxed{} is present, the last integer written anywhere in the response's content counts as the
# answer, so a random policy over a small vocabulary hits a one-digit gold answer with a probability
# well above 0 and RL has a signal to amplify.  "last_digit" is more lenient still, for one-digit gold
# answers: the last digit character of the content (a small BPE merges digits into multi-digit tokens,
# so a random policy's last integer is rarely one digit; its last digit is one of ten):
# scenarios/llm/tiny-cpu-learn.yaml uses it.  Never use either to report math accuracy.
ANSWER_PARSES = ("boxed", "last_integer", "last_digit", "answer_tag")
_INTEGER = re.compile(r"(?<![\d.])-?\d+(?![\d.])")


def last_integer(text: str | None) -> str | None:
    """The last integer (optional minus sign, no decimal point) in `text`, as written; None if there is none."""
    if not text:
        return None
    found = _INTEGER.findall(text)
    return found[-1] if found else None


def last_digit(text: str | None) -> str | None:
    """The last decimal digit character in `text`; None if there is none."""
    for ch in reversed(text or ""):
        if "0" <= ch <= "9":
            return ch
    return None


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_tag(text: str | None) -> str | None:
    """The content of the last <answer>…</answer> (Search-R1's answer format), stripped; None if none."""
    found = _ANSWER_TAG.findall(text or "")
    return found[-1].strip() if found and found[-1].strip() else None


LENIENT_PARSERS = {"last_integer": last_integer, "last_digit": last_digit, "answer_tag": answer_tag}


# ---------------------------------------------------------------- QA token F1 (HotpotQA / SQuAD style)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|texttt|mathrm|mathbf|mathit|mbox|emph)\s*\{([^{}]*)\}")


def qa_answer_text(answer: str) -> str:
    """The words of an extracted QA answer: LaTeX text wrappers unwrapped (`\\text{Delhi}` -> `Delhi`,
    nested ones too) and `\\,`/`~` spacing made spaces, so the official scorers' normalisation (which
    keeps letters) sees what the model wrote, not the macro's name."""
    prev = None
    while prev != answer:
        prev, answer = answer, _LATEX_TEXT.sub(r"\1", answer)
    return re.sub(r"\\[,;:! ]|~", " ", answer).strip()


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between normalized answers; yes/no/noanswer must match exactly (HotpotQA's rule)."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in ("yes", "no", "noanswer") or g in ("yes", "no", "noanswer")) and p != g:
        return 0.0
    p_tok, g_tok = p.split(), g.split()
    common = collections.Counter(p_tok) & collections.Counter(g_tok)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_tok), same / len(g_tok)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    """HotpotQA's EM: the normalized answers are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


@dataclass(frozen=True)
class QAResult(RewardResult):
    """A QA score: reward (F1 or EM, as configured) plus both as metrics (answer/f1, answer/em)."""

    metrics: dict = field(default_factory=dict)


@runtime_checkable
class BatchScorer(Protocol):
    """A scorer that wants every answer finished in a step at once, with its question (an LLM judge:
    rtpo.llm.judge.JudgeScorer).  The environment calls score_batch instead of score when a scorer has it."""

    def score_batch(
        self, answers: Sequence[str | None], golds: Sequence[str | Sequence[str]], questions: Sequence[str]
    ) -> list[RewardResult]: ...


class QAScorer:
    """Scores a predicted answer against the gold answers of a QA item (the best over the golds).

    reward: "f1" (the paper's Table 1 metric for HotpotQA / 2Wiki) or "em".  status: correct (EM = 1),
    incorrect, no_answer (nothing parsed: reward 0).  Metrics f1 and em are reported either way.
    """

    def __init__(self, reward: str = "f1") -> None:
        if reward not in ("f1", "em"):
            raise ValueError(f"QAScorer: reward must be f1 or em, got {reward!r}")
        self.reward = reward

    def score(self, answer: str | None, gold: str | Sequence[str]) -> QAResult:
        golds = (gold,) if isinstance(gold, str) else tuple(gold)
        if answer is None:
            return QAResult(0.0, "no_answer", "qa", {"f1": 0.0, "em": 0.0})
        answer = qa_answer_text(answer)
        f1 = max(token_f1(answer, g) for g in golds)
        em = max(exact_match(answer, g) for g in golds)
        return QAResult(f1 if self.reward == "f1" else em, "correct" if em else "incorrect", "qa", {"f1": f1, "em": em})


__all__ = [
    "STATUSES",
    "BatchScorer",
    "MathVerifier",
    "QAResult",
    "QAScorer",
    "RewardResult",
    "default_verifier",
    "exact_match",
    "math_reward",
    "normalize_answer",
    "numeric_equal",
    "qa_answer_text",
    "to_number",
    "token_f1",
]
