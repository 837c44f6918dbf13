"""A fake SGLang server for tests: real HTTP on 127.0.0.1, SGLang's API and field names per version, and a
simulated scheduler whose step times and acceptance are known, so calibration can be checked end to end.

    with FakeSGLang(version="0.5.10", algorithm="eagle3", chain_rates=[0.8, 0.6, 0.4],
                    step_fixed_s=0.004, step_per_request_s=0.001) as fake:
        meas = run_workload(fake.url, prompts, [1, 4], ...)

The scheduler thread runs iterations back to back while requests wait or run, like SGLang's event loop:
- a PREFILL iteration when requests are waiting (SGLang runs prefill as its own batch under speculation:
  mixed chunked prefill is off), `prefill_s + prefill_per_token_s * prompt tokens`; each new request gets
  its first token;
- else a DECODE iteration over every running request, `step_time(batch_size)` seconds
  (default `step_fixed_s + step_per_request_s * batch_size`); each request gets 1 token without
  speculation, else 1 + accepted drafts, drafts accepted along a chain with conditional rates
  `chain_rates` (seeded RNG), cut at max_new_tokens.
Iterations are paced against deadlines (start = previous end), so the mean gap equals the step time.
Ground truth is kept: `iterations` [(start, end, batch size, kind)] as scheduled, `realised` the same as the
thread actually ran them (a loaded machine wakes it late), `accepted` [drafts per verify step].

Per version (fields read from SGLang's wheels; see simspec/calibration/live.py for the files):
- 0.5.8: meta_info spec fields spec_verify_ct, spec_accept_rate, spec_accept_length, spec_accept_token_num,
  spec_draft_token_num, no histogram; server args stream_output, speculative_ngram_branch_length (+ match
  windows), disable_cuda_graph, cuda_graph_max_bs; /v1/tokenize takes only `prompt`.
- 0.5.10: + spec_accept_histogram (list: index = drafts accepted, value = verify steps);
  incremental_streaming_output, speculative_ngram_max_trie_depth.
- 0.5.23: spec_num_correct_drafts, spec_num_proposed_drafts, spec_correct_drafts_histogram; cuda graphs as
  cuda_graph_config {"decode": {"backend", "max_bs"}, ...}; overlap on with speculation; /v1/tokenize renders
  `messages`; /metrics adds sglang:spec_verify_calls_total; a 400 body is {"error": "..."}.
All three serve /server_info and /get_server_info (`server_info_paths` narrows it, to test the fallback).
NEXTN (mtp) shows as speculative_algorithm "EAGLE" with the draft path = the model path, as in SGLang.

Faults (all keyed by the 1-based number of the POST /generate call, retries and warm-ups included):
`Faults(http_status={3: 503}, malformed_chunk=(2, 1), drop_connection=(2, 3), stream_error=4,
hang=(2, 1), hang_s=5, stop_after=5, omit_meta=("spec_verify_ct",))`.

Run standalone (prints the URL, serves until Ctrl-C): python tests/fake_sglang.py --version 0.5.23 --port 30000
"""

from __future__ import annotations

import json
import queue
import random
import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

VERSIONS = ("0.5.8", "0.5.10", "0.5.23")
_SGLANG_NAMES = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "EAGLE", "standalone": "STANDALONE",
                 "ngram": "NGRAM", "none": None}


@dataclass
class Faults:
    http_status: dict[int, int] = field(default_factory=dict)  # call -> status answered instead (500/503/429/400)
    malformed_chunk: tuple[int, int] | None = None  # (call, chunk index): that chunk is cut JSON
    drop_connection: tuple[int, int] | None = None  # (call, chunk index): the socket closes before that chunk
    stream_error: int | None = None  # call: data: {"error": {...}} then [DONE], as SGLang sends a ValueError
    hang: tuple[int, int] | None = None  # (call, chunk index): nothing sent for hang_s before that chunk
    hang_s: float = 5.0
    stop_after: int | None = None  # after this many finished /generate calls the server goes away
    omit_meta: tuple[str, ...] = ()  # meta_info keys never sent


@dataclass
class _Req:
    rid: str
    call: int
    prompt_tokens: int
    max_new: int
    ignore_eos: bool
    created: float
    events: queue.Queue = field(default_factory=queue.Queue)
    output_ids: list[int] = field(default_factory=list)
    verify_ct: int = 0
    accepted_total: int = 0
    histogram: list[int] = field(default_factory=list)
    sent_ids: int = 0
    first_token_time: float | None = None
    aborted: bool = False


class FakeSGLang:
    """See the module docstring. `url` once started; `stop()` (or the context manager) shuts it down."""

    def __init__(self, version: str = "0.5.10", *, algorithm: str = "eagle3",
                 chain_rates: Sequence[float] = (0.8, 0.6, 0.4), num_steps: int | None = None, topk: int = 1,
                 num_draft_tokens: int | None = None, step_fixed_s: float = 0.008,
                 step_per_request_s: float = 0.002, step_time: Callable[[int], float] | None = None,
                 prefill_s: float = 0.003, prefill_per_token_s: float = 0.0, seed: int = 0,
                 incremental: bool = False, enable_metrics: bool = True,
                 server_info_paths: Sequence[str] = ("/server_info", "/get_server_info"), tp: int = 1,
                 model_path: str = "fake-org/Fake-Llama-3-8B-Instruct", max_running_requests: int | None = None,
                 cuda_graph_max_bs: int | None = None, eos_after: int | None = None, faults: Faults | None = None,
                 port: int = 0):
        if version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}")
        if algorithm not in _SGLANG_NAMES:
            raise ValueError(f"algorithm must be one of {sorted(_SGLANG_NAMES)}")
        self.version = version
        self.algorithm = algorithm
        self.spec = algorithm != "none"
        self.chain_rates = list(chain_rates) if self.spec else []
        self.num_steps: int | None = None
        self.num_draft_tokens: int | None = None
        if algorithm == "ngram":
            self.num_draft_tokens = num_draft_tokens or len(self.chain_rates) + 1
            self.num_steps = num_steps
        elif self.spec:
            steps = num_steps or len(self.chain_rates)
            self.num_steps, self.num_draft_tokens = steps, num_draft_tokens or steps + 1
        self.topk = topk if self.spec else None
        self.step_time = step_time or (lambda b: step_fixed_s + step_per_request_s * b)
        self.prefill_s = prefill_s
        self.prefill_per_token_s = prefill_per_token_s
        self.rng = random.Random(seed)
        self.incremental = incremental
        self.enable_metrics = enable_metrics
        self.server_info_paths = tuple(server_info_paths)
        self.tp = tp
        self.model_path = model_path
        self.max_running_requests = max_running_requests or (48 if self.spec else 1024)
        self.cuda_graph_max_bs = cuda_graph_max_bs or 256
        self.eos_after = eos_after
        self.faults = faults or Faults()
        self.port = port

        self.iterations: list[tuple[float, float, int, str]] = []
        # (start, end, batch size, kind) as the thread ran them: end = when the chunks were queued (never before
        # the scheduled end), start = the previous iteration's end (back to back) or the wake-up after idling
        self.realised: list[tuple[float, float, int, str]] = []
        self.accepted: list[int] = []
        self.calls = 0
        self.finished_calls = 0
        self.flushes = 0
        self.profile_requests: list[dict[str, Any]] = []  # /start_profile bodies
        self._profile: dict[str, Any] | None = None  # the profile in progress: dir, steps left, events
        self._counters = {"requests": 0, "generation_tokens": 0, "prompt_tokens": 0, "verify_calls": 0,
                          "accepted": 0, "e2e_sum": 0.0, "ttft_sum": 0.0, "ttft_count": 0}
        self._lock = threading.Condition()
        self._waiting: list[_Req] = []
        self._running: list[_Req] = []
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.url = ""

    # -------------------------------------------------------------------------------------- lifecycle

    def start(self) -> FakeSGLang:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = _Server(("127.0.0.1", self.port), handler)
        self._httpd.daemon_threads = True
        port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{port}"
        for target in (self._httpd.serve_forever, self._scheduler):
            kwargs = {"poll_interval": 0.02} if target == self._httpd.serve_forever else {}
            t = threading.Thread(target=target, kwargs=kwargs, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        """Go away like a crashed server: stop listening and cut every open connection."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2)

    def __enter__(self) -> FakeSGLang:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # -------------------------------------------------------------------------------------- ground truth

    def expected_accept_length(self) -> float:
        """1 + E[accepted drafts] of the chain: sum over i of prod_{j <= i} rate_j (without a max_new_tokens cut)."""
        total, p = 1.0, 1.0
        for a in self.chain_rates:
            p *= a
            total += p
        return total

    def decode_steps(self, batch_size: int) -> list[float]:
        return [end - start for start, end, b, kind in self.iterations if kind == "decode" and b == batch_size]

    # -------------------------------------------------------------------------------------- scheduler

    def _draw_accepted(self) -> int:
        k = 0
        for a in self.chain_rates:
            if self.rng.random() < a:
                k += 1
            else:
                break
        return k

    def _token(self) -> int:
        return self.rng.randrange(100, 32000)

    def realised_step_time(self, batch_size: int, trim: float = 0.2) -> float:
        """Seconds of the decode iterations over `batch_size` requests as the thread actually ran them, the
        lowest and highest `trim` of them left out (as the client's estimate leaves out late chunks): what a
        client timing the stream can recover. step_time(batch_size) on an idle machine. On a busy one a late
        wake-up lengthens a step, and the deadline that catches it up shortens the next, so single steps move
        both ways; lateness the deadlines cannot catch up lengthens them all."""
        durations = sorted(end - start for start, end, b, kind in self.realised
                           if kind == "decode" and b == batch_size)
        if not durations:
            raise ValueError(f"no decode iteration ran at batch size {batch_size}")
        cut = int(len(durations) * trim)
        kept = durations[cut:len(durations) - cut] or durations
        return sum(kept) / len(kept)

    def _scheduler(self) -> None:
        last_end = time.monotonic()
        real_end = last_end
        while not self._stop.is_set():
            with self._lock:
                idle = False
                while not self._stop.is_set() and not self._waiting and not self._running:
                    idle = True
                    self._lock.wait(0.05)
                if self._stop.is_set():
                    return
                self._running = [r for r in self._running if not r.aborted]
                room = self.max_running_requests - len(self._running)
                new = [r for r in self._waiting if not r.aborted][:max(room, 0)]
                self._waiting = [r for r in self._waiting if r not in new and not r.aborted]
                batch = new if new else list(self._running)
            if not batch:
                continue
            kind = "prefill" if new else "decode"
            dur = (self.prefill_s + self.prefill_per_token_s * sum(r.prompt_tokens for r in batch)
                   if new else self.step_time(len(batch)))
            now = time.monotonic()
            # back to back against deadlines: a late wake-up is caught up, so iteration k ends at exactly
            # start + the sum of the durations so far; the clock restarts only after idling
            start = now if idle or now - last_end > 1.0 else last_end
            end = start + dur
            if end > now:
                self._stop.wait(end - now)
            last_end = end
            if self._stop.is_set():
                return
            self.iterations.append((start, end, len(batch), kind))
            # a stall past the 1 s restart rule still shows in the realised record, as the client sees it
            real_start, real_end = (now if idle else real_end), time.monotonic()
            self.realised.append((real_start, real_end, len(batch), kind))
            if kind == "decode" and self._profile is not None:
                self._record_profile(start, end, len(batch))
            finished: list[_Req] = []
            with self._lock:
                for r in batch:
                    if kind == "prefill":
                        n = 1
                        r.first_token_time = time.time()
                        self._counters["ttft_sum"] += r.first_token_time - r.created
                        self._counters["ttft_count"] += 1
                    else:
                        k = self._draw_accepted() if self.spec else 0
                        if self.spec:
                            self.accepted.append(k)
                            r.verify_ct += 1
                            r.accepted_total += k
                            if len(r.histogram) <= k:
                                r.histogram.extend([0] * (k + 1 - len(r.histogram)))
                            r.histogram[k] += 1
                            self._counters["verify_calls"] += 1
                            self._counters["accepted"] += k
                        n = 1 + k
                    n = min(n, r.max_new - len(r.output_ids))
                    r.output_ids.extend(self._token() for _ in range(n))
                    self._counters["generation_tokens"] += n
                    done = len(r.output_ids) >= r.max_new
                    stop = (not r.ignore_eos and self.eos_after is not None and len(r.output_ids) >= self.eos_after)
                    reason = None
                    if done or stop:
                        reason = ({"type": "stop", "matched": 2} if stop and not done
                                  else {"type": "length", "length": len(r.output_ids)})
                        finished.append(r)
                    r.events.put(self._chunk(r, reason))
                if kind == "prefill":
                    self._running.extend(batch)
                self._running = [r for r in self._running if r not in finished]

    def _chunk(self, r: _Req, finish_reason: dict | None) -> dict[str, Any]:
        """One streamed /generate chunk, version's field names (srt/managers/tokenizer_manager.py)."""
        meta: dict[str, Any] = {"id": r.rid, "finish_reason": finish_reason, "prompt_tokens": r.prompt_tokens,
                                "completion_tokens": len(r.output_ids), "cached_tokens": 0}
        if self.version != "0.5.8":
            meta.update({"weight_version": "default", "total_retractions": 0})
        if self.version == "0.5.10":
            meta["reasoning_tokens"] = 0
        if finish_reason is not None:
            meta["e2e_latency"] = time.time() - r.created
            self._counters["requests"] += 1
            self._counters["e2e_sum"] += meta["e2e_latency"]
            if self.spec and r.verify_ct > 0:
                proposed = r.verify_ct * ((self.num_draft_tokens or 2) - 1)
                meta["spec_accept_rate"] = r.accepted_total / proposed
                meta["spec_accept_length"] = len(r.output_ids) / r.verify_ct
                meta["spec_verify_ct"] = r.verify_ct
                if self.version == "0.5.23":
                    meta["spec_num_correct_drafts"] = r.accepted_total
                    meta["spec_num_proposed_drafts"] = proposed
                    meta["spec_correct_drafts_histogram"] = list(r.histogram)
                else:
                    meta["spec_accept_token_num"] = r.accepted_total
                    meta["spec_draft_token_num"] = proposed
                    if self.version == "0.5.10":
                        meta["spec_accept_histogram"] = list(r.histogram)
        for key in self.faults.omit_meta:
            meta.pop(key, None)
        if self.incremental:
            ids = r.output_ids[r.sent_ids:]
            r.sent_ids = len(r.output_ids)
            text = "".join(f" t{t}" for t in ids)
        else:
            ids = list(r.output_ids)
            text = "".join(f" t{t}" for t in ids)
        return {"text": text, "output_ids": ids, "meta_info": meta, "_finished": finish_reason is not None}

    # -------------------------------------------------------------------------------------- server facts

    def _record_profile(self, start: float, end: float, batch: int) -> None:
        """Kineto-style events for one profiled decode iteration (SGLang 0.5.23 range names): a draft range whose
        CUDA-graph launch runs a GEMM and an all-reduce kernel, then a verify range with attention and MoE
        kernels, in proportion to the iteration's time. After num_steps iterations the trace is written as
        {output_dir}/{id}-TP-0.trace.json, as SGLang's profiler does on each rank."""
        prof = self._profile
        assert prof is not None
        t0, dur = start * 1e6, (end - start) * 1e6
        host, gpu = {"pid": 100, "tid": 100}, {"pid": 0, "tid": 7}
        ev = prof["events"]

        def x(cat: str, name: str, ts: float, d: float, where: dict, **args: Any) -> None:
            ev.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": d, **where, "args": args})

        def launch(ts: float, kernels: list[tuple[str, float, float]], api: str = "cudaLaunchKernel") -> None:
            prof["corr"] += 1
            x("cuda_runtime", api, ts, 2, host, correlation=prof["corr"])
            for name, kts, kd in kernels:
                x("kernel", name, kts, kd, gpu, correlation=prof["corr"], stream=7)

        x("user_annotation", "draft", t0, 0.3 * dur, host)
        launch(t0 + 1, [("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn", t0 + 5, 0.2 * dur),
                        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t0 + 5 + 0.2 * dur, 0.05 * dur)],
               api="cudaGraphLaunch")
        x("user_annotation", f"step[VERIFY bs={batch}]", t0 + 0.3 * dur, 0.7 * dur, host)
        launch(t0 + 0.3 * dur + 1, [("BatchPrefillWithPagedKVCacheKernel", t0 + 0.35 * dur, 0.1 * dur)])
        launch(t0 + 0.3 * dur + 2, [("fused_moe_kernel", t0 + 0.45 * dur, 0.4 * dur)])
        prof["left"] -= 1
        if prof["left"] <= 0:
            out = Path(prof["output_dir"])
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{int(time.time())}-TP-0.trace.json").write_text(json.dumps({"traceEvents": ev}))
            self._profile = None

    def start_profile(self, body: dict[str, Any]) -> None:
        self.profile_requests.append(body)
        self._profile = {"output_dir": body.get("output_dir") or "/tmp", "left": int(body.get("num_steps") or 5),
                         "events": [], "corr": 0}

    def server_info(self) -> dict[str, Any]:
        """/server_info: server args (+ scheduler info, internal_states, version), per version's names."""
        spec = self.spec
        info: dict[str, Any] = {
            "model_path": self.model_path, "tokenizer_path": self.model_path, "tp_size": self.tp, "dp_size": 1,
            "pp_size": 1, "ep_size": 1, "mem_fraction_static": 0.85,
            "max_running_requests": self.max_running_requests, "chunked_prefill_size": 8192, "page_size": 1,
            "attention_backend": "fa3", "decode_attention_backend": None, "prefill_attention_backend": None,
            "speculative_algorithm": _SGLANG_NAMES[self.algorithm],
            "speculative_draft_model_path": (self.model_path if self.algorithm == "mtp"
                                             else "fake-org/fake-drafter" if spec and self.algorithm != "ngram"
                                             else None),
            "speculative_num_steps": self.num_steps, "speculative_eagle_topk": self.topk,
            "speculative_num_draft_tokens": self.num_draft_tokens,
            "speculative_ngram_min_bfs_breadth": 1, "speculative_ngram_max_bfs_breadth": 10,
            "speculative_ngram_match_type": "BFS", "speculative_ngram_capacity": 10_000_000,
            "enable_metrics": self.enable_metrics, "decode_log_interval": 40, "stream_interval": 1,
            "enable_mixed_chunk": False, "skip_tokenizer_init": False,
            "max_total_num_tokens": 500_000, "max_req_input_len": 32_000,
            "internal_states": [{"last_gen_throughput": 0.0, "memory_usage": {"weight": 16.0},
                                 "effective_max_running_requests_per_dp": self.max_running_requests,
                                 **({"avg_spec_accept_length": self.expected_accept_length()} if spec else {})}],
            "version": self.version,
        }
        if self.version == "0.5.8":
            info.update({"stream_output": self.incremental, "speculative_ngram_branch_length": 18,
                         "speculative_ngram_min_match_window_size": 1, "speculative_ngram_max_match_window_size": 12,
                         "disable_cuda_graph": False, "cuda_graph_max_bs": self.cuda_graph_max_bs,
                         "disable_overlap_schedule": spec})
        elif self.version == "0.5.10":
            info.update({"incremental_streaming_output": self.incremental, "speculative_ngram_max_trie_depth": 18,
                         "disable_cuda_graph": False, "cuda_graph_max_bs": self.cuda_graph_max_bs,
                         "disable_overlap_schedule": spec})
        else:
            info.update({"incremental_streaming_output": self.incremental, "speculative_ngram_max_trie_depth": 18,
                         "disable_cuda_graph": False, "cuda_graph_max_bs_decode": None,
                         "cuda_graph_config": {"decode": {"backend": "full", "max_bs": self.cuda_graph_max_bs,
                                                          "bs": None},
                                               "prefill": {"backend": "disabled", "max_bs": None, "bs": None}},
                         "disable_overlap_schedule": False, "launch_command": "python -m sglang.launch_server",
                         "frontend": "python", "startup_time": 0.0})
        return info

    def metrics_text(self) -> str:
        """GET /metrics, Prometheus text (srt/observability/metrics_collector.py names)."""
        c = self._counters
        labels = f'model_name="{self.model_path}",engine_type="unified",tp_rank="0",pp_rank="0"'
        with self._lock:
            running, waiting = len(self._running), len(self._waiting)
        accept = (1 + c["accepted"] / c["verify_calls"]) if self.spec and c["verify_calls"] else 0.0
        rate = (c["accepted"] / (c["verify_calls"] * ((self.num_draft_tokens or 2) - 1))) if accept else 0.0
        lines = []

        def metric(name: str, kind: str, value: float, extra: str = "") -> None:
            lines.append(f"# HELP {name} {name}.")
            lines.append(f"# TYPE {name} {kind}")
            sample = name + ("_total" if kind == "counter" else "")
            lines.append(f"{sample}{{{labels}{extra}}} {float(value)}")

        metric("sglang:num_running_reqs", "gauge", running)
        metric("sglang:num_queue_reqs", "gauge", waiting)
        metric("sglang:token_usage", "gauge", 0.01)
        metric("sglang:gen_throughput", "gauge", 0.0)
        metric("sglang:spec_accept_length", "gauge", accept)
        metric("sglang:spec_accept_rate", "gauge", rate)
        metric("sglang:num_requests", "counter", c["requests"])
        metric("sglang:generation_tokens", "counter", c["generation_tokens"])
        metric("sglang:prompt_tokens", "counter", c["prompt_tokens"])
        metric("sglang:cuda_graph_passes", "counter", len(self.iterations), ',mode="decode"')
        if self.version == "0.5.23":
            metric("sglang:spec_verify_calls", "counter", c["verify_calls"])
        for name, total, count in (("sglang:e2e_request_latency_seconds", c["e2e_sum"], c["requests"]),
                                   ("sglang:time_to_first_token_seconds", c["ttft_sum"], c["ttft_count"])):
            lines.append(f"# HELP {name} {name}.")
            lines.append(f"# TYPE {name} histogram")
            for le in ("0.1", "1.0", "10.0", "+Inf"):
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(count)}')
            lines.append(f"{name}_sum{{{labels}}} {float(total)}")
            lines.append(f"{name}_count{{{labels}}} {float(count)}")
        return "\n".join(lines) + "\n"

    # -------------------------------------------------------------------------------------- requests

    def submit(self, body: dict[str, Any]) -> _Req:
        sp = body.get("sampling_params") or {}
        if "input_ids" in body:
            prompt_tokens = len(body["input_ids"])
        else:
            prompt_tokens = max(1, len(str(body.get("text", "")).split()))
        with self._lock:
            req = _Req(rid=f"req-{self.calls}-{time.monotonic_ns()}", call=self.calls, prompt_tokens=prompt_tokens,
                       max_new=int(sp.get("max_new_tokens", 128)), ignore_eos=bool(sp.get("ignore_eos", False)),
                       created=time.time())
            self._counters["prompt_tokens"] += prompt_tokens
            self._waiting.append(req)
            self._lock.notify_all()
        return req

    def tokenize(self, text: str) -> list[int]:
        return [100 + zlib.crc32(w.encode()) % 31000 for w in text.split()] or [100]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:  # clients hanging up are not news
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeSGLang

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.fake._conns.add(self.connection)

    def finish(self) -> None:
        self.fake._conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # ------------------------------------------------------------------ plumbing

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any] | None:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        try:
            obj = json.loads(raw)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    def _not_found(self) -> None:
        self._send(404, {"detail": "Not Found"})

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:
        f = self.fake
        path = self.path.split("?", 1)[0]
        if path in ("/server_info", "/get_server_info"):
            if path in f.server_info_paths:
                self._send(200, f.server_info())
            else:
                self._not_found()
        elif path in ("/model_info", "/get_model_info"):
            self._send(200, {"model_path": f.model_path, "tokenizer_path": f.model_path, "is_generation": True,
                             "architectures": ["LlamaForCausalLM"], "model_type": "llama"})
        elif path == "/metrics":
            if f.enable_metrics:
                self._send(200, f.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._not_found()
        elif path == "/health":
            self._send(200, b"")
        elif path == "/flush_cache":
            self._flush()
        else:
            self._not_found()

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/generate":
            self._generate()
        elif path == "/flush_cache":
            self._body()
            self._flush()
        elif path in ("/v1/tokenize", "/tokenize"):
            self._tokenize()
        elif path == "/start_profile":
            body = self._body()
            if body is not None:
                self.fake.start_profile(body)
                self._send(200, {"success": True})
        else:
            self._body()
            self._not_found()

    def _flush(self) -> None:
        f = self.fake
        with f._lock:
            busy = bool(f._running or f._waiting)
        if not busy:
            f.flushes += 1
        self._send(400 if busy else 200, "Cache flushed.\nPlease check backend logs for more details. "
                   "(When there are running or waiting requests, the operation will not be performed.)\n",
                   "text/plain")

    def _tokenize(self) -> None:
        f = self.fake
        body = self._body()
        if body is None:
            self._send(400, {"detail": "invalid JSON"})
            return
        if "messages" in body and f.version == "0.5.23":
            text = " ".join(f"<{m.get('role')}> {m.get('content')}" for m in body["messages"]) + " <assistant>"
            tokens = f.tokenize(text)
        elif "prompt" in body:
            tokens = f.tokenize(str(body["prompt"]))
        else:  # pydantic: `prompt` is required before 0.5.23 (TokenizeRequest)
            self._send(422, {"detail": [{"type": "missing", "loc": ["body", "prompt"], "msg": "Field required",
                                         "input": body}]})
            return
        self._send(200, {"tokens": tokens, "count": len(tokens), "max_model_len": 32768})

    def _generate(self) -> None:
        f = self.fake
        body = self._body()
        with f._lock:
            f.calls += 1
            call = f.calls
        faults = f.faults
        if body is None:
            self._send(400, {"error": {"message": "the request body is not JSON"}})
            return
        status = faults.http_status.get(call)
        if status is not None:
            if status == 400:
                msg = "Input length (40000 tokens) exceeds the maximum allowed length (32000 tokens)."
                self._send(400, {"error": msg} if f.version == "0.5.23" else {"error": {"message": msg}})
            elif status == 429:
                self._send(429, {"error": {"message": "too many requests"}})
            else:
                self._send(status, {"detail": "Internal Server Error" if status == 500 else "Service Unavailable"})
            return
        req = f.submit(body)
        req.call = call
        if not body.get("stream"):
            final = None
            while final is None or not final.get("_finished"):
                final = req.events.get()
            final.pop("_finished", None)
            self._send(200, final)
            self._finished()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        index = 0
        try:
            if faults.stream_error == call:
                req.aborted = True
                err: dict[str, Any] = {"error": {"message": "The prompt is too long for this model."}}
                if f.version == "0.5.23":
                    err["error"].update({"type": "invalid_request_error", "code": 400, "retryable": False})
                self._write(b"data: " + json.dumps(err).encode() + b"\n\n")
                self._write(b"data: [DONE]\n\n")
                self._write_end()
                return
            while True:
                try:
                    chunk = req.events.get(timeout=0.1)
                except queue.Empty:
                    if f.stopped:
                        raise ConnectionResetError from None
                    continue
                if faults.hang == (call, index):
                    f._stop.wait(faults.hang_s)
                if faults.drop_connection == (call, index):
                    req.aborted = True
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                finished = chunk.pop("_finished")
                if faults.malformed_chunk == (call, index):
                    data = b'data: {"text": "oops", "meta_info": {"completion_tok'
                else:
                    data = b"data: " + json.dumps(chunk).encode()
                self._write(data + b"\n\n")
                index += 1
                if finished:
                    break
            self._write(b"data: [DONE]\n\n")
            self._write_end()
        except OSError:  # the client went away, or stop() cut the connection
            req.aborted = True
            self.close_connection = True
            return
        self._finished()

    def _finished(self) -> None:
        f = self.fake
        with f._lock:
            f.finished_calls += 1
            n = f.finished_calls
        if f.faults.stop_after is not None and n >= f.faults.stop_after:
            threading.Thread(target=f.stop, daemon=True).start()

    def _write(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _write_end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")


def main() -> None:  # pragma: no cover - manual use
    import argparse

    ap = argparse.ArgumentParser(description="A fake SGLang server on 127.0.0.1")
    ap.add_argument("--version", default="0.5.10", choices=VERSIONS)
    ap.add_argument("--algorithm", default="eagle3", choices=sorted(_SGLANG_NAMES))
    ap.add_argument("--rates", default="0.8,0.6,0.4", help="conditional chain acceptance rates")
    ap.add_argument("--fixed-ms", type=float, default=8.0)
    ap.add_argument("--per-request-ms", type=float, default=2.0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    fake = FakeSGLang(args.version, algorithm=args.algorithm,
                      chain_rates=[float(x) for x in args.rates.split(",") if x],
                      step_fixed_s=args.fixed_ms / 1000, step_per_request_s=args.per_request_ms / 1000,
                      port=args.port).start()
    print(fake.url, flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
