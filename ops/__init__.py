"""Operator tooling: the demo stack and its supervisor, drills, traffic replay,
benchmarks, embedded Redis, and every management command."""
