"""Calibrating against a live SGLang server: describe it, stream a workload through it, keep what it shows.

`describe_server` reads GET /server_info (GET /get_server_info on a 404) into a `ServerDescription`.
`run_workload` keeps C streaming POST /generate requests in flight at each concurrency C and records every
streamed chunk's arrival time and how many tokens it carried. With `stream_interval: 1` SGLang sends one
chunk per scheduler iteration and request (srt/managers/scheduler_output_processor_mixin.py:
`len(req.output_ids) % stream_interval == 0`), so:

- the gap between two chunks of a request is one iteration's wall time. Each request's chunks are cut
  into segments wherever the running batch changes (another request's first or last chunk); gaps holding
  another request's prefill are left out; a segment's time / its gaps is the step time at that batch size
  (iteration_segments) -> `StepTime(source="live")`. Segments cancel the chunks' delivery jitter inside them;
- the tokens a decode chunk carries are that verify step's accepted drafts + the bonus token
  (-> `Measurements.accept_lengths`; the first chunk, the prefill's token, and the last, which max_new_tokens
  or a stop may cut, are left out).

Everything is saved (atomically) after each concurrency and when anything fails, so a stopped run resumes.
Only the standard library, httpx and prometheus_client are used; nothing here needs a GPU.

Field names, read from SGLang's wheels 0.5.8, 0.5.10 and 0.5.23 (paths inside the `sglang` package):
- /server_info = the server args + scheduler info + `internal_states` + `version`
  (srt/entrypoints/http_server.py `server_info`; 0.5.23 builds it with srt/utils/common.py
  `build_server_info` from `ServerArgs.resolved_dict()`, srt/server_args.py). Every version serves both
  /server_info and the deprecated /get_server_info.
- Server args: srt/server_args.py (0.5.8, 0.5.10); srt/arg_groups/fields/*.py (0.5.23, flat names).
- Streamed chunks: srt/managers/tokenizer_manager.py: `output_ids` (and `text`) are cumulative unless the
  server runs with `--stream-output` (0.5.8) / `--incremental-streaming-output` (0.5.10, 0.5.23);
  `meta_info.completion_tokens` is cumulative either way, so new tokens = its increase.
- Spec fields are set on the finishing chunk only (tokenizer_manager.py `_calculate_spec_decoding_metrics`).
"""

from __future__ import annotations

import asyncio
import json
import time
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from simspec.calibration.measurements import (
    Measurements,
    RequestRecord,
    ServerDescription,
    StepTime,
    ThroughputPoint,
)
from simspec.errors import InputError

DEFAULT_PORT = 30000  # SGLang's --port default
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class LiveServerError(InputError):
    """A live server answered with an error, sent something unreadable, or could not be reached.

    An InputError, so the CLI prints it on one line and exits 2. `endpoint` and `status` say what failed;
    `saved_to` where the measurements made before the failure were written (None when not saved);
    `partial` holds them."""

    def __init__(self, message: str, *, endpoint: str | None = None, status: int | None = None,
                 saved_to: str | None = None, partial: Measurements | None = None):
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status
        self.saved_to = saved_to
        self.partial = partial


class _Transient(Exception):
    """A failure worth retrying: connection refused or dropped, 5xx, 429."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------------------ HTTP helpers


def normalise_base_url(host: str) -> str:
    """`HOST`, `HOST:PORT` or a URL -> `http://HOST:PORT` without a trailing slash (SGLang's port 30000
    when neither a scheme nor a port is given)."""
    h = (host or "").strip().rstrip("/")
    if not h:
        raise InputError("no server given: pass HOST, HOST:PORT or http://HOST:PORT", key="--host")
    had_scheme = "://" in h
    if not had_scheme:
        h = "http://" + h
    try:
        url = httpx.URL(h)
    except Exception as exc:  # httpx.InvalidURL and friends
        raise InputError(f"{host!r} is not a server address ({exc}): pass HOST:PORT or http://HOST:PORT",
                         key="--host") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InputError(f"{host!r} is not an http(s) server address: pass HOST:PORT or http://HOST:PORT",
                         key="--host")
    if url.port is None and not had_scheme:
        url = url.copy_with(port=DEFAULT_PORT)
    return str(url).rstrip("/")


def _timeout(timeout: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, connect=min(timeout, 10.0))


def _excerpt(body: str | bytes, limit: int = 300) -> str:
    """What an error body says: SGLang's {"error": {"message"}} / {"error": "..."} / FastAPI's {"detail"},
    else the start of the text."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            text = err if isinstance(err, str) else json.dumps(err)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _status_error(method: str, base: str, path: str, status: int, body: str | bytes) -> LiveServerError:
    return LiveServerError(f"{method} {base}{path} answered HTTP {status}: {_excerpt(body) or '(empty body)'}",
                           endpoint=path, status=status)


def _transient_from(exc: httpx.HTTPError) -> _Transient:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return _Transient(f"cannot connect: {exc or type(exc).__name__}")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return _Transient(f"the connection broke: {exc or type(exc).__name__}")
    return _Transient(f"{type(exc).__name__}: {exc}")


_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
              httpx.WriteError, httpx.PoolTimeout)


def _give_up(method: str, base: str, path: str, tries: int, last: _Transient) -> LiveServerError:
    if last.status is None and str(last).startswith("cannot connect"):
        return LiveServerError(
            f"cannot reach an SGLang server at {base} ({method} {path}: {str(last)[len('cannot connect: '):]}; "
            f"{tries} tries): is the server up, and are host and port right?", endpoint=path)
    return LiveServerError(f"{method} {base}{path} failed {tries} times: {last}", endpoint=path,
                           status=last.status)


def _read_timeout(method: str, base: str, path: str) -> LiveServerError:
    return LiveServerError(f"{method} {base}{path}: no answer within the read timeout", endpoint=path)


def _retry_reason(method: str, base: str, path: str, resp: httpx.Response, allow: Iterable[int]) -> _Transient | None:
    """None for an answer to return (2xx or allowed), the reason to retry (5xx, 429), or raise for the rest."""
    if resp.is_success or resp.status_code in allow:
        return None
    if resp.status_code not in RETRY_STATUSES:
        raise _status_error(method, base, path, resp.status_code, resp.content)
    return _Transient(f"HTTP {resp.status_code}: {_excerpt(resp.content)}", resp.status_code)


def _request_sync(client: httpx.Client, method: str, base: str, path: str, *, retries: int, backoff_s: float,
                  allow: Iterable[int] = (), json_body: Any = None) -> httpx.Response:
    """One request with bounded retries (connect errors, 5xx, 429) and exponential backoff. Returns 2xx
    answers and those in `allow`; any other status raises LiveServerError naming endpoint, status, body."""
    last: _Transient | None = None
    tries = max(1, retries)
    for attempt in range(1, tries + 1):
        try:
            resp = client.request(method, base + path, json=json_body)
        except httpx.ReadTimeout:
            raise _read_timeout(method, base, path) from None
        except _RETRYABLE as exc:
            last = _transient_from(exc)
        else:
            last = _retry_reason(method, base, path, resp, allow)
            if last is None:
                return resp
        if attempt < tries:
            time.sleep(backoff_s * 2 ** (attempt - 1))
    assert last is not None
    raise _give_up(method, base, path, tries, last)


async def _request_async(client: httpx.AsyncClient, method: str, base: str, path: str, *, retries: int,
                         backoff_s: float, allow: Iterable[int] = (), json_body: Any = None) -> httpx.Response:
    """`_request_sync` on an async client."""
    last: _Transient | None = None
    tries = max(1, retries)
    for attempt in range(1, tries + 1):
        try:
            resp = await client.request(method, base + path, json=json_body)
        except httpx.ReadTimeout:
            raise _read_timeout(method, base, path) from None
        except _RETRYABLE as exc:
            last = _transient_from(exc)
        else:
            last = _retry_reason(method, base, path, resp, allow)
            if last is None:
                return resp
        if attempt < tries:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
    assert last is not None
    raise _give_up(method, base, path, tries, last)


def _json_of(resp: httpx.Response, what: str) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise LiveServerError(f"{what} did not answer JSON: {_excerpt(resp.content)!r}") from None


# ------------------------------------------------------------------------------------------ the server


# SGLang's --speculative-algorithm names -> simspec's. NEXTN is resolved to EAGLE before /server_info shows
# it (srt/server_args.py 0.5.8 `if self.speculative_algorithm == "NEXTN": ... = "EAGLE"`, 0.5.10 likewise,
# 0.5.23 srt/arg_groups/speculative_hook.py); NGRAM was LOOKAHEAD before; 0.5.23 may promote EAGLE/NEXTN
# to FROZEN_KV_MTP for Gemma-4 assistant drafts.
_ALGORITHMS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "MTP": "mtp", "FROZEN_KV_MTP": "mtp",
               "STANDALONE": "standalone", "NGRAM": "ngram", "LOOKAHEAD": "ngram", "NONE": "none"}


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return int(v)


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def algorithm_name(raw_algorithm: Any, *, model_path: Any = None, draft_model_path: Any = None) -> str:
    """simspec's name for SGLang's `speculative_algorithm` as /server_info reports it.

    EAGLE whose draft model is the target checkpoint itself is MTP (NEXTN): SGLang turns NEXTN into EAGLE
    and points the draft path at the model path for DeepSeek-V3-style models (srt/server_args.py)."""
    if raw_algorithm is None or raw_algorithm == "":
        return "none"
    name = str(raw_algorithm).strip()
    mapped = _ALGORITHMS.get(name.upper(), name.lower())
    if mapped == "eagle" and model_path and draft_model_path and str(draft_model_path) == str(model_path):
        return "mtp"
    return mapped


def description_from_server_info(raw: dict[str, Any], *, host: str | None = None) -> ServerDescription:
    """A ServerDescription from a /server_info dict (also the `server_info` bench_serving writes)."""
    if not isinstance(raw, dict):
        raise LiveServerError(f"/server_info is not a JSON object: {str(raw)[:200]!r}", endpoint="/server_info")
    algorithm = algorithm_name(raw.get("speculative_algorithm"), model_path=raw.get("model_path"),
                               draft_model_path=raw.get("speculative_draft_model_path"))
    spec = algorithm != "none"

    # CUDA graphs: 0.5.8/0.5.10 `disable_cuda_graph`, `cuda_graph_max_bs` (srt/server_args.py); 0.5.23 resolves
    # them into `cuda_graph_config` {"decode": {"backend": full|breakable|disabled, "max_bs", "bs"}, "prefill":
    # ...} (srt/arg_groups/cuda_graph_hook.py, srt/model_executor/cuda_graph_config.py), keeping
    # `disable_cuda_graph` as a legacy field and `cuda_graph_max_bs_decode` (srt/arg_groups/fields/exec_.py).
    cuda_graph: bool | None = None
    max_bs: int | None = None
    cfg = raw.get("cuda_graph_config")
    decode = cfg.get("decode") if isinstance(cfg, dict) else None
    if isinstance(decode, dict):
        backend = decode.get("backend")
        if isinstance(backend, str):
            cuda_graph = backend.lower() != "disabled"
        max_bs = _int(decode.get("max_bs"))
    if cuda_graph is None and isinstance(raw.get("disable_cuda_graph"), bool):
        cuda_graph = not raw["disable_cuda_graph"]
    if max_bs is None:
        max_bs = _int(raw.get("cuda_graph_max_bs_decode", raw.get("cuda_graph_max_bs")))

    max_running = _int(raw.get("max_running_requests"))
    states = raw.get("internal_states")
    if max_running is None and isinstance(states, list) and states and isinstance(states[0], dict):
        max_running = _int(states[0].get("effective_max_running_requests_per_dp"))

    overlap = _bool(raw.get("disable_overlap_schedule"))
    ngram: dict[str, float | int | str] = {}
    if algorithm == "ngram":
        # 0.5.8: speculative_ngram_branch_length (= later max_trie_depth), min/max_match_window_size, and a
        # match_type it ignores (always BFS); 0.5.10/0.5.23: speculative_ngram_max_trie_depth.
        for src, dst in (("speculative_ngram_min_bfs_breadth", "min_bfs_breadth"),
                         ("speculative_ngram_max_bfs_breadth", "max_bfs_breadth"),
                         ("speculative_ngram_max_trie_depth", "max_trie_depth"),
                         ("speculative_ngram_branch_length", "max_trie_depth"),
                         ("speculative_ngram_match_type", "match_type"),
                         ("speculative_ngram_capacity", "capacity"),
                         ("speculative_ngram_min_match_window_size", "min_match_window_size"),
                         ("speculative_ngram_max_match_window_size", "max_match_window_size")):
            v = raw.get(src)
            if isinstance(v, int | float | str) and not isinstance(v, bool) and dst not in ngram:
                ngram[dst] = v
    attention = raw.get("attention_backend") or raw.get("decode_attention_backend")
    version = raw.get("version")
    return ServerDescription(
        model_path=str(raw["model_path"]) if raw.get("model_path") is not None else None,
        tp=_int(raw.get("tp_size")),
        sglang_version=str(version) if version is not None else None,
        algorithm=algorithm,
        num_steps=_int(raw.get("speculative_num_steps")) if spec else None,
        topk=_int(raw.get("speculative_eagle_topk")) if spec else None,
        num_draft_tokens=_int(raw.get("speculative_num_draft_tokens")) if spec else None,
        cuda_graph=cuda_graph,
        cuda_graph_max_bs=max_bs,
        max_running_requests=max_running,
        mem_fraction_static=_float(raw.get("mem_fraction_static")),
        kv_cache_dtype=str(raw["kv_cache_dtype"]) if isinstance(raw.get("kv_cache_dtype"), str) else None,
        overlap_schedule=None if overlap is None else not overlap,
        scheduler_recv_interval=_int(raw.get("scheduler_recv_interval")),
        attention_backend=str(attention) if attention else None,
        ngram=ngram,
        host=host,
        raw=raw,
    )


def describe_server(base_url: str, *, timeout: float = 10.0, retries: int = 3,
                    backoff_s: float = 0.5) -> ServerDescription:
    """GET /server_info (on a 404, the older /get_server_info) -> ServerDescription (the raw dict kept).

    Raises LiveServerError (an InputError) when the host cannot be reached after `retries` tries, answers
    an error status, or is not an SGLang server."""
    base = normalise_base_url(base_url)
    with httpx.Client(timeout=_timeout(timeout), trust_env=False) as client:
        path = "/server_info"
        resp = _request_sync(client, "GET", base, path, retries=retries, backoff_s=backoff_s, allow=(404,))
        if resp.status_code == 404:
            path = "/get_server_info"
            resp = _request_sync(client, "GET", base, path, retries=retries, backoff_s=backoff_s, allow=(404,))
            if resp.status_code == 404:
                raise LiveServerError(f"{base} answers neither GET /server_info nor GET /get_server_info (404): "
                                      "is it an SGLang server?", endpoint="/server_info", status=404)
        raw = _json_of(resp, f"GET {base}{path}")
    return description_from_server_info(raw, host=base)


def server_step_times(server: ServerDescription) -> list[StepTime]:
    """The scheduler's own step times, when the server runs with SGLANG_RECORD_STEP_TIME=1:
    internal_states[0].step_time_dict = {running batch size: [mean iteration time over each
    --decode-log-interval window, ...]} (srt/managers/scheduler_metrics_mixin.py 0.5.8,
    scheduler_components/metrics_reporter.py 0.5.23)."""
    states = server.raw.get("internal_states")
    if not (isinstance(states, list) and states and isinstance(states[0], dict)):
        return []
    table = states[0].get("step_time_dict")
    if not isinstance(table, dict):
        return []
    out = []
    for bs, values in table.items():
        vals = [float(v) for v in (values if isinstance(values, list) else [values]) if _float(v) is not None]
        try:
            b = int(bs)
        except (TypeError, ValueError):
            continue
        if vals and b > 0:
            out.append(StepTime(batch_size=b, seconds=sum(vals) / len(vals), samples=len(vals),
                                source="server_info:step_time_dict"))
    return sorted(out, key=lambda s: s.batch_size)


# ------------------------------------------------------------------------------------------ prompts


def default_prompts_path() -> Path:
    return Path(str(resources.files("simspec.calibration").joinpath("prompts.jsonl")))


_ROLES = ("system", "user", "assistant")


def load_prompts(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Prompts from a JSONL file (default: the shipped simspec/calibration/prompts.jsonl), one object a line
    with exactly one of `text` (a string sent as is), `input_ids` (token ids) or `messages`
    ([{role: system|user|assistant, content: str}, ...], rendered with a chat template before sending).
    Bad lines raise InputError naming the file and the line."""
    p = Path(path) if path is not None else default_prompts_path()
    where = str(p)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read the prompts file: {exc.strerror or exc}", file=where) from None
    except UnicodeDecodeError:
        raise InputError("the prompts file is not UTF-8 text", file=where) from None
    prompts: list[dict[str, Any]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        key = f"line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not a JSON object ({exc.msg} at column {exc.colno})", file=where, key=key) from None
        if not isinstance(obj, dict):
            raise InputError("expected a JSON object with `text`, `input_ids` or `messages`", file=where, key=key)
        kinds = [k for k in ("text", "input_ids", "messages") if k in obj]
        if len(kinds) != 1:
            found = ", ".join(kinds) or "none"
            raise InputError(f"needs exactly one of `text`, `input_ids`, `messages` (found: {found})",
                             file=where, key=key)
        kind = kinds[0]
        value = obj[kind]
        if kind == "text":
            if not isinstance(value, str) or not value.strip():
                raise InputError("`text` must be a non-empty string", file=where, key=key)
        elif kind == "input_ids":
            if (not isinstance(value, list) or not value
                    or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
                raise InputError("`input_ids` must be a non-empty list of token ids (integers >= 0)",
                                 file=where, key=key)
        else:
            if not isinstance(value, list) or not value:
                raise InputError("`messages` must be a non-empty list of {role, content}", file=where, key=key)
            for i, m in enumerate(value):
                if not (isinstance(m, dict) and m.get("role") in _ROLES and isinstance(m.get("content"), str)):
                    raise InputError(f"messages[{i}] must be {{\"role\": system|user|assistant, \"content\": string}}",
                                     file=where, key=key)
            if value[-1]["role"] != "user":
                raise InputError("the last message must be the user's (the model answers it)", file=where, key=key)
        prompts.append({kind: value})
    if not prompts:
        raise InputError("the prompts file holds no prompts", file=where)
    return prompts


# Generic chat templates, used only where the server cannot render its own (see prepare_prompts). Each is
# (system, user, assistant, generation prompt) formats; `{}` is the content. They approximate the families'
# published formats; the tokenizer adds BOS itself.
CHAT_TEMPLATES: dict[str, tuple[str, str, str, str]] = {
    "chatml": ("<|im_start|>system\n{}<|im_end|>\n", "<|im_start|>user\n{}<|im_end|>\n",
               "<|im_start|>assistant\n{}<|im_end|>\n", "<|im_start|>assistant\n"),
    "llama3": ("<|start_header_id|>system<|end_header_id|>\n\n{}<|eot_id|>",
               "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>",
               "<|start_header_id|>assistant<|end_header_id|>\n\n{}<|eot_id|>",
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "deepseek": ("{}", "<｜User｜>{}", "<｜Assistant｜>{}<｜end▁of▁sentence｜>", "<｜Assistant｜>"),
    "kimi": ("<|im_system|>system<|im_middle|>{}<|im_end|>", "<|im_user|>user<|im_middle|>{}<|im_end|>",
             "<|im_assistant|>assistant<|im_middle|>{}<|im_end|>", "<|im_assistant|>assistant<|im_middle|>"),
    "plain": ("{}\n\n", "User: {}\n\n", "Assistant: {}\n\n", "Assistant:"),
}


def guess_chat_template(model_path: str | None) -> str:
    """The generic template closest to a model's family, from its path; `plain` when unknown."""
    p = (model_path or "").lower()
    if "kimi" in p or "moonshot" in p:
        return "kimi"
    if "deepseek" in p:
        return "deepseek"
    if "llama-3" in p or "llama3" in p or "llama-4" in p:
        return "llama3"
    if "qwen" in p:
        return "chatml"
    return "plain"


def render_messages(messages: Sequence[dict[str, str]], template: str) -> str:
    """Messages as one prompt string in a generic template, ending with the assistant's generation prompt."""
    if template not in CHAT_TEMPLATES:
        raise InputError(f"unknown chat template {template!r}; allowed: auto, server, "
                         f"{', '.join(CHAT_TEMPLATES)}", key="chat_template")
    system, user, assistant, gen = CHAT_TEMPLATES[template]
    fmt = {"system": system, "user": user, "assistant": assistant}
    return "".join(fmt[m["role"]].format(m["content"]) for m in messages) + gen


def prepare_prompts(base_url: str, prompts: Sequence[dict[str, Any]], *, server: ServerDescription | None = None,
                    chat_template: str = "auto", timeout: float = 30.0, retries: int = 3,
                    backoff_s: float = 0.5) -> tuple[list[dict[str, Any]], str]:
    """Prompts -> /generate inputs ({"text": ...} or {"input_ids": [...]}) and a line saying how `messages`
    were rendered.

    `chat_template`: "auto" asks the server to apply the model's own template (POST /v1/tokenize with
    `messages`, which 0.5.23 accepts: srt/entrypoints/openai/protocol.py TokenizeRequest) and falls back to
    the generic template guessed from the model path when the server cannot (0.5.8/0.5.10 take only
    `prompt`, and /server_info carries no chat template); "server" requires the server's; a name from
    CHAT_TEMPLATES forces that one. Raw prompts without a chat template make models loop and inflate the
    accept length, so use the model's template where you can."""
    base = normalise_base_url(base_url)
    if chat_template not in ("auto", "server", *CHAT_TEMPLATES):
        raise InputError(f"unknown chat template {chat_template!r}; allowed: auto, server, "
                         f"{', '.join(CHAT_TEMPLATES)}", key="chat_template")
    out: list[dict[str, Any]] = []
    needs = [p for p in prompts if "messages" in p]
    how = "no chat prompts"
    use_server = False
    rendered: dict[int, list[int]] = {}
    if needs and chat_template in ("auto", "server"):
        with httpx.Client(timeout=_timeout(timeout), trust_env=False) as client:
            resp = _request_sync(client, "POST", base, "/v1/tokenize", json_body={"messages": needs[0]["messages"]},
                                 retries=retries, backoff_s=backoff_s, allow=range(400, 600))
            tokens = _tokens_of(resp)
            if tokens is None:
                if chat_template == "server":
                    raise LiveServerError(
                        f"POST {base}/v1/tokenize cannot render chat messages (HTTP {resp.status_code}: "
                        f"{_excerpt(resp.content)}); SGLang < 0.5.23 cannot: use --chat-template NAME or "
                        "prompts with `text` / `input_ids`", endpoint="/v1/tokenize", status=resp.status_code)
            else:
                use_server = True
                rendered[id(needs[0])] = tokens
                for p in needs[1:]:
                    r = _request_sync(client, "POST", base, "/v1/tokenize", json_body={"messages": p["messages"]},
                                      retries=retries, backoff_s=backoff_s)
                    t = _tokens_of(r)
                    if t is None:
                        raise LiveServerError(f"POST {base}/v1/tokenize answered without token ids: "
                                              f"{_excerpt(r.content)!r}", endpoint="/v1/tokenize")
                    rendered[id(p)] = t
        if use_server:
            how = "chat prompts rendered by the server's own chat template (POST /v1/tokenize)"
    template = chat_template
    if needs and not use_server:
        if template in ("auto", "server"):
            template = guess_chat_template(server.model_path if server else None)
        how = (f"chat prompts rendered with simspec's generic '{template}' template (an approximation of the "
               "model's own; the server exposes no chat template before SGLang 0.5.23)")
    for p in prompts:
        if "messages" in p:
            out.append({"input_ids": rendered[id(p)]} if use_server else
                       {"text": render_messages(p["messages"], template)})
        else:
            out.append(dict(p))
    return out, how


def _tokens_of(resp: httpx.Response) -> list[int] | None:
    if not resp.is_success:
        return None
    try:
        obj = resp.json()
    except ValueError:
        return None
    tokens = obj.get("tokens") if isinstance(obj, dict) else None
    if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens):
        return tokens
    return None


# ------------------------------------------------------------------------------------------ derived figures


def max_step_tokens(server: ServerDescription) -> int | None:
    """Most tokens one iteration can give a request: 1 without speculation, num_steps + 1 for the EAGLE
    family (a tree's depth is num_steps), num_draft_tokens for n-gram. A chunk carrying more holds several
    iterations (SGLang coalesces chunks a slow client did not read in time) and is left out."""
    if server.algorithm == "none":
        return 1
    if server.algorithm == "ngram":
        return server.num_draft_tokens
    if server.num_steps:
        return server.num_steps + 1
    return server.num_draft_tokens


def iteration_segments(records: Sequence[RequestRecord], *,
                       max_step_tokens: int | None = None) -> dict[int, list[tuple[float, int]]]:
    """Stretches of iterations at a constant running batch, per batch size: [(wall seconds, iterations)].

    `records` are requests that ran together (one concurrency of one run: their chunk_times share a clock);
    records of several concurrencies are split by `concurrency` first. With stream_interval 1 every running
    request gets one chunk per decode iteration, so the gap between two chunks of a request is one
    iteration, unless a prefill ran between them (SGLang runs prefill as its own batch with speculation; the
    running requests get no chunk from it). The batch changes only when a request's first chunk comes
    (its prefill ended) or its last (it left). For each request its chunks are cut into segments:
    - a gap holding another request's first chunk is dropped (a prefill ran in it; requests prefilled in
      the same batch as this one come with its own first chunk and do not count),
    - a gap ending in a chunk with more than max_step_tokens tokens is dropped (coalesced iterations),
    - another request's last chunk ends the segment at this request's nearest chunk (same iteration).
    A segment of n gaps spanning D seconds gives (D, n): its chunks' delivery jitter cancels inside it, so
    only the end points' jitter remains. Its batch size = the requests whose first chunk came before the
    segment's middle and whose last came after it."""
    groups: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.chunk_times:
            groups[r.concurrency].append(r)
    out: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for group in groups.values():
        firsts = sorted((r.chunk_times[0], i) for i, r in enumerate(group))
        lasts = sorted((r.chunk_times[-1], i) for i, r in enumerate(group))
        first_t = [t for t, _ in firsts]
        last_t = [t for t, _ in lasts]
        for i, r in enumerate(group):
            ts, ns = r.chunk_times, r.chunk_tokens
            m = len(ts)
            if m < 2:
                continue
            bad = [False] * m  # bad[j]: gap (ts[j-1], ts[j]] is dropped
            cut = [False] * m  # cut[j]: a segment ends (and the next starts) at chunk j
            for j in range(1, m):
                if max_step_tokens is not None and ns[j] > max_step_tokens:
                    bad[j] = True
            tol0 = (ts[1] - ts[0]) / 4  # same prefill batch as this request: first chunks near its own
            for t, q in firsts[bisect_right(first_t, ts[0]):bisect_left(first_t, ts[-1])]:
                if q != i and t > ts[0] + tol0:
                    bad[bisect_left(ts, t)] = True
            for t, q in lasts[bisect_right(last_t, ts[0]):bisect_left(last_t, ts[-1])]:
                if q != i:
                    j = bisect_left(ts, t)
                    if j > 0 and (j == m or t - ts[j - 1] < ts[j] - t):
                        j -= 1
                    cut[j] = True
            bounds: list[tuple[int, int]] = []
            s = 0
            for j in range(1, m):
                if bad[j]:  # drop gap j: the segment ends before it, the next starts after it
                    bounds.append((s, j - 1))
                    s = j
                elif cut[j]:  # the batch changes after chunk j's iteration
                    bounds.append((s, j))
                    s = j
            bounds.append((s, m - 1))
            for a, b in bounds:
                if b > a:
                    mid = (ts[a] + ts[b]) / 2
                    running = bisect_left(first_t, mid) - bisect_left(last_t, mid)
                    out[max(running, 1)].append((ts[b] - ts[a], b - a))
    return dict(out)


def _trimmed_rate(segments: Sequence[tuple[float, int]], trim: float = 0.2) -> float:
    """Seconds per iteration over segments (seconds, iterations): the mean of the segments' per-iteration
    times weighted by their iterations, the lowest and highest `trim` of the weight left out (a segment whose
    end chunk came late, e.g. while the client was busy, is an outlier; long segments dominate)."""
    pts = sorted((d / n, n) for d, n in segments if n > 0)
    total = sum(n for _, n in pts)
    lo, hi = trim * total, (1 - trim) * total
    acc = kept = weight = 0.0
    for v, n in pts:
        w = max(0.0, min(acc + n, hi) - max(acc, lo))
        acc += n
        kept += w * v
        weight += w
    return kept / weight if weight > 0 else sum(d for d, _ in segments) / total


def step_times_from_records(records: Sequence[RequestRecord], *, max_step_tokens: int | None = None,
                            min_samples: int = 3, source: str = "live",
                            concurrency: int | None = None) -> list[StepTime]:
    """StepTime per running batch size from iteration_segments: the per-iteration time of the segments,
    weighted by their iterations, 20% of the weight trimmed at each end; `samples` = iterations seen
    (segment iterations summed over requests / batch size). Batch sizes seen in fewer than min_samples
    iterations are dropped. `concurrency`: the run's, recorded on each (what `calibrate --hold-out` filters by)."""
    out = []
    for bs, segs in sorted(iteration_segments(records, max_step_tokens=max_step_tokens).items()):
        n = sum(k for _, k in segs)
        iterations = max(1, round(n / bs))
        if iterations >= min_samples and n > 0:
            out.append(StepTime(batch_size=bs, seconds=_trimmed_rate(segs), samples=iterations, source=source,
                                concurrency=concurrency))
    return out


def accept_lengths_from_records(records: Sequence[RequestRecord], *,
                                max_step_tokens: int | None = None) -> list[float]:
    """Per verify step: tokens the step's chunk carried (accepted drafts + the bonus). The first chunk
    (the prefill's token) and the last (max_new_tokens or a stop may cut it) are left out, and so are
    chunks with more than max_step_tokens (several iterations coalesced)."""
    out: list[float] = []
    for r in records:
        for n in r.chunk_tokens[1:-1]:
            if n >= 1 and (max_step_tokens is None or n <= max_step_tokens):
                out.append(float(n))
    return out


def throughput_point(records: Sequence[RequestRecord], concurrency: int, *, speculative: bool) -> ThroughputPoint:
    """Mean per-request decode tok/s ((completion - 1) / (last chunk - first chunk)), all output tokens
    over the wall time from the first submission to the last finish, and the accept length
    (sum of completion tokens / sum of verify steps, as SGLang computes spec_accept_length)."""
    rates, starts, ends, total = [], [], [], 0
    for r in records:
        total += r.completion_tokens
        if r.chunk_times:
            ends.append(r.chunk_times[-1])
            if r.e2e_latency is not None:
                starts.append(r.chunk_times[-1] - r.e2e_latency)
        if len(r.chunk_times) >= 2 and r.completion_tokens > 1:
            decode = r.chunk_times[-1] - r.chunk_times[0]
            if decode > 0:
                rates.append((r.completion_tokens - 1) / decode)
    wall = (max(ends) - min(starts)) if ends and starts else 0.0
    accept = None
    if speculative:
        pairs = [(r.completion_tokens, r.spec_verify_ct) for r in records if r.spec_verify_ct]
        if pairs:
            accept = sum(c for c, _ in pairs) / sum(v for _, v in pairs)
        else:
            steps = accept_lengths_from_records(records)
            accept = sum(steps) / len(steps) if steps else None
    return ThroughputPoint(concurrency=concurrency, tokens_per_s=sum(rates) / len(rates) if rates else 0.0,
                           throughput_tokens_per_s=total / wall if wall > 0 else None,
                           accept_length=accept, source="live")


# ------------------------------------------------------------------------------------------ /metrics


# Samples kept from GET /metrics (Prometheus text; needs --enable-metrics). Names from
# srt/metrics/collector.py (0.5.8) and srt/observability/metrics_collector.py (0.5.10, 0.5.23).
PROMETHEUS_SAMPLES = frozenset({
    "sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:gen_throughput", "sglang:num_running_reqs",
    "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_used_tokens", "sglang:max_total_num_tokens",
    "sglang:is_cuda_graph", "sglang:cuda_graph_passes_total", "sglang:spec_verify_calls_total",
    "sglang:spec_num_steps", "sglang:spec_num_draft_tokens", "sglang:generation_tokens_total",
    "sglang:prompt_tokens_total", "sglang:num_requests_total",
    "sglang:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_count",
    "sglang:inter_token_latency_seconds_sum", "sglang:inter_token_latency_seconds_count",
    "sglang:e2e_request_latency_seconds_sum", "sglang:e2e_request_latency_seconds_count",
})


def parse_prometheus(text: str, *, extra_labels: dict[str, str] | None = None) -> dict[str, float]:
    """The PROMETHEUS_SAMPLES in a /metrics text as {'name{label="v",...}': value} (labels sorted)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name not in PROMETHEUS_SAMPLES:
                    continue
                labels = {**s.labels, **(extra_labels or {})}
                inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                out[f"{s.name}{{{inner}}}"] = float(s.value)
    except ValueError as exc:
        raise LiveServerError(f"GET /metrics sent text that is not Prometheus exposition format: {exc}",
                              endpoint="/metrics") from None
    return out


def _bare(samples: dict[str, float]) -> dict[str, float]:
    """One value per metric name: the sum over series for counters (_total, _sum, _count), else the mean."""
    groups: dict[str, list[float]] = defaultdict(list)
    for key, v in samples.items():
        groups[key.split("{", 1)[0]].append(v)
    return {name: (sum(vs) if name.endswith(("_total", "_sum", "_count")) else sum(vs) / len(vs))
            for name, vs in groups.items()}


# ------------------------------------------------------------------------------------------ streaming


@dataclass
class _Stream:
    submit: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    completion: int = 0
    finished: bool = False


def _chunk_error(base: str, what: str, data: str) -> LiveServerError:
    return LiveServerError(f"POST {base}/generate sent {what}: {data[:200]!r}", endpoint="/generate")


async def _stream_generate(client: httpx.AsyncClient, base: str, payload: dict[str, Any], *,
                           incremental: bool | None, timeout: float) -> _Stream:
    """One streaming /generate: every chunk's arrival time and new-token count, the final meta_info."""
    st = _Stream(submit=time.monotonic())
    try:
        async with client.stream("POST", base + "/generate", json=payload) as resp:
            if resp.status_code != 200:
                body = await resp.aread()
                if resp.status_code in RETRY_STATUSES:
                    raise _Transient(f"HTTP {resp.status_code}: {_excerpt(body)}", resp.status_code)
                raise _status_error("POST", base, "/generate", resp.status_code, body)
            done = False
            async for line in resp.aiter_lines():
                now = time.monotonic()
                line = line.strip()
                if not line or line.startswith(":") or not line.startswith("data:"):
                    continue  # SSE blank separators, comments, other fields
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    raise _chunk_error(base, "a stream chunk that is not JSON", data) from None
                if not isinstance(obj, dict):
                    raise _chunk_error(base, "a stream chunk that is not a JSON object", data)
                if "error" in obj:  # SGLang streams a ValueError as data: {"error": {"message": ...}}
                    raise LiveServerError(f"POST {base}/generate: the server reported an error mid-stream: "
                                          f"{_excerpt(data)}", endpoint="/generate")
                _take_chunk(st, obj, now, incremental, base, data)
            if not done and not st.finished:
                raise _Transient("the stream ended before the request finished (no [DONE])")
    except httpx.ReadTimeout:
        raise LiveServerError(f"POST {base}/generate: no data for {timeout:g} s (read timeout; the server may be "
                              f"stuck or overloaded: raise the timeout or lower the concurrency)",
                              endpoint="/generate") from None
    except _RETRYABLE as exc:
        raise _transient_from(exc) from None
    if not st.chunk_times:
        raise LiveServerError(f"POST {base}/generate streamed no tokens", endpoint="/generate")
    return st


def _take_chunk(st: _Stream, obj: dict[str, Any], now: float, incremental: bool | None, base: str,
                data: str) -> None:
    meta = obj.get("meta_info")
    meta = meta if isinstance(meta, dict) else {}
    ids = obj.get("output_ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
        raise _chunk_error(base, "a chunk whose output_ids is not a list of token ids", data)
    completion = _int(meta.get("completion_tokens"))
    inc = incremental
    if inc is None and ids is not None:
        # not told by /server_info: cumulative ids are as long as the completion so far and extend the last ones
        prev = st.output_ids
        inc = (len(ids) != completion if completion is not None
               else not (len(ids) >= len(prev) and ids[:len(prev)] == prev))
    if completion is None:
        if ids is None:
            raise _chunk_error(base, "a chunk with neither meta_info.completion_tokens nor output_ids", data)
        completion = st.completion + len(ids) if inc else len(ids)
    new = completion - st.completion
    if new < 0:
        raise _chunk_error(base, f"a chunk whose completion_tokens went down ({st.completion} -> {completion})", data)
    if ids is not None:
        if inc:
            st.output_ids.extend(ids)
        else:
            st.output_ids = list(ids)
    st.meta = meta
    st.completion = completion
    if new > 0:
        st.chunk_times.append(now)
        st.chunk_tokens.append(new)
    if meta.get("finish_reason") is not None:
        st.finished = True


def _histogram(meta: dict[str, Any]) -> dict[int, int] | None:
    # 0.5.10 spec_accept_histogram, 0.5.23 spec_correct_drafts_histogram (tokenizer_manager.py
    # _calculate_spec_decoding_metrics): a list, index = drafts accepted in a verify step, value = steps.
    h = meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram"))
    if isinstance(h, list) and all(_int(v) is not None for v in h):
        return {k: int(v) for k, v in enumerate(h)}
    if isinstance(h, dict):
        try:
            return {int(k): int(v) for k, v in h.items()}
        except (TypeError, ValueError):
            return None
    return None


def _record(st: _Stream, concurrency: int, fallback_prompt_tokens: int) -> RequestRecord:
    meta = st.meta
    fr = meta.get("finish_reason")
    if isinstance(fr, dict):
        fr = fr.get("type")
    prompt = _int(meta.get("prompt_tokens"))
    return RequestRecord(
        concurrency=concurrency,
        prompt_tokens=prompt if prompt is not None else fallback_prompt_tokens,
        completion_tokens=st.completion,
        e2e_latency=st.chunk_times[-1] - st.submit,  # client side: submission -> last chunk
        spec_verify_ct=_int(meta.get("spec_verify_ct")),
        accept_histogram=_histogram(meta),
        chunk_times=st.chunk_times,
        chunk_tokens=st.chunk_tokens,
        output_ids=st.output_ids,
        finish_reason=str(fr) if fr is not None else None,
    )


# ------------------------------------------------------------------------------------------ the workload


class _NoProgress:
    def add_task(self, *_: Any, **__: Any) -> int:
        return 0

    def update(self, *_: Any, **__: Any) -> None:
        pass

    def advance(self, *_: Any, **__: Any) -> None:
        pass


def _make_progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True))


def requests_at(concurrency: int, num_requests: int | None) -> int:
    """Requests sent at one concurrency: `num_requests` (at least the concurrency), by default 3 waves."""
    if num_requests is None:
        return max(3 * concurrency, 6)
    return max(num_requests, concurrency)


@dataclass
class _Run:
    base: str
    meas: Measurements
    save_path: str | None
    partial: list[RequestRecord] = field(default_factory=list)
    started: bool = False


def _same_server(a: ServerDescription, b: ServerDescription) -> list[str]:
    """What differs between a saved description and the server now (fields both know)."""
    keys = ("model_path", "tp", "sglang_version", "algorithm", "num_steps", "topk", "num_draft_tokens")
    return [f"{k}: {getattr(a, k)!r} then, {getattr(b, k)!r} now" for k in keys
            if getattr(a, k) is not None and getattr(b, k) is not None and getattr(a, k) != getattr(b, k)]


def run_workload(
    base_url: str,
    prompts: Sequence[dict[str, Any]],
    concurrencies: Sequence[int],
    *,
    max_new_tokens: int = 256,
    num_requests: int | None = None,
    measurements: Measurements | None = None,
    save_path: str | Path | None = None,
    progress: Any = True,
    server: ServerDescription | None = None,
    chat_template: str = "auto",
    ignore_eos: bool = False,
    timeout: float = 60.0,
    retries: int = 3,
    backoff_s: float = 0.5,
    warmup: int = 1,
    flush_cache: bool = True,
    min_step_samples: int = 3,
    on_concurrency_done: Callable[[int, Measurements], None] | None = None,
) -> Measurements:
    """Stream a closed-loop workload through a live SGLang server at each concurrency; return what it showed.

    At each C in `concurrencies` (any order; duplicates ignored), `requests_at(C, num_requests)` streaming
    POST /generate requests are sent, C in flight at any time (temperature 0, stream_interval 1, prompts
    cycled). Per request a RequestRecord (every chunk's time and token count, output ids, the server's spec
    fields); per C a ThroughputPoint, StepTimes per running batch size (source "live"), the per-step accept
    lengths (with speculation), /metrics samples before and after (when the server serves /metrics:
    `name{labels,simspec_concurrency="C",simspec_point="before|after"}`, and the bare `name` = latest value).

    `measurements`: a previous run's (Measurements.load(save_path)) to resume: concurrencies in its
    done_concurrencies are skipped, records of unfinished ones are dropped and redone. The result is saved to
    `save_path` after each concurrency and whenever something fails (then the error says where).
    `progress`: True (a rich bar on stderr), False, or a started rich Progress to add tasks to.
    `server`: the description when already read (else GET /server_info). `chat_template`: see prepare_prompts.
    Errors: LiveServerError (an InputError) for an unreachable host, HTTP errors (after `retries` tries with
    exponential backoff from `backoff_s` for connect errors, 5xx and 429), unreadable chunks, read timeouts.
    """
    base = normalise_base_url(base_url)
    levels: list[int] = []
    for c in concurrencies:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise InputError(f"concurrency must be a whole number >= 1, got {c!r}", key="concurrency")
        if c not in levels:
            levels.append(c)
    if not levels:
        raise InputError("no concurrency to run", key="concurrency")
    if max_new_tokens < 2:
        raise InputError("max_new_tokens must be >= 2 (one prefill token, then decode steps)", key="max_new_tokens")
    if not prompts:
        raise InputError("no prompts to send", key="prompts")

    meas = measurements.model_copy(deep=True) if measurements is not None else Measurements()
    run = _Run(base=base, meas=meas, save_path=str(save_path) if save_path is not None else None)
    try:
        desc = server or describe_server(base, timeout=min(timeout, 30.0), retries=retries, backoff_s=backoff_s)
        if meas.server.raw:
            differ = _same_server(meas.server, desc)
            if differ:
                raise InputError("the measurements being resumed came from a different server ("
                                 + "; ".join(differ) + "): start a new run", file=run.save_path)
        meas.server = desc
        source = f"live:{base}"
        if source not in meas.sources:
            meas.sources.append(source)
        todo = [c for c in levels if c not in meas.done_concurrencies]
        inputs: list[dict[str, Any]] = []
        if todo:
            inputs, how = prepare_prompts(base, prompts, server=desc, chat_template=chat_template,
                                          timeout=timeout, retries=retries, backoff_s=backoff_s)
            note = f"prompts: {how}"
            if note not in meas.sources:
                meas.sources.append(note)
        # records of a concurrency that did not finish last time are redone as a whole
        meas.requests = [r for r in meas.requests if r.concurrency in meas.done_concurrencies
                         or r.concurrency not in todo]
        own = progress if progress not in (True, False, None) else None
        bar = own or (_make_progress() if progress is True else _NoProgress())
        if bar is not own and hasattr(bar, "start"):
            bar.start()
        try:
            for c in levels:
                if c not in todo:
                    bar.add_task(f"concurrency {c}: done in an earlier run", total=1, completed=1)
            if todo:
                asyncio.run(_run_levels(run, desc, inputs, todo, bar, max_new_tokens=max_new_tokens,
                                        num_requests=num_requests, ignore_eos=ignore_eos, timeout=timeout,
                                        retries=retries, backoff_s=backoff_s, warmup=warmup,
                                        flush_cache=flush_cache, min_step_samples=min_step_samples,
                                        on_done=on_concurrency_done))
        finally:
            if bar is not own and hasattr(bar, "stop"):
                bar.stop()
    except LiveServerError as exc:
        if not run.started:
            raise
        raise _with_partial(exc, run) from exc
    except InputError:
        raise
    except BaseException:
        if run.started:
            _save_partial(run)
        raise
    return run.meas


def _save_partial(run: _Run) -> str | None:
    """Write what was measured, the unfinished concurrency's finished requests included (redone on resume)."""
    if run.partial:
        run.meas.requests = run.meas.requests + run.partial
        run.partial = []
    if run.save_path is None:
        return None
    try:
        run.meas.save(run.save_path)
    except OSError:
        return None
    return run.save_path


def _with_partial(exc: LiveServerError, run: _Run) -> LiveServerError:
    saved = _save_partial(run)
    done = sorted(run.meas.done_concurrencies)
    n = len(run.meas.requests)
    if saved:
        note = (f"measurements so far ({n} requests; concurrencies done: {done or 'none'}) saved to {saved}; "
                "resume from that file to continue")
    elif run.save_path:
        note = f"could not save the measurements so far to {run.save_path}"
    else:
        note = f"measurements so far ({n} requests) not saved: no save path given"
    return LiveServerError(f"{exc.message} ({note})", endpoint=exc.endpoint, status=exc.status, saved_to=saved,
                           partial=run.meas)


async def _run_levels(run: _Run, desc: ServerDescription, inputs: list[dict[str, Any]], todo: list[int], bar: Any,
                      *, max_new_tokens: int, num_requests: int | None, ignore_eos: bool, timeout: float,
                      retries: int, backoff_s: float, warmup: int, flush_cache: bool, min_step_samples: int,
                      on_done: Callable[[int, Measurements], None] | None) -> None:
    base, meas = run.base, run.meas
    incremental = _incremental(desc)
    bound = max_step_tokens(desc)
    top = max(todo)
    limits = httpx.Limits(max_connections=top + 4, max_keepalive_connections=top + 4)
    async with httpx.AsyncClient(timeout=_timeout(timeout), limits=limits, trust_env=False) as client:
        metrics_ok = True
        offset = 0
        run.started = True
        for i in range(max(0, warmup)):
            payload = _payload(inputs[i % len(inputs)], min(max_new_tokens, 16), ignore_eos)
            await _generate_with_retries(client, base, payload, incremental=incremental, timeout=timeout,
                                         retries=retries, backoff_s=backoff_s)
        for c in todo:
            n = requests_at(c, num_requests)
            task = bar.add_task(f"concurrency {c}: {n} requests, up to {max_new_tokens} tokens each", total=n)
            if flush_cache:  # best effort: SGLang refuses (400) while requests run; older servers may lack it
                try:
                    await _request_async(client, "POST", base, "/flush_cache", retries=1, backoff_s=backoff_s,
                                         allow=range(400, 600))
                except LiveServerError:
                    pass
            if metrics_ok:
                metrics_ok = await _read_metrics(client, base, meas, c, "before", retries, backoff_s)
            run.partial = []
            run.started = True
            numbers = iter(range(n))

            async def worker(c: int = c, task: Any = task, it: Any = numbers, offset: int = offset) -> None:
                for k in it:
                    src = inputs[(offset + k) % len(inputs)]
                    st = await _generate_with_retries(client, base, _payload(src, max_new_tokens, ignore_eos),
                                                      incremental=incremental, timeout=timeout, retries=retries,
                                                      backoff_s=backoff_s)
                    prompt_len = len(src["input_ids"]) if "input_ids" in src else 0
                    run.partial.append(_record(st, c, prompt_len))
                    bar.advance(task)

            workers = [asyncio.create_task(worker()) for _ in range(c)]
            try:
                done, pending = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
                failed = [t for t in done if t.exception() is not None]
                if failed:
                    raise failed[0].exception()  # type: ignore[misc]
            finally:
                for t in workers:
                    t.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
            offset += n
            records = sorted(run.partial, key=lambda r: r.chunk_times[0])
            run.partial = []
            speculative = desc.algorithm != "none" or any(r.spec_verify_ct for r in records)
            meas.requests.extend(records)
            meas.step_times.extend(step_times_from_records(records, max_step_tokens=bound,
                                                           min_samples=min_step_samples, concurrency=c))
            if speculative:
                meas.accept_lengths.extend(accept_lengths_from_records(records, max_step_tokens=bound))
            meas.throughput.append(throughput_point(records, c, speculative=speculative))
            if metrics_ok:
                metrics_ok = await _read_metrics(client, base, meas, c, "after", retries, backoff_s)
            meas.done_concurrencies = sorted(set(meas.done_concurrencies) | {c})
            if run.save_path is not None:
                meas.save(run.save_path)
            if on_done is not None:
                on_done(c, meas)


def _incremental(desc: ServerDescription) -> bool | None:
    # --stream-output (0.5.8) / --incremental-streaming-output (0.5.10, 0.5.23): deltas instead of
    # cumulative output_ids (srt/server_args.py; srt/arg_groups/fields/serving.py).
    for key in ("incremental_streaming_output", "stream_output"):
        v = desc.raw.get(key)
        if isinstance(v, bool):
            return v
    return None


def _payload(src: dict[str, Any], max_new_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    return {**src, "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos,
                                "stream_interval": 1}}


async def _generate_with_retries(client: httpx.AsyncClient, base: str, payload: dict[str, Any], *,
                                 incremental: bool | None, timeout: float, retries: int,
                                 backoff_s: float) -> _Stream:
    tries = max(1, retries)
    last: _Transient | None = None
    for attempt in range(1, tries + 1):
        try:
            return await _stream_generate(client, base, payload, incremental=incremental, timeout=timeout)
        except _Transient as exc:
            last = exc
        if attempt < tries:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
    assert last is not None
    raise _give_up("POST", base, "/generate", tries, last)


async def _read_metrics(client: httpx.AsyncClient, base: str, meas: Measurements, concurrency: int, point: str,
                        retries: int, backoff_s: float) -> bool:
    """Add /metrics samples; False when the server has no /metrics (started without --enable-metrics)."""
    resp = await _request_async(client, "GET", base, "/metrics", retries=retries, backoff_s=backoff_s,
                                allow=range(400, 500))
    if not resp.is_success:
        return False
    meas.prometheus.update(parse_prometheus(resp.text, extra_labels={"simspec_concurrency": str(concurrency),
                                                                     "simspec_point": point}))
    if point == "after":
        meas.prometheus.update(_bare(parse_prometheus(resp.text)))
    return True


def measure(base_url: str, concurrencies: Sequence[int], *, prompts_path: str | Path | None = None,
            **kwargs: Any) -> Measurements:
    """describe_server + load_prompts + run_workload in one call (kwargs go to run_workload)."""
    prompts = load_prompts(prompts_path)
    return run_workload(base_url, prompts, concurrencies, **kwargs)


__all__ = [
    "CHAT_TEMPLATES", "LiveServerError", "PROMETHEUS_SAMPLES", "accept_lengths_from_records", "algorithm_name",
    "default_prompts_path", "describe_server", "description_from_server_info", "guess_chat_template",
    "iteration_segments", "load_prompts", "max_step_tokens", "measure", "normalise_base_url", "parse_prometheus",
    "prepare_prompts", "render_messages", "requests_at", "run_workload", "server_step_times",
    "step_times_from_records", "throughput_point",
]
