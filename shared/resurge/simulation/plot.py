"""The comparison plot: one bar per policy, its time split into productive and lost by
cause, as shares of the time held (so the productive share is the ETTR).

matplotlib is imported here only, and with the Agg backend (no display): install it
with the ``simulate`` extra (``pip install 'resurge[simulate]'``).
"""

from __future__ import annotations

from pathlib import Path

from resurge.simulation.results import CAUSES, Summary

__all__ = ["MissingPlotting", "write_plot"]

_COLOURS = {
    "productive": "#2a9d8f",
    "detection": "#e9c46a",
    "restart": "#f4a261",
    "redone": "#e76f51",
    "checkpoint": "#8d99ae",
    "waiting": "#6d597a",
    "snapshot": "#b5838d",
}


class MissingPlotting(RuntimeError):
    """matplotlib is not installed."""


def write_plot(summary: Summary, path: Path, title: str = "") -> Path:
    """Draw ``summary``'s policies side by side into the PNG ``path``; returns it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingPlotting(
            "the plot needs matplotlib: pip install 'resurge[simulate]'"
        ) from None
    results = summary.results
    names = [r.policy for r in results]
    if len(set(names)) < len(names):  # one policy at several checkpoint intervals
        names = [f"{r.policy}\n{r.checkpoint_interval_minutes:g} min ckpt" for r in results]
    places = list(range(len(results)))
    figure, axes = plt.subplots(figsize=(max(6.0, 1.5 * len(names) + 2.5), 4.8))
    bottoms = [0.0] * len(results)
    for part in ("productive", *CAUSES):
        shares = []
        for r in results:
            held = r.productive_gpu_hours + sum(r.lost_gpu_hours.values())
            hours = r.productive_gpu_hours if part == "productive" else r.lost_gpu_hours[part]
            shares.append(hours / held if held else 0.0)
        axes.bar(places, shares, bottom=bottoms, label=part, color=_COLOURS[part])
        bottoms = [b + s for b, s in zip(bottoms, shares, strict=True)]
    for x, r in enumerate(results):
        axes.text(x, r.ettr / 2, f"ETTR\n{r.ettr:.3f}", ha="center", va="center", fontsize=9)
    axes.set_xticks(places, names, fontsize=8)
    axes.set_ylim(0, 1)
    axes.set_ylabel("share of GPU time held")
    axes.set_title(title or "Goodput by policy")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
