"""Errors a user can act on."""


class ConfigError(ValueError):
    """A configuration that cannot run. The message says what to change."""


class RankFailedError(RuntimeError):
    """One or more ranks failed; the message names them and carries their tracebacks."""
