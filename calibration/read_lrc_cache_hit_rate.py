"""Read each model's expert-cache hit rate at a cache of k experts from Liang et al.'s published figure.

Liang et al., "Not All Models Suit Expert Offloading: On Local Routing Consistency of Mixture-of-Expert Models"
(arXiv 2505.16056, ICLR 2026) publish with their code (github.com/ljcleo/moe-lrc) the figure plot/mchr.pdf: the
cache hit rate CHR of an LRU, an LFU and an optimal (Belady) expert cache per layer, against the cache size rho in
units of the k experts a token activates (src/51_chr_refine.py: cache_m = (cache size) / top_k), averaged over
layers and their datasets (RedPajama, arena conversations, OpenMathInstruct-2, OpenCodeInstruct,
OpenScienceReasoning-2; forward passes over the text, 512-token samples).

An LRU cache of exactly k experts holds the k experts of the token before (src/50_chr_calc.py calc_lru counts a
hit when an expert's recency rank is below the cache size), so its hit rate at rho = 1 is the mean fraction of a
token's experts that the previous token also used: simspec's `moe_routing_locality` (timing/forward.py
distinct_experts). The figure is vector graphics: this script reads the plotted polylines, not pixels, and
interpolates each model's LRU curve at rho = 1 (the polyline's vertices lie ~0.06 rho apart there).

Usage (pdfplumber: pip install -e '.[sources]'; the PDF comes from the authors' repository, not this one):
    python calibration/read_lrc_cache_hit_rate.py path/to/moe-lrc/plot/mchr.pdf [--rho 1.0]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable

# the figure's legend labels, as its words come out of the PDF (multi-word labels by their first word)
PANELS = ("LRU", "LFU", "Beladi")


def _centre(word: dict) -> tuple[float, float]:
    return (word["x0"] + word["x1"]) / 2, (word["top"] + word["bottom"]) / 2


def _fit(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of page coordinate against axis value."""
    n = len(pairs)
    mx = sum(v for v, _ in pairs) / n
    my = sum(p for _, p in pairs) / n
    slope = sum((v - mx) * (p - my) for v, p in pairs) / sum((v - mx) ** 2 for v, _ in pairs)
    return slope, my - slope * mx


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def axes(words: list[dict], grid: list[dict]) -> tuple[list[tuple[float, float, float]], tuple[float, float]]:
    """Per panel (x of rho = 0, page units per rho, right edge), and (slope, intercept) of y against CHR, from the
    white gridlines: each panel draws rho = 0, 1, 2, 3 and CHR = 0, 0.2, 0.4, 0.6, 0.8. The tick labels check
    the reading (pdfplumber joins a panel's "4" and the next panel's "0" into one word, so only 1 and 2 are used)."""
    titles = sorted((w for w in words if w["text"] in PANELS), key=lambda w: w["x0"])
    if [w["text"] for w in titles] != list(PANELS):
        raise SystemExit("not the mchr figure: expected panels LRU, LFU, Beladi")
    verticals = sorted({round(g["x0"], 2) for g in grid if abs(g["x1"] - g["x0"]) < 0.01})
    horizontals = sorted({round(g["top"], 2) for g in grid if abs(g["bottom"] - g["top"]) < 0.01}, reverse=True)
    if len(verticals) != 12 or len(horizontals) != 5:
        raise SystemExit(f"expected 4 vertical gridlines a panel and 5 horizontal ones, found {len(verticals)}"
                         f" and {len(horizontals)}")
    rows = [w for w in words if _number(w["text"]) is not None]
    x_labels = {v: [_centre(w)[0] for w in rows if _number(w["text"]) == v and w["x0"] > 65] for v in (1.0, 2.0)}
    panels = []
    for i in range(3):
        xs = verticals[4 * i:4 * i + 4]
        per_rho = (xs[3] - xs[0]) / 3
        for v in (1.0, 2.0):
            if not x_labels[v] or min(abs(x - xs[int(v)]) for x in x_labels[v]) > 1.0:
                raise SystemExit(f"panel {PANELS[i]}: the gridline of rho = {v:g} has no tick label under it")
        panels.append((xs[0], per_rho, xs[0] + 4 * per_rho))
    y_values = (0.0, 0.2, 0.4, 0.6, 0.8)
    return panels, _fit(list(zip(y_values, horizontals, strict=True)))


def legend(words: list[dict], curves: list[dict], top_of_legend: float) -> dict[str, tuple[float, ...]]:
    """Legend label -> line colour: the stroke that ends just left of the label on its row."""
    out = {}
    for w in words:
        if w["top"] < top_of_legend or _number(w["text"]) is not None or w["text"].startswith("("):
            continue
        _, yc = _centre(w)
        swatches = [c for c in curves if abs((c["top"] + c["bottom"]) / 2 - yc) < 4 and 0 < w["x0"] - c["x1"] < 12
                    and c["x1"] - c["x0"] > 10]
        if swatches:
            colour = swatches[0]["stroking_color"]
            out.setdefault(w["text"], tuple(round(v, 4) for v in colour))
    return out


def value_at(points: Iterable[tuple[float, float]], x: float) -> float | None:
    """Linear interpolation of a polyline (page coordinates) at page x; None if x is outside its span."""
    pts = sorted(points)
    for (xa, ya), (xb, yb) in zip(pts, pts[1:], strict=False):
        if xa <= x <= xb and xb > xa:
            return ya + (yb - ya) * (x - xa) / (xb - xa)
    return None


def read(path: str, rho: float) -> dict[str, dict[str, float | None]]:
    import pdfplumber  # optional: pip install -e '.[sources]'

    with pdfplumber.open(path) as pdf:
        page = pdf.pages[0]
        words = page.extract_words()
        drawn = page.curves + page.lines
        curves = [c for c in drawn if c.get("stroking_color") not in (None, (1.0, 1.0, 1.0))]
        grid = [c for c in drawn if c.get("stroking_color") == (1.0, 1.0, 1.0)]
    panels, (y_slope, y_icept) = axes(words, grid)
    # the legend's rows start below the rho axis titles; plotted lines stay above CHR = 0
    top_of_legend = max(w["top"] for w in words if w["text"] == "ρ") + 10
    colours = legend(words, curves, top_of_legend)
    floor = y_icept + 1  # page y of CHR = 0, plus a point for line width
    by_colour: dict[tuple[float, ...], list[dict]] = defaultdict(list)
    for c in curves:
        if c["bottom"] <= floor:
            by_colour[tuple(round(v, 4) for v in c["stroking_color"])].append(c)
    result: dict[str, dict[str, float | None]] = {}
    for label, colour in colours.items():
        result[label] = {}
        for name, (x0, per_rho, right) in zip(PANELS, panels, strict=True):
            # a curve belongs to the panel it starts in: the clip hides where a solid one runs on (to rho = E / k)
            # across the next panels, so curves are told apart by where they start, not by where their points lie
            pts = [p for c in by_colour[colour] if x0 - 1 <= c["x0"] <= right for p in c["pts"]]
            y = value_at(pts, x0 + rho * per_rho)
            result[label][name] = None if y is None else (y - y_icept) / y_slope
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pdf", help="plot/mchr.pdf of github.com/ljcleo/moe-lrc")
    ap.add_argument("--rho", type=float, default=1.0, help="cache size in units of the k active experts (default 1)")
    args = ap.parse_args(argv)
    table = read(args.pdf, args.rho)
    print(f"cache hit rate at a cache of {args.rho:g} x k experts per layer (model: LRU / LFU / Belady)")
    for label, row in table.items():
        cells = " / ".join("-" if v is None else f"{v:.3f}" for v in row.values())
        print(f"  {label:20s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
