"""One defaults.yaml coefficient fitted to one kernel table (validation/kernels), and the check that it still is.

The fit scripts of this kind (fit_moe_empty_blocks.py, fit_moe_program_rate.py) each name the coefficient, the
table (marked fitted), the bounds and the rounding; this runs them: the value that minimises the squared log error
over the table's compared points with every other coefficient at its default, or with --check whether the checked-in
value still beats its neighbours.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from scipy.optimize import minimize_scalar

from simspec import kernel_validation as kv
from simspec.calibration.fitting import check_minimum

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "simspec" / "presets" / "defaults.yaml"
GRID_POINTS = 60  # coarse log grid for objectives flat past their basin


@dataclass(frozen=True)
class TableFit:
    name: str  # the coefficient: its defaults.yaml name, also its Efficiencies field
    table: Path
    bounds: tuple[float, float]
    decimals: int
    check_step: float  # --check: the checked-in value must beat its neighbours this far away
    unset: float  # the coefficient's value when the mechanism is off, for the printed comparison
    coarse_grid: bool = False  # find the basin on a log grid first (the objective is flat beyond it)

    def objective(self, value: float, table: kv.FusedMoeTable) -> float:
        """Sum over the table's compared points of log(predicted / measured)^2 with the coefficient at `value`."""
        if not self.bounds[0] <= value <= self.bounds[1]:
            return math.inf
        result = kv.predict_table(table, eff=replace(kv.default_efficiencies(), **{self.name: value}))
        return sum(math.log(p.predicted_us / p.measured_us) ** 2 for p in result.compared)

    def checked_in(self) -> float:
        return float(yaml.safe_load(DEFAULTS.read_text())[self.name]["value"])

    def fitted(self, table: kv.FusedMoeTable) -> float:
        bounds = self.bounds
        if self.coarse_grid:
            lo, hi = bounds
            grid = [lo * (hi / lo) ** (i / GRID_POINTS) for i in range(GRID_POINTS + 1)]
            best = min(range(len(grid)), key=lambda i: self.objective(grid[i], table))
            bounds = (grid[max(best - 1, 0)], grid[min(best + 1, GRID_POINTS)])
        res = minimize_scalar(lambda x: self.objective(x, table), bounds=bounds, method="bounded",
                              options={"xatol": 1e-6})
        return round(float(res.x), self.decimals)

    def main(self, description: str) -> int:
        ap = argparse.ArgumentParser(description=description)
        ap.add_argument("--check", action="store_true",
                        help="verify that defaults.yaml's value minimises the fit objective (cheap: three evaluations)")
        args = ap.parse_args()
        table = kv.load_table(self.table)
        assert isinstance(table, kv.FusedMoeTable) and table.grid is not None and table.fitted
        if args.check:
            return check_minimum(lambda x: self.objective(x[0], table), (self.name,), (self.checked_in(),),
                                 (self.check_step,), DEFAULTS, "rerun this script and set the value it prints")
        value = self.fitted(table)
        for label, x in ((f"unset ({self.unset})", self.unset), (f"fitted {value}", value)):
            eff = replace(kv.default_efficiencies(), **{self.name: x})
            errors = " / ".join(f"{p.error_pct:+.1f}%" for p in kv.predict_table(table, eff=eff).compared)
            print(f"{label}: errors by size {errors}")
        print(f"{self.name}: {value}  (set it in {DEFAULTS.relative_to(ROOT)})")
        return 0
