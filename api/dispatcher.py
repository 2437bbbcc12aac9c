"""Background dispatcher: every few seconds, publish queued runs that a down broker left undispatched."""

from __future__ import annotations

import asyncio
import logging

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from worker.dispatch import dispatch_pending

log = logging.getLogger(__name__)


async def dispatcher_loop(session_factory: sessionmaker[Session], celery: Celery, interval_s: float) -> None:
    """Runs until cancelled. Each pass runs in a thread (blocking DB and broker I/O)."""
    last_error: str | None = None
    while True:
        try:
            outcome = await asyncio.to_thread(dispatch_pending, session_factory, celery)
            error = outcome.error
        except Exception as exc:  # the database may be down too; keep trying, log once per change
            error = f"{type(exc).__name__}: {exc}"
        if error != last_error:
            (log.warning if error else log.info)("dispatcher: %s", error or "broker and database reachable")
            last_error = error
        await asyncio.sleep(interval_s)
