#!/usr/bin/env bash
# Makes sure PostgreSQL and Redis answer on 127.0.0.1; starts them if installed but down.
set -u
pg_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    echo "PostgreSQL is down: starting it"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 30); do pg_up && break; sleep 0.5; done
  fi
fi
pg_up || { echo "ERROR: PostgreSQL does not answer on 127.0.0.1:5432 and is not installed here (apt-get install postgresql)"; exit 1; }

if ! redis_up; then
  if command -v redis-server >/dev/null; then
    echo "Redis is down: starting it"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
    for _ in $(seq 30); do redis_up && break; sleep 0.2; done
  fi
fi
redis_up || { echo "ERROR: Redis does not answer on 127.0.0.1:6379 and is not installed here (apt-get install redis-server)"; exit 1; }
echo "PostgreSQL and Redis answer on 127.0.0.1"
