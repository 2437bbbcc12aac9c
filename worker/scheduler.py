"""The scheduler process (`scalebench up`'s and compose's `beat`): the reaper pass every few seconds and the
nightly tick (worker/nightly.py) on its own period, in one plain loop.

    python -m worker.scheduler [--reap-interval-s 5] [--nightly-interval-s NIGHTLY_TICK_S]

Celery beat can drive the same two tasks (scalebench.reap, scalebench.nightly_tick); this loop needs no
worker to be free, which matters when the only worker is busy with a long run.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time

import sqlalchemy as sa

from worker.celery_app import make_celery
from worker.nightly import NIGHTLY_TICK_S, nightly_tick
from worker.reaper import reap_once
from worker.runtime import get_runtime

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reap-interval-s", type=float, default=5.0)
    parser.add_argument("--nightly-interval-s", type=float, default=NIGHTLY_TICK_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    rt = get_runtime()
    celery = make_celery(rt.settings)
    log.info("scheduler: reaper every %.0f s, nightly tick every %.0f s", args.reap_interval_s,
             args.nightly_interval_s)
    next_reap = next_nightly = 0.0
    while not stop:
        now = time.monotonic()
        if now >= next_reap:
            next_reap = now + args.reap_interval_s
            _guarded("reaper", lambda: reap_once(rt, celery))
        if now >= next_nightly:
            next_nightly = now + args.nightly_interval_s
            _guarded("nightly", lambda: nightly_tick(rt.session_factory, celery, rt.clusters))
        time.sleep(min(0.5, max(0.0, min(next_reap, next_nightly) - time.monotonic())))


def _guarded(name: str, fn) -> None:  # noqa: ANN001
    try:
        fn()
    except sa.exc.OperationalError as exc:
        log.warning("%s: database unavailable (%s)", name, exc.__class__.__name__)
    except Exception:  # noqa: BLE001 - one failed pass must not stop the scheduler; it is logged
        log.exception("%s pass failed", name)


if __name__ == "__main__":
    main()
