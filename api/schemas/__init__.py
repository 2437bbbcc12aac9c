"""Request and response schemas by resource (experiments and runs, nightly resources, projection and plan)."""
