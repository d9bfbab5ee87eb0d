"""The sweep's frontier as a PNG: GPU-hours reclaimed against restarts per session-day, one point per policy.

matplotlib is imported only here, when a plot is asked for. The PNG's `Description` text says where the
current configuration and the recommendation were drawn (pixel coordinates from the top left), so a reader
(and the tests) can find them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kf_culler.replay.sweep import Evaluated, frontier

CURRENT_COLOUR = "#d62728"
RECOMMENDED_COLOUR = "#2ca02c"


def frontier_png(items: list[Evaluated], current: Evaluated, recommended: Evaluated | None, path: str | Path, *,
                 max_restarts: float, title: str, bound_gpu_h: float | None = None) -> dict[str, tuple[int, int]]:
    """Draw the sweep; returns the pixel (x, y from the top left) of the current and the recommended point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6.4))
    clean = [e for e in items if e.total.interruptions == 0]
    hurt = [e for e in items if e.total.interruptions > 0]
    ax.scatter([e.total.restarts_per_session_day for e in clean], [e.total.reclaimed_gpu_h for e in clean],
               s=28, color="#1f77b4", alpha=0.75, label="policy without interruptions", zorder=2)
    if hurt:
        ax.scatter([e.total.restarts_per_session_day for e in hurt], [e.total.reclaimed_gpu_h for e in hurt],
                   s=36, marker="x", color="#7f7f7f", label="policy that interrupts running work", zorder=2)
    front = frontier(clean)
    ax.step([e.total.restarts_per_session_day for e in front], [e.total.reclaimed_gpu_h for e in front],
            where="post", color="#1f77b4", linewidth=1.2, label="frontier (no interruptions)", zorder=1)
    ax.axvline(max_restarts, color="black", linestyle=":", linewidth=1,
               label=f"budget: {max_restarts:g} restarts per session-day")
    if bound_gpu_h is not None:
        ax.axhline(bound_gpu_h, color="black", linestyle="--", linewidth=1,
                   label=f"bound: {bound_gpu_h:,.0f} GPU-h")
    marks: list[tuple[str, Evaluated, str, str]] = [("current", current, CURRENT_COLOUR, "*")]
    if recommended is not None:
        marks.append(("recommended", recommended, RECOMMENDED_COLOUR, "D"))
    for name, e, colour, marker in marks:
        x, y = e.total.restarts_per_session_day, e.total.reclaimed_gpu_h
        ax.scatter([x], [y], s=260 if marker == "*" else 150, marker=marker, color=colour, edgecolors="black",
                   linewidths=0.8, zorder=4, label=name if e.label == name else f"{name}: {e.label}")
        ax.annotate(f"{name}\n{y:,.0f} GPU-h, {x:.2f}/session-day", (x, y), textcoords="offset points",
                    xytext=(12, -26 if name == "current" else 10), fontsize=8, color=colour)
    ax.set_xlabel("restarts per session-day (24 h of a session running)")
    ax.set_ylabel("GPU-hours reclaimed")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.canvas.draw()
    height = fig.canvas.get_width_height()[1]
    dpi_scale = 110 / fig.dpi
    pixels: dict[str, tuple[int, int]] = {}
    for name, e, _, _ in marks:
        px, py = ax.transData.transform((e.total.restarts_per_session_day, e.total.reclaimed_gpu_h))
        pixels[name] = (round(px * dpi_scale), round((height - py) * dpi_scale))
    description = "; ".join(f"{name} at ({x}, {y})" for name, (x, y) in pixels.items())
    metadata: dict[str, Any] = {"Description": description, "Title": title}
    fig.savefig(path, dpi=110, metadata=metadata)
    plt.close(fig)
    return pixels
