"""scalebench api package (see DESIGN.md for its import rules)."""
