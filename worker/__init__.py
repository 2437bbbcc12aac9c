"""scalebench worker package (see DESIGN.md for its import rules)."""
