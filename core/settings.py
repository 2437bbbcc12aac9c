"""Settings from the environment (stdlib only). Defaults are the embedded stack: SQLite + filesystem broker."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _bool(value: str | None, default: bool = False) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    data_dir: Path = Path(".scalebench")
    database_url: str = ""
    broker_url: str = ""
    clusters_file: str | None = None
    require_read_token: bool = False
    runs_dir: Path = field(default=Path(".scalebench/runs"))
    heartbeat_s: float = 5.0
    lease_s: float = 30.0  # a running run whose heartbeat is older than this is reaped
    max_infra_retries: int = 2
    # Request bodies above these sizes are answered 413 before they are parsed (import carries loss curves).
    max_body_bytes: int = 4 << 20
    max_import_body_bytes: int = 64 << 20
    # Writes per token: a token bucket refilled at write_rate_per_min, holding at most write_burst; 0: no limit.
    write_rate_per_min: float = 600.0
    write_burst: int = 300
    # A queued run whose latest message is older than this and that no worker claimed is published again
    # (the broker may have lost the message, e.g. a Redis without an append-only file restarted).
    redispatch_after_s: float = 1800.0
    # Webhooks go to public addresses only; an operator with a receiver inside the cluster allows private ones.
    webhook_allow_private: bool = False
    # An experiment's change fingerprint (its ETag) is reused this long by every request of an API process: a
    # thousand dashboards polling one experiment cost one query a second. A change shows up this much later; 0: off.
    etag_ttl_s: float = 1.0
    # Whole answers (/scaling JSON, CSV, PNG) kept per API process by their ETag; 0: off.
    report_cache_size: int = 64

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        data_dir = Path(e.get("SCALEBENCH_DATA_DIR", ".scalebench")).resolve()
        database_url = (
            e.get("SCALEBENCH_DATABASE_URL") or e.get("DATABASE_URL") or f"sqlite:///{data_dir / 'scalebench.db'}"
        )
        broker_url = e.get("SCALEBENCH_BROKER_URL") or e.get("REDIS_URL") or f"filesystem://{data_dir / 'broker'}"
        return cls(
            data_dir=data_dir,
            database_url=database_url,
            broker_url=broker_url,
            clusters_file=e.get("SCALEBENCH_CLUSTERS_FILE") or None,
            require_read_token=_bool(e.get("SCALEBENCH_REQUIRE_READ_TOKEN")),
            runs_dir=Path(e.get("SCALEBENCH_RUNS_DIR", str(data_dir / "runs"))).resolve(),
            heartbeat_s=float(e.get("SCALEBENCH_HEARTBEAT_S", "5")),
            lease_s=float(e.get("SCALEBENCH_LEASE_S", "30")),
            max_infra_retries=int(e.get("SCALEBENCH_MAX_INFRA_RETRIES", "2")),
            max_body_bytes=int(e.get("SCALEBENCH_MAX_BODY_BYTES", str(cls.max_body_bytes))),
            max_import_body_bytes=int(e.get("SCALEBENCH_MAX_IMPORT_BODY_BYTES", str(cls.max_import_body_bytes))),
            write_rate_per_min=float(e.get("SCALEBENCH_WRITE_RATE_PER_MIN", str(cls.write_rate_per_min))),
            write_burst=int(e.get("SCALEBENCH_WRITE_BURST", str(cls.write_burst))),
            redispatch_after_s=float(e.get("SCALEBENCH_REDISPATCH_AFTER_S", "1800")),
            webhook_allow_private=_bool(e.get("SCALEBENCH_WEBHOOK_ALLOW_PRIVATE")),
            etag_ttl_s=float(e.get("SCALEBENCH_ETAG_TTL_S", str(cls.etag_ttl_s))),
            report_cache_size=int(e.get("SCALEBENCH_REPORT_CACHE", str(cls.report_cache_size))),
        )

    @property
    def broker_is_filesystem(self) -> bool:
        return self.broker_url.startswith("filesystem://")
