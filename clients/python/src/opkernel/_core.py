"""What the sync and async clients share: a call's description, its URL,
TLS, the retry rule and the decoding of answers. No I/O here."""

from __future__ import annotations

import email.utils
import json
import os
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Union
from urllib.parse import quote

import httpx

from ._errors import ApiError, TransportError
from ._routes import ROUTES

#: a call whose answer may take any time (``finish``, an unbounded stream)
UNBOUNDED = -1.0
#: longest pause asked by a ``Retry-After`` that the client honours
MAX_RETRY_AFTER = 30.0
USER_AGENT = "opkernel-python/0.1.0"

#: a private CA: a PEM file's path, or a ready ``SSLContext``
CA = Union[str, "os.PathLike[str]", ssl.SSLContext, None]


@dataclass
class Call:
    """One API call: its route (a key of ``ROUTES``), parameters and how to
    retry and read it."""

    route: str
    path: Dict[str, str] = field(default_factory=dict)
    query: Dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: Any = None
    headers: Dict[str, str] = field(default_factory=dict)
    #: the ``Idempotency-Key`` sent with every attempt of this call
    key: Optional[str] = None
    #: the call may be repeated: retried on any transport error and on a
    #: 503 with ``Retry-After`` (reads, keyed starts, idempotent changes)
    safe: bool = False
    #: seconds the kernel may hold the call before answering (added to the
    #: read timeout), or ``UNBOUNDED``
    wait: float = 0.0
    #: ``json``, ``bytes``, ``text`` or ``empty``
    answer: str = "json"

    @property
    def method(self) -> str:
        return ROUTES[self.route][0]

    def url_path(self) -> str:
        """The route's template with its parameters filled in (a file path
        keeps its slashes; every other parameter is one segment)."""
        template = ROUTES[self.route][1]
        values = {}
        for name, value in self.path.items():
            if name == "path":
                values[name] = quote(value.lstrip("/"), safe="/")
            else:
                values[name] = quote(value, safe="")
        return template.format(**values)

    def all_headers(self) -> Dict[str, str]:
        headers = dict(self.headers)
        if self.key is not None:
            headers["Idempotency-Key"] = self.key
        return headers


def new_key() -> str:
    """A fresh ``Idempotency-Key`` for one call (kept across its retries)."""
    return str(uuid.uuid4())


def dropping_none(values: Mapping[str, Any]) -> Dict[str, Any]:
    """The mapping without its ``None`` values (the API's defaults apply)."""
    return {k: v for k, v in values.items() if v is not None}


def tls_verify(ca: CA) -> ssl.SSLContext:
    """What to trust: the system's roots plus ``ca`` (a PEM file) or, when
    it is not given, the ``OPKERNEL_CA`` file; an ``SSLContext`` as is."""
    if isinstance(ca, ssl.SSLContext):
        return ca
    path = ca if ca is not None else os.environ.get("OPKERNEL_CA") or None
    context = ssl.create_default_context()
    if path is not None:
        context.load_verify_locations(cafile=os.fspath(path))
    return context


def base_headers(token: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT}


def timeout_for(call: Call, default: float) -> httpx.Timeout:
    """The default timeout, with a read long enough for the call's wait."""
    if call.wait == UNBOUNDED:
        return httpx.Timeout(default, read=None)
    return httpx.Timeout(default, read=default + call.wait)


def retry_after(response: httpx.Response) -> Optional[float]:
    """The ``Retry-After`` of an answer, in seconds (``None``: absent)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    when = email.utils.parsedate_to_datetime(value) if value else None
    if when is None:
        return 1.0
    return max(0.0, when.timestamp() - time.time())


def backoff(attempt: int) -> float:
    """Pause before retry ``attempt`` (1, 2, ...) after a transport error."""
    return float(min(0.2 * (2 ** (attempt - 1)), 3.0))


def retry_delay_for_error(call: Call, error: Exception, attempt: int) -> Optional[float]:
    """Whether (and after how long) to retry after a transport error.

    A connection that was never made cannot have reached the kernel, so any
    call is retried; any other failure only for a call that may repeat."""
    unsent = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
    if unsent or (call.safe and isinstance(error, httpx.TransportError)):
        return backoff(attempt)
    return None


def retry_delay_for_answer(call: Call, response: httpx.Response) -> Optional[float]:
    """A 503 with ``Retry-After`` (the control plane is unreachable now) is
    retried for a call that may repeat, after the pause it asks for."""
    if response.status_code != 503 or not call.safe:
        return None
    pause = retry_after(response)
    if pause is None:
        return None
    return min(pause, MAX_RETRY_AFTER)


def api_error(call: Call, response: httpx.Response) -> ApiError:
    """The ``ApiError`` of an error answer whose body has been read."""
    body: Any = None
    code, message = f"http_{response.status_code}", response.reason_phrase
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        body = response.text
        message = body.strip()[:500] or message
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = str(body["error"].get("code", code))
        message = str(body["error"].get("message", message))
    return ApiError(
        response.status_code,
        code,
        message,
        body=body,
        retry_after=retry_after(response),
        idempotency_key=call.key,
    )


def decode(call: Call, response: httpx.Response) -> Any:
    """A success answer as the call wants it (the body has been read)."""
    if call.answer == "bytes":
        return response.content
    if call.answer == "text":
        return response.text
    if call.answer == "empty" or not response.content:
        return None
    return json.loads(response.content)


def settings(url: Optional[str], token: Optional[str]) -> Tuple[str, str]:
    """The kernel's URL and the token: as given, else ``OPKERNEL_URL`` and
    ``OPKERNEL_TOKEN``."""
    url = url or os.environ.get("OPKERNEL_URL")
    token = token or os.environ.get("OPKERNEL_TOKEN")
    if not url:
        raise ValueError("no kernel URL: pass url= or set OPKERNEL_URL")
    if not token:
        raise ValueError("no token: pass token= or set OPKERNEL_TOKEN")
    return url.rstrip("/"), token.strip()


def exhausted(call: Call, error: Exception, attempts: int) -> TransportError:
    message = f"{call.method} {call.url_path()}: {type(error).__name__}: {error} ({attempts} attempts)"
    return TransportError(message, idempotency_key=call.key)
