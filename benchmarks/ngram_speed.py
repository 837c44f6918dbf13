"""How fast `simspec ngram` replays: median of a few runs over a fixed synthetic corpus, in tokens per second.

The corpus (fixed seed): 1,000 requests x 1,000 output tokens (1M replayed tokens) with a 64-token prompt each,
drawn from a small Markov chain (2,000-token vocabulary, each token followed by one of ~8 successors with
Zipf-like weights) that, now and then, copies a span of 4-40 tokens from earlier in the same request or from a
shared pool of "boilerplate" passages, the way model outputs repeat their prompt, code and phrases. Default
configuration: SGLang 0.5.10, num_draft_tokens 12, breadth 1..10, max_trie_depth 18, BFS.

    python benchmarks/ngram_speed.py [--requests 1000] [--tokens 1000] [--runs 3] [--concurrency 1]
                                     [--engine auto|compiled|literal] [--match-type BFS|PROB]

Not a timed test: it prints figures for the README. A warm-up replay of two requests comes first and is timed
apart: it compiles the numba engine (or loads it from numba's on-disk cache).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from simspec.ngram import NgramConfig, Sequence, replay


def markov_corpus(requests: int, tokens: int, prompt: int = 64, vocab: int = 2000, seed: int = 0) -> list[Sequence]:
    rng = random.Random(seed)
    succ = [[rng.randrange(vocab) for _ in range(8)] for _ in range(vocab)]
    weights = [1 / (k + 1) for k in range(8)]
    pool = []
    for _ in range(200):
        t = rng.randrange(vocab)
        passage = []
        for _ in range(rng.randint(8, 60)):
            t = rng.choices(succ[t], weights)[0]
            passage.append(t)
        pool.append(passage)

    def text(n: int, t: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            r = rng.random()
            if r < 0.012 and len(out) > 8:  # repeat something said earlier in this request
                a = rng.randrange(len(out))
                out.extend(out[a:a + rng.randint(4, 40)])
            elif r < 0.02:  # a stock phrase
                out.extend(rng.choice(pool))
            else:
                t = rng.choices(succ[t], weights)[0]
                out.append(t)
            t = out[-1]
        return out[:n]

    seqs = []
    for i in range(requests):
        p = text(prompt, rng.randrange(vocab))
        seqs.append(Sequence(output_ids=text(tokens, p[-1]), prompt_ids=p, name=f"r{i}"))
    return seqs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--match-type", default="BFS")
    args = ap.parse_args()
    seqs = markov_corpus(args.requests, args.tokens)
    n = sum(len(s.output_ids) for s in seqs)
    config = NgramConfig(match_type=args.match_type)
    t0 = time.perf_counter()
    replay(seqs[:2], config, args.concurrency, engine=args.engine)
    print(f"warm-up (compiling the engine or loading it from the cache): {time.perf_counter() - t0:.1f} s")
    times, cpu = [], []
    result = None
    for _ in range(args.runs):
        t0, c0 = time.perf_counter(), time.process_time()
        result = replay(seqs, config, args.concurrency, engine=args.engine)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    med, med_cpu = statistics.median(times), statistics.median(cpu)
    assert result is not None
    print(f"{n:,} replayed tokens, {args.requests} requests, concurrency {args.concurrency}, engine {result.engine}, "
          f"{config.label()}")
    print(f"accept length {result.mean_accept_length:.3f} over {result.verify_steps:,} verify steps")
    print(f"median of {args.runs}: {med:.2f} s wall = {n / med:,.0f} tokens/s; {med_cpu:.2f} s CPU = "
          f"{n / med_cpu:,.0f} tokens/s  (wall runs: {', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
