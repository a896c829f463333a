"""A throwaway local PostgreSQL (initdb + pg_ctl on 127.0.0.1) for the tests and the benchmarks; not part of
the shipped package."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

PASSWORD = "tw-test-Secret-9"  # throwaway cluster, loopback only
USER = "tokwatch"


def find_bindir() -> Path | None:
    """Directory holding initdb and pg_ctl: `pg_config --bindir`, else /usr/lib/postgresql/<newest>/bin."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        try:
            out = subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = sorted(
            (p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True
        )
        candidates += [v / "bin" for v in versions]
    return next((c for c in candidates if (c / "initdb").exists() and (c / "pg_ctl").exists()), None)


def free_port() -> int:
    """An ephemeral loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    """One cluster in a temp dir; `start()`/`stop()` may repeat (outage tests); `destroy()` removes it."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tokwatch-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        # initdb refuses to run as root: run the server binaries as the `postgres` system user then.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.running = False

    def _cmd(self, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [*self._as, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{Path(args[0]).name} failed: {result.stderr.strip()[-2000:]}\n{log}")

    def init(self) -> None:
        """initdb with SCRAM password auth over TCP for user `tokwatch`."""
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._as:
            shutil.chown(self.dir, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        self._cmd(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            USER,
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            f"--pwfile={pwfile}",
            "-E",
            "UTF8",
            "--no-sync",
        )
        pwfile.unlink()

    def start(self) -> None:
        """Start on 127.0.0.1:port (fsync off: throwaway data) and wait until it accepts connections."""
        opts = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        self._cmd(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start"
        )
        self.running = True

    def stop(self) -> None:
        """Fast shutdown (clients are disconnected)."""
        if self.running:
            self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.running = False

    def destroy(self) -> None:
        """Stop (immediate) and delete the cluster."""
        if self.running:
            try:
                self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
            finally:
                self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def dsn(self, dbname: str = "postgres", password: str = PASSWORD) -> str:
        """A libpq URI for a database on this cluster."""
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name`; returns its DSN."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.dsn(name)

    def new_database(self) -> str:
        """A fresh, uniquely named database (the server is restarted if a test stopped it); its DSN."""
        if not self.running:
            self.start()
        return self.create_database(f"t_{uuid.uuid4().hex[:12]}")


def stored_runs(dsn: str, until: float = 2e9) -> list[tuple[str, int]]:
    """(run_id, rows) of every run stored at or before unix time `until`: more than one row is a duplicate."""
    import psycopg  # the PostgreSQL tests' extra: imported where a test that has it asks

    with psycopg.connect(dsn, connect_timeout=5) as conn:
        return conn.execute(
            "SELECT run_id, count(*) FROM runs WHERE time <= to_timestamp(%s) GROUP BY run_id", (until,)
        ).fetchall()
