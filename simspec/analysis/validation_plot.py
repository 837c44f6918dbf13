"""The validation suite's errors as one figure (matplotlib, drawn off-screen): `simspec validate --plot`.

One row per case, grouped by source (the worst source's cases first, as `validate` lists the sources), the
signed error on a symmetric-log axis (linear within +-20%, so the 10% bar reads true and a +250% miss still
fits), the bar shaded, fitted cases hollow, and the span of all a case's readings (its own and its
`alternatives`) as a line. A case that failed to predict is left out and named in the title.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simspec.validation import CASE_BAR_PCT, CaseResult, source_of, summary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROW_INCHES = 0.13
LINEAR_WITHIN_PCT = 20.0


def error_figure(results: list[CaseResult]) -> Figure:
    from matplotlib.figure import Figure

    shown = [r for r in results if r.error_pct is not None]
    s = summary(results)
    order = {row["source"]: i for i, row in enumerate(s["by_source"])}
    # fitted-only sources after the rest; within a source, worst case first
    shown.sort(key=lambda r: (order.get(source_of(r.case), len(order)), source_of(r.case), -abs(r.error_pct or 0.0)))
    height = max(3.0, 1.6 + ROW_INCHES * len(shown))
    fig = Figure(figsize=(9.0, height), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("symlog", linthresh=LINEAR_WITHIN_PCT)
    ax.axvspan(-CASE_BAR_PCT, CASE_BAR_PCT, color="#d9f0d3", zorder=0, label=f"within {CASE_BAR_PCT:g}%")
    ax.axvline(0.0, color="#444444", linewidth=0.8, zorder=1)
    ys = range(len(shown))
    for y, r in zip(ys, shown, strict=True):
        span = r.error_range_pct
        if span is not None:
            ax.plot(span, (y, y), color="#7b6cb3", linewidth=1.6, alpha=0.7, zorder=2)
        colour = "#1a9641" if r.within_bar else "#d7191c"
        ax.plot(r.error_pct, y, marker="o", markersize=3.5, zorder=3, linestyle="none",
                markerfacecolor="none" if r.case.fitted else colour, markeredgecolor=colour)
    boundaries = [y - 0.5 for y in range(1, len(shown)) if source_of(shown[y].case) != source_of(shown[y - 1].case)]
    for b in boundaries:
        ax.axhline(b, color="#cccccc", linewidth=0.5, zorder=0)
    ax.set_yticks(list(ys), [r.case.id for r in shown], fontsize=5.5)
    if shown:
        ax.set_ylim(len(shown) - 0.5, -0.5)
    errors = [e for r in shown for e in (r.error_pct or 0.0, *(r.error_range_pct or ()))]
    lo, hi = min(errors, default=-CASE_BAR_PCT), max(errors, default=CASE_BAR_PCT)
    ticks = [t for t in (-500, -200, -100, -50, -20, -10, 0, 10, 20, 50, 100, 200, 500)
             if min(lo, -CASE_BAR_PCT) * 1.5 <= t <= max(hi, CASE_BAR_PCT) * 1.5]
    ax.set_xticks(ticks, [f"{t:+d}%" if t else "0" for t in ticks], fontsize=7)
    ax.set_xticks([], minor=True)
    ax.set_xlabel("error: (predicted - measured) / measured (linear within +-20%, logarithmic beyond)")
    ax.plot([], [], color="#7b6cb3", linewidth=1.6, label="span of all the case's readings")
    ax.plot([], [], marker="o", markersize=3.5, linestyle="none", markerfacecolor="none", markeredgecolor="#444444",
            label="fitted case (hollow)")
    ax.legend(loc="lower right", fontsize=6, framealpha=0.9)
    mape = s["mape_not_fitted_pct"]
    predicted_free = sum(not r.case.fitted for r in shown)
    title = (f"simspec validate: {len(shown)} cases; mean |error| over the {predicted_free} not fitted "
             f"{'n/a' if mape is None else f'{mape:.1f}%'}, {s['not_fitted_within_case_bar']} of them within "
             f"{CASE_BAR_PCT:g}%\ngrouped by source, worst source first")
    failed = [r.case.id for r in results if r.error_pct is None]
    if failed:
        named = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        title += f"\nnot predicted (left out): {named}"
    ax.set_title(title, fontsize=8)
    return fig
