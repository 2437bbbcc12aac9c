"""scalebench runner package (see DESIGN.md for its import rules)."""
