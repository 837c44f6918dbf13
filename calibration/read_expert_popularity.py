"""Derive a MoE model's expert popularity spread (`moe_routing_spread`) from published routing statistics.

simspec's distinct_experts (timing/forward.py) lets each routed expert's chance of being chosen vary across the
experts of a layer as a gamma law of mean k/E; `moe_routing_spread` is that law's squared coefficient of variation
(0: every expert equally likely). This script reads it from the two kinds of published data presets/models.yaml
cites (the data stay in their authors' repositories, not this one):

- per-expert selection frequencies, one row per (language, layer) with columns Expert_0..Expert_{E-1}, each row the
  share of tokens whose top-k includes that expert (summing to k): sarelWeinberger/qwen-hebrew-finetuning @d82c831,
  cross_lang_moe_analysis/moe_csv_results/*_avg_activation.csv (Qwen3-30B-A3B, six evaluation sets). The spread is
  the squared CV of a layer's frequencies, taken over the sets pooled with equal weight, median over layers.

      python calibration/read_expert_popularity.py frequencies FILE.csv [FILE.csv ...] [--language English]

- a sorted load summary: the share of a layer's selections the top eighth of its experts take, as printed by
  johanna-rock/moe-balance @700358b analysis_notebook.ipynb ("summary: top-32 combined frequency per layer for
  <dataset>", DeepSeek-V3/R1, 256 experts). The spread is the gamma law's that gives each layer's share (a Lorenz
  point of the law), median over layers, per dataset.

      python calibration/read_expert_popularity.py top-share analysis_notebook.ipynb [--experts 256]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys

from scipy import optimize, stats

TOP_FRACTION = 1 / 8  # the moe-balance notebook prints the top 32 of 256 experts


def top_share(spread: float, fraction: float = TOP_FRACTION) -> float:
    """Share of all choices that the most chosen `fraction` of the experts take, when popularity follows a gamma law
    of squared CV `spread`: for a gamma law of shape a, the mass above a quantile x is P(Gamma(a + 1) > x)."""
    if spread <= 0:
        return fraction
    shape = 1.0 / spread
    threshold = stats.gamma.ppf(1.0 - fraction, shape)
    return float(stats.gamma.sf(threshold, shape + 1.0))


def spread_from_top_share(share: float, fraction: float = TOP_FRACTION) -> float:
    """The gamma law's squared CV whose top `fraction` of experts take `share` of the choices."""
    if not fraction < share < 1.0:
        raise ValueError(f"a top share of {share} is not between uniform routing's {fraction} and 1")
    return float(optimize.brentq(lambda s: top_share(s, fraction) - share, 1e-6, 100.0))


def squared_cv(values: list[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.pvariance(values, mean) / mean**2


def pooled(tables: list[dict[int, list[float]]]) -> dict[int, list[float]]:
    """Per layer the tables share, each expert's frequency averaged over the tables with equal weight."""
    layers = sorted(set.intersection(*(set(t) for t in tables)))
    return {layer: [statistics.fmean(col) for col in zip(*(t[layer] for t in tables), strict=True)]
            for layer in layers}


def pooled_spread(tables: list[dict[int, list[float]]]) -> tuple[float, dict[int, float]]:
    """(median over layers, per layer) squared CV of the frequencies pooled over the tables (pooled)."""
    per_layer = {layer: squared_cv(freqs) for layer, freqs in pooled(tables).items()}
    return statistics.median(per_layer.values()), per_layer


def read_frequencies(path: str, language: str) -> dict[int, list[float]]:
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("Language") == language]
    if not rows:
        raise SystemExit(f"{path}: no rows with Language = {language}")
    experts = sorted((c for c in rows[0] if c.startswith("Expert_")), key=lambda c: int(c.split("_")[1]))
    return {int(r["Layer"]): [float(r[c]) for c in experts] for r in rows}


def read_top_shares(notebook: str) -> dict[str, list[float]]:
    """Per dataset, the per-layer top-eighth shares (percent -> fraction) of the notebook's first printed summary
    for that dataset (later ones add expert replication, which is not the model's routing)."""
    with open(notebook) as f:
        cells = json.load(f)["cells"]
    text = "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))
    shares: dict[str, list[float]] = {}
    for block in text.split("summary: top-32 combined frequency per layer for ")[1:]:
        name, _, body = block.partition("\n")
        values = [float(v) / 100 for v in re.findall(r"^\s*layer \d+: ([\d.]+)%", body, flags=re.M)]
        if values and name.strip() not in shares:
            shares[name.strip()] = values
    if not shares:
        raise SystemExit(f"{notebook}: no 'top-32 combined frequency' summary found")
    return shares


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    fr = sub.add_parser("frequencies", help="per-expert selection frequency tables (CSV)")
    fr.add_argument("files", nargs="+")
    fr.add_argument("--language", default="English")
    ts = sub.add_parser("top-share", help="a notebook printing the top eighth's share per layer")
    ts.add_argument("notebook")
    ts.add_argument("--experts", type=int, default=256)
    args = ap.parse_args(argv)
    if args.kind == "frequencies":
        tables = [read_frequencies(p, args.language) for p in args.files]
        for path, table in zip(args.files, tables, strict=True):
            alone = statistics.median(squared_cv(v) for v in table.values())
            print(f"{path}: median squared CV over {len(table)} layers {alone:.2f}")
        median, per_layer = pooled_spread(tables)
        shares = []
        for freqs in pooled(tables).values():
            ranked = sorted(freqs, reverse=True)
            shares.append(sum(ranked[: round(len(ranked) * TOP_FRACTION)]) / sum(ranked))
        check = spread_from_top_share(statistics.median(shares))
        print(f"pooled, equal weight: moe_routing_spread {median:.2f} (median over {len(per_layer)} layers; "
              f"the gamma law through the median top-eighth share {statistics.median(shares):.3f} gives {check:.2f})")
    else:
        fraction = 32 / args.experts
        for name, shares in read_top_shares(args.notebook).items():
            spreads = [spread_from_top_share(s, fraction) for s in shares]
            print(f"{name}: top-32 share median {statistics.median(shares):.3f} over {len(shares)} layers -> "
                  f"moe_routing_spread {statistics.median(spreads):.2f} (median over layers; mean "
                  f"{statistics.fmean(spreads):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
