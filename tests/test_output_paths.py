"""Files the commands write, through the real command line: an output that would overwrite one of the command's
inputs (or its other output), or whose name says another format than the one written, exits with code 2 before
any work, naming the file and the flag; the input's bytes are untouched. Nothing here runs a prediction."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simspec.cli import main
from simspec.errors import InputError
from simspec.outputs import check_output, same_file
from tests.conftest import SCENARIOS, assert_refused, cli_runner

PROFILE = (SCENARIOS.parent / "calibration" / "profiles" / "m1-kimi-k25-8x-rtxpro6000-pcie.yaml").resolve()


@pytest.fixture
def box(tmp_path, monkeypatch) -> Path:
    """A directory (the working one) with scenario.yaml (the M1 baseline with a copy of its profile, profile.yaml:
    a test whose fix is missing overwrites files here, never the repository's; one short request), sweep.yaml over
    it, and table.csv (a tiny table as `simspec sweep` writes it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profile.yaml").write_bytes(PROFILE.read_bytes())
    data = yaml.safe_load((SCENARIOS / "baseline.yaml").read_text())
    data["calibration"] = "profile.yaml"
    data["workload"].update(num_requests=1, output_tokens={"dist": "fixed", "value": 16})
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"base": "scenario.yaml", "grid": {"seed": [0, 1]}}))
    pd.DataFrame({"point": [0], "seed": [0], "error": [None], "tokens_per_s": [80.0]}).to_csv(
        tmp_path / "table.csv", index=False)
    return tmp_path


def _unchanged(box: Path):
    """Every file in the box, and a check that none changed and none was added."""
    before = {p.name: p.read_bytes() for p in box.iterdir()}

    def check() -> None:
        assert {p.name: p.read_bytes() for p in box.iterdir()} == before

    return check


# (arguments, the file named, the flag, what the message says)
SWEEP_CASES = [
    (["--out", "sweep.yaml"], "sweep.yaml", "--out", "is the sweep file"),
    (["--out", "./sweep.yaml"], "./sweep.yaml", "--out", "is the sweep file"),
    (["--out", "scenario.yaml"], "scenario.yaml", "--out", "is the base scenario"),
    (["--out", "t.csv", "--parquet", "scenario.yaml"], "scenario.yaml", "--parquet", "is the base scenario"),
    (["--out", "t.csv", "--parquet", "sweep.yaml"], "sweep.yaml", "--parquet", "is the sweep file"),
    (["--out", "./profile.yaml"], "./profile.yaml", "--out", "is the base scenario's calibration profile"),
    (["--out", "t.csv", "--parquet", "t.csv"], "t.csv", "--parquet", "is the --out table (t.csv)"),
    (["--parquet", "sweep.csv"], "sweep.csv", "--parquet", "is the --out table (sweep.csv)"),  # the default --out
    (["--out", "t.csv", "--parquet", "z.csv"], "z.csv", "--parquet", "writes a Parquet table; allowed: a file name"
                                                                     " ending in .parquet or .pq"),
    (["--out", "x.yaml"], "x.yaml", "--out", "writes a CSV table; allowed: a file name ending in .csv"),
    (["--out", "x.json"], "x.json", "--out", "writes a CSV table; allowed: a file name ending in .csv"),
]


@pytest.mark.parametrize(("args", "file", "flag", "message"), SWEEP_CASES, ids=[" ".join(c[0]) for c in SWEEP_CASES])
def test_sweep_refuses_an_output_that_is_an_input_or_has_the_wrong_suffix(box, args, file, flag, message):
    unchanged = _unchanged(box)
    res = cli_runner().invoke(main, ["sweep", "sweep.yaml", "--jobs", "1", *args])
    assert_refused(res, f"{file}: {flag}: {message}")
    unchanged()


def test_sweep_with_an_inline_scenario_refuses_its_own_file(box):
    data = yaml.safe_load((box / "scenario.yaml").read_text())
    (box / "inline.yaml").write_text(yaml.safe_dump({"scenario": data, "grid": {"seed": [0]}}))
    unchanged = _unchanged(box)
    res = cli_runner().invoke(main, ["sweep", "inline.yaml", "--out", "inline.yaml"])
    assert_refused(res, "inline.yaml: --out: is the sweep file")
    unchanged()


# (arguments, the file named, what the message says)
PREDICT_CASES = [
    (["--trace", "scenario.yaml"], "scenario.yaml", "is the scenario file"),
    (["--trace", "out.yaml"], "out.yaml", "writes a Chrome trace (JSON); allowed: a file name ending in .json"),
    (["--trace", "out.csv"], "out.csv", "writes a Chrome trace (JSON); allowed"),
]


@pytest.mark.parametrize(("args", "file", "message"), PREDICT_CASES, ids=[" ".join(c[0]) for c in PREDICT_CASES])
def test_predict_refuses_a_trace_that_is_an_input_or_not_json(box, args, file, message):
    unchanged = _unchanged(box)
    res = cli_runner().invoke(main, ["predict", "scenario.yaml", *args])
    assert_refused(res, f"{file}: --trace: {message}")
    unchanged()


def test_predict_refuses_a_trace_over_the_scenarios_calibration_profile(box):
    """The profile the scenario names (here one with a .json name, so the suffix alone would let it through)."""
    os.replace(box / "profile.yaml", box / "profile.json")
    data = yaml.safe_load((box / "scenario.yaml").read_text())
    (box / "scenario.yaml").write_text(yaml.safe_dump({**data, "calibration": "profile.json"}, sort_keys=False))
    unchanged = _unchanged(box)
    res = cli_runner().invoke(main, ["predict", "scenario.yaml", "--trace", "profile.json"])
    assert_refused(res, "profile.json: --trace: is the scenario's calibration profile")
    unchanged()


def test_predict_refuses_a_trace_that_links_to_the_scenario(box):
    (box / "link.json").symlink_to(box / "scenario.yaml")
    unchanged = _unchanged(box)
    res = cli_runner().invoke(main, ["predict", "scenario.yaml", "--trace", "link.json"])
    assert_refused(res, "link.json: --trace: is the scenario file")
    unchanged()


# (arguments, the file named, what the message says)
REPORT_CASES = [
    (["table.csv", "--out", "table.csv"], "table.csv", "is the table (table.csv)"),
    (["table.csv", "--out", "x.pdf"], "x.pdf", "writes an HTML page; allowed: a file name ending in .html or .htm"),
    (["table.csv", "--out", "x.svg"], "x.svg", "writes an HTML page; allowed"),
]


@pytest.mark.parametrize(("args", "file", "message"), REPORT_CASES, ids=[" ".join(c) for c, _, _ in REPORT_CASES])
def test_report_refuses_an_output_that_is_its_table_or_not_html(box, args, file, message):
    unchanged = _unchanged(box)
    res = cli_runner().invoke(main, ["report", *args])
    assert_refused(res, f"{file}: --out: {message}")
    unchanged()


def test_report_refuses_its_default_output_when_that_is_the_table(box):
    """`report T.html` on a table named .html: the default page name (the table's with .html) is the table."""
    os.replace(box / "table.csv", box / "table.html")
    unchanged = _unchanged(box)
    res = cli_runner().invoke(main, ["report", "table.html"])
    assert_refused(res, "table.html: --out: is the table")
    unchanged()


def test_an_allowed_name_is_accepted_in_any_case(box):
    res = cli_runner().invoke(main, ["report", "table.csv", "--out", "Page.HTM"])
    assert res.exit_code == 0, res.output + res.stderr
    assert (box / "Page.HTM").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_plot_out_dir_that_is_a_file_exits_2(box):
    unchanged = _unchanged(box)
    res = cli_runner().invoke(main, ["plot", "table.csv", "--out-dir", "table.csv"])
    assert res.exit_code == 2 and "--out-dir" in res.stderr and "table.csv" in res.stderr, res.stderr
    assert "Traceback" not in res.output + res.stderr
    unchanged()


def test_same_file_and_check_output(tmp_path):
    a = tmp_path / "a.csv"
    a.write_text("x")
    os.link(a, tmp_path / "hard.csv")
    assert same_file(a, tmp_path / "hard.csv") and same_file(a, tmp_path / "sub" / ".." / "a.csv")
    assert not same_file(a, tmp_path / "missing.csv")
    with pytest.raises(InputError) as err:
        check_output(str(tmp_path / "hard.csv"), "--out", "a CSV table", (".csv",), [("the table", a), ("none", None)])
    assert err.value.key == "--out" and err.value.file == str(tmp_path / "hard.csv")
    assert "is the table" in str(err.value)
    check_output(str(tmp_path / "b.CSV"), "--out", "a CSV table", (".csv",), [("the table", a)])  # no error


def _files(box: Path) -> dict[str, bytes | str]:
    """Every entry in the box: a file's bytes, a link's target (a symlink loop cannot be read)."""
    return {p.name: os.readlink(p) if p.is_symlink() else p.read_bytes() for p in box.iterdir()}


LOOP = "is a symlink loop"
# (command line, the file named, the flag): each output named is a symlink to itself (`ln -s loop.x loop.x`)
LOOP_CASES = [
    (["report", "table.csv", "--out", "loop.html"], "loop.html", "--out"),
    (["predict", "scenario.yaml", "--trace", "loop.json"], "loop.json", "--trace"),
    (["sweep", "sweep.yaml", "--jobs", "1", "--out", "loop.csv"], "loop.csv", "--out"),
    (["sweep", "sweep.yaml", "--jobs", "1", "--out", "t.csv", "--parquet", "loop.parquet"], "loop.parquet",
     "--parquet"),
]


@pytest.mark.parametrize(("args", "file", "flag"), LOOP_CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in LOOP_CASES])
def test_an_output_that_is_a_symlink_loop_exits_2_naming_the_flag(box, args, file, flag):
    (box / file).symlink_to(file)
    before = _files(box)
    res = cli_runner().invoke(main, args)
    assert_refused(res, f"{file}: {flag}: {LOOP}", "allowed: a file name, or a link that ends at a file")
    assert _files(box) == before


def test_an_output_in_a_looping_folder_exits_2(box):
    (box / "dir").symlink_to("dir")
    res = cli_runner().invoke(main, ["report", "table.csv", "--out", "dir/page.html"])
    assert_refused(res, f"dir/page.html: --out: {LOOP}")


def test_an_input_that_is_a_symlink_loop_is_refused_as_unreadable_not_as_a_loop_output(box):
    """Comparing the output with an input that is a loop must not crash: the input's own reading refuses it."""
    (box / "in.csv").symlink_to("in.csv")
    (box / "in.yaml").symlink_to("in.yaml")
    assert_refused(cli_runner().invoke(main, ["report", "in.csv", "--out", "page.html"]), "in.csv: file not found")
    assert_refused(cli_runner().invoke(main, ["predict", "in.yaml", "--trace", "t.json"]), "in.yaml: cannot read")
    assert_refused(cli_runner().invoke(main, ["sweep", "in.yaml", "--out", "t.csv"]), "in.yaml: cannot read")
    assert not (box / "page.html").exists() and not (box / "t.json").exists() and not (box / "t.csv").exists()


def test_same_file_and_check_output_on_a_symlink_loop(tmp_path):
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    a = tmp_path / "a.csv"
    a.write_text("x")
    assert not same_file(a, loop) and not same_file(loop, a)
    assert same_file(loop, tmp_path / "." / "loop.csv")  # the one path, spelled alike
    with pytest.raises(InputError) as err:
        check_output(str(loop), "--out", "a CSV table", (".csv",), [("the table", a)])
    assert err.value.key == "--out" and err.value.file == str(loop) and LOOP in str(err.value)
    check_output(str(a.with_name("b.csv")), "--out", "a CSV table", (".csv",), [("the table", loop)])  # no error
