"""Name resolution through the system resolver (the one network call the webhook guard needs)."""

from __future__ import annotations

import socket


def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for host (IPv4 and IPv6)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
