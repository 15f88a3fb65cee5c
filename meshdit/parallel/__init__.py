"""Parallel strategies: sequence.py and pipefusion.py install hooks (apply_sequence_parallel, PipeFusion);
cfg.py and data.py split work without hooks; meshdit.combine.parallelize combines them all into one Parallelized."""
