"""Private files under the data dir: run directories, logs and the filesystem broker hold specs, results, logs
and queued task bodies (a run's log may show a token holder's paths and hosts). Directories are 0700 and files
0600: the processes that write there run with umask 077, and each directory is made (or made again) 0700, since
mkdir's mode is masked by the umask and a directory made by an earlier version may be 0755."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_UMASK = 0o077


def private_umask() -> int:
    """Files and directories this process (and its children) creates are its user's only; the old umask."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: str | Path) -> Path:
    """`path` as a directory only its owner can read, write or enter (parents made as needed)."""
    p = Path(path)
    p.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    if p.stat().st_mode & 0o777 != PRIVATE_DIR_MODE:
        os.chmod(p, PRIVATE_DIR_MODE)
    return p
