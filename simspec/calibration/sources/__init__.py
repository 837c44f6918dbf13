"""Offline calibration sources: files an SGLang deployment leaves behind, each read into Measurements.

- log.read_decode_log: server logs (decode-log lines, server_args) -> step times, throughput, accept lengths
- bench.read_bench: bench_serving / bench_one_batch_server / bench_one_batch JSON lines -> throughput, step times
- trace.read_traces: torch-profiler Chrome traces -> kernel time per phase and category
- metrics.read_metrics: a saved /metrics scrape -> Prometheus samples (helpers read accept length, ITL, ...)
- common.server_description_from_args: SGLang server args (/server_info, a logged server_args) -> ServerDescription
The collective microbenchmark's tables are read by simspec.calibration.collectives.
"""

from simspec.calibration.sources.bench import read_bench
from simspec.calibration.sources.common import map_algorithm, parse_server_args_text, server_description_from_args
from simspec.calibration.sources.log import read_decode_log
from simspec.calibration.sources.metrics import parse_metrics_text, read_metrics
from simspec.calibration.sources.trace import read_traces

__all__ = ["map_algorithm", "parse_metrics_text", "parse_server_args_text", "read_bench", "read_decode_log",
           "read_metrics", "read_traces", "server_description_from_args"]
