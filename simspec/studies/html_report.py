"""One self-contained HTML page for a sweep table: its plots (embedded PNG), its failed points and the table.

Nothing is linked: styles are inline, images are data: URIs, there is no script, so the page opens offline and
can be mailed as one file. Every string from the table (setup names, field values, error messages, column
names) is escaped.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simspec.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

# Figures shown in the main table (when the table has them); the full table follows in a <details> block.
KEY_FIGURES = (
    "algorithm", "max_running_requests", "tokens_per_s", "throughput_tokens_per_s", "accept_length", "iteration_ms",
    "breakdown_ms.draft_compute", "breakdown_ms.draft_comm", "breakdown_ms.verify_compute",
    "breakdown_ms.verify_comm", "breakdown_ms.cpu", "baseline_tokens_per_s", "speedup", "break_even_accept_length",
    "ttft_ms.p50", "ttft_ms.p99", "itl_ms.p50", "itl_ms.p99", "allreduce_token_us",
)

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.8em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; position: sticky; top: 0; }
td.text, th.text { text-align: left; }
tr.failed td { background: #fde8e8; }
.scroll { overflow-x: auto; max-width: 100%; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #555; }
.meta { color: #555; font-size: 0.9em; }
td.error { text-align: left; white-space: normal; min-width: 30em; color: #a00; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _num(v: Any, precise: bool = False) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, int) or (precise and float(v).is_integer() and abs(v) < 1e15):
        return str(int(v)) if float(v).is_integer() else f"{v:.6g}"
    if precise:
        return f"{v:.6g}"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.01 or a == 0:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _cell(v: Any, precise: bool) -> tuple[str, bool]:
    """(escaped text, is_text)."""
    if _missing(v):
        return "", False
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, int | float) and not isinstance(v, bool):
        return _e(_num(v, precise)), False
    return _e(v), True


def _whole_numbers(col: pd.Series) -> bool:
    """A numeric column whose values are all whole numbers (pandas turns int columns with gaps into floats)."""
    import pandas as pd

    if not pd.api.types.is_float_dtype(col):
        return False
    vals = col.dropna()
    return len(vals) > 0 and bool((vals == vals.round()).all()) and bool((vals.abs() < 1e15).all())


def _is_failed(row: Any) -> bool:
    err = row.get("error")
    return not _missing(err) and str(err) != ""


def table_html(df: pd.DataFrame, columns: Sequence[str], precise: bool | Sequence[str] = False) -> str:
    """A table of these columns; `precise`: True, or the columns whose numbers are shown as given (inputs)."""
    import pandas as pd

    out = ["<div class=\"scroll\"><table>", "<thead><tr>"]
    for c in columns:
        numeric = pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
        out.append(f"<th>{_e(c)}</th>" if numeric else f"<th class=\"text\">{_e(c)}</th>")
    out.append("</tr></thead><tbody>")
    whole = {c for c in columns if _whole_numbers(df[c])}  # counts stay counts where failed rows left NaN
    for _, row in df.iterrows():
        out.append("<tr class=\"failed\">" if _is_failed(row) else "<tr>")
        for c in columns:
            v = row[c]
            if c in whole and not _missing(v):
                v = int(v)
            text, is_text = _cell(v, precise is True or (not isinstance(precise, bool) and c in precise))
            cls = " class=\"error\"" if c == "error" and text else " class=\"text\"" if is_text else ""
            out.append(f"<td{cls}>{text}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def render(df: pd.DataFrame, title: str, source: str = "") -> str:
    """The report page as a string."""
    from simspec import __version__
    from simspec.studies import plots as P
    from simspec.studies.sweep import failed_points

    inputs = P.input_columns(df)
    failed = failed_points(df) if "error" in df.columns else df.iloc[0:0]
    plot_list, skipped = P.make_plots(df)
    parts = [
        "<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{_e(title)}</title>", f"<style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p class=\"meta\">{len(df)} points, {len(failed)} failed"
        + (f"; table: {_e(source)}" if source else "") + f"; simspec {_e(__version__)}</p>",
    ]
    if inputs:
        varied = [c for c in inputs if df[c].astype(str).nunique() > 1]
        fixed = [f"{c} = {df[c].iloc[0]}" for c in inputs if c not in varied]
        parts.append(f"<p class=\"meta\">varied: {_e(', '.join(varied)) or 'nothing'}"
                     + (f"; the same at every point: {_e(', '.join(fixed))}" if fixed else "") + "</p>")

    parts.append("<h2>Plots</h2>")
    for plot in plot_list:
        data = base64.b64encode(P.png_bytes(plot)).decode("ascii")
        parts.append(f"<figure><img alt=\"{_e(plot.title)}\" src=\"data:image/png;base64,{data}\">"
                     f"<figcaption>{_e(plot.name)}: {_e(plot.title)}</figcaption></figure>")
    if not plot_list:
        parts.append("<p>No plot: the table's columns allow none (see below).</p>")
    if skipped:
        parts.append("<p class=\"meta\">Not drawn:</p><ul class=\"meta\">")
        parts += [f"<li>{_e(name)}: {_e(reason)}</li>" for name, reason in skipped]
        parts.append("</ul>")

    if len(failed):
        parts.append(f"<h2>Failed points ({len(failed)})</h2>")
        parts.append(table_html(failed, [c for c in ["point", *inputs, "error"] if c in df.columns], inputs))

    parts.append("<h2>Results</h2>")
    main_cols = list(dict.fromkeys(["point", *inputs, *(c for c in KEY_FIGURES if c in df.columns), "error"]))
    main_cols = [c for c in main_cols if c in df.columns]
    parts.append(table_html(df, main_cols, inputs))
    parts.append(f"<details><summary>All {len(df.columns)} columns</summary>")
    parts.append(table_html(df, list(df.columns), precise=True))
    parts.append("</details></body></html>")
    return "\n".join(parts)


def write_report(df: pd.DataFrame, out: str | Path, title: str | None = None, source: str = "") -> Path:
    path = Path(out)
    page = render(df, title or f"simspec sweep: {Path(source).stem or 'results'}", source)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as err:
        raise InputError(f"cannot write the report: {err.strerror}", file=str(path), key="--out") from None
    return path
