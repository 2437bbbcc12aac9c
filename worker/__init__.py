"""Celery app and thin tasks, run execution, launchers, the scheduler; imports core and db (docs/architecture.md)."""
