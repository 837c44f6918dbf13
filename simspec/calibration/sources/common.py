"""What the offline sources share: opening files, SGLang's server arguments -> ServerDescription, algorithm names.

SGLang prints its arguments once at start-up (sglang/srt/entrypoints/engine.py, `logger.info(f"{server_args=}")`):
0.5.8 and 0.5.10 print the dataclass repr, `server_args=ServerArgs(model_path='...', tp_size=8, ...)`; 0.5.23
prints the resolved dict, `server_args={'model_path': '...', 'tp_size': 8, ...}`
(`_server_args_for_logging` -> `ServerArgs.resolved_dict()`). `/server_info` (bench_serving's `server_info`) is
the same fields as a JSON object plus `version` and `internal_states` (sglang/srt/entrypoints/http_server.py).
Both are logged AFTER argument post-processing: `--speculative-algorithm NEXTN` already reads `EAGLE` there
(0.5.8/0.5.10 server_args.py `if self.speculative_algorithm == "NEXTN": self.speculative_algorithm = "EAGLE"`;
0.5.23 resolves the reserved alias NEXTN to EAGLE in speculative/spec_registry.py). For the DeepSeek-style
architectures whose MTP layer ships with the checkpoint, SGLang then sets `speculative_draft_model_path` to
`model_path`; that is how an MTP server is told apart from an EAGLE one here.
"""

from __future__ import annotations

import ast
import gzip
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from simspec.calibration.measurements import ServerDescription
from simspec.errors import InputError

# SGLang's --speculative-algorithm choices -> simspec's names. NEXTN is an alias of EAGLE with the model's own
# NextN layer (sglang/srt/speculative/spec_info.py); NGRAM was called LOOKAHEAD before.
ALGORITHMS = {
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "NEXTN": "mtp",
    "MTP": "mtp",
    "STANDALONE": "standalone",
    "NGRAM": "ngram",
    "LOOKAHEAD": "ngram",
    "NONE": "none",
}


def map_algorithm(name: Any, *, file: str | None = None, key: str = "speculative_algorithm") -> str:
    """SGLang's algorithm name (any case, None for no speculation) -> simspec's."""
    if name is None or (isinstance(name, str) and name.strip() in ("", "None", "null")):
        return "none"
    upper = str(name).strip().upper()
    if upper.startswith("SPECULATIVEALGORITHM."):  # an enum repr
        upper = upper.split(".", 1)[1]
    if upper not in ALGORITHMS:
        raise InputError(f"speculative algorithm {name!r} is not one simspec models; expected one of "
                         f"{', '.join(sorted(ALGORITHMS))} or None", file=file, key=key)
    return ALGORITHMS[upper]


def open_text(path: str | Path) -> Iterator[str]:
    """Lines of a text file, gzip-compressed or not; undecodable bytes are replaced, not fatal."""
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", file=str(p))
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt", encoding="utf-8", errors="replace") as fh:
            yield from fh
    except (OSError, EOFError) as err:
        raise InputError(f"cannot read: {err}", file=str(p)) from None


def json_safe(value: Any) -> Any:
    """Make a parsed value storable in Measurements (JSON): sets and tuples to lists, NaN/inf and objects to str."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((json_safe(v) for v in value), key=str)
    return str(value)


def _split_top_level(text: str) -> list[str]:
    """Split `a=1, b=[1, 2], c='x, y'` at the commas outside quotes and brackets."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "<":  # object reprs like <Enum.X: 1> may hold commas
            depth += 1
        elif c == ">" and depth > 0 and text[i - 1] != "-":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text  # an object repr SGLang printed (an enum, a path object): kept as its text


def parse_server_args_text(text: str, *, file: str | None = None, key: str | None = None) -> dict[str, Any]:
    """The text after `server_args=`: `ServerArgs(k=v, ...)` (0.5.8/0.5.10) or `{'k': v, ...}` (0.5.23)."""
    text = text.strip()
    if text.startswith("ServerArgs(") and text.endswith(")"):
        body = text[len("ServerArgs("):-1]
        out: dict[str, Any] = {}
        for part in _split_top_level(body):
            name, eq, value = part.partition("=")
            if not eq or not name.strip().isidentifier():
                raise InputError(f"cannot read {part[:60]!r} in ServerArgs(...): expected name=value", file=file,
                                 key=key)
            out[name.strip()] = _literal(value.strip())
        return out
    if text.startswith("{") and text.endswith("}"):
        whole = _literal(text)
        if isinstance(whole, dict):
            return {str(k): v for k, v in whole.items()}
        out = {}
        for part in _split_top_level(text[1:-1]):
            name, colon, value = part.partition(":")
            name = _literal(name.strip())
            if not colon or not isinstance(name, str):
                raise InputError(f"cannot read {part[:60]!r} in server_args={{...}}: expected 'name': value",
                                 file=file, key=key)
            out[name] = _literal(value.strip())
        return out
    raise InputError("expected server_args=ServerArgs(...) (SGLang 0.5.8-0.5.10) or server_args={...} (0.5.23)",
                     file=file, key=key)


def _opt_int(args: dict, *names: str) -> int | None:
    for n in names:
        v = args.get(n)
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float) and not (isinstance(v, float) and not math.isfinite(v)):
            return int(v)
    return None


def server_description_from_args(args: dict[str, Any], *, file: str | None = None,
                                 key: str = "server_args") -> ServerDescription:
    """ServerDescription from SGLang's server arguments (a logged `server_args=...` or a `/server_info` object).

    Field names are those of 0.5.8-0.5.23: `tp_size`, `speculative_algorithm`, `speculative_num_steps`,
    `speculative_eagle_topk`, `speculative_num_draft_tokens`, `disable_cuda_graph`, `cuda_graph_max_bs`
    (0.5.23: `cuda_graph_max_bs_decode`), `max_running_requests`, `mem_fraction_static`,
    `disable_overlap_schedule`, `scheduler_recv_interval`, `attention_backend`, the n-gram settings
    (`speculative_ngram_max_trie_depth`, called `speculative_ngram_branch_length` in 0.5.8) and `version`
    (/server_info only).
    """
    algorithm = map_algorithm(args.get("speculative_algorithm"), file=file, key=f"{key}.speculative_algorithm")
    draft_path = args.get("speculative_draft_model_path")
    if algorithm == "eagle" and draft_path and draft_path == args.get("model_path"):
        algorithm = "mtp"  # NEXTN was rewritten to EAGLE and its draft path set to the model itself
    ngram: dict[str, float | int | str] = {}
    if algorithm == "ngram":
        for field, names in (("min_bfs_breadth", ("speculative_ngram_min_bfs_breadth",)),
                             ("max_bfs_breadth", ("speculative_ngram_max_bfs_breadth",)),
                             ("match_type", ("speculative_ngram_match_type",)),
                             ("max_trie_depth", ("speculative_ngram_max_trie_depth",
                                                 "speculative_ngram_branch_length")),
                             ("capacity", ("speculative_ngram_capacity",))):
            for n in names:
                v = args.get(n)
                if isinstance(v, int | float | str) and not isinstance(v, bool):
                    ngram[field] = v
                    break
    disable_graph = args.get("disable_cuda_graph")
    disable_overlap = args.get("disable_overlap_schedule")
    mem = args.get("mem_fraction_static")
    version = args.get("version")
    attention = args.get("attention_backend")
    return ServerDescription(
        model_path=str(args["model_path"]) if args.get("model_path") is not None else None,
        tp=_opt_int(args, "tp_size", "tp"),
        sglang_version=str(version) if version is not None else None,
        algorithm=algorithm,
        num_steps=_opt_int(args, "speculative_num_steps"),
        topk=_opt_int(args, "speculative_eagle_topk"),
        num_draft_tokens=_opt_int(args, "speculative_num_draft_tokens"),
        cuda_graph=(not disable_graph) if isinstance(disable_graph, bool) else None,
        cuda_graph_max_bs=_opt_int(args, "cuda_graph_max_bs", "cuda_graph_max_bs_decode"),
        max_running_requests=_opt_int(args, "max_running_requests"),
        mem_fraction_static=float(mem) if isinstance(mem, int | float) and not isinstance(mem, bool) else None,
        overlap_schedule=(not disable_overlap) if isinstance(disable_overlap, bool) else None,
        scheduler_recv_interval=_opt_int(args, "scheduler_recv_interval"),
        attention_backend=str(attention) if attention is not None else None,
        ngram=ngram,
        host=str(args["host"]) if args.get("host") is not None else None,
        raw=json_safe({k: v for k, v in args.items() if k != "internal_states"}),
    )


def skipped_note(kind: str, skipped: list[tuple[str, str]]) -> str:
    """A sources line that says what was skipped and where (first few)."""
    where = "; ".join(f"{k}: {why}" for k, why in skipped[:5])
    more = f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    return f"{kind}: skipped {len(skipped)} malformed ({where}{more})"
