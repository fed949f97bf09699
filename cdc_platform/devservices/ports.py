"""Free TCP ports for private services, so tests and the demo never collide with fixed ports."""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_port_range", "port_accepts"]


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago.

    The port is released before returning, so another process can take it in between; services
    started on it therefore retry with a new port when the bind fails.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port_range(count: int, host: str = "127.0.0.1", attempts: int = 200) -> int:
    """The first of ``count`` consecutive TCP ports on ``host`` that were free a moment ago
    (``metrics.port``: each source's processes take ports counted from one base)."""
    for _ in range(attempts):
        base = free_port(host)
        if base + count > 65536:
            continue
        taken = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                taken.append(sock)
                sock.bind((host, port))
        except OSError:
            continue
        finally:
            for sock in taken:
                sock.close()
        return base
    raise OSError(f"no {count} consecutive free ports on {host} after {attempts} tries")


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port`` (a cheap readiness pre-check)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
