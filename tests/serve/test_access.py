"""The server's access checks on their own: the token's header, the Host the server is reached by, the Origin
of browser pages, headers named twice, the message rate."""

from __future__ import annotations

import pytest
from websockets.datastructures import Headers

from usmkit.serve.access import HeaderError, MessageRate, host_ok, offered_token, one_header, origin_ok, token_ok


@pytest.mark.parametrize(
    "path,authorization,offered",
    [
        ("/?token=abc", None, "abc"),
        ("/", "Bearer abc", "abc"),
        ("/", "bearer abc", "abc"),
        ("/", "BEARER   abc ", "abc"),
        ("/", "Basic abc", ""),
        ("/", "Bearerabc", ""),
        ("/?token=q", "Bearer h", "q"),  # the URL's first, as before
    ],
)
def test_offered_token(path, authorization, offered):
    headers = Headers({"Authorization": authorization} if authorization else {})
    assert offered_token(path, headers) == offered


def test_token_ok():
    assert token_ok(None, "/", Headers())
    assert token_ok("s3cret", "/?token=s3cret", Headers())
    assert not token_ok("s3cret", "/?token=s3cre", Headers())
    assert not token_ok("s3cret", "/", Headers())


@pytest.mark.parametrize(
    "host,origin,allowed,ok",
    [
        ("127.0.0.1:10086", None, (), True),  # not a browser
        ("127.0.0.1:10086", "http://127.0.0.1:10086", (), True),  # the server's own page
        ("asr.example", "https://asr.example", (), True),  # its own page behind a TLS proxy
        ("127.0.0.1:10086", "http://localhost:10086", (), False),  # another host name is another site
        ("127.0.0.1:10086", "https://evil.example", (), False),
        ("127.0.0.1:10086", "null", (), False),  # a file:// page or a sandboxed frame
        ("127.0.0.1:10086", "https://App.Example", ("https://app.example/",), True),
        ("127.0.0.1:10086", "https://evil.example", ("https://app.example",), False),
        ("127.0.0.1:10086", "https://evil.example", ("*",), True),
    ],
)
def test_origin_ok(host, origin, allowed, ok):
    headers = Headers({"Host": host, **({"Origin": origin} if origin else {})})
    assert origin_ok(headers, allowed) is ok


def test_message_rate_allows_a_second_of_burst_then_paces_to_the_rate():
    rate = MessageRate(per_second=100)
    waits = [rate.wait(0.0) for _ in range(150)]
    assert waits[:100] == [0.0] * 100  # a second's worth at once
    assert waits[100:] == pytest.approx([(k + 1) / 100 for k in range(50)])  # then 10 ms a message
    t, total = 10.0, 0  # a client that keeps to the rate never waits
    for _ in range(1000):
        t += 0.01
        total += rate.wait(t) > 0
    assert total == 0
    with pytest.raises(ValueError, match="per_second must be > 0"):
        MessageRate(0)


@pytest.mark.parametrize(
    "host,listen,allowed,ok",
    [
        (None, "127.0.0.1", (), True),  # no Host: not a browser
        ("127.0.0.1:10086", "127.0.0.1", (), True),
        ("localhost:10086", "127.0.0.1", (), True),
        ("LocalHost", "127.0.0.1", (), True),
        ("app.localhost:10086", "127.0.0.1", (), True),  # RFC 6761: browsers resolve it to loopback themselves
        ("[::1]:10086", "127.0.0.1", (), True),
        ("127.0.0.2:10086", "127.0.0.1", (), True),  # loopback, whichever address
        ("evil.example:10086", "127.0.0.1", (), False),  # a DNS-rebinding page sends its own name
        ("evil.example:10086", "0.0.0.0", (), False),
        ("10.1.2.3:10086", "0.0.0.0", (), True),  # bound to every interface: any address of it
        ("10.1.2.3:10086", "10.1.2.3", (), True),
        ("10.9.9.9:10086", "10.1.2.3", (), False),  # not the address it listens on
        ("asr.internal:10086", "asr.internal", (), True),  # --host by name
        ("asr.example", "0.0.0.0", ("ASR.example",), True),  # --allowed-hosts, any case
        ("evil.example", "0.0.0.0", ("asr.example",), False),
        ("evil.example", "127.0.0.1", ("*",), True),
        ("127.0.0.1:port", "127.0.0.1", (), False),  # malformed
    ],
)
def test_host_ok(host, listen, allowed, ok):
    assert host_ok(host, listen, allowed) is ok


def test_a_header_named_twice_is_a_header_error_not_a_crash():
    twice = Headers([("Host", "127.0.0.1:1"), ("Origin", "http://127.0.0.1:1"), ("Origin", "http://evil.example")])
    assert one_header(twice, "Host") == "127.0.0.1:1" and one_header(twice, "Cookie") is None
    with pytest.raises(HeaderError, match="2 Origin headers"):
        one_header(twice, "Origin")
    with pytest.raises(HeaderError):
        origin_ok(twice)
    with pytest.raises(HeaderError, match="2 Authorization headers"):
        offered_token("/", Headers([("Authorization", "Bearer a"), ("Authorization", "Bearer b")]))
