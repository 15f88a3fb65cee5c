"""Side-by-side benchmarks: `python -m benchmarks.run [--quick] [--out benchmarks/results]`."""
