"""kunlun-fleet controller-side package (CLI, reports, simulated fleet tooling)."""
