"""Step caching (DBCache, First-Block Cache, TaylorSeer) whose skip decisions every rank takes alike, as serial
would: signal.py (the rank-agreed change signal), step_cache.py (the hooks on the plan's block lists), run.py (one
generation's caches and its report); the request's `--cache` options are meshdit/cache_settings.py, in the settings
layer (re-exported here). docs/caching.md."""
from ..cache_settings import METHODS, NAMED_PRESETS, PRESETS, CacheSettings, transformer_block_count

__all__ = ["METHODS", "NAMED_PRESETS", "PRESETS", "CacheSettings", "transformer_block_count"]
