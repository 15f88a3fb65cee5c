"""Errors a user can act on."""


class ConfigError(ValueError):
    """A configuration that cannot run. The message says what to change."""


class RankFailedError(RuntimeError):
    """One or more ranks failed; the message names them and carries their tracebacks."""


class RequestFieldError(ConfigError):
    """A ConfigError about one field of a request (GenerateRequest's field name, e.g. "height"), raised by
    request.resolve_request: serve names the request's field from `field`, never from the message's text."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
