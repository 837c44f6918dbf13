"""Which SGLang releases simspec models, and what about a release changes a prediction.

Two early-2025 releases are modelled besides 0.5.8 through 0.5.23, because published measurements were taken
on them: 0.4.4 (the EAGLE-3 paper's batch-size sweep, M3) and 0.4.6.post1 (the Qwen documentation's H20
speed benchmark). Everything below was read from each release's wheel; where a rule is not listed here, the
0.5.x rule applies to them too (see the not-modelled list in docs/time-model.md).

What differs, by release:
- speculative algorithms: 0.4.4 has EAGLE (and NEXTN, which it maps to EAGLE); 0.4.6 adds EAGLE3. Neither
  has n-gram or standalone-draft speculation, nor v2 workers (srt/speculative/spec_info.py).
- the running-request cap an EAGLE-family server sets when the user sets none: 32 in 0.4.4, 48 from 0.4.6
  (server_args.__post_init__).
- which batch sizes get a CUDA graph, and whether the draft's extend after a verify runs in one: see
  simspec/timing/iteration.py early_captured_batch_sizes and IterationModel (the eager draft extend).
- memory defaults (mem_fraction_static, chunked_prefill_size, cuda_graph_max_bs): simspec/scenario/memory.py.
- kernels per decode forward: presets/kernels.yaml `releases`.
- the (num_steps, topk, num_draft_tokens) an EAGLE-family server picks when none is set: (5, 4, 8) for every
  model in both (0.4.4's argument defaults; 0.4.6's auto_choose_speculative_params), where 0.5.x picks by
  architecture (loader.py).
- model architectures: Qwen3 arrived in 0.4.6 and Kimi-K2.5's wrapper after both (models/ of each wheel).
"""

from __future__ import annotations

import re

EARLY_RELEASES = ((4, 4), (4, 6))  # (minor, patch) of the 0.4 releases read
CURRENT_RANGE = ((5, 8), (5, 23))  # every 0.5 release from 0.5.8 to 0.5.23
MODELLED_TEXT = "0.4.4, 0.4.6 (0.4.6.post1) and 0.5.8 through 0.5.23"
VERSION_PATTERN = r"^0\.(\d+)\.(\d+)(\.post\d+)?$"

_ALGORITHMS_0_4_4 = ("none", "eagle", "mtp")
_ALGORITHMS_0_4_6 = ("none", "eagle", "eagle3", "mtp")
EARLY_AUTO_TREE = (5, 4, 8)
# architectures of simspec's model presets that a release's models/ does not define
_MISSING_ARCHITECTURES = {
    (4, 4): ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "KimiK25ForConditionalGeneration"),
    (4, 6): ("KimiK25ForConditionalGeneration",),
}


def minor_patch(version: str) -> tuple[int, int]:
    """(minor, patch) of an SGLang version string "0.M.P" or "0.M.P.postN"."""
    m = re.match(VERSION_PATTERN, version)
    if m is None:
        raise ValueError(f"not an SGLang version 0.M.P[.postN]: {version!r}")
    return int(m.group(1)), int(m.group(2))


def is_modelled(version: tuple[int, int]) -> bool:
    low, high = CURRENT_RANGE
    return version in EARLY_RELEASES or low <= version <= high


def is_early(version: tuple[int, int]) -> bool:
    """A 0.4 release: v1 speculative workers only, the older CUDA-graph and memory rules."""
    return version < CURRENT_RANGE[0]


def speculative_algorithms(version: tuple[int, int]) -> tuple[str, ...] | None:
    """The algorithms this release can run; None = every algorithm simspec models."""
    if version == (4, 4):
        return _ALGORITHMS_0_4_4
    if version == (4, 6):
        return _ALGORITHMS_0_4_6
    return None


def spec_default_max_running(version: tuple[int, int]) -> int:
    """max_running_requests an EAGLE-family (or any speculative, 0.5.x) server sets when the user sets none."""
    return 32 if version == (4, 4) else 48


def runs_architecture(version: tuple[int, int], architecture: str) -> bool:
    return architecture not in _MISSING_ARCHITECTURES.get(version, ())
