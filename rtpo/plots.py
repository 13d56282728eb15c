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
