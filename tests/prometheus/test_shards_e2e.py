"""Two sharded exporters on one fleet and one PostgreSQL, scraped by a real Prometheus, against one exporter
of the same fleet: every query the dashboards make finds each endpoint once, as with one exporter."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import yaml

from tokwatch.shard import owner_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

ENDPOINTS = [f"ep{i}" for i in range(6)]


def _exporter_config(stack: Any, dsn: str) -> dict[str, object]:
    return {
        # a busy test box may flag runs timing_disturbed: the windows must still see every endpoint
        "schedule": {"interval": "2s", "offset": "0s", "window_includes": ["timing_disturbed"]},
        "probe": {"warmup": False, "max_tokens": 32},
        "storage": {"dsn": dsn, "timescale": False},
        "endpoints": [
            stack.endpoint(name, "s", "openai", f"m{i}", timeout="5s") for i, name in enumerate(ENDPOINTS)
        ],
    }


async def _query(session: aiohttp.ClientSession, prom: str, expr: str) -> list[dict[str, Any]]:
    async with session.get(f"{prom}/api/v1/query", params={"query": expr}) as resp:
        resp.raise_for_status()
        result: list[dict[str, Any]] = (await resp.json())["data"]["result"]
        return result


def _by_endpoint(result: list[dict[str, Any]]) -> dict[str, float]:
    return {r["metric"].get("endpoint", ""): float(r["value"][1]) for r in result}


async def test_prometheus_sees_each_endpoint_once_across_shards(
    prometheus_bin: str, kit: SimpleNamespace, stack: Any, tmp_path: Path, pg_server: Any
) -> None:
    models = [{"name": f"m{i}", "decode_tps": 200 + 100 * i, "prefill_tps": 20000} for i in range(6)]
    sim_yml = tmp_path / "sim.yml"
    sim_yml.write_text(
        yaml.safe_dump({"seed": 3, "servers": [{"name": "s", "dialect": "openai", "models": models}]})
    )
    stack.processes.start(
        "sim",
        [
            sys.executable,
            "-m",
            "tokwatch",
            "sim",
            "--config",
            str(sim_yml),
            "--listen",
            f"127.0.0.1:{stack.sim_port}",
        ],
    )
    async with aiohttp.ClientSession() as session:
        await kit.wait_until(
            lambda: kit.http_ok(session, f"{stack.sim_url}/_sim/servers"), 30, "the simulator"
        )
        shared, alone = pg_server.new_database(), pg_server.new_database()
        ports = {name: kit.free_port() for name in ("shard0", "shard1", "single")}
        for name, port in ports.items():
            dsn = alone if name == "single" else shared
            cfg = tmp_path / f"{name}.yml"
            cfg.write_text(yaml.safe_dump(_exporter_config(stack, dsn)))
            args = [
                sys.executable,
                "-m",
                "tokwatch",
                "serve",
                "--config",
                str(cfg),
                "--listen",
                f"127.0.0.1:{port}",
            ]
            if name != "single":
                args += ["--shard", f"{name[-1]}/2"]
            stack.processes.start(name, args, cwd=tmp_path)

        owned = {f"shard{i}": [e for e in ENDPOINTS if owner_of(e, 2) == i] for i in range(2)}
        owned["single"] = ENDPOINTS

        async def all_ran() -> bool:
            stack.processes.check_alive()
            for name, port in ports.items():
                text = await stack.metrics(session, f"http://127.0.0.1:{port}")
                if not all(
                    f'tokwatch_probe_last_ok_timestamp_seconds{{endpoint="{e}"' in text for e in owned[name]
                ):
                    return False
            return True

        await kit.wait_until(all_ran, 60, "every exporter to probe its endpoints")

        prom_port = kit.free_port()
        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "shards",
                            "static_configs": [
                                {"targets": [f"127.0.0.1:{ports['shard0']}", f"127.0.0.1:{ports['shard1']}"]}
                            ],
                        },
                        {
                            "job_name": "single",
                            "static_configs": [{"targets": [f"127.0.0.1:{ports['single']}"]}],
                        },
                    ],
                }
            )
        )
        stack.processes.start(
            "prometheus",
            [
                prometheus_bin,
                f"--config.file={prom_config}",
                f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
        )
        prom = f"http://127.0.0.1:{prom_port}"

        async def scraped_all() -> bool:
            stack.processes.check_alive()
            if not await kit.http_ok(session, f"{prom}/-/ready"):
                return False
            up = await _query(session, prom, "up")
            fleet = await _query(
                session, prom, 'count(tokwatch_fleet_fastest_vs_slowest_ratio{job="shards"})'
            )
            return len(up) == 3 and all(r["value"][1] == "1" for r in up) and bool(fleet)

        await kit.wait_until(scraped_all, 60, "Prometheus to scrape all three exporters")

        # The overview's per-endpoint queries: one series per endpoint, whichever replica owns it.
        for expr in (
            "count by (endpoint) (tokwatch_probe_decode_tokens_per_second{job=%r})",
            "count by (endpoint) (tokwatch_endpoint_info{job=%r})",
            "count by (endpoint) (tokwatch_probe_runs_total{job=%r, status='ok'})",
            "count by (endpoint) (tokwatch_window_uptime_ratio{job=%r})",
        ):
            sharded = _by_endpoint(await _query(session, prom, expr % "shards"))
            single = _by_endpoint(await _query(session, prom, expr % "single"))
            assert sharded == single == dict.fromkeys(ENDPOINTS, 1.0), expr
        # The fleet comparison is exported once across the replicas, and covers the whole fleet.
        fleet = await _query(session, prom, 'tokwatch_fleet_fastest_vs_slowest_ratio{job="shards"}')
        assert len(fleet) == 1
        # ep5 and ep4 decode at 700 and 600 tok/s: a short client-timed run can put either first
        assert fleet[0]["metric"]["fastest"] in ("ep4", "ep5") and fleet[0]["metric"]["slowest"] == "ep0"
