"""The Celery app for the `celery` CLI: `celery -A worker.main:app worker -Q local-cpu --pool solo`.

Only worker processes import this module (the API publishes by task name through worker.queue). Periodic
work (reaper, dispatcher, nightly tick) is the scheduler process's (`python -m worker.scheduler`).
"""

from __future__ import annotations

import logging

from osutil.private import private_umask
from worker.queue import make_celery

private_umask()  # run directories, logs and result files: the worker's user's only (osutil.private)
app = make_celery(include=["worker.tasks"])
logging.getLogger("worker").setLevel(logging.INFO)
