"""Plots of a sweep table (matplotlib, drawn off-screen): whichever of these the table's columns allow.

  tokens_per_s_vs_concurrency  per-request decode tok/s and total throughput against concurrency, one line per
                               setup (or algorithm), one panel per interconnect
  iteration_breakdown          stacked mean iteration time (draft compute, draft comm, verify compute, verify
                               comm, CPU), one bar per point, at the lowest concurrency when it varies
  speedup_heatmap              speedup over (num_draft_tokens, accept length) with the break-even contour
                               (speedup = 1); cells the setup cannot reach stay blank
  speedup_vs_allreduce         speedup against the all-reduce time of one token's hidden state (the
                               interconnect's small-message latency), one line per setup

Which columns are a point's inputs comes from the table's layout (sweep.py): those between `point` and `error`.
An input that varies and that a plot's own axes do not determine splits the lines (or bars, or panels), so no
two different points are ever drawn as one.

A point on a box that does not exist (a GPU paired with an interconnect it does not have: the table's
`hypothetical_interconnect` column, predict.hypothetical_interconnect) is drawn apart: a hollow marker, a
hatched bar, a starred heatmap cell, and the figure's title says what that means. A what-if is worth plotting,
but it must never read as a box one could buy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simspec.errors import InputError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

BREAKDOWN = ("draft_compute", "draft_comm", "verify_compute", "verify_comm", "cpu")
BREAKDOWN_LABELS = {"draft_compute": "draft compute", "draft_comm": "draft communication",
                    "verify_compute": "verify compute", "verify_comm": "verify communication", "cpu": "CPU (exposed)"}
BREAKDOWN_COLORS = {"draft_compute": "#9ecae1", "draft_comm": "#3182bd", "verify_compute": "#fdae6b",
                    "verify_comm": "#e6550d", "cpu": "#969696"}
FORMATS = ("png", "svg", "pdf")
MAX_PANELS = 6
MAX_BARS = 40
MAX_LINES = 12
INTERCONNECT_COLUMNS = ("hardware.interconnect", "interconnect")
HYPOTHETICAL_COLUMN = "hypothetical_interconnect"
HYPOTHETICAL_HATCH = "//"
# the figures the plots read as numbers (empty on a failed point), and the inputs they put on an axis (numbers on
# every point that ran; a failed point keeps whatever value the sweep tried)
NUMERIC_FIGURES = ("tokens_per_s", "throughput_tokens_per_s", "speedup", *(f"breakdown_ms.{k}" for k in BREAKDOWN),
                   "allreduce_token_us", "concurrency", "num_draft_tokens")
NUMERIC_INPUTS = ("acceptance.accept_length", "speculative.num_draft_tokens")


class Skip(Exception):
    """A plot the table's columns do not allow, with the reason."""


@dataclass
class Plot:
    name: str
    title: str
    figure: Figure


# ------------------------------------------------------------------------------------------ table helpers


def input_columns(df: pd.DataFrame) -> list[str]:
    cols = list(df.columns)
    if "point" in cols and "error" in cols and cols.index("point") < cols.index("error"):
        return cols[cols.index("point") + 1: cols.index("error")]
    return []


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose prediction succeeded."""
    err = df["error"] if "error" in df.columns else None
    mask = df["tokens_per_s"].notna() if "tokens_per_s" in df.columns else df.index == df.index
    if err is not None:
        mask &= err.isna() | (err.astype(str) == "")
    return df[mask]


def check_table(df: pd.DataFrame, file: str, verb: str = "plot") -> pd.DataFrame:
    """The table with its plotted columns as numbers; refused (InputError naming the file and the column) when a
    cell there holds something else (an edited table), when it has no rows, or when every point failed: then
    there is nothing to `verb`."""
    import pandas as pd

    if df.empty:
        raise InputError(f"nothing to {verb}: the table has no rows", file=file)
    df = df.copy()
    checks = [(c, df) for c in NUMERIC_FIGURES if c in df.columns]
    checks += [(c, ok_rows(df)) for c in NUMERIC_INPUTS if c in input_columns(df)]
    for col, rows in checks:
        values = rows[col]
        numbers = pd.to_numeric(values, errors="coerce")
        bad = values.notna() & (numbers.isna() | numbers.isin([float("inf"), float("-inf")]))
        if bad.any():
            i = bad.idxmax()
            empty = " (or an empty cell, on a failed point)" if col in NUMERIC_FIGURES else ""
            raise InputError(f"{str(values[i])!r} at point {df.loc[i, 'point']} is not a finite number; allowed:"
                             f" a finite number{empty}", file=file, key=col)
        if col in NUMERIC_FIGURES:
            df[col] = numbers
    if ok_rows(df).empty:
        errors = [e for e in df["error"].dropna().astype(str) if e]
        why = f"; the first: {errors[0]}" if errors else " (no point has a tokens_per_s figure)"
        raise InputError(f"nothing to {verb}: every point failed ({len(df)} of {len(df)}){why}", file=file)
    return df


def _key(df: pd.DataFrame, cols: Sequence[str]) -> pd.Series:
    """One text key per row over `cols` (NaN included), for grouping."""
    if not cols:
        return df.index.to_series().map(lambda _: "")
    return df[list(cols)].astype(str).agg(" | ".join, axis=1)


def extra_inputs(df: pd.DataFrame, fixed: Sequence[str | None]) -> list[str]:
    """Inputs that vary among these rows and that the plot's own columns (`fixed`) do not determine."""
    chosen = [c for c in fixed if c is not None]
    inputs = [c for c in input_columns(df) if c not in chosen and c != "point" and c in df.columns]
    if len(df) == 0:
        return []
    out: list[str] = []
    for c in inputs:  # an input the columns already chosen determine (num_steps with num_draft_tokens) adds nothing
        values = df[c].astype(str)
        if values.nunique() > 1 and values.groupby(_key(df, chosen + out)).nunique().max() > 1:
            out.append(c)
    return out


def hue_column(df: pd.DataFrame) -> str | None:
    for c in ("setup", "algorithm"):
        if c in df.columns and df[c].notna().any():
            return c
    return None


def panel_column(df: pd.DataFrame) -> str | None:
    """The interconnect, when it varies: as an input if it is one, else as the prediction reports it."""
    for c in INTERCONNECT_COLUMNS:
        if c in df.columns and df[c].astype(str).nunique() > 1:
            return c
    return None


def hypothetical(df: pd.DataFrame) -> pd.Series:
    """Per row: is the point's GPU paired with an interconnect it does not have (a what-if box)?"""
    if HYPOTHETICAL_COLUMN not in df.columns:
        return df.index.to_series().map(lambda _: False).astype(bool)
    col = df[HYPOTHETICAL_COLUMN]
    return (col.notna() & (col.astype(str).str.strip() != "")).astype(bool)


def _pairing(reason: str) -> str:
    """'gpu on interconnect' from predict.hypothetical_interconnect's sentence ('<gpu> has <links>, not <kind>
    (<interconnect>) at TP n: ...'); the sentence up to its colon when it does not read that way."""
    head = reason.split(":", 1)[0]
    gpu, _, rest = head.partition(" has ")
    name = rest[rest.rfind("(") + 1: rest.rfind(")")] if "(" in rest and ")" in rest else ""
    tp = rest[rest.rfind(" at TP "):] if " at TP " in rest else ""
    return f"{gpu} on {name}{tp}" if gpu and name else head


def _hypothetical_note(df: pd.DataFrame, how: str) -> str:
    """The title's line for a figure that shows what-if points, naming how they are drawn and the pairings
    (one line each, at most two); else ''."""
    flagged = df[hypothetical(df)]
    if flagged.empty:
        return ""
    pairings = list(dict.fromkeys(_pairing(str(v)) for v in flagged[HYPOTHETICAL_COLUMN]))
    lines = [f"{how}: a box that does not exist"] + pairings[:2]
    if len(pairings) > 2:
        lines.append(f"and {len(pairings) - 2} more (the table's {HYPOTHETICAL_COLUMN} column)")
    return "\n" + "\n".join(lines)


def _plot_line(ax: Any, x: Any, y: Any, flagged: Any, label: str) -> None:
    """One series: a line through every point, filled markers on real boxes, hollow ones on what-if boxes
    (the legend shows a hollow marker for a series that is all what-if)."""
    real = [i for i, f in enumerate(flagged) if not f]
    if real:
        (line,) = ax.plot(x, y, marker="o", markevery=real, label=label)
    else:
        (line,) = ax.plot(x, y, marker="o", markerfacecolor="white", markeredgewidth=1.5, label=label)
        return
    if len(real) < len(flagged):
        xs, ys = list(x), list(y)
        ax.plot([a for a, f in zip(xs, flagged, strict=True) if f], [b for b, f in zip(ys, flagged, strict=True) if f],
                linestyle="none", marker="o", color=line.get_color(), markerfacecolor="white", markeredgewidth=1.5)


def _label(row: Any, cols: Sequence[str]) -> str:
    parts = []
    for c in cols:
        v = row[c]
        parts.append(str(v) if c in ("setup", "algorithm") else f"{c.rsplit('.', 1)[-1]}={_fmt(v)}")
    return ", ".join(parts) or "all points"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _sorted_unique(values: Any) -> list:
    """Distinct values: numbers in order, names in the order the sweep lists them."""
    vals = list(dict.fromkeys(values))
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
        return sorted(vals)
    return vals


def _figure(nrows: int, ncols: int, width: float = 5.0, height: float = 3.6, sharey: Any = False
            ) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey)
    return fig, axes


def _need(df: pd.DataFrame, cols: Sequence[str]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise Skip(f"no {', '.join(missing)} column")


# ------------------------------------------------------------------------------------------ the plots


def tokens_per_s_vs_concurrency(df: pd.DataFrame) -> Plot:
    _need(df, ("concurrency", "tokens_per_s", "throughput_tokens_per_s"))
    ok = ok_rows(df)
    if ok["concurrency"].nunique() < 2:
        raise Skip("needs at least two concurrency values (vary workload.arrival.concurrency, closed loop)")
    panel, hue = panel_column(ok), hue_column(ok)
    panels = _sorted_unique(ok[panel]) if panel else [None]
    if len(panels) > MAX_PANELS:
        raise Skip(f"{len(panels)} interconnects; at most {MAX_PANELS} panels")
    fig, axes = _figure(2, len(panels), sharey="row")  # panels compare interconnects: same scale
    log_x = ok["concurrency"].min() > 0 and ok["concurrency"].max() / ok["concurrency"].min() >= 8
    for j, pv in enumerate(panels):
        sub = ok if panel is None else ok[ok[panel] == pv]
        extras = extra_inputs(sub, ["concurrency", panel, hue])
        series = [c for c in (hue, *extras) if c is not None]
        groups = list(sub.groupby(_key(sub, series), sort=False))
        for row, (metric, ylabel) in enumerate((("tokens_per_s", "per-request decode tok/s"),
                                                ("throughput_tokens_per_s", "total throughput tok/s"))):
            ax = axes[row][j]
            for _, g in groups[:MAX_LINES]:
                g = g.sort_values("concurrency")
                _plot_line(ax, g["concurrency"], g[metric], hypothetical(g).tolist(), _label(g.iloc[0], series))
            if log_x:
                ax.set_xscale("log", base=2)
            ticks = _sorted_unique(ok["concurrency"])
            if len(ticks) <= 12:
                ax.set_xticks(ticks, [_fmt(t) for t in ticks])
                ax.minorticks_off()
            ax.set_xlabel("concurrency (closed loop)")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            if row == 0:
                more = f" (first {MAX_LINES} of {len(groups)} lines)" if len(groups) > MAX_LINES else ""
                ax.set_title((str(pv) if panel else "all points") + more, fontsize=10)
            if j == len(panels) - 1 and row == 0:
                ax.legend(fontsize=8)
    title = "tok/s vs concurrency" + (f", one panel per {panel}" if panel else "")
    fig.suptitle(title + _hypothetical_note(ok, "hollow markers"), fontsize=11)
    return Plot("tokens_per_s_vs_concurrency", title, fig)


def iteration_breakdown(df: pd.DataFrame) -> Plot:
    cols = [f"breakdown_ms.{k}" for k in BREAKDOWN]
    _need(df, cols)
    ok = ok_rows(df)
    if ok.empty:
        raise Skip("no point predicted successfully")
    note = ""
    if "concurrency" in ok.columns and ok["concurrency"].nunique() > 1:
        low = ok["concurrency"].min()
        ok = ok[ok["concurrency"] == low]
        note = f" at concurrency {_fmt(low)}"
    panel, hue = panel_column(ok), hue_column(ok)
    panels = _sorted_unique(ok[panel]) if panel else [None]
    if len(panels) > MAX_PANELS:
        raise Skip(f"{len(panels)} interconnects; at most {MAX_PANELS} panels")
    widest = max(len(ok if panel is None else ok[ok[panel] == pv]) for pv in panels)
    fig, axes = _figure(1, len(panels), width=max(4.0, 0.45 * min(widest, MAX_BARS) + 2.0), height=4.5,
                        sharey=True)
    figure_width = fig.get_figwidth()
    for j, pv in enumerate(panels):
        ax = axes[0][j]
        sub = ok if panel is None else ok[ok[panel] == pv]
        extras = extra_inputs(sub, [panel, hue])
        # acceptance changes how often an iteration runs far more than what one costs: average over it
        averaged = [c for c in extras if c.startswith("acceptance.")]
        series = [c for c in (hue, *extras) if c is not None and c not in averaged]
        if averaged:
            kept = [c for c in (*series, HYPOTHETICAL_COLUMN) if c in sub.columns]  # one box per group
            sub = sub.groupby(_key(sub, series), sort=False).agg(
                {**{c: "first" for c in kept}, **{c: "mean" for c in cols}})
            note_avg = f"\n(mean over {', '.join(averaged)})"
            if note_avg not in note:
                note += note_avg
        shown = sub.iloc[:MAX_BARS]
        labels = [_label(r, series) for _, r in shown.iterrows()]
        x = list(range(len(shown)))
        bottom = [0.0] * len(shown)
        flagged = hypothetical(shown).tolist()
        for k, col in zip(BREAKDOWN, cols, strict=True):
            vals = shown[col].fillna(0.0).astype(float).tolist()
            bars = ax.bar(x, vals, bottom=bottom, color=BREAKDOWN_COLORS[k], label=BREAKDOWN_LABELS[k])
            for bar, f in zip(bars, flagged, strict=True):
                if f:
                    bar.set_hatch(HYPOTHETICAL_HATCH)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("mean decode iteration (ms)")
        more = f" (first {MAX_BARS} of {len(sub)})" if len(sub) > MAX_BARS else ""
        ax.set_title((str(pv) if panel else "") + more, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        if j == len(panels) - 1:  # the parts' colours, unhatched whatever this panel's bars are
            from matplotlib.patches import Patch

            handles = [Patch(facecolor=BREAKDOWN_COLORS[k], label=BREAKDOWN_LABELS[k]) for k in BREAKDOWN]
            if hypothetical(ok).any():
                handles.append(Patch(facecolor="white", edgecolor="black", hatch=HYPOTHETICAL_HATCH,
                                     label="hypothetical box"))
            ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    shown_bars = max(len(ax.patches) for ax in axes[0]) // len(BREAKDOWN)
    fig.set_figwidth(min(figure_width, len(panels) * max(4.0, 0.45 * shown_bars + 2.0)) + 2.0)
    title = f"iteration time breakdown{note}"
    fig.suptitle(title + _hypothetical_note(ok, "hatched bars"), fontsize=11)
    return Plot("iteration_breakdown", title, fig)


def speedup_heatmap(df: pd.DataFrame) -> Plot:
    import numpy as np
    import pandas as pd
    from matplotlib.colors import TwoSlopeNorm

    y_col = "acceptance.accept_length"
    x_col = next((c for c in ("speculative.num_draft_tokens", "num_draft_tokens") if c in df.columns), None)
    if y_col not in input_columns(df):
        raise Skip("needs acceptance.accept_length among the swept fields")
    if x_col is None:
        raise Skip("no num_draft_tokens column")
    _need(df, ("speedup",))
    # a failed point may hold a value that is no number (the sweep tried it): it has no cell
    rows = df[pd.to_numeric(df[x_col], errors="coerce").notna() & pd.to_numeric(df[y_col], errors="coerce").notna()]
    if rows[x_col].nunique() < 2 or rows[y_col].nunique() < 2:
        raise Skip("needs at least two num_draft_tokens and two accept_length values")
    extras = extra_inputs(rows, [x_col, y_col])
    groups = list(rows.groupby(_key(rows, extras), sort=False))
    shown = groups[:MAX_PANELS]
    ncols = min(3, len(shown))
    nrows = -(-len(shown) // ncols)
    fig, axes = _figure(nrows, ncols, width=6.0, height=4.8)
    ok = ok_rows(rows)
    finite = ok["speedup"].astype(float)
    lo, hi = float(finite.min()) if len(finite) else 0.5, float(finite.max()) if len(finite) else 1.5
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.999), vmax=max(hi, 1.001))
    image = None
    for i, (_, g) in enumerate(shown):
        ax = axes[i // ncols][i % ncols]
        xs = _sorted_unique(g[x_col].astype(float))
        ys = _sorted_unique(g[y_col].astype(float))
        z = np.full((len(ys), len(xs)), np.nan)
        good = ok_rows(g)
        starred = set()
        for (_, r), f in zip(good.iterrows(), hypothetical(good), strict=True):
            cell = (ys.index(float(r[y_col])), xs.index(float(r[x_col])))
            z[cell] = float(r["speedup"])
            if f:
                starred.add(cell)
        masked = np.ma.masked_invalid(z)
        image = ax.pcolormesh(np.arange(len(xs) + 1) - 0.5, np.arange(len(ys) + 1) - 0.5, masked, cmap="RdBu",
                              norm=norm, shading="flat")
        if len(xs) <= 16 and len(ys) <= 16:
            for (yi, xi), v in np.ndenumerate(z):
                if np.isfinite(v):
                    star = "*" if (yi, xi) in starred else ""
                    ax.text(xi, yi, f"{v:.2f}{star}", ha="center", va="center", fontsize=7)
        crosses = np.isfinite(z).sum() >= 4 and np.nanmin(z) < 1.0 < np.nanmax(z)
        if crosses:
            ax.contour(np.arange(len(xs)), np.arange(len(ys)), masked, levels=[1.0], colors="black",
                       linewidths=2.0)
        ax.set_xticks(range(len(xs)), [_fmt(int(v) if float(v).is_integer() else v) for v in xs])
        ax.set_yticks(range(len(ys)), [_fmt(v) for v in ys])
        ax.set_xlabel("num_draft_tokens")
        ax.set_ylabel("accept length (input)")
        name = _label(g.iloc[0], extras) if extras else ""
        if starred and len(starred) == int(np.isfinite(z).sum()):
            name += " (hypothetical box)"
        ax.set_title(name + ("" if crosses else " (no break-even inside)"), fontsize=10)
    for k in range(len(shown), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="speedup over no speculation")
    more = f" (first {MAX_PANELS} of {len(groups)} panels)" if len(groups) > MAX_PANELS else ""
    title = "speedup over (num_draft_tokens, accept length)" + more
    fig.suptitle(title + "\nblack line: break-even (speedup 1); blank: unreachable or failed"
                 + _hypothetical_note(ok, "panels titled (hypothetical box), their cells starred"), fontsize=10)
    return Plot("speedup_heatmap", title, fig)


def speedup_vs_allreduce(df: pd.DataFrame) -> Plot:
    _need(df, ("allreduce_token_us", "speedup"))
    ok = ok_rows(df)
    if ok["allreduce_token_us"].round(6).nunique() < 2:
        raise Skip("needs at least two interconnects (all-reduce times): vary hardware.interconnect")
    hue = hue_column(ok)
    facet = "concurrency" if "concurrency" in ok.columns and ok["concurrency"].nunique() > 1 else None
    facets = _sorted_unique(ok[facet]) if facet else [None]
    if len(facets) > 4:  # spread over the range: first, last and two between
        idx = sorted({round(i * (len(facets) - 1) / 3) for i in range(4)})
        facets = [facets[i] for i in idx]
    ncols = min(2, len(facets))
    nrows = -(-len(facets) // ncols)
    fig, axes = _figure(nrows, ncols, width=5.5, height=3.8)
    for j, fv in enumerate(facets):
        ax = axes[j // ncols][j % ncols]
        sub = ok if facet is None else ok[ok[facet] == fv]
        extras = extra_inputs(sub, ["allreduce_token_us", facet, hue, *INTERCONNECT_COLUMNS])
        series = [c for c in (hue, *extras) if c is not None]
        groups = list(sub.groupby(_key(sub, series), sort=False))
        for _, g in groups[:MAX_LINES]:
            g = g.sort_values("allreduce_token_us")
            _plot_line(ax, g["allreduce_token_us"], g["speedup"], hypothetical(g).tolist(),
                       _label(g.iloc[0], series))
        ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
        ax.set_xlabel("all-reduce of one token's hidden state (us)")
        ax.set_ylabel("speedup over no speculation")
        ax.set_title(f"concurrency {_fmt(fv)}" if facet else "all points", fontsize=10)
        ax.grid(True, alpha=0.3)
        if j == len(facets) - 1:
            ax.legend(fontsize=8)
    for k in range(len(facets), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    ic = next((c for c in INTERCONNECT_COLUMNS if c in ok.columns), None)
    names = ""
    if ic is not None:
        pairs = ok.groupby(ok["allreduce_token_us"].round(3))[ic].agg(lambda s: "/".join(dict.fromkeys(map(str, s))))
        names = "\n" + ", ".join(f"{name} {x:.1f} us" for x, name in pairs.items())
    title = "speedup vs interconnect latency"
    fig.suptitle(title + names + _hypothetical_note(ok, "hollow markers"), fontsize=10)
    return Plot("speedup_vs_allreduce", title, fig)


PLOTTERS = (tokens_per_s_vs_concurrency, iteration_breakdown, speedup_heatmap, speedup_vs_allreduce)


def make_plots(df: pd.DataFrame) -> tuple[list[Plot], list[tuple[str, str]]]:
    """Every plot the table allows, and (name, reason) for each one it does not."""
    plots, skipped = [], []
    if "tokens_per_s" not in df.columns or ok_rows(df).empty:
        return [], [(f.__name__, "no point predicted successfully") for f in PLOTTERS]
    for plotter in PLOTTERS:
        try:
            plots.append(plotter(df))
        except Skip as why:
            skipped.append((plotter.__name__, str(why)))
    return plots, skipped


def parse_formats(text: str) -> tuple[str, ...]:
    formats = tuple(f.strip().lower().lstrip(".") for f in text.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise InputError(f"unknown image format {bad[0] if bad else text!r}; allowed: {', '.join(FORMATS)}"
                         " (comma-separated)", key="--format")
    return formats


def save(plot: Plot, path: str | Path) -> None:
    """Write a figure; PNGs without the software tag (they end up embedded in self-contained reports)."""
    fmt = Path(path).suffix.lstrip(".").lower()
    metadata: dict[str, Any] = {"Software": None} if fmt == "png" else {}
    plot.figure.savefig(path, dpi=110, metadata=metadata)


def write_plots(df: pd.DataFrame, out_dir: str | Path, formats: Sequence[str] = ("png", "svg")
                ) -> tuple[list[Path], list[tuple[str, str]]]:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create the directory: {err.strerror}", file=str(out), key="--out-dir") from None
    plots, skipped = make_plots(df)
    written = []
    for plot in plots:
        for fmt in formats:
            path = out / f"{plot.name}.{fmt}"
            try:
                save(plot, path)
            except OSError as err:
                raise InputError(f"cannot write the plot: {err.strerror}", file=str(path)) from None
            written.append(path)
    return written, skipped


def png_bytes(plot: Plot) -> bytes:
    import io

    buf = io.BytesIO()
    plot.figure.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()
