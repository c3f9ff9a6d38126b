"""One scale curve as a PNG: latency against replicas, per NATS, measured and extrapolated.

:func:`plot` draws p50 (solid) and p99 (dashed) against replicas on log-log axes, one
colour per NATS (1 server, a cluster of 3); measured points filled, extrapolated ones
hollow and joined by dotted lines, so neither can be taken for the other. matplotlib
(the ``simulate`` extra) is imported here, lazily, with the Agg backend: the control
plane never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from scale_fit import Point

__all__ = ["plot"]

COLOURS = {1: "tab:blue", 3: "tab:orange"}


def plot(points: Sequence[Point], title: str, ylabel: str, path: Path, caption: str) -> None:
    """Write the curve of ``points`` (one curve, any NATS) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 5))
    for servers in sorted({p.nats_servers for p in points}):
        colour = COLOURS.get(servers, "tab:gray")
        mine = sorted((p for p in points if p.nats_servers == servers), key=lambda p: p.replicas)
        name = "1 NATS server" if servers == 1 else f"NATS cluster of {servers}"
        for quantile, style in (("p50", "-"), ("p99", "--")):
            measured = [p for p in mine if not p.extrapolated]

            def value(p: Point, quantile: str = quantile) -> float:
                return p.p50 if quantile == "p50" else p.p99

            axes.plot(
                [p.replicas for p in measured],
                [value(p) for p in measured],
                style,
                marker="o",
                color=colour,
                label=f"{name}, {quantile}",
            )
            if any(p.extrapolated for p in mine) and measured:
                tail = [measured[-1], *(p for p in mine if p.extrapolated)]
                axes.plot(
                    [p.replicas for p in tail],
                    [value(p) for p in tail],
                    ":",
                    color=colour,
                )
                extra = [p for p in mine if p.extrapolated]
                axes.plot(
                    [p.replicas for p in extra],
                    [value(p) for p in extra],
                    "o",
                    markerfacecolor="white",
                    color=colour,
                    label=f"{name}, {quantile}, extrapolated",
                )
    axes.set_xscale("log", base=2)
    sizes = sorted({p.replicas for p in points})
    axes.set_xticks(sizes, [f"{n:,}" for n in sizes])
    axes.minorticks_off()
    axes.set_yscale("log")
    axes.set_xlabel("replicas (simulated agents)")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=7)
    figure.text(0.01, 0.01, caption, fontsize=6, wrap=True)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
