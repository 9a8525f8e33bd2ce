"""OpenAI's error object: :class:`APIError` (an HTTP status and ``{"error": {...}}``) and :func:`bad`, its 400."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class APIError(Exception):
    """An error answered as OpenAI does: HTTP ``status`` and ``{"error": {"message", "type", "param", "code"}}``.

    Args:
        status: 400 (bad request), 401 (no or wrong key), 404 (unknown model or path), 413 (body
            too large), 429 (queue full; ``headers`` carries ``Retry-After``), 500 (the engine failed).
        message: what is wrong and what to change.
        type: OpenAI's error type (``invalid_request_error``, ``authentication_error``, ...).
        param: the request field at fault (``messages[2].content``), or None.
        code: a machine-readable code (``context_length_exceeded``, ``invalid_api_key``, ...).
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = dict(headers or {})

    def __reduce__(self) -> tuple:  # pickled across the engine process's pipe with its fields
        return _api_error, (self.status, self.message, self.type, self.param, self.code, self.headers)

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI sends with the error."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _api_error(status: int, message: str, type: str, param: str | None, code: str | None,
               headers: Mapping[str, str]) -> APIError:
    return APIError(status, message, type=type, param=param, code=code, headers=headers)


def bad(param: str | None, message: str, code: str = "invalid_value") -> APIError:
    """A 400 ``invalid_request_error`` about ``param``."""
    return APIError(400, f"{param}: {message}" if param else message, param=param, code=code)


__all__ = ["APIError", "bad"]
