"""The `scalebench` command: a client of the HTTP API, the embedded stack supervisor (`up`) and the demo."""
