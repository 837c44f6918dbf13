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

The 0.5.3-0.5.7 wheels, where given, are read only to date 0.5.8's files: each gets `since`, the first release read
from which on every release read gives the same tiles for its shape (in these wheels a file, once shipped, is
byte-identical to 0.5.8's; older releases only lack the files added later). 0.5.3-0.5.7 then use 0.5.8's files
from their `since` on (scenario/releases.py fused_moe_tile_release).

Releases after 0.5.8 (0.5.9-0.5.23, where given) are read with their own lookup rule (read from each wheel's
fused_moe_triton_config.py get_moe_configs): the folder of the Triton the wheel's pinned torch brings first, then
0.5.8-0.5.11's fixed fallback list (triton 3.4.0, 3.3.1, 3.2.0, 3.1.0), or from 0.5.12 every triton_* folder the
wheel ships, newest first; the first folder holding the file wins. Each looks up a separate file for the w2 (down)
GEMM, the w13 file's name plus `_down` (fused_moe.py passes `down_config or config` to w2; its BLOCK_SIZE_M must
equal w13's), recorded as `down_tiles`. A later release gets a section of its own only where the tiles it resolves
differ from the release before it; a release takes the newest section at or before it.

    python calibration/read_fused_moe_tiles.py 0.4.6=sglang-0.4.6.post1-py3-none-any.whl \
        0.5.8=sglang-0.5.8-py3-none-any.whl 0.5.3=sglang-0.5.3-py3-none-any.whl ... \
        0.5.7=sglang-0.5.7-py3-none-any.whl 0.5.9=sglang-0.5.9-py3-none-any.whl ... \
        0.5.23=sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
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
from simspec.scenario.releases import fuses_shared_expert, release_key

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "simspec" / "presets" / "fused_moe_tiles.yaml"
CONFIGS = "sglang/srt/layers/moe/fused_moe_triton/configs/"
CONFIGS_FROM_0_5_11 = "sglang/srt/layers/moe/moe_runner/triton_utils/configs/"  # where 0.5.11 moved them
# the Triton a torch release requires (torch's wheel METADATA, Requires-Dist: triton==; 2.14.1 says ~=3.8.0, and
# 3.8.0 is the only 3.8 release): the folder a release pinning that torch looks in first
TRITON_OF_TORCH = {"2.9.1": "3.5.1", "2.10.0": "3.6.0", "2.11.0": "3.6.0", "2.13.0": "3.7.1", "2.14.1": "3.8.0"}
FIXED_FALLBACK = ("3.4.0", "3.3.1", "3.2.0", "3.1.0")  # get_moe_configs' supported_triton_versions, 0.5.8-0.5.11
LATER = tuple(f"0.5.{p}" for p in range(9, 24))  # read with their own rule, each against the release before it
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
# 0.5.3-0.5.5.post3 pin torch 2.8.0 (triton 3.4.0), 0.5.6-0.5.7 torch 2.9.1 (wheel METADATA); the fallback list is
# the same
_FALLBACK = ("triton_3_4_0/", "triton_3_3_1/", "triton_3_2_0/", "triton_3_1_0/")
_TORCH_2_9 = ("triton_3_5_1/",) + _FALLBACK
SEARCH = {"0.4.6": ("",), "0.5.8": _TORCH_2_9}
SEARCH |= {v: _FALLBACK for v in ("0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.3.post3", "0.5.4", "0.5.4.post1",
                                  "0.5.4.post2", "0.5.4.post3", "0.5.5", "0.5.5.post1", "0.5.5.post2", "0.5.5.post3")}
SEARCH |= {v: _TORCH_2_9 for v in ("0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.7")}
WRITTEN = ("0.4.6", "0.5.8")  # releases with a section of their own; the others date 0.5.8's files


def wanted_shapes() -> set[tuple[int, int]]:
    """(E, N) of simspec's MoE presets at TP 1 to 16, E as the kernel sees it: DeepSeek-V3's shared expert may run
    among the routed ones (releases.fused_shared_expert_copies: TP copies in 0.4.6, one from 0.5.3)."""
    out = set()
    for m in presets.models().values():
        if not m.num_routed_experts:
            continue
        fused = fuses_shared_expert(m.architecture, m.num_routed_experts, m.num_shared_experts)
        for tp in (1, 2, 4, 8, 16):
            if m.moe_intermediate_size % tp == 0:
                extra = {m.num_routed_experts + tp, m.num_routed_experts + 1} if fused else set()
                for e in {m.num_routed_experts} | extra:
                    out.add((e, m.moe_intermediate_size // tp))
    return out


def _folder(version: str) -> str:
    return "triton_" + version.replace(".", "_") + "/"


def config_root(release: str) -> str:
    """Where a release's wheel keeps the tuned configs (0.5.11 moved them)."""
    return CONFIGS_FROM_0_5_11 if release_key(release) >= (5, 11, 0) else CONFIGS


def later_search(z: zipfile.ZipFile, release: str) -> tuple[str, tuple[str, ...]]:
    """(config root, folders in search order) of a release after 0.5.8, from its wheel (module docstring)."""
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    pin = re.search(r"^Requires-Dist: torch==([0-9.]+)\s*$", z.read(meta).decode(), re.M)
    if pin is None or pin.group(1) not in TRITON_OF_TORCH:
        raise SystemExit(f"{release}: its torch pin {pin and pin.group(1)!r} is not in TRITON_OF_TORCH")
    own = TRITON_OF_TORCH[pin.group(1)]
    root = config_root(release)
    if release_key(release) <= (5, 11, 0):
        others = FIXED_FALLBACK
    else:
        shipped = {n[len(root):].split("/")[0] for n in z.namelist() if n.startswith(root + "triton_")}
        others = tuple(sorted((d.removeprefix("triton_").replace("_", ".") for d in shipped),
                              key=lambda v: tuple(int(x) for x in v.split(".")), reverse=True))
    return root, tuple(_folder(v) for v in (own, *(o for o in others if o != own)))


def _tiles(data: dict) -> list[list[int]]:
    return [[int(t), c["BLOCK_SIZE_M"], c["BLOCK_SIZE_N"]] for t, c in sorted(data.items(), key=lambda kv: int(kv[0]))]


def read_release(wheel: Path, release: str, shapes: set[tuple[int, int]]) -> list[dict]:
    found: dict[tuple[str, int, int, str], dict] = {}
    downs: dict[tuple[str, int, int, str], tuple[str, dict]] = {}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        root, search = (CONFIGS, SEARCH[release]) if release in SEARCH else later_search(z, release)
        for folder in search:
            for path in sorted(n for n in names if n.startswith(root + folder) and n.count("/") ==
                               (root + folder).count("/")):
                base = path.rsplit("/", 1)[1]
                down = base.endswith("_down.json")
                m = NAME.match(base.removesuffix("_down.json") + ".json" if down else base)
                if m is None:
                    continue
                e, n, device, fmt = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
                gpu, weights = DEVICE_NAMES.get(device), FORMATS.get(fmt)
                if gpu is None or weights is None or (e, n) not in shapes:
                    continue
                key = (gpu, e, n, weights)
                if key in (downs if down else found):  # an earlier folder in the search order wins
                    continue
                data = json.loads(z.read(path))
                if down:
                    downs[key] = (path[len(root):], data)
                    continue
                found[key] = {"gpu": gpu, "experts": e, "n": n, "weights": weights, "file": path[len(root):],
                              "tiles": _tiles(data)}
    for key, (path, data) in downs.items():
        # 0.4.6 and 0.5.3-0.5.4 have no down lookup; 0.5.5-0.5.7 have it, and for simspec's shapes only the H20's
        # E=257 files, not read there (they date 0.5.8's w13 files and take w13's tile for w2)
        if key in found and (release not in SEARCH or release == "0.5.8"):
            found[key] |= {"down_file": path, "down_tiles": _tiles(data)}
    return [found[k] for k in sorted(found)]


def _resolved(files: list[dict]) -> dict:
    """What a release's files give a call: the tiles and down tiles per shape (not where the files lie)."""
    return {(f["gpu"], f["experts"], f["n"], f["weights"]): (f["tiles"], f.get("down_tiles")) for f in files}


def date_files(files: list[dict], earlier: dict[str, list[dict]]) -> None:
    """Give each of 0.5.8's files `since`: the first release read from which on every release read (0.5.8 included)
    gives its shape the same tiles."""
    order = sorted(earlier, key=release_key, reverse=True)
    for f in files:
        key = (f["gpu"], f["experts"], f["n"], f["weights"])
        since = "0.5.8"
        for release in order:  # newest first: stop at the first release that lacks the file or differs
            same = [g for g in earlier[release] if (g["gpu"], g["experts"], g["n"], g["weights"]) == key]
            if not same or same[0]["tiles"] != f["tiles"]:
                break
            since = release
        f["since"] = since


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", nargs="+", metavar="RELEASE=WHEEL", help=f"releases read: {', '.join((*SEARCH, *LATER))}")
    args = ap.parse_args()
    shapes = wanted_shapes()
    out, earlier, later = {}, {}, {}
    for item in args.wheels:
        release, _, wheel = item.partition("=")
        if not wheel:
            ap.error(f"{item!r}: give RELEASE=WHEEL")
        if release not in SEARCH and release not in LATER:
            ap.error(f"{item!r}: give RELEASE=WHEEL with RELEASE one of {', '.join((*SEARCH, *LATER))}")
        files = read_release(Path(wheel), release, shapes)
        if release in WRITTEN:
            out[release] = {"source": f"{Path(wheel).name}, {CONFIGS}", "files": files}
        elif release in LATER:
            later[release] = (Path(wheel).name, files)
        else:
            earlier[release] = files
    if earlier:
        if "0.5.8" not in out:
            ap.error("the 0.5.3-0.5.7 wheels date 0.5.8's files: give 0.5.8=WHEEL too")
        date_files(out["0.5.8"]["files"], earlier)
        out["0.5.8"]["dated_by"] = ", ".join(sorted(earlier, key=release_key))
    if later:
        if "0.5.8" not in out or sorted(later, key=release_key) != list(LATER[:len(later)]):
            ap.error(f"releases after 0.5.8 are each compared with the one before: give 0.5.8 and {LATER[0]} on, "
                     "without gaps")
        previous = _resolved(out["0.5.8"]["files"])
        for release in LATER[:len(later)]:
            name, files = later[release]
            now = _resolved(files)
            if now == previous:
                continue
            # a section where what a call gets changes: the files that give a shape other tiles, and the shapes
            # that lost their file (they take the default tile again)
            root = config_root(release)
            changed = [f for f in files if previous.get((f["gpu"], f["experts"], f["n"], f["weights"]))
                       != now[(f["gpu"], f["experts"], f["n"], f["weights"])]]
            removed = [{"gpu": k[0], "experts": k[1], "n": k[2], "weights": k[3]} for k in sorted(previous)
                       if k not in now]
            out[release] = {"source": f"{name}, {root}", "changed": changed, **({"removed": removed} if removed
                                                                                  else {})}
            previous = now
        out["0.5.8"]["later_read"] = f"{LATER[0]} through {LATER[len(later) - 1]}, each against the release before"
    header = ("# Tiles (tokens, BLOCK_SIZE_M, BLOCK_SIZE_N) of SGLang's tuned fused-MoE config files for simspec's\n"
              "# MoE presets, per release read. Written by calibration/read_fused_moe_tiles.py from the released\n"
              "# wheels; do not edit by hand. A release uses the newest section at or before it\n"
              "# (scenario/releases.py); 0.5.3-0.5.7 use 0.5.8's files from each file's `since` on. Sections after\n"
              "# 0.5.8 list what changed from the section before. down_tiles: the w2 GEMM's own file (0.5.8 on).\n")
    OUT.write_text(header + yaml.safe_dump(out, sort_keys=False, width=120, default_flow_style=None))
    counts = (f"{r} {len(v['files'])} files" if "files" in v else f"{r} {len(v['changed'])} changed"
              for r, v in out.items())
    print(f"wrote {OUT.relative_to(ROOT)}: " + ", ".join(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
