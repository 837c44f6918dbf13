"""Read the tiles SGLang's tuned fused-MoE configs give simspec's MoE models, from SGLang's released wheels.

SGLang's Triton fused MoE picks its tile (BLOCK_SIZE_M x BLOCK_SIZE_N) per call from a tuned config file named by
the experts E, the per-GPU intermediate width N, the device name and the weight format
(fused_moe_triton/configs/E=...,N=...,device_name=...[,dtype=fp8_w8a8][,block_shape=[128, 128]].json), taking the
file's entry whose batch-size key is nearest the call's tokens (try_get_optimal_moe_config); without a file it
falls back to a default tile (simspec/timing/forward.py default_moe_tile). The tile sets how many programs the
kernel launches (forward.MoeGrid). This script reads, for each release wheel given, the files whose E and N are
those of a simspec MoE model preset at TP 1-16 and whose device is a simspec GPU preset, and writes their
(tokens, BLOCK_SIZE_M, BLOCK_SIZE_N) entries to simspec/presets/fused_moe_tiles.yaml. The wheels are not part of
this repository (pip download sglang==0.4.6.post1 sglang==0.5.8 --no-deps).

    python calibration/read_fused_moe_tiles.py 0.4.6=sglang-0.4.6.post1-py3-none-any.whl \
        0.5.8=sglang-0.5.8-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path

import yaml

from simspec import presets

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "simspec" / "presets" / "fused_moe_tiles.yaml"
CONFIGS = "sglang/srt/layers/moe/fused_moe_triton/configs/"
# torch.cuda.get_device_name() with spaces as underscores (the file names' device_name), per simspec GPU preset
DEVICE_NAMES = {
    "NVIDIA_H100_80GB_HBM3": "h100-sxm", "NVIDIA_H100_PCIe": "h100-pcie", "NVIDIA_H200": "h200-sxm",
    "NVIDIA_H20": "h20", "NVIDIA_B200": "b200", "NVIDIA_A100-SXM4-80GB": "a100-80gb-sxm",
    "NVIDIA_A100-PCIE-40GB": "a100-40gb-pcie", "NVIDIA_L40S": "l40s", "NVIDIA_L20": "l20", "NVIDIA_A40": "a40",
    "NVIDIA_GeForce_RTX_4090": "rtx-4090",
    "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition": "rtx-pro-6000-server",
    "NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition": "rtx-pro-6000-workstation",
}
# simspec's weight formats as the file names select them
FORMATS = {"": "bf16", ",dtype=fp8_w8a8": "fp8", ",dtype=fp8_w8a8,block_shape=[128, 128]": "fp8-block128"}
NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=([^,]+?)((?:,dtype=[^,]+)?(?:,block_shape=\[\d+, \d+\])?)\.json$")
# the Triton versions a release looks in, in order: its own torch's first, then get_moe_configs' fallbacks
# (0.5.8 pins torch 2.9.1, which brings triton 3.5.1; fused_moe_triton_config.py supported_triton_versions)
SEARCH = {"0.4.6": ("",), "0.5.8": ("triton_3_5_1/", "triton_3_4_0/", "triton_3_3_1/", "triton_3_2_0/",
                                    "triton_3_1_0/")}


def wanted_shapes() -> set[tuple[int, int]]:
    """(E, N) of simspec's MoE presets at TP 1 to 16, E as the kernel sees it (0.4.6 adds TP copies of
    DeepSeek-V3's shared expert: releases.fused_moe_experts)."""
    out = set()
    for m in presets.models().values():
        if not m.num_routed_experts:
            continue
        for tp in (1, 2, 4, 8, 16):
            if m.moe_intermediate_size % tp == 0:
                for e in {m.num_routed_experts, m.num_routed_experts + tp}:
                    out.add((e, m.moe_intermediate_size // tp))
    return out


def read_release(wheel: Path, release: str, shapes: set[tuple[int, int]]) -> list[dict]:
    found: dict[tuple[str, int, int, str], dict] = {}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for folder in SEARCH[release]:
            for path in sorted(n for n in names if n.startswith(CONFIGS + folder) and n.count("/") ==
                               (CONFIGS + folder).count("/")):
                m = NAME.match(path.rsplit("/", 1)[1])
                if m is None:
                    continue
                e, n, device, fmt = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
                gpu, weights = DEVICE_NAMES.get(device), FORMATS.get(fmt)
                if gpu is None or weights is None or (e, n) not in shapes:
                    continue
                key = (gpu, e, n, weights)
                if key in found:  # an earlier folder in the search order wins
                    continue
                data = json.loads(z.read(path))
                found[key] = {"gpu": gpu, "experts": e, "n": n, "weights": weights, "file": path[len(CONFIGS):],
                              "tiles": [[int(t), c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"]]
                                        for t, c in sorted(data.items(), key=lambda kv: int(kv[0]))]}
    return [found[k] for k in sorted(found)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", nargs="+", metavar="RELEASE=WHEEL", help=f"releases read: {', '.join(SEARCH)}")
    args = ap.parse_args()
    shapes = wanted_shapes()
    out = {}
    for item in args.wheels:
        release, _, wheel = item.partition("=")
        if release not in SEARCH or not wheel:
            ap.error(f"{item!r}: give RELEASE=WHEEL with RELEASE one of {', '.join(SEARCH)}")
        out[release] = {"source": f"{Path(wheel).name}, {CONFIGS}", "files": read_release(Path(wheel), release,
                                                                                          shapes)}
    header = ("# Tiles (tokens, BLOCK_SIZE_M, BLOCK_SIZE_N) of SGLang's tuned fused-MoE config files for simspec's\n"
              "# MoE presets, per release read. Written by calibration/read_fused_moe_tiles.py from the released\n"
              "# wheels; do not edit by hand. Other releases use the nearest one read (scenario/releases.py).\n")
    OUT.write_text(header + yaml.safe_dump(out, sort_keys=False, width=120, default_flow_style=None))
    print(f"wrote {OUT.relative_to(ROOT)}: " + ", ".join(f"{r} {len(v['files'])} files" for r, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
