"""What-if studies: sweeps, plots, cost and the optimizer."""
