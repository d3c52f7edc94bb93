"""Who may use the server and how hard: the shared token, the Origin of browser pages, the message rate.

These are pure checks on a request's headers and a clock, so the server (``server``) decides with them
and the tests can hold them to their examples without a socket.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers


def offered_token(path: str, headers: Headers) -> str:
    """The token a request offers: ``?token=...`` in its URL, else an ``Authorization: Bearer ...`` header
    (the scheme in any case, as HTTP allows)."""
    offered = parse_qs(urlsplit(path).query).get("token", [""])[0]
    if offered:
        return offered
    scheme, _, credentials = headers.get("Authorization", "").strip().partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


def token_ok(expected: str | None, path: str, headers: Headers) -> bool:
    """Whether the request carries ``expected`` (None: no token is needed); compared in constant time."""
    if expected is None:
        return True
    return hmac.compare_digest(offered_token(path, headers).encode(), expected.encode())


def origin_ok(headers: Headers, allowed: Sequence[str] = ()) -> bool:
    """Whether a WebSocket handshake may go on, judged by its ``Origin`` header.

    Browsers send ``Origin`` with every WebSocket handshake, and let any page open a socket to any
    address; other clients (WeNet's tools, ``websockets``, curl) send none. Allowed: no ``Origin``; a page
    of the server itself (the Origin's host and port are the request's ``Host``); an origin listed in
    ``allowed`` (``scheme://host[:port]``, compared without case; ``"*"`` allows every page).

    >>> h = Headers({"Host": "127.0.0.1:10086", "Origin": "http://127.0.0.1:10086"})
    >>> origin_ok(h), origin_ok(Headers({"Host": "127.0.0.1:10086", "Origin": "https://evil.example"}))
    (True, False)
    >>> origin_ok(Headers({"Host": "a:1", "Origin": "https://app.example"}), ["https://app.example"])
    True
    """
    origin = headers.get("Origin")
    if origin is None:
        return True
    origin = origin.strip().lower()
    if "*" in allowed or origin in (a.strip().lower().rstrip("/") for a in allowed):
        return True
    host = headers.get("Host", "").strip().lower()
    return bool(host) and urlsplit(origin).netloc == host


class MessageRate:
    """A token bucket over a connection's messages: ``per_second`` on average, bursts up to one second's worth.

    ``wait(now)`` takes one message and says how long (s) the reader should pause before the next: 0
    while the connection keeps to the rate. Pausing the reader stops reading the socket, so a client
    sending faster is slowed by TCP, not dropped.

    >>> rate = MessageRate(per_second=2)
    >>> [rate.wait(0.0) for _ in range(4)]
    [0.0, 0.0, 0.5, 1.0]
    >>> rate.wait(10.0)
    0.0
    """

    def __init__(self, per_second: float) -> None:
        if per_second <= 0:
            raise ValueError(f"per_second must be > 0, got {per_second}")
        self.per_second = per_second
        self._tokens = float(per_second)  # a full bucket: one second of messages
        self._last: float | None = None

    def wait(self, now: float) -> float:
        if self._last is not None:
            self._tokens = min(self.per_second, self._tokens + (now - self._last) * self.per_second)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.per_second
