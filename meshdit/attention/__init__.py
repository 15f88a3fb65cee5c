"""Attention kernels and sequence-parallel attention (Ulysses, Ring, USP)."""
