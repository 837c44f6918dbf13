"""`simspec calibrate` on bad input: each refusal exits 2 with one line naming the file or flag and what is allowed,
never a traceback, and (where the input is checkable up front) before anything is measured or written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from simspec.cli import main
from tests.conftest import ROOT
from tests.fake_sglang import FakeSGLang

DATA = ROOT / "tests" / "data" / "sglang"
NOSPEC = DATA / "sglang-0.5.10-nospec-tp1-logms.log"  # tp 1, 6.3 ms at batch 1 and 7.1 ms at batch 8
EAGLE_TP8 = DATA / "sglang-0.5.8-eagle3-tp8.log"
H100 = ["--gpu", "h100-sxm", "--interconnect", "nvlink4-nccl"]
H200 = ["--gpu", "h200-sxm", "--interconnect", "nvlink4-nccl"]


def _refused(args: list[str]) -> str:
    """Run calibrate, assert it refused as bad input (exit 2, one error line, no traceback); its output."""
    res = CliRunner().invoke(main, ["calibrate", "--bootstrap", "0", *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)
    assert res.output.startswith("error: "), res.output
    return res.output


def _scaled_log(tmp_path: Path, factor: float) -> Path:
    """The no-speculation log with every step `factor` times as long (gen throughput divided by it)."""
    text = re.sub(r"gen throughput \(token/s\): ([\d.]+)",
                  lambda m: f"gen throughput (token/s): {float(m.group(1)) / factor:.6g}", NOSPEC.read_text())
    path = tmp_path / f"slow{factor:g}.log"
    path.write_text(text)
    return path


# ------------------------------------------------------------------- 1. step times no setup could produce


@pytest.mark.parametrize(("factor", "needle"), [
    (100.0, "memory_bandwidth_efficiency is held at its lower bound 0.2"),  # 630 ms steps of an 8B on an H100
    (0.01, "memory_bandwidth_efficiency is held at its upper bound 1"),  # 0.06 ms: faster than HBM can stream
    # so slow that no coefficient moves the fit: it used to stay at the defaults and label them fitted
    (1e5, "misses its own points by 100% RMS, -100% at batch"),
])
def test_step_times_the_model_cannot_reach_are_refused_not_fitted(tmp_path, factor, needle):
    log = _scaled_log(tmp_path, factor)
    out = tmp_path / "out" / "p.yaml"
    msg = _refused(["--from-log", str(log), "--model", "llama-3.1-8b", "--out", str(out), *H100])
    assert str(log) in msg and needle in msg and "cannot be fitted" in msg
    assert not out.parent.exists() or not any(out.parent.iterdir())  # no profile, scenario or measurements


def test_a_fit_held_at_a_bound_within_noise_is_labelled_so():
    """Step times the fit reproduces (within the noise) while a coefficient sits at its bound keep the profile, but
    the coefficient says it was held there, not pinned by the data."""
    from simspec.calibration.fitting import Box, fit
    from simspec.calibration.measurements import Measurements, ServerDescription, StepTime

    box = Box(gpu="h100-sxm", interconnect="nvlink4-nccl", model="llama-3.1-8b")
    m = Measurements(server=ServerDescription(model_path="meta-llama/Llama-3.1-8B-Instruct", tp=1,
                                              sglang_version="0.5.10"), sources=["synthetic"])
    # 5.6 ms at batch 1: a shade faster than an 8B can stream its weights at the H100's full bandwidth
    m.step_times = [StepTime(batch_size=b, seconds=(5.3 + 0.3 * b) / 1e3, samples=5, source="s") for b in (1, 2, 4)]
    f = fit(m, box, name="t", bootstrap=0)
    eff = f.profile.coefficients["memory_bandwidth_efficiency"]
    assert eff.value == pytest.approx(1.0, abs=1e-3) and "held there at its bound 1" in eff.source
    assert any("ended at its bound 1" in n for n in f.notes)
    for _, measured, modelled in f.residuals_pct:
        assert modelled == pytest.approx(measured, rel=0.10)


# ------------------------------------------------------------------- 2. a collective table with one size


def test_a_collective_table_with_one_message_size_is_refused(tmp_path):
    table = tmp_path / "ar.csv"
    table.write_text("bytes,time_us,world_size,backend,in_cuda_graph,op\n"
                     "1048576,30.1,8,nccl,1,all_reduce\n1048576,30.4,8,nccl,1,all_reduce\n")
    out = tmp_path / "out" / "c.yaml"
    msg = _refused(["--collectives", str(table), "--tp", "8", "--model", "llama-3.1-70b", "--out", str(out), *H200])
    assert f"{table}: bytes:" in msg and "at least 2 different sizes" in msg
    assert not out.parent.exists()


# ------------------------------------------------------------------- 3. flags checked before anything is written


@pytest.mark.parametrize(("log", "box", "args", "flag", "needle"), [
    (NOSPEC, H100, ["--model", "llama-9"], "--model", "unknown model preset 'llama-9'"),
    (NOSPEC, H100, ["--model", "llama-3.1-8b", "--drafter", "nope"], "--drafter", "unknown drafter preset"),
    (NOSPEC, H100, ["--model", "llama-3.1-8b", "--drafter", "eagle3-llama-3.1-8b"], "--drafter",
     "no speculative decoding"),
    (NOSPEC, H100, ["--model", "llama-3.1-8b", "--num-gpus", "4"], "--num-gpus", "allowed is 1"),
    (EAGLE_TP8, H200, ["--drafter", "llama-3.1-8b"], "--drafter", "unknown drafter preset 'llama-3.1-8b'"),
    (EAGLE_TP8, H200, ["--drafter", "eagle3-qwen3-8b"], "--drafter", "hidden states"),
    (EAGLE_TP8, H200, ["--num-gpus", "4"], "--num-gpus", "allowed is 8"),
])
def test_bad_flags_are_refused_before_anything_is_written(tmp_path, log, box, args, flag, needle):
    out = tmp_path / "out" / "p.yaml"
    msg = _refused(["--from-log", str(log), "--out", str(out), *box, *args])
    assert msg.startswith(f"error: {flag}: ") and needle in msg and "<calibrate>" not in msg
    assert not out.parent.exists()  # not even the measurements: a corrected re-run needs no --force


def test_a_refused_fit_leaves_nothing_so_the_corrected_run_needs_no_force(tmp_path):
    out = tmp_path / "p.yaml"
    _refused(["--from-log", str(_scaled_log(tmp_path, 100.0)), "--model", "llama-3.1-8b", "--out", str(out), *H100])
    res = CliRunner().invoke(main, ["calibrate", "--from-log", str(NOSPEC), "--model", "llama-3.1-8b", "--out",
                                    str(out), "--bootstrap", "0", "--json", *H100])
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------------- 4. --tp against what the server said


def test_tp_that_disagrees_with_the_log_is_refused(tmp_path):
    out = tmp_path / "out" / "p.yaml"
    msg = _refused(["--from-log", str(EAGLE_TP8), "--tp", "4", "--out", str(out), *H200])
    assert msg.startswith("error: --tp: 4 but the server ran tp 8") and str(EAGLE_TP8) in msg
    assert not out.parent.exists()


def test_tp_that_disagrees_with_the_live_server_is_refused_before_measuring(tmp_path, no_long_gc_pauses):
    out = tmp_path / "out" / "p.yaml"
    with FakeSGLang("0.5.10", algorithm="none", tp=1) as fake:
        msg = _refused(["--host", fake.url, "--tp", "2", "--model", "llama-3.1-8b", "--out", str(out), *H100])
        assert fake.iterations == []  # no workload was run
    assert msg.startswith("error: --tp: 2 but the server at") and "reports tp 1" in msg
    assert not out.parent.exists()


# ------------------------------------------------------------------- 5. --name is a file stem


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "a\\b", "x y"])
def test_a_profile_name_with_a_path_is_refused(tmp_path, monkeypatch, name):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    msg = _refused(["--from-log", str(NOSPEC), "--model", "llama-3.1-8b", "--name", name, *H100])
    assert msg.startswith("error: --name: ") and "letters, digits" in msg
    assert list(tmp_path.rglob("*.yaml")) == [] and list(tmp_path.rglob("*.json")) == []


# ------------------------------------------------------------------- 6. a binary /metrics file


def test_a_binary_metrics_file_is_named_not_echoed(tmp_path):
    blob = tmp_path / "m.prom"
    blob.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 3)
    msg = _refused(["--from-metrics", str(blob), "--tp", "1", "--model", "llama-3.1-8b",
                    "--out", str(tmp_path / "p.yaml"), *H100])
    assert f"{blob}: line 1: not Prometheus text" in msg
    assert "\ufffd" not in msg and not any(ord(c) < 32 and c != "\n" for c in msg)
    assert "PNG" not in msg and "IHDR" not in msg


# ------------------------------------------------------------------- 7. a log whose throughputs are NaN


def test_a_log_with_nan_throughput_names_the_file_and_field(tmp_path):
    log = tmp_path / "nan.log"
    log.write_text(re.sub(r"gen throughput \(token/s\): [\d.]+", "gen throughput (token/s): nan",
                          NOSPEC.read_text()))
    out = tmp_path / "out" / "p.yaml"
    msg = _refused(["--from-log", str(log), "--model", "llama-3.1-8b", "--out", str(out), *H100])
    assert msg.startswith(f"error: {log}: line ") and "'gen throughput (token/s)' is nan" in msg
    assert not out.parent.exists()


def test_nothing_to_fit_names_what_was_read(tmp_path):
    """A log with server arguments but no clean decode interval: the error names the file it read."""
    lines = [ln for ln in NOSPEC.read_text().splitlines(keepends=True) if "Decode batch" not in ln]
    log = tmp_path / "args-only.log"
    log.write_text("".join(lines))
    msg = _refused(["--from-log", str(log), "--model", "llama-3.1-8b", "--out", str(tmp_path / "p.yaml"), *H100])
    assert msg.startswith(f"error: {log}: nothing to fit")


def test_valid_flags_still_calibrate(tmp_path):
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(main, ["calibrate", "--from-log", str(EAGLE_TP8), "--tp", "8", "--num-gpus", "8",
                                    "--drafter", "eagle3-kimi-k2.5", "--name", "ok-name_1.0", "--out", str(out),
                                    "--bootstrap", "0", "--json", *H200])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(out.read_text())["name"] == "ok-name_1.0"


# ------------------------------------------------------------------- 8. a live fit refused for a wrong flag


A40 = ["--gpu", "a40", "--interconnect", "pcie4-nccl"]


def test_a_live_fit_refused_for_a_wrong_gpu_says_to_correct_it_then_resume(tmp_path, monkeypatch,
                                                                              no_long_gc_pauses):
    """An 8B's 8-10 ms steps (an H100's) claimed from an A40, whose bandwidth needs 23 ms to stream the weights
    once: the fit is refused, the measurements are kept, and the message says to correct the flags before
    --resume, with --out at the saved run (the default path is named after --gpu). Doing just that fits the saved
    measurements without measuring again."""
    monkeypatch.chdir(tmp_path)  # the default output folder, calibration/profiles, is made here
    live = ["--concurrency", "1,2", "--max-new-tokens", "32", "--model", "llama-3.1-8b", "--bootstrap", "0",
            "--json"]  # --json: no progress bars around the one error line
    with FakeSGLang("0.5.10", algorithm="none", tp=1, step_fixed_s=0.008, step_per_request_s=0.001,
                    prefill_s=0.007, seed=3) as fake:
        msg = _refused(["--host", fake.url, *live, *A40])
        saved = Path("calibration/profiles/llama-3.1-8b-a40-tp1-none.measurements.json")
        profile = saved.with_name("llama-3.1-8b-a40-tp1-none.yaml")
        assert "cannot be fitted" in msg and f"the measurements are saved in {saved}" in msg
        assert (f"if --model, --gpu or --tp is wrong, correct it first, then re-run with --resume --out {profile}"
                " (the default path follows --model, --gpu and --tp) to fit them again") in msg
        assert len(msg.strip().splitlines()) == 1 and saved.exists() and not profile.exists()
        measured = len(fake.iterations)
        # without --out the corrected flags name another default path, with no saved measurements
        assert "nothing to resume" in _refused(["--host", fake.url, *live, *H100, "--resume"])
        res = CliRunner().invoke(main, ["calibrate", "--host", fake.url, *live, *H100, "--resume", "--out",
                                        str(profile)])
        assert res.exit_code == 0, res.output
        assert len(fake.iterations) == measured  # refitted from the saved measurements, nothing measured again
    assert yaml.safe_load(profile.read_text())["measured_on"]["gpu"] == "h100-sxm"


def test_a_live_fit_refused_with_out_given_says_resume_without_out(tmp_path, no_long_gc_pauses):
    out = tmp_path / "p.yaml"
    with FakeSGLang("0.5.10", algorithm="none", tp=1, step_fixed_s=0.008, step_per_request_s=0.001,
                    prefill_s=0.007, seed=3) as fake:
        msg = _refused(["--host", fake.url, "--concurrency", "1", "--max-new-tokens", "32", "--model",
                        "llama-3.1-8b", "--out", str(out), "--json", *A40])
    assert (f"the measurements are saved in {tmp_path / 'p.measurements.json'}: if --model, --gpu or --tp is wrong,"
            " correct it first, then re-run with --resume to fit them again without measuring)") in msg
