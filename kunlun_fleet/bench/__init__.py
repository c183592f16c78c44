"""The bench's controller side: results.json (gates, curves), the capacity plan and the
report. The measuring is roles/bench with library/bench_point.py (aiperf)."""
