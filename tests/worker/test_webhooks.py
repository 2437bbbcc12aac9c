"""Webhook delivery to a real HTTP server on 127.0.0.1 (a receiver inside the cluster: the operator allows private
targets here, allow_private=True): signed body, retries with backoff, delivery log."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from db.models import WebhookDelivery
from db.webhooks import create_webhook, enqueue_event
from worker.webhooks import BASE_DELAY_S, ReceiverBackoff, deliver_due

SECRET = "s3cret-for-the-test-receiver"
NOW = datetime(2026, 12, 3, 2, 30, tzinfo=UTC)


class Receiver:
    """A real HTTP server; answers with `statuses` in order (then 200) and keeps every request."""

    def __init__(self, statuses: list[int]):
        self.statuses, self.requests = list(statuses), []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server names the method
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"boom")

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/scalebench"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory() -> Iterator:
    made: list[Receiver] = []

    def make(statuses: list[int]) -> Receiver:
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _enqueue(factory, url: str) -> int:
    with factory() as s:
        create_webhook(s, url, secret=SECRET, events=["regression.confirmed"], allow_private=True)
        create_webhook(
            s,
            url,
            secret=SECRET,
            events=["regression.recovered"],  # not subscribed: no delivery
            allow_private=True,
        )
        [delivery_id] = enqueue_event(
            s,
            "regression.confirmed",
            {"event": "regression.confirmed", "regression": {"id": 7, "metric": "tokens_per_sec"}},
            now=NOW,
        )
        s.commit()
    return delivery_id


def test_receiver_gets_a_signed_payload_that_verifies(pg_session_factory, receiver_factory):
    receiver = receiver_factory([])
    delivery_id = _enqueue(pg_session_factory, receiver.url)
    [outcome] = deliver_due(pg_session_factory, NOW, allow_private=True)
    assert outcome.delivered and outcome.status_code == 200

    [(headers, body)] = receiver.requests
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Scalebench-Signature"], expected)
    payload = json.loads(body)
    assert payload["event"] == "regression.confirmed" and payload["regression"]["metric"] == "tokens_per_sec"
    assert payload["timestamp"] == int(NOW.timestamp()) == int(headers["X-Scalebench-Timestamp"])
    assert payload["delivery_id"] == delivery_id and headers["X-Scalebench-Event"] == "regression.confirmed"
    tampered = body.replace(b"tokens_per_sec", b"tokens_per_min")
    assert hmac.new(SECRET.encode(), tampered, hashlib.sha256).hexdigest() not in headers["X-Scalebench-Signature"]
    with pg_session_factory() as s:
        d = s.get(WebhookDelivery, delivery_id)
        assert (d.status, d.attempt, d.status_code, d.delivered_at) == ("delivered", 1, 200, NOW)
    assert deliver_due(pg_session_factory, NOW + timedelta(hours=1), allow_private=True) == []  # delivered once


def test_a_failing_receiver_is_retried_with_backoff(pg_session_factory, receiver_factory):
    receiver = receiver_factory([500, 503])
    delivery_id = _enqueue(pg_session_factory, receiver.url)
    [first] = deliver_due(pg_session_factory, NOW, allow_private=True)
    assert not first.delivered and first.status_code == 500 and "HTTP 500" in first.error
    not_yet = NOW + timedelta(seconds=BASE_DELAY_S - 1)
    assert deliver_due(pg_session_factory, not_yet, allow_private=True) == []
    [second] = deliver_due(pg_session_factory, NOW + timedelta(seconds=BASE_DELAY_S), allow_private=True)
    assert second.status_code == 503 and second.attempt == 2
    third_at = NOW + timedelta(seconds=BASE_DELAY_S * 3)  # second delay is 2 * BASE_DELAY_S
    assert deliver_due(pg_session_factory, third_at - timedelta(seconds=1), allow_private=True) == []
    [third] = deliver_due(pg_session_factory, third_at, allow_private=True)
    assert third.delivered and third.attempt == 3
    assert [json.loads(b)["attempt"] for _, b in receiver.requests] == [1, 2, 3]
    with pg_session_factory() as s:
        d = s.get(WebhookDelivery, delivery_id)
        assert d.status == "delivered" and [a["status_code"] for a in d.attempts_log] == [500, 503, 200]


def test_gives_up_after_bounded_attempts(pg_session_factory, receiver_factory):
    receiver = receiver_factory([500] * 10)
    delivery_id = _enqueue(pg_session_factory, receiver.url)
    at = NOW
    for _ in range(3):
        [o] = deliver_due(pg_session_factory, at, max_attempts=3, allow_private=True)
        at += timedelta(hours=2)
    assert o.gave_up and len(receiver.requests) == 3
    assert deliver_due(pg_session_factory, at + timedelta(days=1), max_attempts=3, allow_private=True) == []
    with pg_session_factory() as s:
        d = s.get(WebhookDelivery, delivery_id)
        assert d.status == "failed" and d.next_attempt_at is None and len(d.attempts_log) == 3


def test_unreachable_receiver_is_an_error_not_a_crash(pg_session_factory):
    delivery_id = _enqueue(pg_session_factory, "http://127.0.0.1:9/nothing-listens")
    [o] = deliver_due(pg_session_factory, NOW, allow_private=True)
    assert not o.delivered and o.status_code is None and "ConnectError" in o.error
    with pg_session_factory() as s:
        assert s.get(WebhookDelivery, delivery_id).next_attempt_at == NOW + timedelta(seconds=BASE_DELAY_S)


def test_one_at_a_time_per_receiver_and_a_refusing_receiver_backs_off(pg_session_factory, receiver_factory):
    """One pass delivers every due delivery of a healthy receiver (one at a time) and makes one attempt at a
    receiver that refuses connections; the shared back-off then keeps later passes away from it until it ends."""
    good = receiver_factory([])
    with socket.socket() as probe:  # a port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
        dead_url = f"http://127.0.0.1:{dead_port}/x"  # the same host as the healthy receiver, another port
    with pg_session_factory() as s:
        create_webhook(s, good.url, secret=SECRET, events=["regression.confirmed"], allow_private=True)
        create_webhook(s, dead_url, secret=SECRET, events=["regression.confirmed"], allow_private=True)
        for _ in range(5):
            enqueue_event(s, "regression.confirmed", {"event": "regression.confirmed"}, now=NOW)
        s.commit()
    clock = [0.0]
    backoff = ReceiverBackoff(base_s=60.0, clock=lambda: clock[0])
    outcomes = deliver_due(pg_session_factory, NOW, allow_private=True, backoff=backoff)
    delivered = [o for o in outcomes if o.delivered]
    refused = [o for o in outcomes if not o.delivered]
    assert len(delivered) == 5 and len(good.requests) == 5
    assert len(refused) == 1 and refused[0].error == "ConnectError"  # one attempt, then the receiver backs off
    later = NOW + timedelta(seconds=BASE_DELAY_S)  # the refused delivery is due again, the others all along
    assert deliver_due(pg_session_factory, later, allow_private=True, backoff=backoff) == []
    with pg_session_factory() as s:
        attempts = sorted(d.attempt for d in s.query(WebhookDelivery).all() if d.status == "pending")
    assert attempts == [0, 0, 0, 0, 1]  # held back by the back-off: no attempt spent
    clock[0] += 61.0
    again = deliver_due(pg_session_factory, later, allow_private=True, backoff=backoff)
    assert [o.error for o in again] == ["ConnectError"]  # back-off over: one attempt again, doubled next time
    good_port = urlsplit(good.url).port
    assert backoff.waiting(f"127.0.0.1:{dead_port}") and not backoff.waiting(f"127.0.0.1:{good_port}")
