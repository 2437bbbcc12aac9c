"""The HTTP server; imports core, db and worker.queue only (docs/architecture.md)."""
