"""Parallel strategies: sequence.py and pipefusion.py install hooks (apply_sequence_parallel, PipeFusion);
cfg.py and data.py split work without hooks; parallelize.py combines them all into one Parallelized."""
