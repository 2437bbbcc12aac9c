"""scalebench db package (see DESIGN.md for its import rules)."""
