"""CLI command groups; api.cli.GROUPS registers each (add a module here and one line there)."""
