"""The Celery app for the `celery` CLI: `celery -A worker.main:app worker -Q local-cpu --pool solo`.

Only the worker and beat processes import this module (the API publishes by task name).
"""

from __future__ import annotations

import logging

from worker.celery_app import make_celery
from worker.nightly import BEAT_SCHEDULE

app = make_celery(include=["worker.tasks", "worker.nightly"])
# `celery -A worker.main:app beat` + a worker on NIGHTLY_QUEUE: the nightly tick every 30 s (worker/nightly.py;
# `python -m worker.nightly` is the same tick as a plain loop).
app.conf.beat_schedule = BEAT_SCHEDULE
logging.getLogger("worker").setLevel(logging.INFO)
