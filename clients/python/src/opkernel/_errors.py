"""The client's exceptions."""

from __future__ import annotations

from typing import Any, Optional


class OpkernelError(Exception):
    """Base of every error this client raises."""


class ApiError(OpkernelError):
    """The kernel answered with an error status.

    ``status`` is the HTTP status, ``code`` the API's stable error code from
    the JSON body (``bad_request``, ``not_found``, ``budget_exhausted``...;
    ``http_<status>`` when the body had none) and ``message`` its text.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        body: Any = None,
        retry_after: Optional[float] = None,
        idempotency_key: Optional[str] = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        self.retry_after = retry_after
        #: the key the call was made with: pass it again to retry safely
        self.idempotency_key = idempotency_key


class TransportError(OpkernelError):
    """The kernel could not be reached (or the answer was lost) after the
    bounded retries. For a start, retrying with ``idempotency_key`` set to
    this error's key returns the same operation instead of a second one."""

    def __init__(self, message: str, *, idempotency_key: Optional[str] = None) -> None:
        super().__init__(message)
        self.idempotency_key = idempotency_key
