"""Webhooks cannot reach inside: every form of a loopback, link-local, private, unspecified or multicast target
(and credentials in the URL) is refused at creation (422 naming `url`) and again at delivery, where the name is
resolved once, every address is checked and the request goes to the checked address (DNS rebinding); redirects
are not followed; a failed delivery stores a short status line; webhooks and their deliveries are read with a
token; PATCH enables, disables and changes events, DELETE removes. Real HTTP receivers on 127.0.0.1 only;
resolvers are passed in as functions (no DNS is asked for a name other than localhost).
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts.webhook_targets import TargetRefused, address_problem, check_url, pin
from db.models import WebhookDelivery
from db.webhooks import create_webhook, enqueue_event
from osutil.dns import system_resolve
from worker.webhooks import deliver_due

NOW = datetime(2026, 12, 4, 2, 30, tzinfo=UTC)
# The outside tester's accepted URLs (2026-12-04): each reached Postgres, Redis or the metadata service.
REPRODUCTIONS = [
    "http://127.0.0.1:5432/",
    "http://169.254.169.254/latest/meta-data/",
    "http://localhost:6379/",
    "http://[::1]:5432/",
    "http://0.0.0.0:5432/",
    "http://2130706433:5432/",
    "http://[::ffff:169.254.169.254]/",
    "https://169.254.169.254./",
    "http://user:pass@127.0.0.1:5432/",
]
MORE_INSIDE = [
    "http://127.1/",
    "http://0x7f.0.0.1/",
    "http://017700000001/",
    "http://10.0.0.5/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://224.0.0.1/",
    "http://[fe80::1%25eth0]/",
    "http://[fc00::1]/",
    "http://[::]/",
    "http://[2002:7f00:1::]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[ff02::1]/",
    "http://app.localhost/",
    "http://LOCALHOST./",
    "http://[::ffff:7f00:1]:6379/",
    "https://hooks.example.com@127.0.0.1/",
    "http://127.0.0.1\\@hooks.example.com/",
    "http://[fec0::1]/",  # site-local (deprecated, RFC 3879): Python calls it global
    "http://[fec0::1]:8080/hook",
    "http://hooks.example.com:0/",  # port 0 was taken as 80
    "https://8.8.8.8:0/",
]
PUBLIC = [
    "https://hooks.example.com/services/T0/B0/X",
    "http://8.8.8.8:8080/hook?x=1",
    "http://[2001:4860:4860::8888]/hook",
    "https://1.1.1.1./",
]


def _resolve_to(*addresses: str):
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return list(addresses)

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


# ------------------------------------------------------------------------------------------------- pure


@pytest.mark.parametrize("url", REPRODUCTIONS + MORE_INSIDE)
def test_inside_targets_are_refused_at_creation_and_at_delivery(url: str) -> None:
    with pytest.raises(TargetRefused) as created:
        check_url(url, resolve=system_resolve)
    assert created.value.reason
    with pytest.raises(TargetRefused):
        pin(url, resolve=_resolve_to("8.8.8.8"))  # even a name that now resolves outside: the name itself or form


@pytest.mark.parametrize("url", PUBLIC)
def test_public_targets_are_accepted(url: str) -> None:
    target = check_url(url, resolve=_resolve_to("93.184.216.34"))
    pinned = pin(url, resolve=_resolve_to("93.184.216.34"))
    assert pinned.address in ("93.184.216.34", str(target.address))


def test_the_operator_allows_private_receivers_but_never_credentials() -> None:
    for url in ["http://127.0.0.1:5432/", "http://10.0.0.5/", "http://localhost:8080/", "http://[::1]/"]:
        check_url(url, allow_private=True)
        assert pin(url, allow_private=True, resolve=_resolve_to("10.1.2.3")).address
    with pytest.raises(TargetRefused, match="credentials"):
        check_url("http://user:pass@10.0.0.5/", allow_private=True)


def test_a_name_is_resolved_once_and_every_address_is_checked() -> None:
    """DNS rebinding: the check and the connection use one resolution; one private address among public ones is
    enough to refuse."""
    with pytest.raises(TargetRefused, match="resolves to 127.0.0.1"):
        pin("https://rebind.example/hook", resolve=_resolve_to("93.184.216.34", "127.0.0.1"))
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])
    resolve = _resolve_to()
    pinned = pin("https://rebind.example:8443/hook?a=1", resolve=lambda h, p: resolve(h, p) or next(answers))
    assert pinned.connect_url == "https://93.184.216.34:8443/hook?a=1" and len(resolve.calls) == 1
    assert (pinned.host_header, pinned.sni_hostname) == ("rebind.example:8443", "rebind.example")
    with pytest.raises(TargetRefused, match="does not resolve"):
        pin("https://nowhere.example/", resolve=_resolve_to())


ipv4 = st.integers(min_value=0, max_value=2**32 - 1).map(ipaddress.IPv4Address)
ipv6 = st.integers(min_value=0, max_value=2**128 - 1).map(ipaddress.IPv6Address)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    ip=st.one_of(
        ipv4,
        st.sampled_from(
            [
                ipaddress.IPv4Address(a)
                for a in (
                    "127.0.0.1",
                    "169.254.169.254",
                    "10.0.0.1",
                    "0.0.0.0",
                    "224.0.0.1",
                    "100.64.0.1",
                    "8.8.8.8",
                    "1.1.1.1",
                )
            ]
        ),
    )
)
def test_every_form_of_an_ipv4_address_gets_the_same_answer(ip: ipaddress.IPv4Address) -> None:
    """Dotted, integer, hex, octal-free legacy, IPv4-mapped, 6to4 and NAT64 forms: all refused or all accepted,
    and refused exactly when the address is not a public unicast one."""
    n = int(ip)
    forms = [
        str(ip),
        str(n),
        f"{hex(n)}",
        f"{str(ip)}.",
        f"[::ffff:{ip}]",
        f"[2002:{n >> 16:x}:{n & 0xFFFF:x}::]",
        f"[64:ff9b::{n >> 16:x}:{n & 0xFFFF:x}]",
    ]
    refused = not (ip.is_global and not ip.is_multicast)
    for form in forms:
        try:
            check_url(f"http://{form}/hook")
            got = False
        except TargetRefused:
            got = True
        assert got == refused, (form, ip)
    assert (address_problem(ip) is not None) == refused


def _refused(url: str) -> bool:
    try:
        check_url(url)
    except TargetRefused:
        return True
    return False


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("::1", True),  # loopback
        ("::", True),  # unspecified
        ("fe80::1", True),  # link-local
        ("fc00::1", True),  # unique local (private)
        ("fd12:3456:789a::1", True),  # unique local (private)
        ("ff02::1", True),  # multicast, link scope
        ("ff0e::1", True),  # multicast, global scope
        ("2001:db8::1", True),  # documentation
        ("100::1", True),  # discard-only
        ("::ffff:127.0.0.1", True),  # IPv4-mapped loopback
        ("::ffff:8.8.8.8", False),  # IPv4-mapped public
        ("2002:7f00:1::", True),  # 6to4 of 127.0.0.1
        ("2002:808:808::", False),  # 6to4 of 8.8.8.8
        ("64:ff9b::a9fe:a9fe", True),  # NAT64 of 169.254.169.254
        ("2001:4860:4860::8888", False),  # public (Google DNS)
        ("2606:4700:4700::1111", False),  # public (Cloudflare DNS)
        ("2a00:1450:4001:80b::200e", False),  # public
    ],
)
def test_named_ipv6_addresses_get_their_answer(address: str, refused: bool) -> None:
    assert _refused(f"http://[{address}]:8080/") is refused, address


_EMBEDS_IPV4 = [ipaddress.ip_network(n) for n in ("::ffff:0:0/96", "2002::/16", "2001::/32", "64:ff9b::/96")]
# half the draws from 2000::/3, the global unicast block, so that accepted addresses are drawn too
ipv6_mixed = st.one_of(ipv6, st.integers(min_value=0x2 << 125, max_value=(0x4 << 125) - 1).map(ipaddress.IPv6Address))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(ip=ipv6_mixed.filter(lambda ip: not any(ip in n for n in _EMBEDS_IPV4)))
def test_any_ipv6_address_is_refused_unless_public(ip: ipaddress.IPv6Address) -> None:
    """An address that carries no IPv4 address is accepted exactly when the standard library calls it
    globally routable, unicast and not reserved."""
    public = ip.is_global and not ip.is_multicast and not ip.is_reserved
    assert _refused(f"http://[{ip}]:8080/") is not public, ip


# ----------------------------------------------------------------------------------- delivery, for real


class Receiver:
    """A real HTTP server on 127.0.0.1 answering `status` (with `headers`) and a long body; keeps requests."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None, reason: str | None = None):
        self.requests: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server names the method
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(dict(self.headers))
                self.send_response(status, reason)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(b"internal detail: postgres 16.4 on 10.0.0.7 " * 100)

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator:
    made: list[Receiver] = []

    def make(status: int = 200, headers: dict[str, str] | None = None, reason: str | None = None) -> Receiver:
        made.append(Receiver(status, headers, reason))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _hook(factory, *urls: str, allow_private: bool = False) -> int:
    """Webhooks on `urls` and one event: a delivery for each (the first one's id returned)."""
    with factory() as s:
        for url in urls:
            create_webhook(s, url, events=["regression.confirmed"], allow_private=allow_private)
        ids = enqueue_event(s, "regression.confirmed", {"event": "regression.confirmed"}, now=NOW)
        s.commit()
    return ids[0]


def test_a_name_that_rebinds_to_loopback_is_refused_at_delivery(pg_session_factory, receivers) -> None:
    receiver = receivers()
    delivery_id = _hook(pg_session_factory, f"http://hooks.rebind.example:{receiver.port}/in")  # no DNS yet: accepted
    [o] = deliver_due(pg_session_factory, NOW, resolve=_resolve_to("127.0.0.1"))
    assert not o.delivered and o.error.startswith("refused: ") and "loopback" in o.error
    assert receiver.requests == []
    with pg_session_factory() as s:
        assert s.get(WebhookDelivery, delivery_id).error == o.error and len(o.error) <= 200


def test_the_request_goes_to_the_checked_address_with_the_urls_host(pg_session_factory, receivers) -> None:
    receiver = receivers()
    _hook(pg_session_factory, f"http://hooks.inside.example:{receiver.port}/in", allow_private=True)
    resolve = _resolve_to("127.0.0.1")
    [o] = deliver_due(pg_session_factory, NOW, allow_private=True, resolve=resolve)
    assert o.delivered and resolve.calls == ["hooks.inside.example"]
    assert receiver.requests[0]["Host"] == f"hooks.inside.example:{receiver.port}"


def test_redirects_are_not_followed_and_a_failure_stores_a_status_line(pg_session_factory, receivers) -> None:
    inside = receivers()
    redirect = receivers(302, {"Location": f"http://127.0.0.1:{inside.port}/steal"})
    failing = receivers(500)
    talking = receivers(503, reason="postgres 16.4 on 10.0.0.7 is down")  # the receiver's own reason phrase
    _hook(
        pg_session_factory,
        f"http://127.0.0.1:{redirect.port}/r",
        f"http://127.0.0.1:{failing.port}/f",
        f"http://127.0.0.1:{talking.port}/t",
        allow_private=True,
    )
    outcomes = deliver_due(pg_session_factory, NOW, allow_private=True)
    assert sorted(o.error for o in outcomes) == ["HTTP 302", "HTTP 500", "HTTP 503"]  # the status line, no phrase
    assert inside.requests == []
    with pg_session_factory() as s:
        for d in s.query(WebhookDelivery):
            assert "postgres" not in (d.error or "") and all(
                "postgres" not in (a["error"] or "") for a in d.attempts_log
            )


def test_a_closed_port_stores_the_error_class_only(pg_session_factory) -> None:
    _hook(pg_session_factory, "http://127.0.0.1:9/nothing-listens", allow_private=True)
    [closed] = deliver_due(pg_session_factory, NOW, allow_private=True)
    assert closed.error == "ConnectError"  # the class only, never the socket's text


# ------------------------------------------------------------------------------------------------ API


def test_the_reproductions_answer_422_naming_url(client) -> None:
    for url in REPRODUCTIONS + MORE_INSIDE:
        r = client.post("/webhooks", json={"url": url})
        assert r.status_code == 422, (url, r.text)
        [err] = r.json()["errors"]
        assert err["field"] == "url" and err["message"], (url, err)
    assert client.get("/webhooks").json() == []


def test_an_operator_allows_a_private_receiver(make_client, test_settings) -> None:
    client = make_client(replace(test_settings, webhook_allow_private=True))
    assert client.post("/webhooks", json={"url": "http://10.0.0.5:8080/hook"}).status_code == 201
    r = client.post("/webhooks", json={"url": "http://user:pass@10.0.0.5:8080/hook"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "url"


def test_webhooks_are_read_with_a_token_and_can_be_disabled_changed_and_deleted(
    client, anon_client, pg_session_factory
) -> None:
    hook = client.post("/webhooks", json={"url": "https://hooks.example.com/x"}).json()
    with pg_session_factory() as s:
        [delivery_id] = enqueue_event(s, "regression.confirmed", {"event": "regression.confirmed"}, now=NOW)
        s.commit()
    for path in ("/webhooks", f"/webhooks/{hook['id']}/deliveries"):
        assert anon_client.get(path).status_code == 401
        assert client.get(path).status_code == 200
    assert anon_client.patch(f"/webhooks/{hook['id']}", json={"enabled": False}).status_code == 401
    assert anon_client.delete(f"/webhooks/{hook['id']}").status_code == 401

    r = client.patch(f"/webhooks/{hook['id']}", json={"enabled": False, "events": ["regression.failed"]})
    assert r.status_code == 200 and (r.json()["enabled"], r.json()["events"]) == (False, ["regression.failed"])
    [d] = client.get(f"/webhooks/{hook['id']}/deliveries").json()
    assert (d["id"], d["status"], d["error"]) == (delivery_id, "failed", "webhook disabled")
    assert deliver_due(pg_session_factory, NOW) == []
    bad = client.patch(f"/webhooks/{hook['id']}", json={"events": ["regression.exploded"]})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"].startswith("events")
    assert client.patch(f"/webhooks/{hook['id']}", json={"enabled": True}).json()["enabled"] is True

    assert client.delete(f"/webhooks/{hook['id']}").status_code == 204
    assert client.get("/webhooks").json() == []
    assert client.get(f"/webhooks/{hook['id']}/deliveries").status_code == 404
    assert client.delete(f"/webhooks/{hook['id']}").status_code == 404
    assert client.patch("/webhooks/999", json={"enabled": False}).status_code == 404


def test_cli_adds_lists_disables_and_deletes_webhooks(test_settings, api_token, pg_session_factory) -> None:
    from typer.testing import CliRunner

    from cli.main import app
    from tests.live_server import live_server

    with live_server(test_settings) as url:

        def cli(*args: str):
            return CliRunner().invoke(app, ["webhook", *args, "--server", url, "--token", api_token])

        refused = cli("add", "http://169.254.169.254/latest/meta-data/")
        assert refused.exit_code == 1 and "url: 169.254.169.254 is a link-local address" in refused.output
        added = cli("add", "https://hooks.example.com/x", "--event", "regression.failed")
        assert added.exit_code == 0 and "secret (shown once)" in added.output, added.output
        assert "hooks.example.com" in cli("list").output
        assert "disabled" in cli("disable", "1").output and "(enabled" in cli("enable", "1").output
        assert "regression.recovered" in cli("events", "1", "regression.recovered").output
        assert cli("deliveries", "1").exit_code == 0
        assert cli("delete", "1").output.strip() == "deleted webhook 1"
        missing = cli("delete", "1")
        assert missing.exit_code == 1 and "webhook 1 does not exist" in missing.output
