#!/usr/bin/env bash
# System packages the slow tests need (browser, Slurm, compose CLI for tests/test_compose.py), installed once; each is skipped if present.
set -u
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v sbatch >/dev/null || need+=(slurm-wlm munge)
command -v docker-compose >/dev/null || need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (Debian packages) for the browser and Slurm tests"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >/tmp/scalebench-apt.log 2>&1 \
      || echo "WARNING: apt-get install ${need[*]} failed (see /tmp/scalebench-apt.log); those tests will skip"
  else
    echo "WARNING: not root; install ${need[*]} by hand or those tests will skip"
  fi
fi
exit 0
