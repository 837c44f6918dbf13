"""Reading a replay corpus: recorded token ids, or text tokenized here.

Formats (picked by the file name):
- `.jsonl` / `.ndjson` / `.json`: one JSON object per line (blank lines skipped). Token ids: `output_ids`
  (what `simspec calibrate` records), optionally `prompt_ids` or `input_ids` for the prompt (a line with
  `output_ids` is read as ids, whatever `text` it also carries: SGLang's /generate responses carry both, for
  the same output). Text: `text` (the output), optionally `prompt`
  (its prompt as text). Optional `id` or `name` labels the request. Other keys are
  ignored, so records with more fields can be fed as they are.
- anything else: plain text, one document per block of lines separated by blank lines; each block is one
  request's output, with no prompt.
- every request needs an output (an empty one is refused, naming its line), and at least one needs 2 tokens or
  more: a request is verified only from its second output token on (the first comes from prefill).

Text is tokenized with the `tokenizers` library from a local tokenizer.json (`tokenizer=`), without special
tokens; with no tokenizer it falls back to UTF-8 bytes as token ids (0..255). The tokenization used is
returned by name, and every output says it: accept lengths over bytes are not accept lengths over a model's
tokens.

Prompts: SGLang does not insert prompts into the trie at prefill (ngram_worker.py only inserts after a
verify), but the matched suffix and the inserted window are the last max_trie_depth tokens of prompt + output,
so a prompt's tail matters for a request's first steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simspec.errors import InputError
from simspec.ngram.config import MAX_TOKEN_ID
from simspec.ngram.replayer import Sequence

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
BYTES = "UTF-8 bytes (no tokenizer given: each byte is a token)"
IDS = "token ids as recorded"


class _Tokenizer:
    def __init__(self, path: str | Path | None) -> None:
        self.path = path
        self.used = False
        self._tok: Any = None
        if path is None:
            return
        p = Path(path)
        if not p.is_file():
            raise InputError("tokenizer file not found (expected a local tokenizer.json)", file=str(path),
                             key="--tokenizer")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise InputError("reading a tokenizer needs the `tokenizers` package: pip install tokenizers",
                             file=str(path), key="--tokenizer") from None
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as err:  # the library raises its own Exception subclasses for any bad file
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise InputError(f"not a tokenizer.json the tokenizers library can read ({first})", file=str(path),
                             key="--tokenizer") from None

    @property
    def name(self) -> str:
        if self._tok is None:
            return BYTES
        return f"tokenizers: {self.path}"

    def encode(self, text: str) -> list[int]:
        self.used = True
        if self._tok is None:
            return list(text.encode("utf-8"))
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def _ids(value: Any, where: str, file: str, key: str) -> list[int]:
    if not isinstance(value, list):
        raise InputError(f"`{key}` must be a list of token ids (integers 0 .. {MAX_TOKEN_ID}), "
                         f"got {type(value).__name__}", file=file, key=where)
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > MAX_TOKEN_ID:
            raise InputError(f"`{key}` must be a list of token ids (integers 0 .. {MAX_TOKEN_ID}), got {v!r}",
                             file=file, key=where)
    return value


def _text(value: Any, where: str, file: str, key: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"`{key}` must be a string, got {type(value).__name__}", file=file, key=where)
    return value


def _read_jsonl(path: Path, tok: _Tokenizer) -> tuple[list[Sequence], bool]:
    file = str(path)
    seqs = []
    saw_ids = False
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"not valid JSON ({err.msg} at column {err.colno})", file=file,
                                 key=where) from None
            if not isinstance(obj, dict):
                raise InputError(f"expected a JSON object with `output_ids` or `text`, got {type(obj).__name__}",
                                 file=file, key=where)
            name = obj.get("id", obj.get("name"))
            name = None if name is None else str(name)
            if "output_ids" in obj:
                out = _ids(obj["output_ids"], where, file, "output_ids")
                saw_ids = True
                if "prompt_ids" in obj and "input_ids" in obj:
                    raise InputError("give the prompt as `prompt_ids` or `input_ids`, not both", file=file,
                                     key=where)
                pkey = "prompt_ids" if "prompt_ids" in obj else "input_ids"
                prompt = _ids(obj[pkey], where, file, pkey) if pkey in obj else []
            elif "text" in obj:
                if "prompt_ids" in obj or "input_ids" in obj:
                    raise InputError("with `text` the prompt must be text too (`prompt`), not token ids",
                                     file=file, key=where)
                out = tok.encode(_text(obj["text"], where, file, "text"))
                prompt = tok.encode(_text(obj["prompt"], where, file, "prompt")) if "prompt" in obj else []
            else:
                raise InputError("needs `output_ids` (token ids) or `text` (found: "
                                 f"{', '.join(sorted(obj)) or 'no keys'})", file=file, key=where)
            if not out:
                field = "output_ids" if "output_ids" in obj else "text"
                raise InputError(f"`{field}` holds no output tokens: each request needs an output (at least 2 "
                                 "tokens for a verify step, the first coming from prefill); drop the line or fill it",
                                 file=file, key=where)
            seqs.append(Sequence(output_ids=list(out), prompt_ids=list(prompt), name=name))
    return seqs, saw_ids


def _read_text(path: Path, tok: _Tokenizer) -> list[Sequence]:
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"not UTF-8 text (byte {err.start}); token ids go in a .jsonl file", file=str(path)) \
            from None
    blocks: list[str] = []
    cur: list[str] = []
    for line in content.splitlines():
        if line.strip():
            cur.append(line)
        elif cur:
            blocks.append("\n".join(cur))
            cur = []
    if cur:
        blocks.append("\n".join(cur))
    return [Sequence(output_ids=tok.encode(b), name=f"block {i + 1}") for i, b in enumerate(blocks)]


def tok_count(seqs: list[Sequence]) -> str:
    n = len(seqs)
    return f"{n} request{'s' if n != 1 else ''}, {sum(len(s.output_ids) for s in seqs)} output token(s) in all"


def load_corpus(path: str | Path, tokenizer: str | Path | None = None) -> tuple[list[Sequence], str]:
    """Read `path` into sequences; returns (sequences, how they were tokenized)."""
    p = Path(path)
    if not p.exists():
        raise InputError("corpus file not found", file=str(path))
    if not p.is_file():
        raise InputError("not a file (expected a .jsonl of token ids or text, or a plain text file)",
                         file=str(path))
    tok = _Tokenizer(tokenizer)
    try:
        if p.suffix.lower() in JSONL_SUFFIXES:
            seqs, saw_ids = _read_jsonl(p, tok)
        else:
            seqs, saw_ids = _read_text(p, tok), False
    except UnicodeDecodeError as err:
        raise InputError(f"not UTF-8 (byte {err.start})", file=str(path)) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror}", file=str(path)) from None
    if not seqs:
        raise InputError("no requests in the file (every line or block was empty)", file=str(path))
    if all(len(s.output_ids) < 2 for s in seqs):
        raise InputError(f"nothing to replay: every output is shorter than 2 tokens ({tok_count(seqs)}); a request "
                         "is verified only from its second output token on (the first comes from prefill)",
                         file=str(path))
    if tok.used and saw_ids:
        name = f"{IDS}; text: {tok.name}"
    elif tok.used:
        name = tok.name
    else:
        name = IDS
    if tokenizer is not None and not tok.used:
        name += f" (--tokenizer {tokenizer} unused: the file holds token ids)"
    return seqs, name
