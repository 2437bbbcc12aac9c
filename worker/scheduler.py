"""The scheduler: the one process for periodic work (`scalebench up` and compose each run one).

    python -m worker.scheduler [--reap-interval-s 5] [--dispatch-interval-s 3] [--nightly-interval-s 30] [--once]

Three passes on their own periods, in one plain loop (no Celery beat: this needs no free worker, which
matters when the only worker is busy with a long run):
- reaper (worker.reaper): recover finished run dirs, requeue runs whose Slurm job can be re-attached,
  reap expired leases;
- dispatcher (worker.queue.dispatch_pending): publish queued runs whose message was never sent (the
  broker was down at submission) or that the reaper requeued; and (worker.queue.redispatch_stale) publish
  again, once per SCALEBENCH_REDISPATCH_AFTER_S, runs that stayed queued that long after their message;
- nightly tick (worker.nightly): fire due suites, check finished suite experiments.
Webhook deliveries run on a thread of their own (worker.webhooks.WebhookSender: bounded concurrency, a budget
per pass, a back-off per receiver), so a receiver that never answers delays no reaper pass and no suite firing.
With --once, one bounded delivery pass runs after the others.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from worker.nightly import NIGHTLY_TICK_S, nightly_tick
from worker.queue import dispatch_pending, make_celery, redispatch_stale
from worker.reaper import reap_once
from worker.runtime import get_runtime
from worker.webhooks import SENDER_INTERVAL_S, WebhookSender

log = logging.getLogger(__name__)


@dataclass
class Pass:
    name: str
    interval_s: float
    run: Callable[[], object]
    due_at: float = 0.0


def passes(
    reap_interval_s: float, dispatch_interval_s: float, nightly_interval_s: float, deliver_webhooks: bool = False
) -> list[Pass]:
    """The loop's passes; deliver_webhooks: the nightly pass also delivers (--once; else the sender thread)."""
    rt = get_runtime()
    celery = make_celery(rt.settings)
    return [
        Pass("reaper", reap_interval_s, lambda: reap_once(rt)),
        Pass(
            "dispatcher",
            dispatch_interval_s,
            lambda: _dispatch(rt.session_factory, celery, rt.settings.redispatch_after_s),
        ),
        Pass(
            "nightly",
            nightly_interval_s,
            lambda: nightly_tick(
                rt.session_factory,
                celery,
                rt.clusters,
                webhook_allow_private=rt.settings.webhook_allow_private,
                deliver_webhooks=deliver_webhooks,
            ),
        ),
    ]


def _dispatch(session_factory, celery, redispatch_after_s: float) -> None:
    outcome = dispatch_pending(session_factory, celery)
    if outcome.ok:
        outcome = redispatch_stale(session_factory, celery, redispatch_after_s)
    if outcome.error:
        log.warning("dispatcher: %s", outcome.error)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.scheduler", description=__doc__.splitlines()[0])
    parser.add_argument("--reap-interval-s", type=float, default=5.0)
    parser.add_argument("--dispatch-interval-s", type=float, default=3.0)
    parser.add_argument("--nightly-interval-s", type=float, default=NIGHTLY_TICK_S)
    parser.add_argument("--once", action="store_true", help="Run each pass once, then exit.")
    parser.add_argument("--webhook-interval-s", type=float, default=SENDER_INTERVAL_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    todo = passes(args.reap_interval_s, args.dispatch_interval_s, args.nightly_interval_s, deliver_webhooks=args.once)
    log.info("scheduler: %s", ", ".join(f"{p.name} every {p.interval_s:g} s" for p in todo))
    sender = None
    if not args.once:
        rt = get_runtime()
        sender = WebhookSender(
            rt.session_factory, allow_private=rt.settings.webhook_allow_private, interval_s=args.webhook_interval_s
        )
        sender.start()
    while not stop:
        for p in todo:
            if time.monotonic() >= p.due_at:
                p.due_at = time.monotonic() + p.interval_s
                _guarded(p.name, p.run)
        if args.once:
            break
        time.sleep(min(0.5, max(0.0, min(p.due_at for p in todo) - time.monotonic())))
    if sender is not None:
        sender.stop()


def _guarded(name: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except sa.exc.OperationalError as exc:
        log.warning("%s: database unavailable (%s)", name, exc.__class__.__name__)
    except Exception:  # noqa: BLE001 - one failed pass must not stop the scheduler; it is logged
        log.exception("%s pass failed", name)


if __name__ == "__main__":
    main()
