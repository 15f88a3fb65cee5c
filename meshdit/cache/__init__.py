"""Step caching (DBCache, First-Block Cache, TaylorSeer) whose skip decisions every rank takes alike, as serial
would: settings.py (the request's `--cache` options), signal.py (the rank-agreed change signal), step_cache.py
(the hooks on the plan's block lists), run.py (one generation's caches and its report). docs/caching.md."""
from .settings import METHODS, NAMED_PRESETS, PRESETS, CacheSettings, transformer_block_count

__all__ = ["METHODS", "NAMED_PRESETS", "PRESETS", "CacheSettings", "transformer_block_count"]
