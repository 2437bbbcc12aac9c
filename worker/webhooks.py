"""Webhook sender: POSTs pending deliveries (the outbox rows db.webhooks writes with each finding).

Request: a JSON body (the stored payload plus delivery_id, attempt and timestamp, so the signature also
covers the time it was sent: a receiver can refuse replays older than a few minutes) and headers

  X-Scalebench-Signature: sha256=<hex HMAC-SHA256 of the raw body with the webhook's secret>
  X-Scalebench-Timestamp: <unix seconds, the body's timestamp>
  X-Scalebench-Event, X-Scalebench-Delivery

A 2xx answer delivers it. Anything else (status, a redirect, timeout, refused connection, a target the
guard refuses) is retried with exponential backoff: BASE_DELAY_S * 2**(attempt-1), capped at MAX_DELAY_S,
MAX_ATTEMPTS attempts in all, then the row is `failed`. Every attempt is logged on the row with a short status
line only ("HTTP 503 Service Unavailable", "ConnectError", "refused: ..."): never the receiver's body nor a
socket error's text. Each attempt is claimed first (compare-and-set on next_attempt_at), so two senders never
POST the same attempt. A webhook disabled meanwhile ends the delivery as failed ("webhook disabled").

Every attempt resolves the URL's host, checks every address and connects to the checked one
(core.contracts.webhook_targets.pin: public addresses only unless SCALEBENCH_WEBHOOK_ALLOW_PRIVATE=1; no proxy from
the environment, no redirects followed).

A receiver cannot hold up anything else: deliveries run on their own thread of the scheduler (WebhookSender),
never on the loop that reaps leases, publishes runs and fires suites; a pass attempts at most MAX_CONCURRENT
deliveries at once, starts none after PASS_BUDGET_S, and a receiver (host and port) that timed out or refused gets no
attempt for a back-off that doubles from RECEIVER_BACKOFF_S to RECEIVER_BACKOFF_MAX_S (its deliveries stay
pending, their attempt count unspent) until one attempt there succeeds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import httpx
from sqlalchemy.orm import Session, sessionmaker

import db.webhooks
from core.contracts.webhook_targets import Resolver, TargetRefused, pin
from db.base import utcnow
from db.models import Webhook, WebhookDelivery
from osutil.dns import system_resolve

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 6
BASE_DELAY_S = 30.0
MAX_DELAY_S = 3600.0
TIMEOUT_S = 10.0
CLAIM_LEASE_S = 120.0  # a sender that died mid-attempt leaves the row to be retried after this
MAX_ERROR_CHARS = 200  # a status line, not a body: the log is no window into what answered
MAX_CONCURRENT = 4  # deliveries in flight at once, per sender
PASS_BUDGET_S = 30.0  # a pass starts no delivery after this; those left stay due for the next pass
RECEIVER_BACKOFF_S = 30.0  # a receiver that timed out or refused is left alone this long (doubling) ...
RECEIVER_BACKOFF_MAX_S = 900.0  # ... up to this
SENDER_INTERVAL_S = 5.0
SIGNATURE_HEADER = "X-Scalebench-Signature"
TIMESTAMP_HEADER = "X-Scalebench-Timestamp"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff_s(attempt: int) -> float:
    """Delay after failed attempt number `attempt` (1-based)."""
    return min(MAX_DELAY_S, BASE_DELAY_S * 2 ** (attempt - 1))


@dataclass(frozen=True)
class AttemptOutcome:
    delivery_id: int
    attempt: int
    status_code: int | None
    error: str | None
    delivered: bool
    gave_up: bool


def _request(d: WebhookDelivery, hook: Webhook, now: datetime) -> tuple[bytes, dict[str, str]]:
    stamp = int(now.timestamp())
    body = json.dumps(
        {**d.payload, "delivery_id": d.id, "attempt": d.attempt, "timestamp": stamp},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "scalebench-webhooks/0.1",
        SIGNATURE_HEADER: sign(hook.secret, body),
        TIMESTAMP_HEADER: str(stamp),
        "X-Scalebench-Event": d.event,
        "X-Scalebench-Delivery": str(d.id),
    }
    return body, headers


def _post(
    client: httpx.Client, url: str, body: bytes, headers: dict[str, str], *, allow_private: bool, resolve: Resolver
) -> tuple[int | None, str | None]:
    """POST to the checked address of `url`; (status code, None) when delivered, else a short status line."""
    try:
        target = pin(url, allow_private=allow_private, resolve=resolve)
    except TargetRefused as exc:
        return None, f"refused: {exc.reason}"[:MAX_ERROR_CHARS]
    extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
    try:
        response = client.post(
            target.connect_url, content=body, headers={**headers, "Host": target.host_header}, extensions=extensions
        )
    except httpx.HTTPError as exc:
        return None, type(exc).__name__  # the class only: the text of a socket error says what listens there
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"HTTP {response.status_code}"  # never the receiver's reason phrase: its text


def make_client() -> httpx.Client:
    """No redirects followed, no proxy taken from the environment (the request goes to the checked address)."""
    return httpx.Client(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False)


def attempt_delivery(
    session_factory: sessionmaker[Session],
    client: httpx.Client,
    delivery_id: int,
    seen_next_attempt_at: datetime,
    now: datetime,
    max_attempts: int = MAX_ATTEMPTS,
    *,
    allow_private: bool = False,
    resolve: Resolver = system_resolve,
) -> AttemptOutcome | None:
    """Claim, POST (outside any transaction), record. None when another sender claimed it first."""
    with session_factory() as s:
        if not db.webhooks.claim_delivery(s, delivery_id, seen_next_attempt_at, now, CLAIM_LEASE_S):
            return None
        s.commit()
        d = s.get(WebhookDelivery, delivery_id)
        hook = s.get(Webhook, d.webhook_id) if d is not None else None
        if d is None or hook is None:  # deleted since it was listed
            return None
        body, headers = _request(d, hook, now)
        url, attempt, enabled = hook.url, d.attempt, hook.enabled
    started = time.monotonic()
    if enabled:
        status_code, error = _post(client, url, body, headers, allow_private=allow_private, resolve=resolve)
    else:
        status_code, error = None, "webhook disabled"
    duration_ms = (time.monotonic() - started) * 1000
    delivered = error is None
    gave_up = not delivered and (attempt >= max_attempts or not enabled)
    retry_at = None if delivered or gave_up else now + timedelta(seconds=backoff_s(attempt))
    with session_factory() as s:
        db.webhooks.record_attempt(
            s,
            delivery_id,
            now=now,
            status_code=status_code,
            error=error,
            duration_ms=duration_ms,
            delivered=delivered,
            retry_at=retry_at,
        )
        s.commit()
    if not delivered:
        (log.error if gave_up else log.warning)(
            "webhook delivery %d to %s, attempt %d: %s%s",
            delivery_id,
            urlsplit(url).hostname,
            attempt,
            error,
            " (giving up)" if gave_up else "",
        )
    return AttemptOutcome(delivery_id, attempt, status_code, error, delivered, gave_up)


@dataclass
class ReceiverBackoff:
    """Receivers (URL host and port) that timed out or refused, left alone until a time that doubles per failure."""

    base_s: float = RECEIVER_BACKOFF_S
    max_s: float = RECEIVER_BACKOFF_MAX_S
    clock: Callable[[], float] = time.monotonic
    _until: dict[str, tuple[float, float]] = field(default_factory=dict)  # host -> (until, last delay)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def waiting(self, host: str) -> bool:
        with self._lock:
            entry = self._until.get(host)
            return entry is not None and self.clock() < entry[0]

    def failed(self, host: str) -> None:
        with self._lock:
            last = self._until.get(host, (0.0, 0.0))[1]
            delay = min(self.max_s, last * 2 if last else self.base_s)
            self._until[host] = (self.clock() + delay, delay)

    def succeeded(self, host: str) -> None:
        with self._lock:
            self._until.pop(host, None)


def _receiver_failed(outcome: AttemptOutcome) -> bool:
    """No answer at all (timeout, refused connection, a refused target): the receiver, not the request."""
    return outcome.status_code is None and outcome.error is not None and outcome.error != "webhook disabled"


def deliver_due(
    session_factory: sessionmaker[Session],
    now: datetime | None = None,
    client: httpx.Client | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    *,
    allow_private: bool = False,
    resolve: Resolver = system_resolve,
    max_concurrent: int = MAX_CONCURRENT,
    budget_s: float = PASS_BUDGET_S,
    backoff: ReceiverBackoff | None = None,
) -> list[AttemptOutcome]:
    """One pass: attempt the deliveries due at `now`, at most `max_concurrent` at once and one at a time per
    receiver (receivers taken in turn), starting none after `budget_s`, none to a receiver in back-off (a
    receiver that times out or refuses in this pass gets no further attempt in it).
    allow_private: the operator allows receivers on private networks (SCALEBENCH_WEBHOOK_ALLOW_PRIVATE);
    resolve: host -> addresses (the system resolver)."""
    now = now or utcnow()
    with session_factory() as s:
        due = db.webhooks.due_deliveries(s, now)
        hosts = db.webhooks.delivery_hosts(s, [i for i, _ in due])
    if not due:
        return []
    backoff = backoff if backoff is not None else ReceiverBackoff()
    deadline = time.monotonic() + budget_s
    own = client is None
    client = client or make_client()
    outcomes: list[AttemptOutcome] = []
    running: dict[Future, str] = {}

    def collect(done: set[Future]) -> None:
        for future in done:
            host = running.pop(future)
            outcome = future.result()
            if outcome is None:
                continue
            outcomes.append(outcome)
            if _receiver_failed(outcome):
                backoff.failed(host)
            elif outcome.delivered:
                backoff.succeeded(host)

    by_host: dict[str, deque[tuple[int, datetime]]] = {}
    for delivery_id, seen in due:  # each receiver's deliveries in due order; receivers taken in turn
        by_host.setdefault(hosts.get(delivery_id, ""), deque()).append((delivery_id, seen))
    try:
        with ThreadPoolExecutor(max_workers=max(1, max_concurrent), thread_name_prefix="webhook") as pool:
            while True:
                if time.monotonic() >= deadline:
                    if any(by_host.values()):
                        log.warning(
                            "webhooks: pass budget of %.0f s spent; the rest stay due for the next pass", budget_s
                        )
                    break
                for host in list(by_host):
                    if len(running) >= max_concurrent:
                        break
                    if host in running.values():
                        continue  # one attempt at a time per receiver
                    if not by_host[host] or backoff.waiting(host):
                        del by_host[host]  # done, or in back-off: its deliveries stay due, attempts unspent
                        continue
                    delivery_id, seen = by_host[host].popleft()
                    future = pool.submit(
                        attempt_delivery,
                        session_factory,
                        client,
                        delivery_id,
                        seen,
                        now,
                        max_attempts,
                        allow_private=allow_private,
                        resolve=resolve,
                    )
                    running[future] = host
                if not running:
                    break
                collect(wait(running, return_when=FIRST_COMPLETED).done)
            while running:
                collect(wait(running, return_when=FIRST_COMPLETED).done)
    finally:
        if own:
            client.close()
    return outcomes


class WebhookSender:
    """The scheduler's delivery thread: a deliver_due pass every `interval_s`, off the scheduler's loop, with one
    ReceiverBackoff kept across passes."""

    def __init__(
        self, session_factory: sessionmaker[Session], *, allow_private: bool, interval_s: float = SENDER_INTERVAL_S
    ) -> None:
        self.session_factory, self.allow_private, self.interval_s = session_factory, allow_private, interval_s
        self.backoff = ReceiverBackoff()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="webhook-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                deliver_due(self.session_factory, allow_private=self.allow_private, backoff=self.backoff)
            except Exception:  # noqa: BLE001 - logged; the next pass retries
                log.exception("webhook delivery pass failed")
            self._stop.wait(self.interval_s)
