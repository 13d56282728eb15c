"""A comparison's statistics and its markdown table (rtpo.compare): one row per (sweep value, method)
with mean ± 95% t-interval over seeds, the resolved settings and the regime diagnostic."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rtpo.compare.runner import Outcome


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval (nan for fewer than 2 values)."""
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    if v.size == 1:
        return float(v[0]), float("nan")
    half = stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(half)


def _ratio_dev(curve: list[dict]) -> float | None:
    r = [c["consistency/rollout_train_ratio"] for c in curve if "consistency/rollout_train_ratio" in c]
    return float(np.max(np.abs(np.asarray(r) - 1.0))) if r else None


def _normalised_gain(curve: list[dict]) -> float | None:
    """(V − V_uniform) / (V* − V_uniform) at the run's last evaluation: 0 = the uniform policy, 1 = V*.
    On families where an exogenous event sets most of the value (region_chain), value/V* starts near
    1 for any policy; this is the share of the controllable gap closed."""
    last = [c for c in curve if "eval/value" in c and "eval/v_uniform" in c and "eval/v_star" in c]
    if not last:
        return None
    c = last[-1]
    gap = c["eval/v_star"] - c["eval/v_uniform"]
    return (c["eval/value"] - c["eval/v_uniform"]) / gap if gap > 0 else None


def _samples_per_turn(curve: list[dict]) -> dict[str, float]:
    """Training samples of each turn over the whole run: the sum of the phases' `samples/turn_<k>`."""
    out: dict[str, float] = {}
    for c in curve:
        for key, v in c.items():
            if key.startswith("samples/turn_"):
                k = key.removeprefix("samples/turn_")
                out[k] = out.get(k, 0.0) + float(v)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def _wrong_first_action(curve: list[dict]) -> bool | None:
    """Whether the run ended locked onto a wrong first action: at its last evaluation, more than half
    of the start-state mass has a most likely turn-0 action that is not optimal (tabular)."""
    last = [c for c in curve if "eval/first_action_wrong" in c]
    return None if not last else bool(last[-1]["eval/first_action_wrong"] > 0.5)


def aggregate(outcomes: list[Outcome]) -> list[dict]:
    """One row per (sweep value, label): mean ± 95% interval over seeds of each quantity."""
    groups: dict[tuple, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault((o.job.sweep, o.job.label), []).append(o)
    rows = []
    for (point, label), outs in groups.items():
        ok = [o for o in outs if o.summary is not None]
        row: dict[str, Any] = {
            "sweep": point,
            "method": label,
            "G": outs[0].job.G,
            "seeds": len(outs),
            "failed": [o.error for o in outs if o.error],
            "per_seed": [],
        }
        for o in ok:
            s = o.summary
            row["per_seed"].append(
                {
                    "seed": o.job.seed,
                    "value_over_optimum": s.get("value_over_optimum"),
                    "normalised_gain": _normalised_gain(o.curve),
                    "wrong_first_action": _wrong_first_action(o.curve),
                    "final_value": s.get("final_value"),
                    "reached_target": s.get("reached_target"),
                    "zero_advantage_rate": s.get("zero_advantage_rate_mean"),
                    "zero_advantage_siblings": s.get("zero_advantage_rollout_share_mean"),
                    "rollout_train_ratio": s.get("rollout_train_ratio_mean"),
                    "max_abs_ratio_minus_1": _ratio_dev(o.curve),
                    "rollouts": s.get("rollouts"),
                    "tokens": s.get("tokens"),
                    "samples_per_turn": _samples_per_turn(o.curve),
                    "wall_s": s.get("wall_s"),
                    "run_dir": s.get("run_dir"),
                }
            )
            per = row["per_seed"][-1]["samples_per_turn"]
            per_mean = float(np.mean(list(per.values()))) if per else None
            row["per_seed"][-1]["samples_per_turn_mean"] = per_mean
        for key in (
            "value_over_optimum",
            "normalised_gain",
            "final_value",
            "zero_advantage_rate",
            "zero_advantage_siblings",
            "rollout_train_ratio",
            "max_abs_ratio_minus_1",
            "rollouts",
            "tokens",
            "samples_per_turn_mean",
            "wall_s",
        ):
            m, h = mean_ci([p[key] for p in row["per_seed"] if p[key] is not None])
            row[key] = {"mean": m, "ci95": h}
        row["reached_target"] = sum(bool(p["reached_target"]) for p in row["per_seed"])
        wrong = [p["wrong_first_action"] for p in row["per_seed"] if p["wrong_first_action"] is not None]
        row["wrong_first_action"] = sum(wrong) if wrong else None
        row["settings"] = outs[0].job.settings
        turns = sorted({k for p in row["per_seed"] for k in p["samples_per_turn"]}, key=int)
        row["samples_per_turn"] = {
            k: float(np.mean([p["samples_per_turn"].get(k, 0.0) for p in row["per_seed"]])) for k in turns
        }
        if ok:
            row["optimum"] = ok[0].summary.get("optimum")
        rows.append(row)
    return rows


def settings_lines(rows: list[dict]) -> list[str]:
    """One line per method with its resolved settings (one per distinct setting where they differ
    between sweep values, e.g. after --tune, with the values they apply to), and the update settings
    several methods share (epochs, minibatch, clip, KL, lr) where they differ between rows, so an
    inherited value is visible."""
    seen: dict[str, dict] = {}
    variants: dict[str, dict[str, tuple[dict, list]]] = {}
    for r in rows:
        st = r.get("settings") or {}
        seen.setdefault(r["method"], st)
        per = variants.setdefault(r["method"], {})
        entry = per.setdefault(repr(sorted(st.items())), (st, []))
        if r.get("sweep") not in entry[1]:
            entry[1].append(r.get("sweep"))
    lines = []
    for m, per in variants.items():
        for st, points in per.values():
            where = f" (at {', '.join(map(str, points))})" if len(per) > 1 else ""
            lines.append(f"- {m}{where}: " + ", ".join(f"{k}={v}" for k, v in st.items()))
    shared = ("epochs", "minibatch_size", "clip_eps", "clip_eps_high", "kl_coef", "log_ratio_clip", "train.lr")
    for key in shared:
        vals = {m: st[key] for m, st in seen.items() if key in st}
        if len(set(map(repr, vals.values()))) > 1:
            lines.append(f"- differs between methods: {key} (" + ", ".join(f"{m} {v}" for m, v in vals.items()) + ")")
    return lines


def _pm(stat: dict, digits: int = 3) -> str:
    m, h = stat["mean"], stat["ci95"]
    if m is None or math.isnan(m):
        return "–"
    if abs(m) >= 1000:
        return f"{m:.0f}" + ("" if math.isnan(h) else f" ± {h:.0f}")
    return f"{m:.{digits}f}" + ("" if math.isnan(h) else f" ± {h:.{digits}f}")


def table_markdown(rows: list[dict], meta: dict) -> str:
    sweep_key = meta.get("sweep_key")
    head = ["method"] if sweep_key is None else [sweep_key, "method"]
    head += [
        "value/V*",
        "gain",
        "final value",
        "reached target",
        "wrong first action",
        "zero-adv rate",
        "zero-adv siblings",
        "rollout/train ratio",
        "max abs(ratio−1)",
        "rollouts",
        "tokens",
        "samples/turn",
        "wall s",
    ]
    lines = [
        f"# rtpo compare: {meta['scenario']}",
        "",
        f"Command: `{meta['command']}`",
        "",
        (
            meta["budget_note"] + "; "
            if meta.get("budget_note")
            else f"Equal {meta.get('budget_unit', 'rollouts')[:-1]} budget per run (SPEC §2.3): "
            f"{', '.join(f'{v}' for v in meta['budgets'].values())} {meta.get('budget_unit', 'rollouts')}; "
        )
        + f"{meta['seeds']} seeds; mean ± 95% t-interval over seeds.  gain = (V − V_uniform) / (V* − V_uniform) "
        "at the last evaluation (tabular and llm exact worlds); wrong first action = seeds whose final policy's most likely turn-0 "
        "action is not optimal for most of the start-state mass; zero-adv rate = share of advantage groups that "
        "tie, zero-adv siblings = share of RTPO-family sibling rollouts in tied groups (the same for equal groups).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [r["method"]] if sweep_key is None else [str(r["sweep"]), r["method"]]
        n_ok = len(r["per_seed"])
        cells += [
            _pm(r["value_over_optimum"]),
            _pm(r["normalised_gain"]),
            _pm(r["final_value"]),
            f"{r['reached_target']}/{n_ok}",
            "–" if r.get("wrong_first_action") is None else f"{r['wrong_first_action']}/{n_ok}",
            _pm(r["zero_advantage_rate"]),
            _pm(r["zero_advantage_siblings"]),
            _pm(r["rollout_train_ratio"], 4),
            _pm(r["max_abs_ratio_minus_1"], 4),
            _pm(r["rollouts"]),
            _pm(r["tokens"]),
            _pm(r["samples_per_turn_mean"], 1),
            _pm(r["wall_s"], 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "samples/turn: training samples (batch rows) per turn over the run, averaged over turns; by turn k:",
        "",
    ]
    for r in rows:
        where = "" if sweep_key is None else f" ({sweep_key}={r['sweep']})"
        per = ", ".join(f"{k}: {v:.0f}" for k, v in r.get("samples_per_turn", {}).items())
        lines.append(f"- {r['method']}{where}: {per or '–'}")
    lines += ["", "Method settings, resolved (what each row ran):", "", *settings_lines(rows)]
    if meta.get("tuning_lines"):
        lines += ["", *meta["tuning_lines"]]
    unit = meta.get("budget_unit", "rollouts")
    over = [
        (r["method"], r["sweep"], r[unit]["mean"])
        for r in rows
        if r["per_seed"] and r[unit]["mean"] > meta["budgets"].get(str(r["sweep"]), math.inf)
    ]
    if over:
        why = (
            "one whole iteration costs more than the budget"
            if unit == "rollouts"
            else "the cap is checked at iteration boundaries, so the last iteration runs past it"
        )
        lines += ["", f"Over budget ({why}; it ran and is reported):"]
        lines += [
            f"- {m}{'' if p is None else f' at {sweep_key}={p}'}: {v:.0f} {unit} > {meta['budgets'][str(p)]}"
            for m, p, v in over
        ]
    for point, diag in (meta.get("diagnostics") or {}).items():
        where = "" if sweep_key is None else f" ({sweep_key}={point})"
        lines += [
            "",
            f"Which regime{where}, before training (exact; rtpo.tabular.diagnostic):",
            "",
            "```",
            *diag,
            "```",
        ]
    failed = [(r["method"], e) for r in rows for e in r["failed"]]
    if failed:
        lines += ["", "Failed runs:"] + [f"- {m}: {e}" for m, e in failed]
    lines += ["", "![learning curves](curves.png)", "", "![rollout/train ratio](ratio.png)", ""]
    if meta.get("has_zero_plot"):
        lines += ["![zero-advantage rate vs G](zero_adv_vs_G.png)", ""]
    if sweep_key is not None:
        lines += [f"![final value vs {sweep_key}](sweep.png)", ""]
    return "\n".join(lines)
