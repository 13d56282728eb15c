"""Learning-curve plot of a run: the policy's value against rollouts spent, with the exact optimum."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt  # noqa: E402


def learning_curve(
    metrics: list[dict], path: Path, value_key: str, references: dict[str, float], title: str
) -> Path | None:
    """Plot value_key against budget/rollouts; references are drawn as labelled horizontal lines.
    Returns the path written, or None when no metric line carries value_key."""
    rows = [m for m in metrics if value_key in m]
    if not rows:
        return None
    x = [m.get("budget/rollouts", i) for i, m in enumerate(rows)]
    y = [m[value_key] for m in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.plot(x, y, marker=".", lw=1.5, label=value_key)
    styles = iter(["--", ":", "-."])
    for label, value in references.items():
        ax.axhline(value, ls=next(styles, "--"), color="k", lw=1, label=f"{label} = {value:.4g}")
    ax.set_xlabel("rollouts spent")
    ax.set_ylabel("policy value")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# Readable axis labels for the metric keys a paper plots (other keys are shown as they are).
LABELS = {
    "eval/value": "policy value",
    "eval/value_over_v_star": "value / V*",
    "eval/pass@1": "Pass@1",
    "consistency/rollout_train_ratio": "rollout/train log-prob ratio (geometric mean)",
    "adv/zero_rate": "zero-advantage rate",
    "return/mean": "mean return",
    "budget/rollouts": "rollouts spent",
    "budget/tokens": "tokens generated",
    "loss/clipfrac": "clipped fraction",
    "loss/approx_kl": "approximate KL to the rollout policy",
    "loss/kl_ref": "KL to the reference policy",
    "kl_reward/token_kl_mean": "KL to the reference in the reward (token mean per turn)",
    "kl_reward/coef": "KL coefficient β in the reward",
    "global_phase": "phase",
    "train/entropy": "policy entropy (nats per token)",
    "train/lr": "learning rate",
    "train/grad_norm": "gradient norm",
    "gen/response_len_mean": "mean response length (tokens)",
    "gen/tokens_per_s": "generated tokens per second",
    "time/generate_s": "generation time per phase (s)",
    "time/train_s": "training time per phase (s)",
    "time/phase_s": "phase time (s)",
    "time/elapsed_s": "wall time (s)",
}


def label(key: str) -> str:
    return LABELS.get(key, key)


def run_curves(
    runs: dict[str, list[list[dict]]], path: Path, metric: str, x_key: str = "budget/rollouts", title: str = ""
) -> Path | None:
    """One curve per label (mean over its runs, band = min..max across them) of `metric` against `x_key`,
    each run's points interpolated onto a common grid.  The file type follows the suffix (.png, .svg, .pdf).
    Returns the path written, or None when no run has the metric."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    drawn = False
    for name, group in runs.items():
        series = []
        for metrics in group:
            rows = [m for m in metrics if metric in m and x_key in m]
            if rows:
                series.append((np.array([m[x_key] for m in rows], float), np.array([m[metric] for m in rows], float)))
        if not series:
            continue
        lo = max(s[0][0] for s in series)
        hi = min(s[0][-1] for s in series)
        grid = np.linspace(lo, hi, 100) if hi > lo else np.array([lo])
        ys = np.stack([np.interp(grid, x, y) for x, y in series])
        ax.plot(grid, ys.mean(0), lw=1.5, label=f"{name} (n={len(series)})")
        if len(series) > 1:
            ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.2)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel(label(x_key))
    ax.set_ylabel(label(metric))
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
