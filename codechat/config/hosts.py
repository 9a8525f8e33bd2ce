"""Whether a host name or address is this machine: ``codechat serve`` warns when it binds elsewhere,
``codechat distill`` asks a teacher on this machine without an API key."""
from __future__ import annotations

import ipaddress
import urllib.parse


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost``, 127.0.0.0/8 or ``::1`` (``[::1]`` too)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine (:func:`is_loopback`)."""
    return is_loopback(urllib.parse.urlparse(url).hostname or "")


__all__ = ["is_loopback", "is_loopback_url"]
