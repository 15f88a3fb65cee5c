"""Helpers shared by the tests and the benchmarks: a pool of gloo ranks and tiny models."""
