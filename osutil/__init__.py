"""Operating-system helpers: processes (procs: parent-death signals, process groups, /proc scans) and name
resolution (dns). Not pure, so not in core; worker, api, cli and runner may import it (tests/test_imports.py)."""
