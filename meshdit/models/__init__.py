"""Per-family model plans and the registry that finds them (imports are lazy)."""
