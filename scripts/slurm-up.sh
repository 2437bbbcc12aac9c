#!/usr/bin/env bash
# Idempotent one-node Slurm on this machine (root, Debian 12, no systemd as init): installs slurm-wlm and
# munge if missing, renders /etc/slurm/slurm.conf from scripts/slurm/, starts munged, slurmdbd (when the
# local MariaDB answers: it gives `sacct`), slurmctld and slurmd directly, and waits until the node is idle.
# Fast when already up with the same configuration. Exit status 0 only when `sinfo` shows the node usable.
#
#   SCALEBENCH_SLURM_ACCOUNTING=auto|slurmdbd|none   (default auto: slurmdbd if MariaDB answers on 127.0.0.1:3306)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
templates=$here/slurm
conf_dir=/etc/slurm
log_dir=/var/log/slurm
accounting=${SCALEBENCH_SLURM_ACCOUNTING:-auto}

say() { echo "slurm-up: $*"; }
die() {
  echo "slurm-up: ERROR: $*" >&2
  for f in "$log_dir"/slurmctld.log "$log_dir"/slurmd.log "$log_dir"/slurmdbd.log; do
    [ -s "$f" ] && { echo "--- last lines of $f" >&2; tail -n 8 "$f" >&2; }
  done
  exit 1
}

# Exit status 2: Slurm cannot be installed here (tests skip); 1: installed but it does not come up (tests fail).
die_install() { echo "slurm-up: CANNOT INSTALL: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die_install "must run as root (it installs packages and starts daemons)"
command -v apt-get >/dev/null || command -v sbatch >/dev/null || die_install "no apt-get and no Slurm here"

host=$(hostname -s)
if ! getent hosts "$host" >/dev/null; then
  # slurmd and torchrun's rendezvous both reach this node by its name
  say "adding '127.0.0.1 $host' to /etc/hosts (the node name must resolve)"
  echo "127.0.0.1 $host" >>/etc/hosts
fi
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc alone would honour OMP_NUM_THREADS
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)

# ------------------------------------------------------------------------------------------- packages
install_packages() {
  local need=()
  for bin in sbatch:slurm-client slurmctld:slurmctld slurmd:slurmd munged:munge; do
    command -v "${bin%%:*}" >/dev/null || need+=("${bin##*:}")
  done
  if [ "$1" = slurmdbd ] && ! command -v slurmdbd >/dev/null; then need+=(slurmdbd); fi
  [ ${#need[@]} -eq 0 ] && return 0
  say "installing ${need[*]} (apt-get; log in /tmp/slurm-up-apt.log)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurm-wlm "${need[@]}"; } >/tmp/slurm-up-apt.log 2>&1 \
    || die_install "apt-get install ${need[*]} failed (see /tmp/slurm-up-apt.log)"
}

mariadb_answers() {
  command -v mysql >/dev/null && mysql -h 127.0.0.1 -P 3306 -u root --connect-timeout=2 -e 'SELECT 1' >/dev/null 2>&1
}

case "$accounting" in
  auto) if mariadb_answers; then accounting=slurmdbd; else accounting=none; fi ;;
  slurmdbd) mariadb_answers || die "SCALEBENCH_SLURM_ACCOUNTING=slurmdbd but MariaDB does not answer on 127.0.0.1:3306 as root" ;;
  none) ;;
  *) die "SCALEBENCH_SLURM_ACCOUNTING must be auto, slurmdbd or none, not '$accounting'" ;;
esac

# ------------------------------------------------------------------------------------------- config
render_conf() {
  local acct min_age
  if [ "$accounting" = slurmdbd ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd"$'\n'"AccountingStorageHost=localhost"
    min_age=300  # like a real cluster: finished jobs leave the controller after 5 min, sacct keeps them
  else
    acct="AccountingStorageType=accounting_storage/none"
    min_age=86400  # no sacct without slurmdbd: keep finished jobs in `scontrol show job` for a day
  fi
  sed -e "s/@HOST@/$host/g" -e "s/@CPUS@/$cpus/g" -e "s/@MEM_MB@/$mem_mb/g" -e "s/@MIN_JOB_AGE@/$min_age/g" \
    "$templates/slurm.conf.in" | awk -v acct="$acct" '{ if ($0 == "@ACCOUNTING@") print acct; else print }'
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_state() { timeout 5 sinfo -h -n "$host" -o %T 2>/dev/null | head -n1 | tr -d '*~#!%$@^-'; }
node_usable() { case "$(node_state)" in idle|mixed|allocated|completing) return 0 ;; *) return 1 ;; esac; }

new_conf=$(render_conf)
if [ -f "$conf_dir/slurm.conf" ] && [ "$new_conf" = "$(cat "$conf_dir/slurm.conf")" ] \
   && pid_alive /run/slurmctld.pid && pid_alive /run/slurmd.pid && node_usable; then
  say "already up: node $host is $(node_state) (accounting: $accounting)"
  exit 0
fi

t0=$(date +%s)
install_packages "$accounting"
mkdir -p "$conf_dir" "$log_dir" /var/spool/slurmctld /var/spool/slurmd /run/munge /var/log/munge /var/lib/munge

# Daemons of an older configuration are stopped by their pid files (never by name).
stop_pidfile() {
  local f=$1 pid
  pid_alive "$f" || return 0
  pid=$(cat "$f"); kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}
if [ -f "$conf_dir/slurm.conf" ] && [ "$new_conf" != "$(cat "$conf_dir/slurm.conf")" ]; then
  say "configuration changed: restarting the Slurm daemons"
  stop_pidfile /run/slurmd.pid; stop_pidfile /run/slurmctld.pid; stop_pidfile /run/slurmdbd.pid
fi
printf '%s\n' "$new_conf" >"$conf_dir/slurm.conf"

# ------------------------------------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
  say "creating the munge key"
  mungekey --create --keyfile /etc/munge/munge.key 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
fi
chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
chmod 700 /etc/munge; chmod 600 /etc/munge/munge.key; chmod 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged || die "munged did not start (see /var/log/munge/munged.log)"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null 2>&1 || die "munge credentials do not round-trip (munge -n | unmunge)"
fi

# ------------------------------------------------------------------------------------------- daemons
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if [ "$accounting" = slurmdbd ]; then
  sed -e "s/@HOST@/$host/g" "$templates/slurmdbd.conf.in" >"$conf_dir/slurmdbd.conf"
  chmod 600 "$conf_dir/slurmdbd.conf"
  if ! pid_alive /run/slurmdbd.pid; then
    say "starting slurmdbd (MariaDB on 127.0.0.1:3306)"
    /usr/sbin/slurmdbd || die "slurmdbd did not start"
  fi
  for _ in $(seq 100); do port_open 6819 && break; sleep 0.1; done
  port_open 6819 || die "slurmdbd does not answer on port 6819"
fi
if ! pid_alive /run/slurmctld.pid; then
  say "starting slurmctld"
  /usr/sbin/slurmctld || die "slurmctld did not start"
fi
for _ in $(seq 100); do timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.2; done
timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' || die "slurmctld does not answer (scontrol ping)"
if [ "$accounting" = slurmdbd ]; then
  # slurmctld registers its cluster on its own; adding it by hand is harmless when it already exists
  sacctmgr -i add cluster scalebench >/dev/null 2>&1 || true
fi
if ! pid_alive /run/slurmd.pid; then
  say "starting slurmd"
  /usr/sbin/slurmd || die "slurmd did not start"
fi

# ------------------------------------------------------------------------------------------- wait idle
for _ in $(seq 150); do
  node_usable && break
  case "$(node_state)" in
    down|drained|draining|drain|fail) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.2
done
node_usable || die "node $host is '$(node_state)' after 30 s, not idle (sinfo -R says: $(sinfo -h -R 2>/dev/null | head -n1))"
say "up in $(( $(date +%s) - t0 )) s: node $host ($cpus CPUs) is $(node_state); accounting: $accounting"
