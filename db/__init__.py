"""Every SQL statement and run state transition; imports core only (docs/architecture.md)."""
