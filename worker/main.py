"""The Celery app for the `celery` CLI: `celery -A worker.main:app worker -Q local-cpu --pool solo`.

Only the worker and beat processes import this module (the API publishes by task name).
"""

from __future__ import annotations

import logging

from worker.celery_app import make_celery

app = make_celery(include=["worker.tasks"])
logging.getLogger("worker").setLevel(logging.INFO)
