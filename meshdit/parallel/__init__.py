"""Parallel strategies, each applied by an apply_<x> function; parallelize.py combines them."""
