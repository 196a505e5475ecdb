"""The two ways a request can fail, kept apart so that every caller can tell them apart.

A :class:`RequestError` is the caller's: the request is invalid in itself (a sampling setting out
of range, a prompt too long, a token id outside the vocabulary).  A server answers it with a 400.
An :class:`EngineFailure` is the engine's: something broke while the request was being served;
the request is failed, the engine is reset and serves the next one.  A server answers it with a 500.
"""


class RequestError(ValueError):
    """The request itself is invalid; the message names the field and the allowed range."""


class EngineFailure(RuntimeError):
    """The engine failed while serving this request (not the request's fault)."""
