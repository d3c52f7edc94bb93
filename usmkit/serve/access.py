"""Who may use the server and how hard: the shared token, the Host it is reached by, the Origin of browser
pages, the message rate.

These are pure checks on a request's headers and a clock, so the server (``server``) decides with them
and the tests can hold them to their examples without a socket.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers

LOOPBACK_NAMES = ("localhost",)  # and every name under .localhost (RFC 6761: browsers resolve them to loopback)
WILDCARD_HOSTS = ("", "0.0.0.0", "::")  # a server bound to every interface
CHECKED_HEADERS = ("Host", "Origin", "Authorization", "Upgrade")  # those the server reads: one of each at most


class HeaderError(ValueError):
    """A request whose headers cannot be judged (one named twice); the message says which."""


def one_header(headers: Headers, name: str) -> str | None:
    """The value of header ``name`` (None when absent); ``HeaderError`` when the request repeats it.

    >>> one_header(Headers([("Host", "a:1")]), "Host"), one_header(Headers(), "Origin")
    ('a:1', None)
    """
    values = headers.get_all(name)
    if len(values) > 1:
        raise HeaderError(f"{len(values)} {name} headers: a request carries at most one")
    return values[0] if values else None


def host_name(host: str) -> str:
    """The name or address of a ``Host`` header, without its port or IPv6 brackets, in lower case.

    >>> host_name("Evil.Example:10086"), host_name("[::1]:10086"), host_name("127.0.0.1")
    ('evil.example', '::1', '127.0.0.1')
    """
    try:
        parts = urlsplit("//" + host.strip())
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:  # a malformed port or bracket
        return ""
    return (parts.hostname or "").lower()


def host_ok(host: str | None, listen_host: str, allowed: Sequence[str] = ()) -> bool:
    """Whether a request's ``Host`` header names this server: a loopback name or address, the address it
    listens on (any address when it listens on all), or a name in ``allowed`` (``"*"``: any). A page whose
    own name was made to resolve to the server (DNS rebinding) sends that name as ``Host`` and is refused.
    No ``Host`` (HTTP/1.0 tools, not browsers) is allowed.

    >>> host_ok("127.0.0.1:10086", "127.0.0.1"), host_ok("localhost:10086", "127.0.0.1")
    (True, True)
    >>> host_ok("evil.example:10086", "127.0.0.1"), host_ok("asr.example", "0.0.0.0", ["asr.example"])
    (False, True)
    """
    if host is None or "*" in allowed:
        return True
    name = host_name(host)
    if not name:
        return False
    if name in LOOPBACK_NAMES or name.endswith(".localhost") or name in (a.strip().lower() for a in allowed):
        return True
    listen = listen_host.strip().strip("[]").lower()
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name == listen
    return address.is_loopback or listen in WILDCARD_HOSTS or name == listen


def offered_token(path: str, headers: Headers) -> str:
    """The token a request offers: ``?token=...`` in its URL, else an ``Authorization: Bearer ...`` header
    (the scheme in any case, as HTTP allows)."""
    offered = parse_qs(urlsplit(path).query).get("token", [""])[0]
    if offered:
        return offered
    scheme, _, credentials = (one_header(headers, "Authorization") or "").strip().partition(" ")
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
    origin = one_header(headers, "Origin")
    if origin is None:
        return True
    origin = origin.strip().lower()
    if "*" in allowed or origin in (a.strip().lower().rstrip("/") for a in allowed):
        return True
    host = (one_header(headers, "Host") or "").strip().lower()
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
