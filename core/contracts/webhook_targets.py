"""Where a webhook may POST (pure; the resolver is a parameter): public http(s) addresses only, unless the
operator allows private receivers (SCALEBENCH_WEBHOOK_ALLOW_PRIVATE=1, for a receiver inside the cluster).

Refused at creation (`check_url`) and again at every delivery (`pin`):
- a scheme other than http/https, a URL without a host, a bad port, credentials in the URL (user:pass@),
  a backslash (parsers disagree on it);
- a host that is, or resolves to, a loopback, link-local (169.254.169.254: cloud metadata), private,
  shared (100.64/10), unspecified (0.0.0.0, ::), multicast or reserved address, or any address that is not
  globally routable; IPv6 forms that carry such an IPv4 address (IPv4-mapped ::ffff:a.b.c.d, 6to4, Teredo,
  NAT64 64:ff9b::/96) count as that address; IPv4 in legacy forms (2130706433, 0x7f.1, 127.1) is read as
  the address it names, and a trailing dot (169.254.169.254.) is ignored;
- the names `localhost` and `*.localhost`.

At delivery the name is resolved once, every address is checked, and the request goes to the checked address
(`Pinned.connect_url`, with the original Host header and TLS server name): a name that resolves to a public
address for the check and to 127.0.0.1 for the connection (DNS rebinding) cannot reach inside.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[str]]  # (host, port) -> IP address strings
ALLOW_PRIVATE_ENV = "SCALEBENCH_WEBHOOK_ALLOW_PRIVATE"
_LEGACY_IPV4 = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$", re.IGNORECASE)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


class TargetRefused(ValueError):
    """A webhook URL or address that may not be used; `reason` says why (shown as the url field's message)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # lower case, without brackets or a trailing dot; IDNA (ASCII) for names
    port: int
    path: str  # path and query, at least "/"
    address: IPAddress | None  # when the host is an IP literal (in any form)

    @property
    def host_header(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return shown if self.port == default else f"{shown}:{self.port}"


@dataclass(frozen=True)
class Pinned:
    """Where one delivery connects: the checked address, with the Host header and TLS name of the URL."""

    connect_url: str
    host_header: str
    sni_hostname: str | None  # https only
    address: str


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_problem(ip: IPAddress) -> str | None:
    """Why a webhook may not go to `ip` (a short noun phrase), or None for a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            problem = address_problem(inner)
            return f"{problem} (it carries the IPv4 address {inner})" if problem else None
    for what, hit in (
        ("an unspecified", ip.is_unspecified),
        ("a loopback", ip.is_loopback),
        ("a link-local", ip.is_link_local),
        ("a multicast", ip.is_multicast),
        ("a private", ip.is_private),
        ("a reserved", ip.is_reserved),
        # fec0::/10, deprecated by RFC 3879 but still routed inside some sites; Python counts it as global
        ("a site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
    ):
        if hit:
            return f"{what} address"
    if not ip.is_global:
        return "not a globally routable address"
    return None


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _LEGACY_IPV4.match(host):  # what inet_aton (and so many HTTP clients) accept: 2130706433, 0x7f.1, 127.1
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def parse_target(url: str) -> Target:
    """The parts of a webhook URL, or TargetRefused (scheme, host, port, credentials)."""
    if "\\" in url or any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise TargetRefused(f"{url[:200]!r} has a backslash, a space or a control character")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"{url[:200]!r} is not an absolute http(s) URL")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise TargetRefused(
            "credentials in the URL (user:password@) are not accepted; the receiver checks the "
            "X-Scalebench-Signature header instead"
        )
    try:
        port = parts.port if parts.port is not None else (443 if parts.scheme == "https" else 80)  # :0 stays 0
    except ValueError:
        raise TargetRefused(f"{parts.netloc[:200]!r} has no valid port (1-65535)") from None
    if not 1 <= port <= 65535:
        raise TargetRefused(f"port {port} is outside 1-65535")
    host = parts.hostname.rstrip(".").lower().replace("%25", "%")  # an IPv6 zone id arrives percent-encoded
    if not host:
        raise TargetRefused(f"{url[:200]!r} has no host")
    address = _literal(host)
    if address is None:
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise TargetRefused(f"{parts.hostname[:200]!r} is not a valid host name") from None
    path = parts.path or "/"
    return Target(
        parts.scheme,
        str(address) if address is not None else host,
        port,
        path + (f"?{parts.query}" if parts.query else ""),
        address,
    )


def _refuse(what: str, problem: str) -> TargetRefused:
    return TargetRefused(
        f"{what} is {problem}; webhooks go to public addresses only (an operator allows "
        f"receivers on private networks with {ALLOW_PRIVATE_ENV}=1)"
    )


def _check_name(host: str) -> None:
    if host in _LOCAL_NAMES or host.endswith(".localhost"):
        raise _refuse(host, "a name of this host")


def check_addresses(host: str, addresses: Sequence[str]) -> list[IPAddress]:
    """Every address parsed and allowed (TargetRefused names the first that is not)."""
    out = []
    for text in addresses:
        ip = ipaddress.ip_address(text.split("%", 1)[0])  # a scope id (fe80::1%eth0) is link-local anyway
        problem = address_problem(ip)
        if problem:
            raise _refuse(host if str(ip) == host else f"{host} (resolves to {ip})", problem)
        out.append(ip)
    return out


def check_url(url: str, *, allow_private: bool = False, resolve: Resolver | None = None) -> Target:
    """At creation: the URL's form, and its host's addresses (a literal, or what `resolve` gives; a name that
    does not resolve yet is accepted: every delivery checks again)."""
    target = parse_target(url)
    if allow_private:
        return target
    if target.address is not None:
        check_addresses(target.host, [str(target.address)])
        return target
    _check_name(target.host)
    if resolve is not None:
        try:
            addresses = resolve(target.host, target.port)
        except (OSError, UnicodeError):
            return target
        check_addresses(target.host, addresses)
    return target


def pin(url: str, *, allow_private: bool = False, resolve: Resolver) -> Pinned:
    """At delivery: resolve once, check every address, and connect to the first checked one."""
    target = parse_target(url)
    if target.address is not None:
        addresses = [str(target.address)]
    else:
        if not allow_private:
            _check_name(target.host)
        try:
            addresses = list(resolve(target.host, target.port))
        except (OSError, UnicodeError) as exc:
            raise TargetRefused(f"{target.host} does not resolve ({type(exc).__name__})") from None
        if not addresses:
            raise TargetRefused(f"{target.host} does not resolve")
    if allow_private:
        ips = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]
    else:
        ips = check_addresses(target.host, addresses)
    ip = ips[0]
    shown = f"[{ip}]" if ip.version == 6 else str(ip)
    return Pinned(
        connect_url=f"{target.scheme}://{shown}:{target.port}{target.path}",
        host_header=target.host_header,
        sni_hostname=target.host if target.scheme == "https" and target.address is None else None,
        address=str(ip),
    )
