"""A comparison's figures (rtpo.compare): curves.png, ratio.png, zero_adv_vs_G.png and sweep.png."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rtpo.compare.runner import Outcome


def _band(
    outs: list[Outcome], key: str, grid: np.ndarray, normalise: bool, x_key: str = "budget/rollouts"
) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean and 95% half-width over seeds of `key` interpolated on a spend grid of `x_key` (step-wise hold)."""
    from scipy import stats

    ys = []
    for o in outs:
        pts = [
            (c[x_key], c[key] / c["eval/v_star"] if normalise else c[key])
            for c in o.curve
            if key in c and x_key in c and (not normalise or c.get("eval/v_star"))
        ]
        if not pts:
            continue
        x, y = np.array(pts).T
        idx = np.searchsorted(x, grid, side="right") - 1
        ys.append(np.where(idx >= 0, y[np.maximum(idx, 0)], y[0]))
    if not ys:
        return None
    ys = np.array(ys)
    mean = ys.mean(axis=0)
    if len(ys) < 2:
        return mean, np.zeros_like(mean)
    return mean, stats.t.ppf(0.975, len(ys) - 1) * ys.std(axis=0, ddof=1) / np.sqrt(len(ys))


def write_plots(outcomes: list[Outcome], rows: list[dict], meta: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [o for o in outcomes if o.summary is not None]
    if not ok:
        return
    points = list(dict.fromkeys(o.job.sweep for o in ok))
    labels = list(dict.fromkeys(o.job.label for o in ok))
    colors = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    for fname, key, normalise, ylabel in (
        ("curves.png", "eval/value", True, "policy value / V*"),
        ("ratio.png", "consistency/rollout_train_ratio", False, "rollout/train ratio (geometric mean)"),
    ):
        fig, axes = plt.subplots(1, len(points), figsize=(5.0 * len(points), 3.8), dpi=100, squeeze=False)
        for ax, point in zip(axes[0], points):
            budget = meta["budgets"][str(point)]
            grid = np.linspace(0, budget, 200)
            for lab in labels:
                outs = [o for o in ok if o.job.label == lab and o.job.sweep == point]
                band = _band(outs, key, grid, normalise, f"budget/{meta.get('budget_unit', 'rollouts')}")
                if band is None:
                    continue
                m, h = band
                ax.plot(grid, m, color=colors[lab], label=lab, lw=1.5)
                ax.fill_between(grid, m - h, m + h, color=colors[lab], alpha=0.2, lw=0)
            if normalise:
                ax.axhline(1.0, color="k", ls="--", lw=1, label="V*")
                psi = [
                    c["eval/v_star_psi"] / c["eval/v_star"]
                    for o in ok
                    if o.job.sweep == point
                    for c in o.curve
                    if "eval/v_star_psi" in c and c.get("eval/v_star")
                ]
                if psi and psi[0] < 1 - 1e-9:
                    ax.axhline(psi[0], color="k", ls=":", lw=1, label="V*_ψ (recursive optimum)")
            else:
                ax.axhline(1.0, color="k", ls="--", lw=1)
            title = meta["scenario"] if point is None else f"{meta['scenario']}  {meta['sweep_key']}={point}"
            ax.set_title(title, fontsize=9)
            ax.set_xlabel(f"{meta.get('budget_unit', 'rollouts')} spent")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(out / fname)
        plt.close(fig)
    with_g = [r for r in rows if r["G"] is not None and r["per_seed"]]
    meta["has_zero_plot"] = bool(with_g)
    if with_g:
        fig, ax = plt.subplots(figsize=(5.0, 3.8), dpi=100)
        by_method: dict[str, list] = {}
        for r in with_g:
            name = r["method"].split(":")[0]
            by_method.setdefault(name, []).append(
                (r["G"], r["zero_advantage_rate"]["mean"], r["zero_advantage_rate"]["ci95"])
            )
        for i, (name, pts) in enumerate(by_method.items()):
            pts.sort()
            g, m, h = (np.array(x, np.float64) for x in zip(*pts))
            ax.errorbar(g, m, yerr=np.nan_to_num(h), marker="o", capsize=3, label=name, color=f"C{i}")
        ax.set_xlabel("group size G")
        ax.set_ylabel("zero-advantage rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "zero_adv_vs_G.png")
        plt.close(fig)
    if meta.get("sweep_key") is not None:
        fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=100)
        for lab in labels:
            pts = [
                (r["sweep"], r["value_over_optimum"]["mean"], r["value_over_optimum"]["ci95"])
                for r in rows
                if r["method"] == lab and r["per_seed"]
            ]
            try:
                xs = [float(p[0]) for p in pts]
            except ValueError:
                xs = list(range(len(pts)))
            ax.errorbar(
                xs,
                [p[1] for p in pts],
                yerr=np.nan_to_num([p[2] for p in pts]),
                marker="o",
                capsize=3,
                label=lab,
                color=colors[lab],
            )
        ax.set_xlabel(meta["sweep_key"])
        ax.set_ylabel("final value / V*")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "sweep.png")
        plt.close(fig)
