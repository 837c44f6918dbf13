"""`simspec ngram`: output, corpus formats, tokenization and bad input (one line, exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from simspec.cli import main
from simspec.errors import InputError
from simspec.ngram import Sequence, load_corpus, replay
from simspec.ngram.config import NgramConfig

DATA = Path(__file__).resolve().parent / "data" / "ngram"
OUTPUTS = DATA / "outputs.jsonl"
TEXT = DATA / "sample.txt"


def run(*args: str):
    return CliRunner().invoke(main, ["ngram", *args])


def bad(result, *fragments: str) -> str:
    """Exit 2 with one line on stderr naming what is wrong, never a traceback."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_json_output_parses_and_matches_the_api():
    result = run(str(OUTPUTS), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["tokenization"] == "token ids as recorded"
    assert out["num_requests"] == 4 and len(out["requests"]) == 4
    assert len(out["histogram"]) == 12 and sum(out["histogram"]) == out["verify_steps"]
    seqs, _ = load_corpus(OUTPUTS)
    api = replay(seqs, NgramConfig())
    assert out["histogram"] == api.histogram
    assert out["mean_accept_length"] == pytest.approx(api.mean_accept_length)
    assert [r["name"] for r in out["requests"]] == ["req-0", "req-1", "req-2", "req-3"]
    assert out["requests"][3]["prompt_tokens"] == 16  # `input_ids` read as the prompt


def test_table_output_names_the_tokenization():
    result = run(str(TEXT))
    assert result.exit_code == 0, result.output
    assert "UTF-8 bytes" in result.stdout
    assert "mean accept length" in result.stdout
    assert "block 3" in result.stdout


def test_sweep_is_a_grid():
    result = run(str(OUTPUTS), "--sweep", "num-draft-tokens=4,8", "--sweep", "max_bfs_breadth=1,10",
                 "--concurrency", "2", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["sweep"] == {"num_draft_tokens": [4, 8], "max_bfs_breadth": [1, 10]}
    combos = [(r["swept"]["num_draft_tokens"], r["swept"]["max_bfs_breadth"]) for r in out["results"]]
    assert combos == [(4, 1), (4, 10), (8, 1), (8, 10)]
    assert all(r["concurrency"] == 2 for r in out["results"])
    assert [len(r["histogram"]) for r in out["results"]] == [4, 4, 8, 8]
    table = run(str(OUTPUTS), "--sweep", "concurrency=1,2")
    assert table.exit_code == 0 and "concurrency" in table.stdout


def test_text_jsonl_and_bytes_fallback(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"text": "abcabcabc", "prompt": "xy"}\n\n{"text": "\\u00e9\\u00e9"}\n', encoding="utf-8")
    seqs, name = load_corpus(f)
    assert "UTF-8 bytes" in name
    assert seqs[0].output_ids == list(b"abcabcabc") and seqs[0].prompt_ids == list(b"xy")
    assert seqs[1].output_ids == list("éé".encode())
    out = json.loads(run(str(f), "--json").stdout)
    assert "UTF-8 bytes" in out["tokenization"]


def _tiny_tokenizer(path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "on": 4, "mat": 5, ".": 6}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    out = path / "tokenizer.json"
    tok.save(str(out))
    return out


def test_tokenizer_json(tmp_path):
    tok = _tiny_tokenizer(tmp_path)
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat .\n\nthe cat sat on the mat . the cat sat\n", encoding="utf-8")
    seqs, name = load_corpus(corpus, tok)
    assert name == f"tokenizers: {tok}"
    assert seqs[0].output_ids == [1, 2, 3, 4, 1, 5, 6]
    result = run(str(corpus), "--tokenizer", str(tok), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["tokenization"] == f"tokenizers: {tok}"
    assert out["output_tokens"] == 7 + 10
    assert out["requests"][1]["accepted_drafts"] > 0  # the second block repeats the first


def test_tokenizer_given_for_an_ids_file_is_said_unused(tmp_path):
    tok = _tiny_tokenizer(tmp_path)
    _, name = load_corpus(OUTPUTS, tok)
    assert "unused" in name


def test_tokenizers_missing_is_a_clear_error(tmp_path, monkeypatch):
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises ImportError
    with pytest.raises(InputError, match="pip install tokenizers"):
        load_corpus(TEXT, tok)
    bad(run(str(TEXT), "--tokenizer", str(tok)), "--tokenizer", "tokenizers")


def test_bad_tokenizer_file(tmp_path):
    pytest.importorskip("tokenizers")
    tok = tmp_path / "tokenizer.json"
    tok.write_text('{"not": "a tokenizer"}', encoding="utf-8")
    bad(run(str(TEXT), "--tokenizer", str(tok)), str(tok), "--tokenizer", "not a tokenizer.json")


@pytest.mark.parametrize(("args", "fragments"), [
    (["missing.jsonl"], ["missing.jsonl", "not found"]),
    ([str(OUTPUTS), "--num-draft-tokens", "0"], ["--num-draft-tokens", ">= 1"]),
    ([str(OUTPUTS), "--num-draft-tokens", "-4"], ["--num-draft-tokens", ">= 1"]),
    ([str(OUTPUTS), "--num-draft-tokens", "many"], ["--num-draft-tokens", "whole number"]),
    ([str(OUTPUTS), "--min-bfs-breadth", "5", "--max-bfs-breadth", "2"], ["--min-bfs-breadth", "<= max_bfs_breadth"]),
    ([str(OUTPUTS), "--match-type", "DFS"], ["--match-type", "BFS, PROB"]),
    ([str(OUTPUTS), "--max-trie-depth", "1"], ["--max-trie-depth", ">= 2"]),
    ([str(OUTPUTS), "--capacity", "10"], ["--capacity", "max_trie_depth"]),
    ([str(OUTPUTS), "--sglang-version", "0.4.6"], ["--sglang-version", "0.5.10"]),
    ([str(OUTPUTS), "--concurrency", "0"], ["--concurrency", ">= 1"]),
    ([str(OUTPUTS), "--tokenizer", "nowhere/tokenizer.json"], ["nowhere/tokenizer.json", "--tokenizer", "not found"]),
    ([str(OUTPUTS), "--sweep", "num_draft_tokens"], ["--sweep num_draft_tokens", "KEY=V1,V2"]),
    ([str(OUTPUTS), "--sweep", "colour=1,2"], ["--sweep colour=1,2", "unknown key", "num_draft_tokens"]),
    ([str(OUTPUTS), "--sweep", "num_draft_tokens=4,0"], ["--sweep num_draft_tokens=4,0", ">= 1"]),
    ([str(OUTPUTS), "--sweep", "max_bfs_breadth=1", "--sweep", "max_bfs_breadth=2"], ["swept twice"]),
    ([str(OUTPUTS), "--requests", "some"], ["--requests", "whole number"]),
    ([str(OUTPUTS), "--engine", "turbo"], ["--engine", "auto, compiled or literal"]),
])
def test_bad_input(args, fragments):
    bad(run(*args), *fragments)


@pytest.mark.parametrize(("content", "fragments"), [
    ('{"output_ids": [1, 2, 3]}\n{"output_ids": [1, 2,\n', ["line 2", "not valid JSON"]),
    ('{"output_ids": [1, 2, 3]}\n\n[1, 2]\n', ["line 3", "JSON object"]),
    ('{"output_ids": [1, -2]}\n', ["line 1", "output_ids", "-2"]),
    ('{"output_ids": "1 2"}\n', ["line 1", "output_ids", "list of token ids"]),
    ('{"output_ids": [1], "prompt_ids": [true]}\n', ["line 1", "prompt_ids"]),
    ('{"tokens": [1, 2]}\n', ["line 1", "`output_ids`", "`text`", "tokens"]),
    ('{"text": 5}\n', ["line 1", "`text` must be a string"]),
    ('{"text": "ab", "prompt_ids": [1]}\n', ["line 1", "prompt must be text"]),
    ("\n\n", ["no requests"]),
])
def test_malformed_jsonl(tmp_path, content, fragments):
    f = tmp_path / "bad.jsonl"
    f.write_text(content, encoding="utf-8")
    line = bad(run(str(f)), str(f), *fragments)
    with pytest.raises(InputError):
        load_corpus(f)
    assert line.startswith("error:")


def test_not_utf8_text(tmp_path):
    f = tmp_path / "bin.txt"
    f.write_bytes(b"\xff\xfe\x00abc")
    bad(run(str(f)), str(f), "UTF-8")


def test_a_directory_is_not_a_corpus(tmp_path):
    bad(run(str(tmp_path)), "not a file")


def test_subprocess_exit_code_and_one_line():
    proc = subprocess.run([sys.executable, "-m", "simspec.cli", "ngram", "no/such/corpus.jsonl"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no/such/corpus.jsonl" in proc.stderr and "Traceback" not in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "simspec.cli", "ngram", str(OUTPUTS), "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verify_steps"] > 0


def test_load_corpus_returns_sequences():
    seqs, name = load_corpus(OUTPUTS)
    assert all(isinstance(s, Sequence) for s in seqs)
    assert name == "token ids as recorded"
    assert seqs[0].name == "req-0" and len(seqs[0].prompt_ids) == 16
