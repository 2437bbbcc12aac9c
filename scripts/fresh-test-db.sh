#!/usr/bin/env bash
# Drops and re-creates the test database, then builds its schema with `alembic upgrade head`.
set -euo pipefail
db=${1:-scalebench_test}
psql -h 127.0.0.1 -U root -d postgres -v ON_ERROR_STOP=1 -q \
  -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
SCALEBENCH_DATABASE_URL="postgresql+psycopg://root@127.0.0.1:5432/$db" .venv/bin/alembic upgrade head
