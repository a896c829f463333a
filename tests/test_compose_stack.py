"""docker-compose.yml as an operator runs it: the monitoring never waits on the exporter, each container gets
only its own secrets, placeholder passwords stop the stack, Grafana reads the store through a read-only role
(created by the compose init script on a real PostgreSQL here), and the build context carries no secrets or
state (the real docker client, talking to a stand-in daemon: there is no Docker engine here)."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from tests.support.postgres import PASSWORD, USER, LocalPostgres

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
MONITORING = ("prometheus", "alertmanager", "grafana", "alert-sink")
MONITORED = ("tokwatch", "tokwatch-demo", "timescaledb", "sim")
REFUSE = ROOT / "deploy" / "compose" / "refuse-placeholder-secrets.sh"
READER_INIT = ROOT / "deploy" / "compose" / "timescaledb-init" / "grafana-reader.sh"


def _services() -> dict[str, dict[str, object]]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]  # type: ignore[no-any-return]


def _depends(svc: dict[str, object]) -> dict[str, str]:
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):  # the short form means service_started
        return dict.fromkeys(deps, "service_started")
    return {name: spec["condition"] for name, spec in deps.items()}  # type: ignore[union-attr]


def test_the_monitoring_starts_whatever_the_exporter_does() -> None:
    """No monitoring service depends, even through another service, on tokwatch (or its database or the
    demo), and none waits for any service's health: a broken tokwatch config cannot keep Prometheus,
    Alertmanager or Grafana from running, so TokwatchDown can fire."""
    services = _services()
    for name in MONITORING:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            for dep, condition in _depends(services[current]).items():
                assert condition == "service_started", f"{current} waits for {dep}: {condition}"
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        assert not seen & set(MONITORED), f"{name} depends on {sorted(seen & set(MONITORED))}"
    assert _depends(services["prometheus"]) == {"alertmanager": "service_started"}
    # the exporter itself still waits for its database to accept connections
    assert _depends(services["tokwatch"]) == {"timescaledb": "service_healthy"}


def test_every_container_gets_only_its_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """tokwatch gets its DSN and the API keys its config names, never the whole .env (Grafana's admin
    password, the database owner's password as such); Grafana gets its admin password and the read-only
    role's, not the owner's."""
    from tokwatch.settings.config import load_config

    services = _services()
    assert not [name for name, svc in services.items() if "env_file" in svc]
    monkeypatch.setenv("TOKWATCH_DSN", "postgresql://tokwatch@timescaledb/tokwatch")
    config = load_config(ROOT / "deploy" / "compose" / "tokwatch.yml")
    keys = {e.api_key_env for e in config.endpoints if e.api_key_env}
    assert keys == {"OPENAI_API_KEY"}
    assert set(services["tokwatch"]["environment"]) == {"TOKWATCH_DSN"} | keys  # type: ignore[arg-type]
    grafana = services["grafana"]["environment"]
    assert set(grafana) == {"GF_SECURITY_ADMIN_PASSWORD", "GRAFANA_PG_PASSWORD"}  # type: ignore[arg-type]
    database = services["timescaledb"]["environment"]
    assert set(database) == {"POSTGRES_USER", "POSTGRES_DB", "POSTGRES_PASSWORD", "GRAFANA_PG_PASSWORD"}  # type: ignore[arg-type]
    # compose stops `up` at once when a password is unset or empty
    text = COMPOSE.read_text(encoding="utf-8")
    for var in ("TOKWATCH_PG_PASSWORD", "GRAFANA_PG_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        uses = text.count("${" + var)
        assert uses and text.count("${" + var + ":?set " + var + " in .env}") == uses, var
    # .env.example ships no password, so a copied .env cannot slip a placeholder through
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert not [line for line in example.splitlines() if "change-me" in line and not line.startswith("#")]
    for var in ("TOKWATCH_PG_PASSWORD", "GRAFANA_PG_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        assert f"\n{var}=\n" in example


def _sh() -> str:
    found = shutil.which("sh")
    assert found is not None
    return found


def _refuse(env: dict[str, str], *names: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_sh(), str(REFUSE), *names, "--", _sh(), "-c", 'echo "started as $0"', "the-entrypoint"],
        env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "refusing to start: DB_PASSWORD is empty; set it in .env"),
        ("change-me", "refusing to start: DB_PASSWORD is still a placeholder; set a real password in .env"),
        ("Change-Me-Too", "refusing to start: DB_PASSWORD is still a placeholder"),
        ("changeme", "is still a placeholder"),
        ("admin", "is still a placeholder"),
    ],
)
def test_placeholder_passwords_are_refused_at_start(value: str, message: str) -> None:
    """The entry point wrapper of timescaledb and grafana (compose's ${VAR:?} already refuses unset ones)."""
    out = _refuse({"DB_PASSWORD": value, "ADMIN_PASSWORD": "a-real-one-7Qx"}, "DB_PASSWORD", "ADMIN_PASSWORD")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [message] or message in out.stderr
    assert "ADMIN_PASSWORD" not in out.stderr and (not value or value not in out.stderr)


def test_real_passwords_start_the_image_entrypoint_and_the_wrapper_is_wired() -> None:
    out = _refuse({"DB_PASSWORD": "s3cret-Enough", "UNSET_OK": "x"}, "DB_PASSWORD")
    assert (out.returncode, out.stdout, out.stderr) == (0, "started as the-entrypoint\n", "")
    unset = _refuse({}, "DB_PASSWORD")
    assert unset.returncode == 1 and "DB_PASSWORD is empty" in unset.stderr
    bad = _refuse({}, "not a name")
    assert bad.returncode == 64
    # wired in front of each image's own entry point, with the variables that service holds
    services = _services()
    mount = f"./{REFUSE.relative_to(ROOT)}:/tokwatch/refuse-placeholder-secrets.sh:ro"
    for name, variables, entrypoint, command in (
        ("timescaledb", ["POSTGRES_PASSWORD", "GRAFANA_PG_PASSWORD"], ["docker-entrypoint.sh"], ["postgres"]),
        ("grafana", ["GF_SECURITY_ADMIN_PASSWORD", "GRAFANA_PG_PASSWORD"], ["/run.sh"], None),
    ):
        svc = services[name]
        assert svc["entrypoint"] == [
            "/bin/sh", "/tokwatch/refuse-placeholder-secrets.sh", *variables, "--", *entrypoint
        ]  # fmt: skip
        assert svc.get("command") == command  # overriding entrypoint clears the image's CMD: set again
        assert mount in svc["volumes"]  # type: ignore[operator]
        assert set(variables) <= set(svc["environment"])  # type: ignore[arg-type]


def _psql(pg: LocalPostgres, db: str, user: str, password: str, sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(pg.bindir / "psql"), "-v", "ON_ERROR_STOP=1", "-X", "-q", "-A", "-t", "-c", sql],
        env={**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(pg.port), "PGDATABASE": db,
             "PGUSER": user, "PGPASSWORD": password},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_grafana_reads_the_store_through_a_read_only_role(pg_server: LocalPostgres, tmp_path: Path) -> None:
    """The compose init script, run as the TimescaleDB image runs it (as the owner, before tokwatch's
    migrations create the tables), then tokwatch's migrations: grafana_reader can read every table and
    write, alter or create nothing. Real PostgreSQL; the grant on TimescaleDB's hypertable chunks follows
    from the grant on the hypertable (TimescaleDB propagates it), which needs a TimescaleDB server."""

    dsn = pg_server.new_database()
    db = dsn.rsplit("/", 1)[1]
    reader_password = "graf-Reader-42"
    env = {**os.environ, "POSTGRES_USER": USER, "POSTGRES_DB": db, "GRAFANA_PG_PASSWORD": reader_password,
           "PGHOST": "127.0.0.1", "PGPORT": str(pg_server.port), "PGPASSWORD": PASSWORD,
           "PATH": f"{pg_server.bindir}:{os.environ['PATH']}"}  # fmt: skip
    try:
        init = subprocess.run([_sh(), str(READER_INIT)], env=env, capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        assert reader_password not in init.stdout + init.stderr
        migrate = subprocess.run(
            [sys.executable, "-m", "tokwatch", "db", "migrate"],
            env={**os.environ, "TOKWATCH_DSN": dsn}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert migrate.returncode == 0, migrate.stderr
        tables = _psql(
            pg_server, db, USER, PASSWORD, "SELECT tablename FROM pg_tables WHERE schemaname='public'"
        )
        names = set(tables.stdout.split())
        assert {
            "endpoints",
            "endpoint_aliases",
            "runs",
            "runs_hourly",
            "bench_runs",
            "bench_requests",
        } <= names
        for table in sorted(names):
            read = _psql(pg_server, db, "grafana_reader", reader_password, f"SELECT count(*) FROM {table}")
            assert read.returncode == 0 and read.stdout.strip().isdigit(), (table, read.stderr)
        for sql in (
            "INSERT INTO endpoints (name) VALUES ('x')",
            "DELETE FROM runs",
            "CREATE TABLE mine (x int)",
            "SET default_transaction_read_only = off; CREATE TABLE mine (x int)",
            "ALTER TABLE runs ADD COLUMN x int",
        ):
            denied = _psql(pg_server, db, "grafana_reader", reader_password, sql)
            assert denied.returncode != 0, sql
            assert "permission denied" in denied.stderr or "read-only transaction" in denied.stderr, (
                denied.stderr
            )
        # idempotent (an existing volume, run by hand): again, with a new password
        again = subprocess.run(
            [_sh(), str(READER_INIT)], env={**env, "GRAFANA_PG_PASSWORD": "rotated-Reader-43"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert (
            _psql(pg_server, db, "grafana_reader", "rotated-Reader-43", "SELECT 1 FROM runs").returncode == 0
        )
    finally:
        _psql(
            pg_server, db, USER, PASSWORD, "DROP OWNED BY grafana_reader; DROP ROLE IF EXISTS grafana_reader"
        )
    # Grafana's datasource logs in as that role, with its own password variable
    source = yaml.safe_load(
        (ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "tokwatch-postgres.yaml").read_text()
    )["datasources"][0]
    assert source["user"] == "grafana_reader"
    assert source["secureJsonData"]["password"] == "${GRAFANA_PG_PASSWORD}"
    assert (
        f"./{READER_INIT.relative_to(ROOT)}:/docker-entrypoint-initdb.d/100_grafana_reader.sh:ro"
        in (
            _services()["timescaledb"]["volumes"]  # type: ignore[operator]
        )
    )


class StandInDaemon:
    """Just enough of the Docker Engine API for `docker build` to send its context: keeps the file names."""

    def __init__(self) -> None:
        self.context: list[str] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_get("/_ping", self._ping)
        app.router.add_get("/{version}/_ping", self._ping)
        app.router.add_post("/{version}/build", self._build)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"tcp://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", headers={"API-Version": "1.47", "OSType": "linux"})

    async def _build(self, request: web.Request) -> web.Response:
        with tarfile.open(fileobj=io.BytesIO(await request.read())) as tar:
            self.context = [m.name for m in tar.getmembers() if m.isfile()]
        return web.Response(text='{"stream":"built\\n"}\n{"aux":{"ID":"sha256:0"}}\n')


def _tracked(*paths: str) -> list[str]:
    """Files git tracks (under `paths`)."""
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def _checkout_with_clutter(dest: Path) -> None:
    """The repository's tracked files, plus what a working copy accumulates."""
    for rel in {*_tracked(), ".dockerignore"}:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    clutter = [
        ".env", ".env.local", ".git/config", "tokwatch-state/tokwatch.db", "tokwatch-state/outbox.jsonl",
        "dashboards/node_modules/@grafana/schema/index.js", ".mypy_cache/3.11/cache.db",
        "exporter/tokwatch/__pycache__/cli.cpython-311.pyc", "exporter/tokwatch/.env",
        "exporter/tokwatch/tokwatch.db", "exporter/node_modules/x.js",
    ]  # fmt: skip
    for rel in clutter:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text("OPENAI_API_KEY=sk-should-never-ship\n")


async def test_the_build_context_holds_what_the_dockerfile_copies_and_no_secrets(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client")
    context = tmp_path / "checkout"
    _checkout_with_clutter(context)
    daemon = StandInDaemon()
    await daemon.start()
    try:
        proc = await asyncio.create_subprocess_exec(
            docker, "build", "-f", "deploy/Dockerfile", "-t", "registry.example/tokwatch:test", ".",
            cwd=context, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            # the classic builder sends the context itself (BuildKit needs the buildx plugin, absent here);
            # both apply .dockerignore with the same rules
            env={**os.environ, "DOCKER_HOST": daemon.url, "DOCKER_BUILDKIT": "0",
                 "DOCKER_CONFIG": str(tmp_path / "docker-config")},
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        await daemon.stop()
    assert proc.returncode == 0, out.decode()
    shipped = set(daemon.context) - {"deploy/Dockerfile", ".dockerignore"}
    assert shipped == {"pyproject.toml", "README.md", *_tracked("exporter")}
    # what deploy/Dockerfile copies is all there
    for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert any(name == source or name.startswith(source.rstrip("/") + "/") for name in shipped)
