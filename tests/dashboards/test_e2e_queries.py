"""Every dashboard query against REAL servers: a Prometheus on 127.0.0.1 (the shipped recording and alert
rules loaded) scraping two tokwatch exporters at sites `a` and `b` that probe the simulator and share one
PostgreSQL store, which also holds a stored `tokwatch bench` run.

No Grafana here, so each query is sent the way Grafana sends it: PromQL to Prometheus' HTTP API with the
template variables substituted (a range query for a time-series target, an instant query for an instant one,
`$__interval` the panel's minimum interval), SQL to the store with Grafana's macros expanded. Every query
must run without an error, and every panel must return data unless its description names the condition it
needs (dashboards/panels.py: `Condition`) and that condition does not hold here; where it holds (its probe
query returns data), the panel must show data too.
Marker `e2e` (starts prometheus, two exporters, the simulator and a bench run as subprocesses).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
import yaml

from dashboards import generate, panels
from dashboards.lint import iter_panels, iter_queries, metrics_from_exposition, unknown_metrics
from tests.bench.processes import bench_ran
from tests.support.grafana_sql import expand_sql
from tests.support.postgres import LocalPostgres
from tokwatch.settings.config import Config

psycopg = pytest.importorskip("psycopg")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(170)]

ROOT = Path(__file__).resolve().parents[2]
SITES = ("a", "b")
PROMQL_DASHBOARDS = ("tokwatch-overview.json", "tokwatch-server.json", "tokwatch-health.json")
SQL_DASHBOARDS = ("tokwatch-history.json", "tokwatch-benchmarks.json")
# How long the stack may take to give every unconditional panel data (runs, window figures, server counter
# rates over two scrapes); typically reached in 15-25 s.
SETTLE_S = 90.0


def _stack_helpers() -> ModuleType:
    """The simulator + tokwatch process helpers of tests/prometheus (shared rather than copied)."""
    path = ROOT / "tests" / "prometheus" / "conftest.py"
    spec = importlib.util.spec_from_file_location("tokwatch_dashboards_e2e_stack", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


HELPERS = _stack_helpers()

MODEL = {"name": "m", "decode_tps": 400, "prefill_tps": 20000}
SIM = {
    "seed": 5,
    "servers": [
        {"name": "plain", "dialect": "openai", "models": [MODEL]},
        {
            "name": "reasoner",
            "dialect": "openai",
            "models": [{**MODEL, "think_tokens": 8, "reasoning_format": "reasoning_content"}],
        },
        {"name": "limited", "dialect": "openai", "models": [{**MODEL, "faults": {"http_429": 1.0}}]},
        {
            "name": "busy",
            "dialect": "vllm",
            "gpu_power": {"gpus": 2, "idle_watts": 60.0, "watts_per_running": 40.0},
            "kv_capacity_tokens": 512,
            "background_rps": 4,
            "background_prompt_tokens": 64,
            "background_max_tokens": 64,
            "models": [MODEL],
        },
        {"name": "local", "dialect": "ollama", "models": [MODEL]},
    ],
}


def _cost_on(stack: Any) -> dict[str, dict[str, object]]:
    """Prices and a power source per endpoint name (`pricing:`, `power_metrics_url`), so the "Cost and
    energy" panels are checked: `plain` hosted, `busy` self-hosted with the simulator's DCGM series."""
    return {
        "plain": {"pricing": {"input_per_mtok": 0.5, "output_per_mtok": 2.0, "cached_input_per_mtok": 0.1}},
        "busy": {
            "pricing": {"gpu_hour": 2.5, "gpus": 2},
            "power_metrics_url": f"{stack.sim_url}/busy/dcgm/metrics",
        },
    }


def _endpoints(stack: Any) -> list[dict[str, object]]:
    cost = _cost_on(stack)
    return [
        stack.endpoint("plain", "plain", "openai", "m", timeout="5s", **cost.get("plain", {})),
        stack.endpoint("reasoner", "reasoner", "openai", "m", timeout="5s"),
        # Always rate-limited, and its /metrics URL answers 404: failed runs and failed server scrapes.
        stack.endpoint(
            "limited", "limited", "openai", "m", timeout="5s", metrics_url=f"{stack.sim_url}/nowhere/metrics"
        ),
        stack.endpoint(
            "busy",
            "busy",
            "vllm",
            "m",
            timeout="10s",
            scrape_interval="1s",
            mirror_metrics=["vllm:request_success_total", "vllm:num_requests_running"],
            **cost.get("busy", {}),
        ),
        stack.endpoint("local", "local", "ollama", "m", timeout="5s"),
    ]


def _histograms_on() -> dict[str, object]:
    """`metrics: {histograms: true}` where the exporter has that knob (its latency histograms are opt-in),
    nothing where they are always exported: either way the histogram panels are checked."""
    field = Config.model_fields.get("metrics")
    fields = getattr(field.annotation, "model_fields", {}) if field is not None else {}
    return {"metrics": {"histograms": True}} if "histograms" in fields else {}


@dataclass
class Fleet:
    """The running stack the tests query."""

    prom: str
    dsn: str
    started: float
    bench_run: str
    exporters: list[str]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, pg_server: LocalPostgres) -> Iterator[Fleet]:
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        pytest.skip("prometheus is not installed")
    tmp_path = tmp_path_factory.mktemp("fleet")
    processes = HELPERS.Processes(tmp_path)
    try:
        yield asyncio.run(_start(processes, tmp_path, prometheus_bin, pg_server.new_database()))
    finally:
        processes.stop_all()


async def _start(processes: Any, tmp_path: Path, prometheus_bin: str, dsn: str) -> Fleet:
    stack = HELPERS.Stack(processes, tmp_path)
    ports = [HELPERS.free_port() for _ in SITES]
    prom_port = HELPERS.free_port()
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": _fast_rules(tmp_path),
                "scrape_configs": [
                    {
                        "job_name": "tokwatch",
                        "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in ports]}],
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    started = time.time()
    processes.start(
        "prometheus",
        [
            prometheus_bin,
            f"--config.file={prom_config}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
    )
    await stack.start_sim(SIM)
    endpoints = _endpoints(stack)
    extra = _histograms_on()
    # Site a first: it migrates the store; then site b and the bench run, which find it migrated.
    await stack.start_tokwatch("site-a", ports[0], endpoints, "2s", storage=dsn, site="a", extra=extra)
    bench_config = tmp_path / "bench.yml"
    bench_config.write_text(
        yaml.safe_dump({"endpoints": endpoints, "storage": {"dsn": dsn}}), encoding="utf-8"
    )
    bench = processes.start(
        "bench",
        [
            sys.executable, "-m", "tokwatch", "bench", "-c", str(bench_config), "--endpoint", "plain",
            "--number", "6", "--concurrency", "2", "--output-tokens", "8", "--input-tokens", "16",
            "--no-server-metrics", "--live-interval", "60", "--output-dir", str(tmp_path / "bench"),
        ],
        one_shot=True,
    )  # fmt: skip
    await stack.start_tokwatch("site-b", ports[1], endpoints, "2s", storage=dsn, site="b", extra=extra)
    await asyncio.to_thread(bench.wait, 60)
    assert bench.returncode is not None and bench_ran(bench.returncode, processes.log("bench")), (
        processes.log("bench")
    )
    run_id = json.loads((tmp_path / "bench" / "summary.json").read_text(encoding="utf-8"))["run_id"]
    # Both sites' window figures (the exporters refresh them from the store in the background) and the
    # rate-limited endpoint's runs are in Prometheus before any test reads them.
    async with aiohttp.ClientSession() as session:
        client = PromClient(session, f"http://127.0.0.1:{prom_port}", started)

        async def scraped() -> bool:
            windows, _ = await client.instant("count by (site) (tokwatch_window_runs)")
            limited, _ = await client.instant(
                'count by (site) (tokwatch_probe_runs_total{endpoint="limited"})'
            )
            want = set(SITES)
            return {s["metric"].get("site") for s in windows} >= want and {
                s["metric"].get("site") for s in limited
            } >= want

        await HELPERS.wait_until(scraped, 90, "both sites' window figures and limited runs in Prometheus")
    return Fleet(
        prom=f"http://127.0.0.1:{prom_port}",
        dsn=dsn,
        started=started,
        bench_run=str(run_id),
        exporters=[f"http://127.0.0.1:{port}" for port in ports],
    )


def _fast_rules(tmp_path: Path) -> list[str]:
    """The shipped rule files with every group evaluated each second (the recording groups run once a
    minute), so a test of under a minute sees them evaluated."""
    paths = []
    for path in HELPERS.RULE_FILES:
        rules = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in rules["groups"]:
            group["interval"] = "1s"
        copy = tmp_path / path.name
        copy.write_text(yaml.safe_dump(rules), encoding="utf-8")
        paths.append(str(copy))
    return paths


def _dashboard(name: str) -> dict[str, Any]:
    return dict(json.loads((generate.JSON_DIR / name).read_text(encoding="utf-8")))


def _duration(seconds: float) -> str:
    return f"{max(1, int(seconds))}s"


def expand(expr: str, interval: str = "15s", window: str = "24h", range_s: float = 60.0) -> str:
    """Grafana's substitution with every multi-value variable at All (`.*`) and the window at its
    default."""
    values = {
        "${datasource}": "",
        "$__interval": interval,
        "$__rate_interval": interval,
        "$__range": _duration(range_s),
        "$latency_window": "5m",
        "$window": window,
        '"$endpoint"': '".*"',
        '"$instance"': '".*"',
        '"$site"': '".*"',
        '"$workload"': '".*"',
    }
    for key, value in values.items():
        expr = expr.replace(key, value)
    assert "$" not in expr, expr
    return expr


class PromClient:
    """Prometheus' HTTP query API, answering (result, error)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, started: float) -> None:
        self.session = session
        self.base = base
        self.started = started

    async def _get(self, path: str, params: dict[str, str]) -> tuple[list[Any], str | None]:
        async with self.session.get(
            f"{self.base}{path}", params=params, timeout=aiohttp.ClientTimeout(total=10)
        ) as resp:
            body = await resp.json()
        if body.get("status") != "success":
            return [], f"{body.get('errorType')}: {body.get('error')}"
        return list(body["data"]["result"]) if "result" in body["data"] else list(body["data"]), None

    async def instant(self, expr: str) -> tuple[list[Any], str | None]:
        return await self._get("/api/v1/query", {"query": expr})

    async def range(self, expr: str) -> tuple[list[Any], str | None]:
        now = time.time()
        return await self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{self.started:.3f}", "end": f"{now:.3f}", "step": "1s"},
        )

    async def label_values(self, label: str, metric: str) -> list[str]:
        values, error = await self._get(f"/api/v1/label/{label}/values", {"match[]": metric})
        assert error is None, error
        return sorted(values)


@dataclass
class Report:
    errors: list[str]
    empty: list[str]
    checked: int
    conditional: dict[str, str]  # panel -> its condition
    held: set[str]  # the conditional panels whose condition held (so they were required to show data)


async def _check_promql(client: PromClient, window: str) -> Report:
    """Run every PromQL query of every Prometheus dashboard once: errors, empty panels, counts."""
    range_s = time.time() - client.started
    errors: list[str] = []
    empty: list[str] = []
    conditional: dict[str, str] = {}
    held: set[str] = set()
    holds: dict[panels.Condition, bool] = {}
    checked = 0
    for name in PROMQL_DASHBOARDS:
        dash = _dashboard(name)
        for panel in iter_panels(dash):
            condition = panels.condition_of(panel.get("description") or "")
            if condition is not None and condition not in holds:
                result, error = await client.instant(expand(condition.probe, "10s", window, range_s))
                assert error is None, f"condition probe {condition.probe}: {error}"
                holds[condition] = bool(result)
            interval = panel.get("interval") or "10s"
            got_data = False
            for target in panel.get("targets", []):
                expr = expand(target["expr"], interval, window, range_s)
                query = client.instant if target.get("instant") else client.range
                result, error = await query(expr)
                checked += 1
                if error:
                    errors.append(f"{name}: {panel['title']!r} {target['refId']}: {error}\n  {expr}")
                got_data = got_data or bool(result)
                if condition is None and not result:
                    empty.append(f"{name}: {panel['title']!r} {target['refId']}: {expr}")
            if condition is not None:
                conditional[f"{name}: {panel['title']}"] = condition.text
                if holds[condition]:
                    held.add(f"{name}: {panel['title']}")
                if holds[condition] and not got_data:
                    empty.append(f"{name}: {panel['title']!r} (its condition holds: {condition.text})")
        for where, expr in iter_queries(dash):
            if where.startswith("annotation"):
                result, error = await client.range(expand(expr, "10s", window, range_s))
            elif where.startswith("variable"):
                # label_values(metric, label) lists the label's values on that metric's series.
                match = re.fullmatch(r"label_values\((\w+), (\w+)\)", expr)
                assert match, expr
                result, error = await client.instant(f"count by ({match[2]}) ({match[1]})")
            else:
                continue
            checked += 1
            if error:
                errors.append(f"{name}: {where}: {error}")
            if not result:
                empty.append(f"{name}: {where}: {expr}")
    return Report(errors, empty, checked, conditional, held)


async def test_every_promql_query_runs_and_every_panel_shows_data(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session:
        client = PromClient(session, fleet.prom, fleet.started)
        windows = await client.label_values("window", "tokwatch_window_runs")
        window = "24h" if "24h" in windows else windows[0]
        last: list[Report] = []

        async def settled() -> bool:
            report = await _check_promql(client, window)
            last[:] = [report]
            return not report.errors and not report.empty

        try:
            await HELPERS.wait_until(
                settled, SETTLE_S, "every unconditional panel to show data", interval=1.0
            )
        except pytest.fail.Exception:
            report = last[0]
            pytest.fail(
                "dashboard queries failing:\n"
                + "\n".join(report.errors)
                + "\npanels without data:\n"
                + "\n".join(report.empty)
            )
        report = last[0]
        print(f"{report.checked} queries; conditional panels whose condition held here, checked too:")
        for panel, condition in sorted(report.conditional.items()):
            print(f"  {'checked' if panel in report.held else 'may be empty'}: {panel} ({condition})")
        assert report.checked >= 80
        # The conditional panels are the ones their code marks, each with its condition in its description.
        assert "tokwatch-server.json: Ollama model reloads" in report.conditional
        assert all(text for text in report.conditional.values())
        # Both sites are choices of the `$site` variable, and every site's exporter serves its own series.
        assert await client.label_values("site", "tokwatch_endpoint_info") == list(SITES)
        # Every metric the overview and health dashboards query is on a live /metrics.
        text = await _metrics(session, fleet.exporters[0])
        live = metrics_from_exposition(text)
        for name in ("tokwatch-overview.json", "tokwatch-health.json"):
            assert unknown_metrics(_dashboard(name), live) == []


async def _metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return await resp.text()


def _panel(name: str, title: str) -> dict[str, Any]:
    (panel,) = [p for p in iter_panels(_dashboard(name)) if p.get("title") == title]
    return panel


async def test_two_sites_stay_two_series(fleet: Fleet) -> None:
    """The per-endpoint tiles and the uptime tile give each site its own figure, and the status pill maps
    the rate-limited endpoint's code to RATE LIMITED at both sites."""
    async with aiohttp.ClientSession() as session:
        client = PromClient(session, fleet.prom, fleet.started)
        status = _panel("tokwatch-overview.json", "Status")
        series, error = await client.instant(expand(status["targets"][0]["expr"], "10s", "24h", 60))
        assert error is None
        codes = {(s["metric"]["endpoint"], s["metric"]["site"]): s["value"][1] for s in series}
        texts = status["fieldConfig"]["defaults"]["mappings"][0]["options"]
        for site in SITES:
            assert texts[codes[("limited", site)]]["text"] == "RATE LIMITED"
            assert texts[codes[("plain", site)]]["text"] == "OK"
        uptime = _panel("tokwatch-overview.json", "Uptime ($window)")
        one_site = expand(uptime["targets"][0]["expr"], "10s", "24h", 60).replace('site=~".*"', 'site=~"a"')
        series, error = await client.instant(one_site)
        assert error is None and series
        assert {s["metric"]["site"] for s in series} == {"a"}
        assert {s["metric"]["endpoint"] for s in series} >= {"plain", "reasoner", "limited", "busy", "local"}


async def test_recording_and_alert_rules_evaluate_without_errors(fleet: Fleet) -> None:
    async with aiohttp.ClientSession() as session:

        async def evaluated() -> list[dict[str, Any]] | None:
            async with session.get(f"{fleet.prom}/api/v1/rules", timeout=aiohttp.ClientTimeout(total=5)) as r:
                groups = (await r.json())["data"]["groups"]
            rules = [rule for group in groups for rule in group["rules"]]
            return (
                rules
                if rules and all(rule.get("lastEvaluation", "").startswith("2") for rule in rules)
                else None
            )

        rules = await HELPERS.wait_until(evaluated, 30, "every rule evaluated once")
        assert isinstance(rules, list)
        assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []


def test_every_sql_panel_runs_on_the_store(fleet: Fleet) -> None:
    """Run history and Benchmarks SQL against the store both sites write to, with Grafana's macros and
    variables expanded as its PostgreSQL datasource does."""
    end = datetime.now(UTC) + timedelta(minutes=1)
    start = end - timedelta(hours=1)
    with psycopg.connect(fleet.dsn, autocommit=True) as conn:

        def rows(sql: str, variables: dict[str, Any]) -> list[tuple[Any, ...]]:
            cur = conn.execute(expand_sql(sql, start, end, variables, interval_s=60))
            return list(cur.fetchall())

        # The variables' own queries list what the store has (Grafana's All = every listed value).
        history = _dashboard("tokwatch-history.json")
        choices = {v["name"]: [r[-1] for r in rows(v["query"], {})] for v in history["templating"]["list"]}
        assert set(choices["site"]) == set(SITES)
        assert {"plain", "limited"} <= set(choices["endpoint"])
        bench = _dashboard("tokwatch-benchmarks.json")
        bench_choices = {
            v["name"]: [r[-1] for r in rows(v["query"], {})] for v in bench["templating"]["list"]
        }
        assert bench_choices["endpoint"] == ["plain"] and bench_choices["run"] == [fleet.bench_run]
        selected = {"history": choices, "benchmarks": {"endpoint": ["plain"], "run": fleet.bench_run}}
        failures = []
        returned = {}
        for name in SQL_DASHBOARDS:
            variables = selected["history" if "history" in name else "benchmarks"]
            for panel in iter_panels(_dashboard(name)):
                for target in panel.get("targets", []):
                    if not target.get("rawSql"):
                        continue
                    try:
                        returned[f"{name}: {panel['title']}/{target['refId']}"] = rows(
                            target["rawSql"], variables
                        )
                    except psycopg.Error as exc:
                        failures.append(f"{name}: {panel['title']!r} {target['refId']}: {exc}")
        assert failures == []
        assert len(returned) >= 12
        # The stored runs come back per site: the window table has a row per endpoint, site and workload.
        summary = returned["tokwatch-history.json: Window figures over the selected time range/A"]
        assert {(r[0], r[1]) for r in summary} >= {(e, s) for e in ("plain", "limited") for s in SITES}
        # The network phases the exporters stored: processing (request sent to first byte) for every series.
        phases = returned["tokwatch-history.json: Network phases over the selected time range/A"]
        assert {(r[0], r[1]) for r in phases} >= {("plain", s) for s in SITES}
        assert all(r[6] is not None and r[6] > 0 for r in phases)
        assert returned["tokwatch-benchmarks.json: Bench runs/A"]
        assert returned["tokwatch-benchmarks.json: Request TTFT distribution/A"]


def test_the_exporters_ran_with_the_configured_sites(fleet: Fleet) -> None:
    """Sanity of the setup the tests above rely on: two exporters, one per site, the bench run stored."""
    with psycopg.connect(fleet.dsn, autocommit=True) as conn:
        sites = {row[0] for row in conn.execute("SELECT DISTINCT site FROM runs").fetchall()}
        assert sites == set(SITES)
        assert conn.execute("SELECT count(*) FROM bench_runs").fetchone() == (1,)
