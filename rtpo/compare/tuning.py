"""Per-method tuning for a comparison (rtpo.compare, `--tune KEY=v1,v2,...`): best-vs-best instead of
one shared setting.

For every method spec and sweep value, each candidate value of KEY runs on the *tuning seeds*, which
are disjoint from the reported ones: the reported seeds are scenario.seed + 0..N−1, the tuning seeds
scenario.seed + N..N+T−1 (`--tune-seeds T`).  The candidate with the highest mean score over the tuning
seeds wins (score: value / V* where the backend has an optimum, else the final value; a tie keeps the
earlier candidate; a candidate whose runs failed scores −inf).  The reported runs then use each
(method, sweep value)'s winner, so no reported seed took part in choosing its own setting, and
the selection is printed and written into comparison.md/json.

How stable a choice is: the tuning seeds are a sample, and with few of them another sample would pick
another winner.  Each selection reports its stability, the share of bootstrap resamples of its tuning
seeds (drawn with replacement, BOOTSTRAP of them, a fixed stream) whose winner is the chosen value;
the report flags choices below STABLE.  bench/bench_tune_stability.py measures how often tuning on one
set of seeds picks what a disjoint set picks, per number of tuning seeds, on the shipped families; the
default `--tune-seeds` is the smallest count at which that agreement reached STABLE there.

KEY is any override: `train.lr` applies to every method; `method.X` only to the methods whose Config
has a field X (the others run their one setting, and the report says "not tuned").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rtpo.compare.jobs import Job, _method_fields, parse_method_spec

BOOTSTRAP = 2000  # resamples of the tuning seeds behind a choice's stability
STABLE = 0.8  # a choice picked in fewer resamples than this is flagged unstable
DEFAULT_TUNE_SEEDS = 4  # bench/tune_stability.json: the fewest reaching STABLE agreement on the shipped families


@dataclass(frozen=True)
class Tune:
    """The parsed `--tune KEY=v1,v2,...` and `--tune-seeds T`."""

    key: str
    values: tuple[str, ...]
    seeds: int = 2

    @classmethod
    def parse(cls, text: str, seeds: int) -> Tune:
        from rtpo.scenario.load import ConfigError

        key, eq, vals = text.partition("=")
        values = tuple(v.strip() for v in vals.split(",") if v.strip())
        if not eq or not key.strip() or len(values) < 2:
            raise ConfigError(f"--tune {text!r}: must look like key=v1,v2,... with at least two values")
        if len(set(values)) != len(values):
            raise ConfigError(f"--tune {text!r}: a value is repeated")
        if seeds < 1:
            raise ConfigError("--tune-seeds must be >= 1")
        return cls(key.strip(), values, seeds)

    def applies_to(self, spec: str) -> bool:
        """Whether KEY changes this method spec's runs (`method.X` only where its Config has X, and not
        where the spec itself fixes X)."""
        if not self.key.startswith("method."):
            return True
        name, kv = parse_method_spec(spec)
        field_name = self.key.split(".", 1)[1]
        return field_name in _method_fields(name) and field_name not in kv


@dataclass
class Selection:
    """The tuning result of one (sweep value, method spec): the score of every candidate and the winner."""

    sweep: str | None
    label: str
    scores: dict[str, float] = field(default_factory=dict)  # candidate -> mean score over tuning seeds
    seeds: list[int] = field(default_factory=list)
    chosen: str | None = None  # None: KEY does not apply to this method
    per_seed: dict[str, dict[int, float]] = field(default_factory=dict)  # candidate -> tuning seed -> score
    stability: float | None = None  # share of bootstrap resamples of the tuning seeds that pick `chosen`

    def as_dict(self) -> dict:
        return {
            "sweep": self.sweep,
            "method": self.label,
            "scores": self.scores,
            "seeds": self.seeds,
            "chosen": self.chosen,
            "per_seed": {v: {str(k): s for k, s in d.items()} for v, d in self.per_seed.items()},
            "stability": self.stability,
        }


def winners(scores: np.ndarray) -> np.ndarray:
    """(V, B) mean scores of V candidates (in the tuned order) under B seed samples -> (B,) the index of
    each sample's winner: the highest mean, a tie to the earlier candidate (as `select` breaks it)."""
    return np.argmax(scores, axis=0)


def stability(per_seed: dict[str, dict[int, float]], order: tuple[str, ...], chosen: str, seed: int = 0) -> float:
    """The share of BOOTSTRAP resamples, with replacement, of the tuning seeds that every candidate ran on
    whose winner (highest mean score, ties to the earlier candidate) is `chosen`; 1.0 means every
    resample agrees.  With T seeds there are at most C(2T−1, T) distinct resamples, so T = 1 gives 1.0
    trivially (nothing to resample): the report says so."""
    values = [v for v in order if v in per_seed]
    common = sorted(set.intersection(*(set(per_seed[v]) for v in values))) if values else []
    if not common:
        return float("nan")
    table = np.array([[per_seed[v][s] for s in common] for v in values], np.float64)  # (V, T)
    idx = np.random.default_rng(seed).integers(0, len(common), size=(BOOTSTRAP, len(common)))
    with np.errstate(invalid="ignore"):
        means = table[:, idx].mean(axis=2)  # (V, BOOTSTRAP); a failed run's −inf keeps its mean −inf
    return float(np.mean(np.asarray(values)[winners(means)] == chosen))


def score(outcome) -> float:
    """A tuning run's score: value / V* where known, else the final value; −inf for a failed run."""
    s = outcome.summary
    if s is None:
        return -math.inf
    v = s.get("value_over_optimum")
    v = s.get("final_value") if v is None else v
    return -math.inf if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def select(tune: Tune, outcomes_by_value: dict[str, list]) -> dict[tuple, Selection]:
    """The winner of each (sweep value, label) from the tuning outcomes of each candidate value."""
    out: dict[tuple, Selection] = {}
    for value in tune.values:
        for o in outcomes_by_value.get(value, []):
            key = (o.job.sweep, o.job.label)
            sel = out.setdefault(key, Selection(o.job.sweep, o.job.label))
            sel.scores.setdefault(value, [])  # type: ignore[arg-type]
            sel.scores[value].append(score(o))  # type: ignore[union-attr]
            sel.per_seed.setdefault(value, {})[int(o.job.seed)] = score(o)
            if o.job.seed not in sel.seeds:
                sel.seeds.append(o.job.seed)
    for sel in out.values():
        means = {v: (sum(s) / len(s) if s else -math.inf) for v, s in sel.scores.items()}  # type: ignore[union-attr]
        sel.scores = means
        best = max(means.values())
        sel.chosen = next(v for v in tune.values if v in means and means[v] == best)
        sel.seeds.sort()
        sel.stability = stability(sel.per_seed, tune.values, sel.chosen)
    return out


def tuning_lines(tune: Tune, selections: list[Selection], reported: list[int], sweep_key: str | None) -> list[str]:
    """The tuning section of the report: the seeds, and per row every candidate's mean score, winner marked."""
    if not selections:
        return []
    tuned = sorted({s for sel in selections for s in sel.seeds})
    lines = [
        f"Tuned per method: {tune.key} over {', '.join(tune.values)} on tuning seeds "
        f"{', '.join(map(str, tuned))} (disjoint from the reported seeds {', '.join(map(str, reported))}); "
        "score = mean value/V* (else final value) over the tuning seeds; * = chosen, used by the reported runs; "
        f"stable = share of {BOOTSTRAP} bootstrap resamples of the tuning seeds that choose the same value.",
        "",
    ]
    head = (["method"] if sweep_key is None else [sweep_key, "method"]) + list(tune.values) + ["stable"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for sel in selections:
        cells = [sel.label] if sweep_key is None else [str(sel.sweep), sel.label]
        if sel.chosen is None:
            cells += ["not tuned"] + [""] * len(tune.values)
        else:
            cells += [
                ("–" if math.isinf(sel.scores.get(v, -math.inf)) else f"{sel.scores[v]:.3f}")
                + ("*" if v == sel.chosen else "")
                for v in tune.values
            ]
            cells.append(_stability_cell(sel.stability, len(sel.seeds)))
        lines.append("| " + " | ".join(cells) + " |")
    shaky = [s for s in selections if s.chosen is not None and s.stability is not None and s.stability < STABLE]
    if shaky:
        lines += [
            "",
            f"Unstable: {len(shaky)} of {sum(s.chosen is not None for s in selections)} choices are picked by fewer "
            f"than {STABLE:.0%} of the resamples; more tuning seeds (--tune-seeds) would make them firmer.",
        ]
    if any(len(s.seeds) == 1 for s in selections if s.chosen is not None):
        lines += ["", "One tuning seed: nothing to resample, so no choice's stability can be measured (shown as n/a)."]
    return lines


def _stability_cell(value: float | None, seeds: int) -> str:
    if value is None or math.isnan(value) or seeds < 2:
        return "n/a"
    return f"{value:.0%}" + (" (unstable)" if value < STABLE else "")


def reported_jobs_with(
    jobs_by_value: dict[str, list[Job]], untuned: list[Job], selections: dict[tuple, Selection]
) -> list[Job]:
    """The reported jobs: for each (sweep value, label) those built with its chosen value, in order."""
    out = list(untuned)
    for value, jobs in jobs_by_value.items():
        for j in jobs:
            sel = selections.get((j.sweep, j.label))
            if sel is not None and sel.chosen == value:
                out.append(j)
    return out
