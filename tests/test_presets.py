"""Presets are data: every one loads, cites a source, and its derived figures match published ones."""

from __future__ import annotations

import pytest

from simspec import presets
from simspec.timing.stack import target_stack


def test_every_preset_loads_and_cites_a_source():
    for kind, items in presets.catalog().items():
        assert items, kind
        for name, preset in items.items():
            assert preset.source.strip(), f"{kind}/{name} has no source"


def test_required_presets_exist():
    cat = presets.catalog()
    for gpu in ("rtx-pro-6000-workstation", "rtx-pro-6000-server", "h100-sxm", "h100-pcie", "h200-sxm", "b200",
                "a100-80gb-sxm", "l40s", "rtx-4090"):
        assert gpu in cat["gpus"]
    for model in ("kimi-k2.5", "deepseek-v3", "llama-3.1-8b", "llama-3.1-70b", "qwen3-235b-a22b"):
        assert model in cat["models"]
    for drafter in ("eagle3-llama-3.1-8b", "eagle3-kimi-k2", "eagle3-kimi-k2.5"):
        assert drafter in cat["drafters"]


@pytest.mark.parametrize("name", list(presets.models()))
def test_parameter_counts_match_published_totals(name):
    m = presets.models()[name]
    assert target_stack(m, 1).total_params / 1e9 == pytest.approx(m.published_params_b, rel=0.01)


def test_kimi_k25_int4_weights_per_gpu():
    """~571 GB INT4 routed experts + ~23 GB BF16 (hardware-and-models.md), over 8 GPUs."""
    s = target_stack(presets.models()["kimi-k2.5"], 8)
    # MLA's A projections are replicated (~1.8 GB per GPU), so the per-GPU figure is a bit over 594/8
    assert 594 / 8 < s.weight_bytes_per_gpu / 1e9 < 594 / 8 + 2.5


def test_fp8_falls_back_to_bf16_on_gpus_without_fp8():
    a100 = presets.gpus()["a100-80gb-sxm"]
    assert a100.peak_tflops("fp8") == a100.bf16_tflops


@pytest.mark.parametrize(("fraction", "says"), [({"fp8": 0.0}, "greater than 0"),
                                               ({"fp8": 1.2}, "less than or equal to 1"),
                                               ({}, "neither bf16 nor fp8")])
def test_a_sustained_tensor_fraction_must_be_a_fraction_and_say_of_what(fraction, says):
    fields = presets.gpus()["h100-pcie"].model_dump()
    fields["sustained_tensor_fraction"] = fraction | {"source": "a test"}
    with pytest.raises(ValueError, match=says):
        presets.GpuPreset(**fields)


@pytest.mark.parametrize(("gpu", "interconnect", "tp", "says"), [
    ("h100-sxm", "nvlink4-nccl", 8, None),
    ("b200", "nvlink5-nccl", 8, None),
    ("rtx-pro-6000-server", "pcie5-nccl", 8, None),
    ("rtx-pro-6000-server", "pcie4-nccl", 8, None),  # a PCIe 5 card in a PCIe 4 slot runs at the slot's rate
    ("a100-40gb-pcie", "nvlink3-nccl", 2, None),      # two cards on their NVLink bridge
    ("h100-pcie", "nvlink4-nccl", 2, None),
    ("l40s", "nvlink4-nccl", 1, None),                # one GPU: nothing crosses the interconnect
    ("a100-40gb-pcie", "nvlink3-nccl", 4, "its NVLink 3 bridge joins two cards"),
    ("rtx-pro-6000-server", "nvlink4-nccl", 8, "has PCIe 5 links, not NVLink 4"),
    ("a40", "nvlink3-nccl", 2, "has PCIe 4 links, not NVLink 3"),  # its bridge is far slower than NVLink 3's
    ("a100-80gb-sxm", "nvlink4-nccl", 8, "has NVLink 3 links, not NVLink 4"),
    ("h100-sxm", "pcie5-nccl", 8, "as if NVLink were off"),
    ("l40s", "pcie5-nccl", 2, "PCIe 4 link cannot reach"),
    ("rtx-4090", "pcie4-nccl-no-p2p", 8, None),
    ("rtx-4090", "pcie4-nccl", 8, "no peer-to-peer copies"),
    ("l40s", "pcie4-nccl-no-p2p", 8, None),            # P2P off on a card that has it: NCCL_P2P_DISABLE, real
])
def test_an_interconnect_another_kind_of_box_has_is_named_a_what_if(gpu, interconnect, tp, says):
    why = presets.interconnect_mismatch(gpu, presets.gpus()[gpu], interconnect,
                                        presets.interconnects()[interconnect], tp)
    if says is None:
        assert why is None
    else:
        assert says in why and gpu in why


def test_every_shipped_scenario_and_case_pairs_its_gpu_with_its_own_interconnect():
    """Presets' `links` mislabelled (nvlink5-nccl as NVLink 4, say) would call real boxes hypothetical."""
    import yaml

    from tests.conftest import ROOT
    files = sorted((ROOT / "scenarios").glob("*.yaml")) + sorted((ROOT / "validation" / "cases").glob("*.yaml"))
    seen = set()
    for f in files:
        data = yaml.safe_load(f.read_text())
        sc = data.get("scenario", data)
        hw = sc["hardware"]
        seen.add((hw["gpu"], hw["interconnect"]))
        assert presets.interconnect_mismatch(hw["gpu"], presets.gpus()[hw["gpu"]], hw["interconnect"],
                                             presets.interconnects()[hw["interconnect"]], sc["server"]["tp"]) is None, f
    assert len(seen) >= 9  # every NVLink generation and both PCIe ones are among them


def test_an_interconnect_s_kind_of_link_is_read_off_its_gpu_links_and_cannot_be_given_apart():
    ics = presets.interconnects()
    assert ics["nvlink4-nccl"].link == "nvlink" and ics["pcie5-custom-allreduce"].link == "pcie"
    data = ics["pcie5-nccl"].model_dump(exclude={"link"}) | {"links": "nvlink4"}
    assert presets.InterconnectPreset(**data).link == "nvlink"
    with pytest.raises(ValueError, match="link"):  # no second field that could disagree with `links`
        presets.InterconnectPreset(**data, link="pcie")


def _lrc_reader():
    from tests.conftest import calibration_script

    return calibration_script("read_lrc_cache_hit_rate")


def _word(text, x, top):
    return {"text": text, "x0": x - 2, "x1": x + 2, "top": top, "bottom": top + 4}


def test_the_locality_reader_maps_the_figure_by_its_gridlines_and_reads_a_curve_between_vertices():
    """calibration/read_lrc_cache_hit_rate.py on a synthetic three-panel figure: rho = 0..3 gridlines 80 apart per
    panel, CHR 0..0.8 gridlines from y 300 up to 100; a polyline through (rho 0.5, 0.3) and (rho 1.5, 0.5) reads
    0.4 at rho 1. The 0.474 in models.yaml is this reading of the published figure (the PDF is not in the repo)."""
    r = _lrc_reader()
    origins = (60.0, 400.0, 740.0)
    grid = [{"x0": o + 80 * i, "x1": o + 80 * i, "top": 50, "bottom": 300} for o in origins for i in range(4)]
    grid += [{"x0": o, "x1": o + 320, "top": 300 - 50 * i, "bottom": 300 - 50 * i} for o in origins for i in range(5)]
    words = [_word(t, o + 100, 10) for t, o in zip(r.PANELS, origins, strict=True)]
    words += [_word(t, o + 80 * int(t), 310) for o in origins for t in ("1", "2")]
    panels, (slope, icept) = r.axes(words, grid)
    assert panels[1][:2] == (400.0, 80.0)
    assert (0.4 * slope + icept) == 200.0  # CHR 0.4 sits on the third gridline
    x0, per_rho, _ = panels[0]
    y = r.value_at([(x0 + 0.5 * per_rho, 300 - 0.3 * 250), (x0 + 1.5 * per_rho, 300 - 0.5 * 250)], x0 + per_rho)
    assert (y - icept) / slope == pytest.approx(0.4)
    assert r.value_at([(0.0, 1.0), (1.0, 2.0)], 5.0) is None  # outside the polyline: no reading


def test_the_locality_reader_refuses_another_figure():
    r = _lrc_reader()
    with pytest.raises(SystemExit, match="not the mchr figure"):
        r.axes([_word("LRU", 10, 10)], [])


def _popularity_reader():
    from tests.conftest import calibration_script

    return calibration_script("read_expert_popularity")


def test_the_popularity_reader_inverts_the_gamma_laws_top_share_and_pools_frequency_tables(tmp_path):
    """calibration/read_expert_popularity.py: a uniform layer has squared CV 0 and its top eighth takes an eighth; the
    gamma law's top share inverts to the spread it came from; two tables pool with equal weight before the CV is
    taken (two sets favouring different experts are less spread together than each alone)."""
    r = _popularity_reader()
    assert r.top_share(0.0) == pytest.approx(1 / 8)
    for spread in (0.3, 0.55, 1.2):
        assert r.spread_from_top_share(r.top_share(spread)) == pytest.approx(spread, rel=1e-4)
    with pytest.raises(ValueError, match="uniform"):
        r.spread_from_top_share(0.1)
    a = {0: [3.0, 1.0, 1.0, 3.0]}  # k = 8 over four experts
    b = {0: [1.0, 3.0, 3.0, 1.0]}
    alone = r.squared_cv(a[0])
    median, per_layer = r.pooled_spread([a, b])
    assert alone == pytest.approx(0.25) and median == per_layer[0] == pytest.approx(0.0)
    rows = "Language,Layer,Expert_0,Expert_1\nEnglish,0,6.0,2.0\nHebrew,0,4.0,4.0\nEnglish,1,4.0,4.0\n"
    (tmp_path / "t.csv").write_text(rows)
    assert r.read_frequencies(str(tmp_path / "t.csv"), "English") == {0: [6.0, 2.0], 1: [4.0, 4.0]}


def test_the_popularity_reader_takes_each_datasets_first_summary_from_the_notebook(tmp_path):
    import json

    r = _popularity_reader()
    text = ("summary: top-32 combined frequency per layer for gpqa\n  layer 3: 31.0%\n  layer 4: 40.0%\n"
            "summary: top-32 combined frequency per layer for gpqa\n  layer 3: 13.0%\n")  # the replicated one: skipped
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": [{"outputs": [{"text": [text]}]}]}))
    assert r.read_top_shares(str(tmp_path / "nb.ipynb")) == {"gpqa": [0.31, 0.40]}


def test_measured_popularity_spreads_sit_in_the_presets_with_their_sources():
    """The figures calibration/read_expert_popularity.py derives (the data stay in their authors' repositories):
    DeepSeek-V3 0.55, Qwen3-30B-A3B 0.83. A model routed by the same design as a measured one carries its figure,
    labelled as not measured: Qwen3-235B-A22B Qwen3-30B-A3B's; the Kimis and GLM-4.7-Flash (sigmoid scores,
    bias-balanced top-k, a shared expert) DeepSeek-V3's. Dense models have none."""
    models = presets.models()
    assert models["deepseek-v3"].moe_routing_spread.value == pytest.approx(0.55)
    assert models["qwen3-30b-a3b"].moe_routing_spread.value == pytest.approx(0.83)
    carried = {"qwen3-235b-a22b": "qwen3-30b-a3b", "qwen3-235b-a22b-fp8": "qwen3-30b-a3b",
               "kimi-k2": "deepseek-v3", "kimi-k2.5": "deepseek-v3", "glm-4.7-flash": "deepseek-v3"}
    for name, measured in carried.items():
        spread = models[name].moe_routing_spread
        assert spread.source.startswith("NOT MEASURED FOR THIS MODEL"), name
        assert spread.value == models[measured].moe_routing_spread.value, name
    moe = {n for n, m in models.items() if m.num_routed_experts}
    assert all(models[n].moe_routing_spread is not None for n in moe)
    with pytest.raises(ValueError, match="needs MoE layers"):
        presets.ModelPreset(**{**models["llama-3.1-8b"].model_dump(),
                               "moe_routing_spread": {"value": 0.5, "source": "test"}})
