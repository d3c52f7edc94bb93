"""The server's access checks on their own: the token's header, the Origin of browser pages, the message rate."""

from __future__ import annotations

import pytest
from websockets.datastructures import Headers

from usmkit.serve.access import MessageRate, offered_token, origin_ok, token_ok


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
