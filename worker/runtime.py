"""Per-process runtime of a worker: settings, clusters, one DB engine and session factory, launchers.

Cached by pid: a Celery prefork child (or any forked process) builds its own engine instead of reusing
the parent's pooled connections, which must never cross a fork.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from core.contracts.clusters import Cluster, load_clusters
from core.settings import Settings
from db.session import make_engine, make_session_factory
from osutil.private import private_dir
from worker.launchers.base import Launcher

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    clusters: dict[str, Cluster]
    engine: sa.Engine
    session_factory: sessionmaker[Session]
    pid: int

    @property
    def host(self) -> str:
        return socket.gethostname()

    @property
    def worker_name(self) -> str:
        return f"{socket.gethostname()}:{self.pid}"

    def cluster(self, name: str) -> Cluster:
        if name not in self.clusters:
            raise ValueError(f"cluster: {name!r} is not configured here; allowed: {', '.join(sorted(self.clusters))}")
        return self.clusters[name]

    def launcher(self, cluster: Cluster) -> Launcher:
        if cluster.launcher == "slurm":
            from worker.launchers.slurm import SlurmLauncher  # only workers of Slurm clusters need it

            return SlurmLauncher(cluster)
        from worker.launchers.local import LocalLauncher

        return LocalLauncher(cluster)

    def run_dir(self, cluster: Cluster, run_id: int, lease_id: int) -> Path:
        """Where the files of one claim of a run live: the cluster's shared directory for Slurm, else the local
        runs dir, then run-N/lease-K. One directory per claim, so that a sweep of one attempt (processes
        whose argv names its spec.json) never matches another attempt's processes."""
        if cluster.slurm and cluster.slurm.shared_dir:
            base = Path(cluster.slurm.shared_dir)
        else:
            base = private_dir(self.settings.runs_dir)  # run directories under it are the worker's only
        return (base / f"run-{run_id}" / f"lease-{lease_id}").resolve()


_RUNTIMES: dict[int, Runtime] = {}


def get_runtime(settings: Settings | None = None) -> Runtime:
    """This process's runtime (built on first use, rebuilt after a fork)."""
    pid = os.getpid()
    rt = _RUNTIMES.get(pid)
    if rt is None:
        settings = settings or Settings.from_env()
        engine = make_engine(settings.database_url)
        rt = Runtime(
            settings=settings,
            clusters=load_clusters(settings.clusters_file),
            engine=engine,
            session_factory=make_session_factory(engine),
            pid=pid,
        )
        _RUNTIMES.clear()  # a parent's runtime is not ours (forked): drop it without disposing its pool
        _RUNTIMES[pid] = rt
        log.info(
            "worker runtime: pid %d, database %s, clusters %s",
            pid,
            engine.url.render_as_string(hide_password=True),
            ", ".join(sorted(rt.clusters)),
        )
    return rt


def reset_runtime() -> None:
    """Dispose this process's engine (tests, shutdown)."""
    rt = _RUNTIMES.pop(os.getpid(), None)
    if rt is not None:
        rt.engine.dispose()
