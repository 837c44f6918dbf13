"""What calibration observes, whatever it came from: a live server, a log, a benchmark file, a trace.

Every source (simspec/calibration/sources/*, live.py) turns its input into these records; fitting
(calibration/fitting.py) reads only these. Saved as JSON next to a profile (the raw evidence) and used by
`simspec calibrate --resume` to continue a stopped run. All times in seconds unless the name says otherwise.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerDescription(_Record):
    """The server as it described itself (/server_info) or as a log/bench file names it."""

    model_path: str | None = None
    tp: int | None = None
    sglang_version: str | None = None
    algorithm: str = "none"  # none | eagle | eagle3 | mtp | standalone | ngram (simspec's names)
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    cuda_graph: bool | None = None
    cuda_graph_max_bs: int | None = None
    max_running_requests: int | None = None
    mem_fraction_static: float | None = None
    kv_cache_dtype: str | None = None  # --kv-cache-dtype as the server resolved it ("auto", "bfloat16", "fp8_e4m3"...)
    overlap_schedule: bool | None = None
    scheduler_recv_interval: int | None = None  # --scheduler-recv-interval (1 = SGLang's default)
    attention_backend: str | None = None
    ngram: dict[str, float | int | str] = Field(default_factory=dict)
    host: str | None = None
    # GiB free when SGLang measured the memory its KV cache is sized from (after CUDA and NCCL start): the log's
    # 'Load weight begin. avail mem=' line, the smallest over ranks (model_runner.init_torch_distributed)
    startup_free_gib: float | None = None
    raw: dict = Field(default_factory=dict)  # every field the server sent, for provenance


class RequestRecord(_Record):
    """One request of a calibration workload, as streamed back by /generate."""

    concurrency: int
    prompt_tokens: int
    completion_tokens: int
    e2e_latency: float | None = None
    spec_verify_ct: int | None = None
    # drafts accepted k -> number of verify steps (meta_info spec_accept_histogram / 0.5.23's
    # spec_correct_drafts_histogram); None where the version has no histogram
    accept_histogram: dict[int, int] | None = None
    # arrival time of each streamed chunk (monotonic clock, seconds) and how many new tokens it carried
    chunk_times: list[float] = Field(default_factory=list)
    chunk_tokens: list[int] = Field(default_factory=list)
    output_ids: list[int] = Field(default_factory=list)
    finish_reason: str | None = None


class StepTime(_Record):
    """Mean wall time of one scheduler iteration at a running batch size."""

    batch_size: int
    seconds: float
    samples: int = 1
    source: str
    # the live run's concurrency these iterations came from (its drain's smaller batches included); None where a
    # file gives them (a log's or benchmark's iterations cannot be told apart by the run's concurrency)
    concurrency: int | None = None


class ThroughputPoint(_Record):
    """A whole-run figure at one concurrency: what `simspec predict` is compared with."""

    concurrency: int
    tokens_per_s: float  # mean per-request decode tok/s
    throughput_tokens_per_s: float | None = None  # all requests' output tokens / wall time
    accept_length: float | None = None
    source: str


class KernelSplit(_Record):
    """GPU busy time per iteration split by kernel category, from torch-profiler traces."""

    phase: str  # decode | draft | verify | draft_extend | prefill | all
    category_ms: dict[str, float]  # communication | attention | moe_gemm | other -> ms per iteration
    iterations: int
    source: str
    concurrency: int | None = None  # the live workload traced (--profile-steps); None for trace files


class GraphLaunch(_Record):
    """CUDA-graph replays seen in torch-profiler traces, grouped by phase and graph size: the host time of their
    cudaGraphLaunch calls against the nodes each graph ran (its GPU events, which carry the launch's correlation
    id). What defaults.yaml's graph_launch_us and graph_launch_per_node_us are fitted from."""

    phase: str  # the phase range open at the launch: decode | draft | verify | draft_extend | prefill | other
    nodes: int  # GPU kernels, copies and fills of one replay
    host_us: float  # median cudaGraphLaunch duration over these launches
    launches: int
    source: str
    concurrency: int | None = None  # the live workload traced (--profile-steps); None for trace files


class CollectiveSample(_Record):
    """One row of the collective microbenchmark (calibration/collective_bench.py) or nccl-tests."""

    op: str = "all_reduce"
    bytes: int
    time_us: float
    world_size: int
    backend: str
    in_cuda_graph: bool = False


class Measurements(_Record):
    """Everything one calibration run observed. Several sources merge into one."""

    server: ServerDescription = Field(default_factory=ServerDescription)
    requests: list[RequestRecord] = Field(default_factory=list)
    step_times: list[StepTime] = Field(default_factory=list)
    throughput: list[ThroughputPoint] = Field(default_factory=list)
    accept_lengths: list[float] = Field(default_factory=list)  # per verify step, tokens incl. the bonus
    kernel_splits: list[KernelSplit] = Field(default_factory=list)
    graph_launches: list[GraphLaunch] = Field(default_factory=list)
    collectives: list[CollectiveSample] = Field(default_factory=list)
    prometheus: dict[str, float] = Field(default_factory=dict)  # /metrics samples, name{labels} -> value
    sources: list[str] = Field(default_factory=list)  # what was read, e.g. "log:server.log"
    done_concurrencies: list[int] = Field(default_factory=list)  # for --resume

    def merge(self, other: Measurements) -> Measurements:
        """Combine two sources: lists concatenate; the server description fills gaps only."""
        server = self.server.model_copy(
            update={k: v for k, v in other.server.model_dump().items()
                    if getattr(self.server, k) in (None, "none", {}, "") and v not in (None, {}, "")})
        return Measurements(
            server=server,
            requests=self.requests + other.requests,
            step_times=self.step_times + other.step_times,
            throughput=self.throughput + other.throughput,
            accept_lengths=self.accept_lengths + other.accept_lengths,
            kernel_splits=self.kernel_splits + other.kernel_splits,
            graph_launches=self.graph_launches + other.graph_launches,
            collectives=self.collectives + other.collectives,
            prometheus={**self.prometheus, **other.prometheus},
            sources=self.sources + other.sources,
            done_concurrencies=sorted(set(self.done_concurrencies) | set(other.done_concurrencies)),
        )

    def save(self, path: str | Path) -> None:
        """Write atomically, so a run killed mid-write never leaves a half file for --resume."""
        p = Path(path)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(self.model_dump_json(indent=1))
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | Path) -> Measurements:
        """Read a saved file; a damaged or foreign one is bad input (InputError naming it), not a crash."""
        from pydantic import ValidationError

        from simspec.errors import InputError

        try:
            return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read saved measurements: {exc}", file=str(path)) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "file"
            raise InputError(f"not a simspec measurements file ({where}: {first.get('msg')}); was it cut short?"
                             " Re-run without --resume (and with --force) to start over", file=str(path)) from None
