"""TimescaleDB: detection, and the retention and compression policies on the `runs` hypertable."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection

# Chunks older than this are compressed (segmented by endpoint, so per-endpoint scans stay cheap).
DEFAULT_COMPRESS_AFTER_S = 7 * 86400.0


async def timescale_available(conn: AsyncConnection[Any]) -> bool:
    """True when the timescaledb extension is installed, or can be installed, in this database."""
    if await (await conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'timescaledb'")).fetchone():
        return True
    if not await (
        await conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb'")
    ).fetchone():
        return False
    try:
        # Fails without shared_preload_libraries or privileges: then plain PostgreSQL it is.
        async with conn.transaction():
            await conn.execute("CREATE EXTENSION IF NOT EXISTS timescaledb")
    except Exception:
        return False
    return True


async def policy_jobs(conn: AsyncConnection[Any]) -> dict[str, int]:
    """Job ids of the policies on `runs`, keyed by proc name (policy_retention, policy_compression)."""
    cur = await conn.execute(
        "SELECT proc_name, job_id FROM timescaledb_information.jobs WHERE hypertable_name = 'runs'"
    )
    return {name: int(job) for name, job in await cur.fetchall()}


async def ensure_policies(conn: AsyncConnection[Any], *, retention_s: float, compress_after_s: float) -> None:
    """Enable compression on `runs` and (re)set the retention and compression policies to the settings."""
    row = await (
        await conn.execute(
            "SELECT compression_enabled FROM timescaledb_information.hypertables "
            "WHERE hypertable_name = 'runs'"
        )
    ).fetchone()
    if row is not None and not row[0]:
        await conn.execute(
            "ALTER TABLE runs SET (timescaledb.compress, timescaledb.compress_segmentby = 'endpoint_id', "
            "timescaledb.compress_orderby = 'time DESC')"
        )
    wanted = {
        "policy_retention": ("drop_after", timedelta(seconds=retention_s)),
        "policy_compression": ("compress_after", timedelta(seconds=compress_after_s)),
    }
    jobs = await policy_jobs(conn)
    for proc, (key, interval) in wanted.items():
        if proc in jobs:
            cur = await conn.execute(
                "SELECT config FROM timescaledb_information.jobs WHERE job_id = %s", (jobs[proc],)
            )
            config = (await cur.fetchone() or [{}])[0] or {}
            current = await (await conn.execute("SELECT %s::interval", (config.get(key),))).fetchone()
            if current is not None and current[0] == interval:
                continue
            remove = "remove_retention_policy" if proc == "policy_retention" else "remove_compression_policy"
            await conn.execute(f"SELECT {remove}('runs', if_exists => true)")
        add = "add_retention_policy" if proc == "policy_retention" else "add_compression_policy"
        await conn.execute(f"SELECT {add}('runs', %s::interval)", (interval,))


async def run_policies(conn: AsyncConnection[Any]) -> list[int]:
    """Run the `runs` policies now (`CALL run_job`) where no background worker does; returns job ids."""
    jobs = await policy_jobs(conn)
    ran = []
    for proc in ("policy_compression", "policy_retention"):
        if proc in jobs:
            await conn.execute(f"CALL run_job({jobs[proc]})")
            ran.append(jobs[proc])
    return ran
