"""`simspec plot` and `simspec report` on real sweep tables: the files are written and non-empty, the plots a
table does not allow are named with the reason, and the HTML page is self-contained and holds every row."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simspec.cli import main
from simspec.studies import html_report, plots
from simspec.studies import sweep as S
from tests.conftest import SCENARIOS, assert_refused, cli_runner

BASELINE = str(SCENARIOS / "baseline.yaml")
EAGLE3 = str(SCENARIOS / "eagle3.yaml")
SPEC = {"speculative": {"algorithm": "eagle3", "drafter": "eagle3-kimi-k2.5", "num_steps": 3, "topk": 1,
                        "num_draft_tokens": 4}, "acceptance": {"accept_length": 1.8}}
TINY = {"workload.num_requests": [8], "workload.output_tokens.value": [16]}


def _sweep(tmp: Path, name: str, spec: dict) -> Path:
    """Run a sweep through the command line and return its CSV table."""
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp / f"{name}.csv"
    res = cli_runner().invoke(main, ["sweep", str(path), "--out", str(out), "--jobs", "1"])
    assert res.exit_code == 0, res.output + res.stderr
    return out


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("tables")
    interconnects = _sweep(tmp, "interconnects", {
        "base": BASELINE,
        "setups": {"baseline": {}, "eagle3": SPEC, "<b>odd & name</b>": {**SPEC, "acceptance.accept_length": 2.2}},
        "points": [{"hardware.interconnect": "pcie5-nccl"},
                   {"hardware.interconnect": "nvlink4-nccl", "calibration": None}],
        "grid": {"workload.arrival.concurrency": [1, 4, 8], **TINY},
    })
    heatmap = _sweep(tmp, "heatmap", {
        "base": EAGLE3,
        "points": [{"speculative.num_steps": s, "speculative.num_draft_tokens": s + 1} for s in (1, 2, 3)],
        "grid": {"acceptance.accept_length": [1.25, 1.75, 2.5, 3.5], **TINY},
    })
    return {"interconnects": interconnects, "heatmap": heatmap}


def test_plot_draws_what_the_columns_allow_and_says_what_it_skips(tables, tmp_path):
    out = tmp_path / "plots"
    res = cli_runner().invoke(main, ["plot", str(tables["interconnects"]), "--out-dir", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    for name in ("tokens_per_s_vs_concurrency", "iteration_breakdown", "speedup_vs_allreduce"):
        for fmt in ("png", "svg"):
            f = out / f"{name}.{fmt}"
            assert f.is_file() and f.stat().st_size > 5_000, f
    assert (out / "tokens_per_s_vs_concurrency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (out / "iteration_breakdown.svg").read_text()
    assert not (out / "speedup_heatmap.png").exists()
    assert "skipped speedup_heatmap: needs acceptance.accept_length" in res.output


def test_points_on_a_box_that_does_not_exist_are_drawn_apart(tables):
    """RTX PRO 6000 cards have no NVLink: the table's NVLink points are what-ifs. The line plots draw them with
    hollow markers, the breakdown hatches their bars, and each figure's title says so; the PCIe points stay
    filled and plain."""
    df = S.read_table(tables["interconnects"])
    flagged = plots.hypothetical(df)
    assert flagged.tolist() == (df["hardware.interconnect"] == "nvlink4-nccl").tolist() and flagged.any()

    def marker_faces(ax) -> dict[str, list[bool]]:  # per panel: hollow (True) or filled marker, per point drawn
        faces = []
        for line in ax.get_lines():
            if line.get_marker() in (None, "None", "") or not len(line.get_xdata()):
                continue
            every = line.get_markevery()
            n = len(line.get_xdata()) if every is None else len(every)
            faces += [line.get_markerfacecolor() == "white"] * n
        return faces

    for plot in (plots.tokens_per_s_vs_concurrency(df), plots.speedup_vs_allreduce(df)):
        text = plot.figure.texts[0].get_text()
        assert "hollow markers: a box that does not exist\nrtx-pro-6000-server on nvlink4-nccl at TP 8" in text, text
        faces = [f for ax in plot.figure.axes for f in marker_faces(ax)]
        assert any(faces) and not all(faces), plot.name
    concurrency = plots.tokens_per_s_vs_concurrency(df)
    axes = concurrency.figure.axes
    titles = {ax.get_subplotspec().colspan.start: ax.get_title() for ax in axes if ax.get_title()}
    assert sorted(titles.values()) == ["nvlink4-nccl", "pcie5-nccl"]
    for ax in axes:  # one column of panels per interconnect: hollow exactly on the NVLink one
        faces, title = marker_faces(ax), titles[ax.get_subplotspec().colspan.start]
        assert faces and (all(faces) if title == "nvlink4-nccl" else not any(faces)), title

    breakdown = plots.iteration_breakdown(df)
    assert "hatched bars: a box that does not exist" in breakdown.figure.texts[0].get_text()
    for ax in breakdown.figure.axes:
        hatches = {p.get_hatch() for p in ax.patches}
        assert hatches == ({plots.HYPOTHETICAL_HATCH} if "nvlink4" in ax.get_title() else {None}), ax.get_title()

    # the hollow overlay takes its series' colour: one colour per series, none skipped (the all-reduce plot's
    # series run across both interconnects, so they mix filled and hollow markers)
    for plot in (concurrency, plots.speedup_vs_allreduce(df)):
        for ax in (a for a in plot.figure.axes if a.get_visible()):
            series = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
            colours = [line.get_color() for line in series]
            assert len(colours) == len(set(colours)) == 3, (plot.name, colours)
            drawn = {line.get_color() for line in ax.get_lines() if len(line.get_xdata()) and line.get_marker() == "o"}
            assert drawn == set(colours), (plot.name, drawn, colours)

    # acceptance varying among the points: the breakdown averages over it, and still hatches the what-ifs
    varied = pd.concat([df.assign(**{"acceptance.accept_length": a}) for a in (1.8, 2.2)], ignore_index=True)
    cols = list(varied.columns)
    cols.insert(cols.index("point") + 1, cols.pop(cols.index("acceptance.accept_length")))
    averaged = plots.iteration_breakdown(varied[cols])
    assert "mean over acceptance.accept_length" in averaged.figure.texts[0].get_text()
    for ax in averaged.figure.axes:
        hatches = {p.get_hatch() for p in ax.patches}
        assert hatches == ({plots.HYPOTHETICAL_HATCH} if "nvlink4" in ax.get_title() else {None}), ax.get_title()

    real = df[~flagged]  # a table of real boxes only: nothing is marked
    plain = plots.tokens_per_s_vs_concurrency(real)
    assert "does not exist" not in plain.figure.texts[0].get_text()
    assert not any(f for ax in plain.figure.axes for f in marker_faces(ax))


def test_heatmap_has_the_break_even_contour(tables, tmp_path):
    df = S.read_table(tables["heatmap"])
    assert df["error"].notna().sum() == 3  # 2.5 and 3.5 with one draft, 3.5 with two: unreachable
    plot = plots.speedup_heatmap(df)
    ax = plot.figure.axes[0]
    assert "no break-even" not in ax.get_title()
    assert any(type(c).__name__.endswith("ContourSet") for c in ax.collections)
    cells = [t.get_text() for t in ax.texts]
    assert cells and not any(c.endswith("*") for c in cells)
    # the same table read as a what-if box: every cell starred, the panel and the title say so
    what_if = df.assign(**{plots.HYPOTHETICAL_COLUMN: "gpu-x has PCIe 4 links, not NVLink 4 (y) at TP 8: a box"})
    starred = plots.speedup_heatmap(what_if)
    ax = starred.figure.axes[0]
    assert [t.get_text() for t in ax.texts] == [c + "*" for c in cells]
    assert "(hypothetical box)" in ax.get_title()
    assert ("their cells starred: a box that does not exist\ngpu-x on y at TP 8"
            in starred.figure.texts[0].get_text())
    res = cli_runner().invoke(main, ["plot", str(tables["heatmap"]), "--out-dir", str(tmp_path), "--format", "png"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "speedup_heatmap.png").stat().st_size > 5_000
    assert "skipped tokens_per_s_vs_concurrency" in res.output and "skipped speedup_vs_allreduce" in res.output


def test_report_is_one_self_contained_page_with_every_row(tables, tmp_path):
    out = tmp_path / "report.html"
    res = cli_runner().invoke(main, ["report", str(tables["interconnects"]), "--out", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    page = out.read_text(encoding="utf-8")
    assert len(page) > 20_000
    assert not re.search(r"https?://", page), "external reference in the report"
    assert not re.search(r"<(script|link|iframe)\b", page, re.I)
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", page, re.I)
    assert page.count('src="data:image/png;base64,') == 3
    df = S.read_table(tables["interconnects"])
    results = page.split("<h2>Results</h2>", 1)[1].split("<details>", 1)[0]
    assert results.count("<tr") == len(df) + 1  # header + one row per point
    for _, row in df.iterrows():
        assert f"<tr><td>{row['point']}</td>" in results
    assert f"{df['tokens_per_s'][0]:.1f}" in results
    # user strings are escaped, never markup
    assert "<b>odd" not in page and "&lt;b&gt;odd &amp; name&lt;/b&gt;" in page


def _outputs(command: str, tmp_path: Path) -> list[str]:
    return ["--out-dir", str(tmp_path / "p")] if command == "plot" else ["--out", str(tmp_path / "r.html")]


def _nothing_written(tmp_path: Path) -> bool:
    return not (tmp_path / "p").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["plot", "report"])
def test_report_and_plot_of_a_table_where_every_point_failed(tmp_path, command):
    """Nothing to draw: exit 2 naming the table and the first failure (the sweep said so too, with exit 2)."""
    table = pd.DataFrame({"point": [0, 1], "acceptance.accept_length": [9.0, 10.0], "error": ["x: too long", "y"],
                          "tokens_per_s": [None, None]})
    path = tmp_path / "failed.csv"
    table.to_csv(path, index=False)
    res = cli_runner().invoke(main, [command, str(path), *_outputs(command, tmp_path)])
    assert_refused(res, "failed.csv", f"nothing to {command}: every point failed (2 of 2)", "x: too long")
    assert _nothing_written(tmp_path)
    page = html_report.render(S.read_table(path), "t")  # the page itself still lists them
    assert "Failed points (2)" in page and "x: too long" in page


@pytest.mark.parametrize("command", ["plot", "report"])
def test_report_and_plot_of_a_table_with_no_rows(tables, tmp_path, command):
    path = tmp_path / "empty.csv"
    pd.read_csv(tables["heatmap"]).iloc[0:0].to_csv(path, index=False)  # the header only
    res = cli_runner().invoke(main, [command, str(path), *_outputs(command, tmp_path)])
    assert_refused(res, "empty.csv", f"nothing to {command}: the table has no rows")
    assert _nothing_written(tmp_path)


# (table, column, what an edit put in a cell of a point that ran)
EDITED_CELLS = [
    ("heatmap", "speedup", "fast"),  # was a float() traceback in the heatmap
    ("interconnects", "speedup", "fast"),  # was drawn as a category
    ("interconnects", "breakdown_ms.cpu", "x"),  # was a float() traceback in the breakdown
    ("interconnects", "throughput_tokens_per_s", "lots"),  # was drawn as a category
    ("interconnects", "concurrency", "many"),
    ("heatmap", "speedup", "inf"),
    ("heatmap", "acceptance.accept_length", "abc"),  # an axis input of a point that ran
]


@pytest.mark.parametrize("command", ["plot", "report"])
@pytest.mark.parametrize(("table", "column", "text"), EDITED_CELLS,
                         ids=[f"{t}-{c}-{x}" for t, c, x in EDITED_CELLS])
def test_a_plotted_column_that_is_not_a_number_exits_2(tables, tmp_path, command, table, column, text):
    df = pd.read_csv(tables[table])
    row = df.index[df["error"].isna()][0]
    df[column] = df[column].astype(object)
    df.loc[row, column] = text
    path = tmp_path / "edited.csv"
    df.to_csv(path, index=False)
    res = cli_runner().invoke(main, [command, str(path), *_outputs(command, tmp_path)])
    assert_refused(res, "edited.csv", f": {column}: ", f"'{text}' at point {df.loc[row, 'point']}",
                    "allowed: a finite number")
    assert _nothing_written(tmp_path)


def test_a_failed_point_whose_swept_value_is_not_a_number_is_left_out_of_the_heatmap(tables, tmp_path):
    """A sweep that tried accept_length: abc writes the text in that failed point's input cell: the table is a
    real one, the point has no cell (it was a float() traceback)."""
    df = pd.read_csv(tables["heatmap"])
    failed = df.index[df["error"].notna()][0]
    df["acceptance.accept_length"] = df["acceptance.accept_length"].astype(object)
    df.loc[failed, "acceptance.accept_length"] = "abc"
    path = tmp_path / "tried.csv"
    df.to_csv(path, index=False)
    res = cli_runner().invoke(main, ["plot", str(path), "--out-dir", str(tmp_path / "p"), "--format", "png"])
    assert res.exit_code == 0, res.output + res.stderr
    assert (tmp_path / "p" / "speedup_heatmap.png").is_file()
    res = cli_runner().invoke(main, ["report", str(path), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output + res.stderr
    assert "abc" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_bad_tables_and_formats_exit_2(tmp_path):
    res = cli_runner().invoke(main, ["report", str(tmp_path / "missing.csv")])
    assert res.exit_code == 2 and "missing.csv: file not found" in res.stderr
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    res = cli_runner().invoke(main, ["plot", str(other)])
    assert res.exit_code == 2 and "not a table written by `simspec sweep`" in res.stderr
    res = cli_runner().invoke(main, ["plot", str(other), "--format", "png,bmp"])
    assert res.exit_code == 2 and "allowed: png, svg, pdf" in res.stderr
