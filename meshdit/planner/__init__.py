"""The layout planner (`meshdit plan`, `--layout auto`): every legal layout of a world with its predicted per-rank
memory and time, from the model's config JSON and per-machine figures; the cost model is docs/planner.md.
No torch is imported here (only `planner.calibrate`, which measures this machine, imports it)."""
