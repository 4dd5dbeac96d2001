"""Probe app of benchmarks/engine_overhead.py."""
