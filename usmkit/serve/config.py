"""``ServeConfig``: where ``usmkit-serve`` listens and what it allows (``usmkit-serve --help`` explains each)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeConfig:
    """Where the server listens and what it allows (``usmkit-serve --help`` explains each).

    ``allowed_hosts``: the host names, besides the loopback names and ``host`` itself, that a request's ``Host``
    header may carry (``access.host_ok``). ``ping_interval`` / ``ping_timeout``: the WebSocket keepalive
    (``client_socket.ClientSocket``)."""

    host: str = "127.0.0.1"
    port: int = 10086
    max_connections: int = 64
    max_seconds: float = 3600.0
    max_batch: int = 32
    token: str | None = None
    max_buffer_seconds: float = 60.0  # undecoded audio per stream; also the largest binary message
    max_messages_per_second: float = 1000.0
    start_timeout: float = 10.0
    idle_timeout: float = 30.0
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    drain_seconds: float = 10.0
    ping_interval: float = 20.0
    ping_timeout: float = 20.0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_batch < 1 or self.max_seconds <= 0:
            raise ValueError(
                f"max_connections and max_batch must be >= 1 and max_seconds > 0, got {self.max_connections}, "
                f"{self.max_batch} and {self.max_seconds}"
            )
        timing = {
            "max_buffer_seconds": self.max_buffer_seconds,
            "max_messages_per_second": self.max_messages_per_second,
            "start_timeout": self.start_timeout,
            "idle_timeout": self.idle_timeout,
            "ping_interval": self.ping_interval,
            "ping_timeout": self.ping_timeout,
        }
        for name, value in timing.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.drain_seconds < 0:
            raise ValueError(f"drain_seconds must be >= 0, got {self.drain_seconds}")
