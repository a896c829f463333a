"""Fixtures for the Prometheus/Alertmanager tests: the real tools, free ports, and processes that are always
stopped, plus the paths of the shipped files under prometheus/."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace

import aiohttp
import pytest
import yaml

from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "prometheus"
RULE_FILES = sorted((PROM_DIR / "rules").glob("*.yml"))
ALERT_RULES = PROM_DIR / "rules" / "tokwatch-alerts.yml"
RECORDING_RULES = PROM_DIR / "rules" / "tokwatch-recording.yml"
ALERTMANAGER_YML = PROM_DIR / "alertmanager.yml"
PROMETHEUS_YML = PROM_DIR / "prometheus.yml"


def _binary(name: str, *alternatives: str) -> str:
    for candidate in (name, *alternatives):
        found = shutil.which(candidate)
        if found:
            return found
    pytest.skip(f"{name} is not installed (Debian packages prometheus / prometheus-alertmanager)")


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool, or skip."""
    return _binary("promtool")


@pytest.fixture(scope="session")
def amtool() -> str:
    """Path of amtool, or skip."""
    return _binary("amtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """Path of the prometheus server, or skip."""
    return _binary("prometheus")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    """Path of the alertmanager server (Debian names it prometheus-alertmanager), or skip."""
    return _binary("prometheus-alertmanager", "alertmanager")


def run_tool(args: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a command line tool to completion, capturing its output."""
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def lint() -> ModuleType:
    """prometheus/lint_metric_names.py loaded as a module (it is a script, not part of the package)."""
    path = PROM_DIR / "lint_metric_names.py"
    spec = importlib.util.spec_from_file_location("tokwatch_lint_metric_names", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Processes:
    """Starts subprocesses with their output in log files; `stop_all` ends every one of them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._one_shot: set[str] = set()

    def start(
        self, name: str, args: Sequence[str], cwd: Path | None = None, *, one_shot: bool = False
    ) -> subprocess.Popen[bytes]:
        """Start one process in its own process group; stdout and stderr go to `<log_dir>/<name>.log`.
        A `one_shot` process (a bench run) is meant to end: `check_alive` leaves it to its own test."""
        log = (self.log_dir / f"{name}.log").open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            proc = subprocess.Popen(
                list(args), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True
            )
        finally:
            log.close()
        self._procs.append((name, proc))
        if one_shot:
            self._one_shot.add(name)
        return proc

    def log(self, name: str) -> str:
        """The captured output of a process (last 4000 characters), for assertion messages."""
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def check_alive(self) -> None:
        """Fail with the process's log if one of them has exited."""
        for name, proc in self._procs:
            if name not in self._one_shot and proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def stop_all(self) -> None:
        """SIGTERM each process group, then SIGKILL what is still running after 10 s."""
        for _, proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for _, proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Processes started by a test; all of them are stopped at teardown, pass or fail."""
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


async def http_ok(session: aiohttp.ClientSession, url: str) -> bool:
    """True if GET url answers 2xx right now."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return resp.status < 300
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


@pytest.fixture(scope="session")
def kit() -> SimpleNamespace:
    """The helpers above and the shipped file paths, for test modules (which cannot import conftest)."""
    return SimpleNamespace(
        root=ROOT,
        prom_dir=PROM_DIR,
        rule_files=RULE_FILES,
        alert_rules=ALERT_RULES,
        recording_rules=RECORDING_RULES,
        alertmanager_yml=ALERTMANAGER_YML,
        prometheus_yml=PROMETHEUS_YML,
        run_tool=run_tool,
        free_port=free_port,
        wait_until=wait_until,
        http_ok=http_ok,
    )


class Stack:
    """A simulator and a tokwatch exporter probing it, both real subprocesses on 127.0.0.1."""

    def __init__(self, processes: Processes, tmp_path: Path) -> None:
        self.processes = processes
        self.tmp_path = tmp_path
        self.sim_port = free_port()
        self.tokwatch_port = free_port()
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.tokwatch_url = f"http://127.0.0.1:{self.tokwatch_port}"

    def endpoint(self, name: str, server: str, kind: str, model: str, **extra: object) -> dict[str, object]:
        """One tokwatch.yml endpoint pointing at a simulated server (OpenAI-style kinds get `/v1`)."""
        suffix = "" if kind in ("ollama", "llamacpp") else "/v1"
        return {
            "name": name,
            "kind": kind,
            "base_url": f"{self.sim_url}/{server}{suffix}",
            "model": model,
            **extra,
        }

    async def start(
        self, sim: dict[str, object], endpoints: list[dict[str, object]], interval: str = "2s"
    ) -> None:
        """Start the simulator, then tokwatch (with SQLite storage) on `tokwatch_port`; return once every
        endpoint has run."""
        await self.start_sim(sim)
        await self.start_tokwatch("tokwatch", self.tokwatch_port, endpoints, interval, storage=True)

    async def start_sim(self, sim: dict[str, object]) -> None:
        """Start `tokwatch sim` with this config on `sim_port`; return once it answers."""
        sim_yml = self.tmp_path / "sim.yml"
        sim_yml.write_text(yaml.safe_dump(sim), encoding="utf-8")
        self.processes.start(
            "sim",
            [
                sys.executable,
                "-m",
                "tokwatch",
                "sim",
                "--config",
                str(sim_yml),
                "--listen",
                f"127.0.0.1:{self.sim_port}",
            ],
        )
        async with aiohttp.ClientSession() as session:

            async def sim_ready() -> bool:
                self.processes.check_alive()
                return await http_ok(session, f"{self.sim_url}/_sim/servers")

            await wait_until(sim_ready, 30, "the simulator to answer")

    async def start_tokwatch(
        self,
        name: str,
        port: int,
        endpoints: list[dict[str, object]],
        interval: str,
        *,
        storage: bool | str,
        site: str | None = None,
        extra: dict[str, object] | None = None,
        metrics: dict[str, object] | None = None,
    ) -> None:
        """Start one tokwatch exporter on `port`; return once every endpoint has run. `storage`: False for
        none, True for an SQLite file of its own, a DSN for that PostgreSQL database; `site` labels every
        series; `extra` adds top-level config sections; `metrics` its `metrics:` opt-ins."""
        store: dict[str, object] = {"outbox_path": str(self.tmp_path / f"{name}-outbox")}
        if isinstance(storage, str):
            store["dsn"] = storage
        else:
            store.update(enabled=storage, sqlite_path=str(self.tmp_path / f"{name}.db"))
        config: dict[str, object] = {
            **({"metrics": metrics} if metrics is not None else {}),
            "schedule": {"interval": interval, "offset": "0s"},
            "probe": {"warmup": False, "max_tokens": 16},
            "storage": store,
            "endpoints": endpoints,
            **({"site": site} if site else {}),
            **(extra or {}),
        }
        config_path = self.tmp_path / f"{name}.yml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.processes.start(
            name,
            [
                sys.executable,
                "-m",
                "tokwatch",
                "serve",
                "--config",
                str(config_path),
                "--listen",
                f"127.0.0.1:{port}",
            ],
            cwd=self.tmp_path,
        )
        url = f"http://127.0.0.1:{port}"
        prefixes = [f'tokwatch_probe_last_run_timestamp_seconds{{endpoint="{e["name"]}"' for e in endpoints]
        async with aiohttp.ClientSession() as session:

            async def all_ran() -> bool:
                self.processes.check_alive()
                text = await self.metrics(session, url)
                return all(p in text for p in prefixes)

            await wait_until(all_ran, 40, f"a probe run of every endpoint by {name}")

    async def metrics(self, session: aiohttp.ClientSession, url: str | None = None) -> str:
        """/metrics text of tokwatch (or of the exporter at `url`), "" while it is not answering."""
        try:
            async with session.get(
                f"{url or self.tokwatch_url}/metrics", timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                return await r.text() if r.status == 200 else ""
        except (TimeoutError, aiohttp.ClientError, OSError):
            return ""


@pytest.fixture
def stack(processes: Processes, tmp_path: Path) -> Stack:
    """An unstarted simulator + tokwatch pair; `await stack.start(...)`. Stopped with `processes`."""
    return Stack(processes, tmp_path)
