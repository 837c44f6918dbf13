"""YAML -> validated Scenario -> ResolvedScenario (presets, profile and SGLang's own defaults filled in).

Every problem becomes an InputError naming the file, the key path and what is allowed. Nothing here writes
files or prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from simspec.timing.stack import Stack

from simspec import presets
from simspec.errors import InputError
from simspec.scenario import releases
from simspec.scenario.memory import plan_memory
from simspec.scenario.profile import CollectiveCurve, Profile
from simspec.scenario.reading import apply_overrides, read_yaml, relative_to_scenario, validation_error
from simspec.scenario.schema import ACCEPTANCE_FORMS, EAGLE_FAMILY, Scenario, Workload

#  SGLang's automatic (num_steps, topk, num_draft_tokens) when none of the three is set
#  (server_args.auto_choose_speculative_params): (3, 1, 4) for STANDALONE whatever the model; otherwise
#  (5, 4, 8) or (3, 1, 4) by architecture and release (releases.auto_tree_is_wide).
WIDE_TREE_AUTO = (5, 4, 8)
DEFAULT_AUTO = (3, 1, 4)
STARTUP_MEMORY_LIMIT = 0.25  # startup_memory_*: at most this share of the GPU (public logs show 1-3 GiB)
V2_DEFAULT_FROM = (5, 23)  # v2 speculative workers (and overlap) are the default from 0.5.23 (sglang.md)

NGRAM_DEFAULT_DRAFT_TOKENS = 12  # --speculative-num-draft-tokens default for NGRAM (sglang.md)


def startup_memory_key(tp: int) -> str:
    """The coefficient for the memory in use before SGLang sizes its KV cache: NCCL adds to it with tp > 1."""
    return "startup_memory_mib" if tp == 1 else "startup_memory_multi_gpu_mib"


@dataclass(frozen=True, slots=True)
class Coefficient:
    value: float
    source: str


@dataclass(frozen=True, slots=True)
class Replayed:
    """Acceptance replayed from a corpus: verify steps that accepted k drafts, and what was replayed."""

    histogram: tuple[float, ...]
    source: str


@dataclass(frozen=True, slots=True)
class ResolvedScenario:
    """A scenario with every preset looked up and every SGLang default applied."""

    scenario: Scenario
    path: str
    gpu: presets.GpuPreset
    model: presets.ModelPreset
    interconnect: presets.InterconnectPreset
    all_reduce: CollectiveCurve
    drafter: presets.DrafterPreset | None
    draft_model: presets.ModelPreset | None
    profile: Profile | None
    coefficients: dict[str, Coefficient]
    num_steps: int
    topk: int
    num_draft_tokens: int
    overlap: bool
    spec_v2: bool
    max_running_requests: int
    kv_capacity_tokens: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    replayed: Replayed | None = None  # acceptance.ngram_replay's result

    @property
    def algorithm(self) -> str:
        return self.scenario.speculative.algorithm

    @property
    def speculative(self) -> bool:
        return self.algorithm != "none"

    @property
    def max_accepted_drafts(self) -> int:
        """The most drafts one verify step can accept (accept length minus the bonus token)."""
        if self.algorithm == "none":
            return 0
        if self.algorithm == "ngram":
            return self.num_draft_tokens - 1
        return min(self.num_steps, self.num_draft_tokens - 1)

    def coefficient(self, name: str) -> float:
        return self.coefficients[name].value


def parse_scenario(data: dict[str, Any], file: str) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, file, Scenario) from None


SCENARIO_KEYS = ("hardware", "model", "server", "workload")  # keys of a scenario that no profile has


def load_profile(path: Path) -> Profile:
    data = read_yaml(path)
    scenario_keys = [k for k in SCENARIO_KEYS if k in data]
    if scenario_keys and not set(data) & (set(Profile.model_fields) - {"name", "description"}):
        raise InputError(f"is a scenario (it has {', '.join(scenario_keys)}), not a calibration profile; a profile"
                         " has measured_on, all_reduce, coefficients or draft_forward_ms (see calibration/profiles/)",
                         file=str(path))
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, str(path), Profile) from None


# ----------------------------------------------------------------------------------------------- resolving


def _lookup(table: dict[str, Any], name: str, what: str, file: str, key: str) -> Any:
    if name not in table:
        close = difflib.get_close_matches(str(name), list(table), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InputError(f"unknown {what} {name!r}; {hint}known: {', '.join(sorted(table))}", file=file, key=key)
    return table[name]


def _tree_settings(sc: Scenario, model: presets.ModelPreset, file: str) -> tuple[int, int, int]:
    spec = sc.speculative
    if spec.algorithm == "none":
        return 0, 0, 1
    if spec.algorithm == "ngram":
        for k in ("num_steps", "topk"):
            if getattr(spec, k) is not None:
                raise InputError("n-gram drafting has no draft steps or topk; set num_draft_tokens and"
                                 " speculative.ngram.*", file=file, key=f"speculative.{k}")
        return 0, 0, spec.num_draft_tokens or NGRAM_DEFAULT_DRAFT_TOKENS
    steps, topk, n = spec.num_steps, spec.topk, spec.num_draft_tokens
    if steps is None and topk is None and n is None:
        if releases.is_early(sc.server.version_minor_patch):
            return releases.EARLY_AUTO_TREE
        if spec.algorithm != "standalone" and releases.auto_tree_is_wide(sc.server.version_minor_patch,
                                                                         model.architecture):
            return WIDE_TREE_AUTO
        return DEFAULT_AUTO
    if steps is None or topk is None or n is None:
        missing = [k for k, v in (("num_steps", steps), ("topk", topk), ("num_draft_tokens", n)) if v is None]
        raise InputError("set all of num_steps, topk and num_draft_tokens, or none of them (SGLang's auto"
                         " default)", file=file, key=f"speculative.{missing[0]}")
    if topk == 1 and n != steps + 1:
        raise InputError(f"with topk 1 the draft is a chain: num_draft_tokens must be num_steps + 1 = {steps + 1}"
                         f" (got {n})", file=file, key="speculative.num_draft_tokens")
    if topk > n - 1:
        raise InputError(f"topk {topk} is larger than the {n - 1} draft tokens the tree can keep"
                         f" (num_draft_tokens - 1); allowed: 1..{n - 1}", file=file, key="speculative.topk")
    capacity = topk + (steps - 1) * topk * topk
    if n - 1 > capacity:
        raise InputError(f"num_draft_tokens {n} needs {n - 1} tree nodes but {steps} steps of topk {topk} draft"
                         f" at most {capacity}; allowed: 2..{capacity + 1}", file=file,
                         key="speculative.num_draft_tokens")
    return steps, topk, n


def _overlap(sc: Scenario, topk: int, file: str) -> tuple[bool, bool]:
    """(overlap scheduling on, v2 workers) as SGLang decides them for this version (sglang.md)."""
    srv, alg = sc.server, sc.speculative.algorithm
    new = srv.version_minor_patch >= V2_DEFAULT_FROM
    if alg == "none":
        supported, v2 = True, False
    elif alg == "ngram":
        supported, v2 = new, False
    else:
        if srv.spec_v2 and not releases.has_v2_workers(srv.release, alg):
            what = " for standalone drafting (0.5.8 adds one)" if alg == "standalone" else ""
            raise InputError(f"SGLang {srv.sglang_version} has no v2 speculative workers{what}; allowed: false or"
                             " unset", file=file, key="server.spec_v2")
        v2 = srv.spec_v2 if srv.spec_v2 is not None else new
        if v2 and topk != 1:
            if srv.spec_v2:
                before = (" (SGLang before 0.5.7 does not check it, but simspec models v2 workers for chains only)"
                          if srv.version_minor_patch < (5, 7) else "")
                raise InputError(f"v2 speculative workers need topk 1{before}", file=file, key="server.spec_v2")
            v2 = False
        supported = v2
    if srv.overlap_schedule == "on" and not supported:
        raise InputError(f"SGLang {srv.sglang_version} cannot overlap scheduling with algorithm {alg}"
                         f"{' without v2 workers (spec_v2: true, topk 1)' if alg in EAGLE_FAMILY else ''};"
                         " allowed: auto or off", file=file, key="server.overlap_schedule")
    return (supported and srv.overlap_schedule != "off"), v2


def _check_acceptance(sc: Scenario, max_drafts: int, file: str) -> None:
    acc, alg = sc.acceptance, sc.speculative.algorithm
    if alg == "none":
        if acc is not None:
            raise InputError("acceptance applies only to a speculative algorithm; remove it or set"
                             " speculative.algorithm", file=file, key="acceptance")
        return
    if acc is None:
        raise InputError(f"speculative.algorithm {alg} needs an acceptance section (one of"
                         f" {', '.join(ACCEPTANCE_FORMS)})", file=file, key="acceptance")
    if acc.ngram_replay is not None and alg != "ngram":
        raise InputError(f"ngram_replay replays SGLang's n-gram drafter; speculative.algorithm is {alg}",
                         file=file, key="acceptance.ngram_replay")
    def within_reach(accept_length: float, key: str, where: str = "") -> None:
        if accept_length > max_drafts + 1 + 1e-9:
            raise InputError(f"accept length {accept_length}{where} is above the {max_drafts + 1} this setup can reach"
                             f" ({max_drafts} drafts + the bonus token); allowed: 1.0..{max_drafts + 1}",
                             file=file, key=key)

    if acc.accept_length is not None:
        within_reach(acc.accept_length, "acceptance.accept_length")
    for i, point in enumerate(acc.accept_length_by_context or ()):
        within_reach(point.accept_length, f"acceptance.accept_length_by_context[{i}].accept_length",
                     f" at {point.context_tokens} context tokens")
    for key in ("chain_rates", "cumulative_rates"):
        rates = getattr(acc, key)
        if rates is not None and len(rates) > max_drafts:
            raise InputError(f"{len(rates)} positions given but this setup drafts at most {max_drafts} deep",
                             file=file, key=f"acceptance.{key}")
    if acc.histogram is not None and len(acc.histogram) > max_drafts + 1:
        extra = acc.histogram[max_drafts + 1:]
        if any(c > 0 for c in extra):
            raise InputError(f"histogram counts steps accepting more than {max_drafts} drafts, which this setup"
                             " cannot draft", file=file, key="acceptance.histogram")
    if acc.positional_rates is not None and alg == "ngram":
        raise InputError("positional_rates describe an EAGLE-style (num_steps, topk) tree; for n-gram give"
                         " accept_length, chain_rates or histogram", file=file, key="acceptance.positional_rates")


def _check_profile_matches(sc: Scenario, profile: Profile, file: str) -> None:
    on = profile.measured_on
    if on is None:
        return
    pairs = (("hardware.gpu", on.gpu, sc.hardware.gpu), ("hardware.interconnect", on.interconnect,
             sc.hardware.interconnect), ("server.tp", on.tp, sc.server.tp))
    for key, measured, wanted in pairs:
        if measured != wanted:
            raise InputError(f"calibration profile {profile.name!r} was measured with {key} = {measured!r} but the"
                             f" scenario has {wanted!r}; drop `calibration` or use a profile of this box",
                             file=file, key=key)
    if on.model is not None and on.model != sc.model:
        raise InputError(f"calibration profile {profile.name!r} was measured serving {on.model!r}, not {sc.model!r}",
                         file=file, key="model")


def _check_shared_prefix(w: Workload, file: str) -> None:
    """Every prompt keeps tokens of its own after the prefix all requests share."""
    shortest = w.input_tokens.shortest
    if w.shared_prefix_tokens >= shortest:
        hint = (" (a normal or lognormal length can draw down to input_tokens.min: set min above the prefix)"
                if w.input_tokens.dist in ("normal", "lognormal") else "")
        raise InputError(f"{w.shared_prefix_tokens} is not below the shortest prompt input_tokens can draw"
                         f" ({shortest}){hint}; allowed: 0..{shortest - 1}, every prompt having tokens of its own"
                         " after the shared prefix", file=file, key="workload.shared_prefix_tokens")


def _coefficients(profile: Profile | None, profile_path: str | None, file: str, model_name: str,
                  model: presets.ModelPreset) -> dict[str, Coefficient]:
    """Each coefficient from the most specific place that has it: the scenario's calibration profile (the box),
    else the model preset (a figure measured for the model, or carried to it and labelled so), else defaults.yaml."""
    defaults = presets.default_coefficients()
    out = {k: Coefficient(v.value, f"default: {v.source}") for k, v in defaults.items()}
    for name, measured in model.measured_routing().items():
        out[name] = Coefficient(measured.value, f"model {model_name}: {measured.source}")
    if profile is not None:
        for name, coef in profile.coefficients.items():
            if name not in defaults:
                hint = (" (layer_overhead_graph_us was replaced by kernel_gap_graph_us and small_kernel_us, "
                        "charged per kernel: see presets/kernels.yaml)" if name == "layer_overhead_graph_us" else "")
                raise InputError(f"unknown coefficient{hint}; allowed: {', '.join(defaults)}", file=profile_path,
                                 key=f"coefficients.{name}")
            out[name] = Coefficient(coef.value, f"profile {profile.name}: {coef.source}")
    for name in ("memory_bandwidth_efficiency", "compute_efficiency", "moe_routing_locality"):
        v = out[name].value
        limit_ok = 0 < v <= 1 if name != "moe_routing_locality" else 0 <= v < 1
        if not limit_ok:
            allowed = "(0, 1]" if name != "moe_routing_locality" else "[0, 1)"
            raise InputError(f"{v} is outside {allowed}", file=profile_path or file, key=f"coefficients.{name}")
    return out


def _draft_presets(sc: Scenario, model: presets.ModelPreset, file: str
                   ) -> tuple[presets.DrafterPreset | None, presets.ModelPreset | None]:
    """(EAGLE drafter preset, standalone draft model preset) the algorithm needs, checked against the target."""
    spec = sc.speculative
    drafter = draft_model = None
    if spec.algorithm in ("eagle", "eagle3"):
        if spec.drafter is None:
            raise InputError(f"algorithm {spec.algorithm} needs a drafter preset; known: "
                             f"{', '.join(sorted(presets.drafters()))}", file=file, key="speculative.drafter")
        drafter = _lookup(presets.drafters(), spec.drafter, "drafter preset", file, "speculative.drafter")
        if drafter.algorithm != spec.algorithm:
            raise InputError(f"drafter {spec.drafter!r} is an {drafter.algorithm} head, not {spec.algorithm}",
                             file=file, key="speculative.drafter")
        if drafter.hidden_size != model.hidden_size:
            raise InputError(f"drafter {spec.drafter!r} reads hidden states of size {drafter.hidden_size} but"
                             f" {sc.model} has {model.hidden_size}", file=file, key="speculative.drafter")
    elif spec.algorithm == "standalone":
        if spec.drafter is None:
            raise InputError("standalone speculation needs a draft model preset in speculative.drafter",
                             file=file, key="speculative.drafter")
        draft_model = _lookup(presets.models(), spec.drafter, "model preset", file, "speculative.drafter")
    elif spec.drafter is not None:
        raise InputError(f"algorithm {spec.algorithm} takes no drafter", file=file, key="speculative.drafter")
    return drafter, draft_model


def _check_draft_settings(sc: Scenario, model: presets.ModelPreset, file: str) -> None:
    """Settings that the chosen algorithm would ignore are errors, not silent defaults."""
    spec = sc.speculative
    if spec.algorithm == "mtp" and model.mtp_layers == 0 and not spec.hypothetical_mtp_head:
        raise InputError(f"{sc.model} ships no MTP (NextN) weights; set speculative.hypothetical_mtp_head: true"
                         " to model a trained one-layer head", file=file, key="speculative.algorithm")
    if spec.hypothetical_mtp_head and spec.algorithm != "mtp":
        raise InputError("hypothetical_mtp_head applies only to algorithm mtp", file=file,
                         key="speculative.hypothetical_mtp_head")
    if "ngram" in spec.model_fields_set and spec.algorithm != "ngram":
        raise InputError(f"n-gram settings apply only to algorithm ngram (this is {spec.algorithm})", file=file,
                         key="speculative.ngram")
    if spec.algorithm == "none":
        for k in ("num_steps", "topk", "num_draft_tokens"):
            if getattr(spec, k) is not None:
                raise InputError("no speculation drafts nothing; remove it or set speculative.algorithm",
                                 file=file, key=f"speculative.{k}")


def _load_profile_for(sc: Scenario, path: str) -> tuple[Profile | None, str | None]:
    """The scenario's calibration profile (its path relative to the scenario file), checked against the box."""
    if sc.calibration is None:
        return None, None
    profile_path = relative_to_scenario(sc.calibration, path)
    if not profile_path.exists():
        raise InputError(f"calibration profile {sc.calibration!r} not found (looked at {profile_path})",
                         file=path, key="calibration")
    try:
        profile = load_profile(profile_path)
    except InputError as err:  # the profile's own problem, said with the scenario and key that point at it
        raise InputError(str(err), file=path, key="calibration") from None
    _check_profile_matches(sc, profile, path)
    return profile, str(profile_path)


def preset_curve(name: str) -> CollectiveCurve:
    """The all-reduce curve of interconnect preset `name`, with the NCCL curve it falls back to, if any."""
    ic = presets.interconnects()[name]
    dispatch = f" (each message goes to {ic.fallback} where that is faster)" if ic.fallback else ""
    return CollectiveCurve(measured_gpus=ic.measured_gpus, points_bytes_us=ic.points_bytes_us,
                           bus_bandwidth_gbps=ic.bus_bandwidth_gbps, nccl_ring=ic.nccl_ring,
                           source=f"interconnect preset {name}{dispatch}: {ic.source}",
                           fallback=preset_curve(ic.fallback) if ic.fallback else None)


@contextlib.contextmanager
def _in_profile(scenario_file: str, profile_path: str | None) -> Iterator[None]:
    """An InputError about the scenario's calibration profile, said with the scenario and the key naming it."""
    try:
        yield
    except InputError as err:
        if profile_path is None or err.file != profile_path:
            raise
        raise InputError(str(err), file=scenario_file, key="calibration") from None


def _check_draft_step_time(profile: Profile, profile_path: str | None, dstack: Stack, gpu: presets.GpuPreset) -> None:
    """A measured draft step cannot beat reading the drafter's weights once at full bandwidth. (A profile
    describes a box: for setups without a draft model its draft step time simply does not apply.)"""
    assert profile.draft_forward_ms is not None
    floor_bytes = sum(g.bytes_per_gpu for g in dstack.groups if not g.extend_only)
    floor_bytes += dstack.experts_per_token * dstack.expert_bytes_per_gpu * dstack.num_moe_layers
    floor_ms = floor_bytes / (gpu.memory_bandwidth_gbps * 1e9) * 1e3
    if profile.draft_forward_ms.value < floor_ms:
        raise InputError(f"{profile.draft_forward_ms.value:g} ms is below the {floor_ms:.3f} ms it takes"
                         f" {gpu.display_name} to read the drafter's weights once at full bandwidth; allowed:"
                         f" >= {floor_ms:.3f}", file=profile_path, key="draft_forward_ms.value")


def resolve(sc: Scenario, path: str = "<scenario>") -> ResolvedScenario:
    """Look up presets, apply SGLang's defaults and check everything that needs more than one field."""
    # imported here: timing imports this module
    from simspec.timing.stack import served_stacks

    file = path
    version = sc.server.version_minor_patch
    if not releases.is_modelled(version):
        raise InputError(f"SGLang {sc.server.sglang_version} is not modelled; allowed: {releases.MODELLED_TEXT}",
                         file=file, key="server.sglang_version")
    algorithms = releases.speculative_algorithms(version)
    if algorithms is not None and sc.speculative.algorithm not in algorithms:
        raise InputError(f"SGLang {sc.server.sglang_version} has no {sc.speculative.algorithm} speculative decoding;"
                         f" allowed there: {', '.join(algorithms)}", file=file, key="speculative.algorithm")
    gpu = _lookup(presets.gpus(), sc.hardware.gpu, "GPU preset", file, "hardware.gpu")
    ic = _lookup(presets.interconnects(), sc.hardware.interconnect, "interconnect preset", file,
                 "hardware.interconnect")
    model = _lookup(presets.models(), sc.model, "model preset", file, "model")
    if not releases.runs_architecture(version, model.architecture):
        raise InputError(f"SGLang {sc.server.sglang_version} has no {model.architecture} ({sc.model}); allowed:"
                         " a model that release serves, or a later sglang_version", file=file, key="model")
    if sc.speculative.algorithm == "eagle3" and not releases.runs_eagle3_on(sc.server.release, model.architecture):
        raise InputError(f"SGLang {sc.server.sglang_version} cannot run EAGLE-3 on {model.architecture} ({sc.model}):"
                         " its target does not expose the hidden states an EAGLE-3 head reads"
                         " (set_eagle3_layers_to_capture, from 0.5.4.post2); allowed: sglang_version 0.5.4.post2 or"
                         " later", file=file, key="speculative.algorithm")
    tp = sc.server.tp
    if tp > sc.hardware.num_gpus:
        raise InputError(f"tp {tp} is larger than the {sc.hardware.num_gpus} GPUs; allowed: 1..{sc.hardware.num_gpus}",
                         file=file, key="server.tp")
    if tp < sc.hardware.num_gpus:
        raise InputError(f"tp {tp} uses fewer than the {sc.hardware.num_gpus} GPUs: simspec models one"
                         " tensor-parallel engine (data-parallel replicas are not modelled); set"
                         " hardware.num_gpus = server.tp", file=file, key="server.tp")

    spec = sc.speculative
    drafter, draft_model = _draft_presets(sc, model, file)
    _check_draft_settings(sc, model, file)

    steps, topk, n = _tree_settings(sc, model, file)
    given_wide_eagle_tree = spec.algorithm in EAGLE_FAMILY and spec.topk is not None and spec.topk > 1
    if (model.attention.kind != "mla" and not given_wide_eagle_tree
            and releases.trtllm_mha_refused_on(sc.server.release, gpu.display_name)):
        raise InputError(f"SGLang {sc.server.sglang_version} does not start this server: on {gpu.display_name} (SM120)"
                         f" it picks the trtllm_mha attention backend for {model.architecture}, an MHA model, when no"
                         " EAGLE topk above 1 is given, then refuses it (\"TRTLLM MHA backend is only supported on"
                         " Blackwell GPUs (SM100)\"); allowed: sglang_version 0.5.6, or 0.5.7 or later, or an"
                         " EAGLE-family speculative.topk above 1", file=file, key="server.sglang_version")
    if (spec.algorithm in EAGLE_FAMILY and spec.topk is None and topk > 1 and model.attention.kind != "mla"
            and releases.auto_tree_fails_on(sc.server.release, gpu.display_name)):
        raise InputError(f"SGLang {sc.server.sglang_version} does not start this server: on {gpu.display_name} it"
                         " picks the trtllm_mha attention backend for an EAGLE server given no topk, then refuses"
                         f" its auto tree's topk {topk} (trtllm_mha supports topk 1 only); allowed: set"
                         " speculative.num_steps, topk and num_draft_tokens, or another sglang_version", file=file,
                         key="speculative.topk")
    overlap, v2 = _overlap(sc, topk, file)
    if sc.server.scheduler_recv_interval > 1 and sc.server.version_minor_patch < (5, 0):
        raise InputError(f"--scheduler-recv-interval is modelled from SGLang 0.5 (every 0.5 release simspec models has"
                         f" it; the 0.4 releases were not checked), not {sc.server.sglang_version}; allowed: 1, or a"
                         " 0.5 release", file=file, key="server.scheduler_recv_interval")

    profile, profile_path = _load_profile_for(sc, path)
    with _in_profile(file, profile_path):
        coefficients = _coefficients(profile, profile_path, file, sc.model, model)

    if profile is not None and profile.all_reduce is not None:
        curve = profile.all_reduce.model_copy(update={"source": f"profile {profile.name}: "
                                                                f"{profile.all_reduce.source}"})
    else:
        curve = preset_curve(sc.hardware.interconnect)

    # memory: weights and KV cache per GPU under TP
    # as this release serves them: the KV cache's dtype, DeepSeek-V3's shared expert stored among the routed
    # experts where it is fused (TP clones of it in 0.4.6)
    target, dstack = served_stacks(spec.algorithm, model, drafter, draft_model, tp, sc.server.release,
                                   gpu.display_name, sc.server.kv_cache_dtype)
    startup_key = startup_memory_key(tp)
    startup = coefficients[startup_key].value
    with _in_profile(file, profile_path):
        if startup >= gpu.memory_mib * STARTUP_MEMORY_LIMIT:
            raise InputError(f"{startup:,.0f} MiB in use at startup leaves too little of the {gpu.display_name}'s"
                             f" {gpu.memory_mib:,} MiB; allowed: 0 to {gpu.memory_mib * STARTUP_MEMORY_LIMIT:,.0f}"
                             f" MiB ({STARTUP_MEMORY_LIMIT:.0%} of it; public logs show 1-3 GiB)",
                             file=profile_path or file, key=f"coefficients.{startup_key}")
        if profile is not None and profile.draft_forward_ms is not None and dstack is not None:
            _check_draft_step_time(profile, profile_path, dstack, gpu)
    mem = plan_memory(gpu, sc.model, model, target, dstack, sc.server, spec.algorithm, file, startup,
                      tree=(steps, topk, n))

    resolved = ResolvedScenario(
        scenario=sc, path=path, gpu=gpu, model=model, interconnect=ic, all_reduce=curve, drafter=drafter,
        draft_model=draft_model, profile=profile, coefficients=coefficients, num_steps=steps, topk=topk,
        num_draft_tokens=n, overlap=overlap, spec_v2=v2, max_running_requests=mem.max_running_requests,
        kv_capacity_tokens=mem.kv_capacity_tokens, chunked_prefill_size=mem.chunked_prefill_size,
        cuda_graph_max_bs=mem.cuda_graph_max_bs,
    )
    _check_acceptance(sc, resolved.max_accepted_drafts, file)
    _check_shared_prefix(sc.workload, file)
    if sc.acceptance is not None and sc.acceptance.ngram_replay is not None:
        resolved = dataclasses.replace(resolved, replayed=_replay(sc, n, path))
    wl = sc.workload
    longest = max(_max_length(wl.input_tokens) + _max_length(wl.output_tokens), 1)
    followup = wl.arrival.followup_tokens if wl.arrival.type == "closed" else None
    if followup is not None:  # the last turn carries every earlier turn's prompt and output
        longest += (wl.turns - 1) * (_max_length(followup) + _max_length(wl.output_tokens))
    if longest >= mem.kv_capacity_tokens:  # SGLang admits a request only if it needs fewer tokens than are free
        carried = " (a conversation's last turn, its earlier turns carried)" if followup is not None else ""
        raise InputError(f"one request can hold {longest} tokens{carried} but the KV cache holds"
                         f" {mem.kv_capacity_tokens} per GPU; lower the workload's max lengths"
                         f"{', turns or followup_tokens' if followup is not None else ''} or free memory",
                         file=file, key="workload")
    return resolved


def _replay(sc: Scenario, num_draft_tokens: int, path: str) -> Replayed:
    """Replay SGLang's n-gram drafter over the scenario's corpus with its n-gram settings (simspec/ngram)."""
    from simspec.ngram.integration import replay_for_scenario

    spec = replay_for_scenario(sc, num_draft_tokens, path)
    return Replayed(histogram=tuple(spec[0]), source=spec[1])


def _max_length(d: Any) -> int:
    """The longest length a distribution can sample: samples are clipped to [min, max]."""
    if d.dist in ("fixed", "bench_serving_random"):  # bench_serving: numpy's randint(low, value + 1), value at most
        return max(min(d.value, d.max), d.min)
    if d.dist == "uniform":
        return max(min(d.high, d.max), d.min)
    assert d.mean is not None and d.std is not None
    return min(d.max, int(d.mean + 6 * d.std))  # simulate() checks the lengths actually sampled


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> ResolvedScenario:
    """Read, override, validate and resolve a scenario file."""
    file = str(path)
    data = read_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides, file)
    sc = parse_scenario(data, file)
    return resolve(sc, file)
