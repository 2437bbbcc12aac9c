"""Process-tree helpers for launched runs (Linux /proc; no psutil).

torchrun starts every rank with `start_new_session=True`, so a rank is *not* in torchrun's process group:
killing torchrun's group alone can leave ranks behind. Ranks are found instead by their command line,
which names the run's spec.json (unique per run directory).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """preexec_fn: the child gets `sig` when the thread that forked it dies (also on SIGKILL of the worker).

    SIGTERM (not SIGKILL) so that torchrun can forward it to its ranks before exiting.
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:  # not glibc Linux: nothing to set, the sweep by command line still applies
        pass


def start_time_ticks(pid: int) -> int | None:
    """The process start time (clock ticks since boot) from /proc/<pid>/stat; None if it is gone.

    Together with the pid it identifies a process across pid reuse.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: split after its closing parenthesis.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19])  # field 22 overall


def is_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True if pid runs (not a zombie) and, when given, started at start_ticks."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return False
    return start_ticks is None or int(fields[19]) == start_ticks


def _pids_where(match: Callable[[list[bytes]], bool]) -> list[int]:
    """Live processes (not this one) whose argument list (bytes) satisfies `match`."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if match(args) and is_alive(int(entry)):
            found.append(int(entry))
    return found


def pids_with_arg(needle: str) -> list[int]:
    """Live processes whose command line contains `needle` as one argument (exact match)."""
    return _pids_where(lambda args: needle.encode() in args)


def pids_with_arg_like(prefix: str, suffix: str) -> list[int]:
    """Live processes with an argument that starts with `prefix` and ends with `suffix` (e.g. the spec.json of
    any run under a runs dir: torchrun and its ranks)."""
    head, tail = prefix.encode(), suffix.encode()
    return _pids_where(lambda args: any(a.startswith(head) and a.endswith(tail) for a in args))


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_run_processes(
    pgid: int | None, spec_arg: str, grace_s: float = 5.0, reap: Callable[[], object] | None = None
) -> None:
    """SIGTERM the launcher's group and every process naming spec_arg; SIGKILL what is left after grace_s.

    `reap` (optional callable) is polled while waiting, so that our own child does not linger as a zombie.
    """
    if pgid is not None:
        signal_group(pgid, signal.SIGTERM)
    signal_pids(pids_with_arg(spec_arg), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        group_alive = pgid is not None and is_alive(pgid)
        if not group_alive and not pids_with_arg(spec_arg):
            return
        time.sleep(0.1)
    left = pids_with_arg(spec_arg)
    log.warning("run processes still alive %.1f s after SIGTERM: SIGKILL group %s and pids %s", grace_s, pgid, left)
    if pgid is not None:
        signal_group(pgid, signal.SIGKILL)
    signal_pids(left, signal.SIGKILL)
    if reap is not None:
        for _ in range(20):
            reap()
            if pgid is None or not is_alive(pgid):
                break
            time.sleep(0.05)


_TCP_LISTEN = "0A"  # st column of /proc/net/tcp{,6}


def tcp_listener_pids(port: int) -> list[int]:
    """Processes holding a listening TCP socket on `port` (any address), from /proc/net/tcp{,6} and the socket
    inodes in /proc/<pid>/fd. Empty when none is visible (another user's processes, other namespaces)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) > 9 and fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for entry in os.listdir("/proc") if inodes else []:
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                    pids.append(int(entry))
                    break
            except OSError:
                continue
    return sorted(pids)


def describe(pid: int, max_chars: int = 200) -> str:
    """'pid 123 (python -m http.server 8000)' from /proc; just 'pid 123' when its command line is not readable."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return f"pid {pid}"
    cmd = " ".join(a.decode(errors="replace") for a in args)
    return f"pid {pid} ({cmd[:max_chars]})" if cmd else f"pid {pid}"
