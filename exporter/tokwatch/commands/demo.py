"""`tokwatch demo` (simulated server + exporter, no setup) and `tokwatch sim` (the simulated server alone)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

from tokwatch.commands.launch import add_web_config_option, print_results, start_exporter, until_signal
from tokwatch.service.app import App
from tokwatch.settings.argtypes import http_url, listen_address
from tokwatch.settings.config import DEFAULT_LISTEN, Config
from tokwatch.settings.setting_values import parse_listen
from tokwatch.settings.strict_yaml import validate_yaml
from tokwatch.settings.webconfig import WebConfig, load_web_config
from tokwatch.sim.config import load_sim_config, load_sim_config_text
from tokwatch.sim.server import serve_sim
from tokwatch.sim.testing import run_sim
from tokwatch.tracing.extra import OtelUnavailable, require_otel

log = logging.getLogger("tokwatch.commands.demo")

# Five endpoints of different speeds and behaviours: what a newcomer sees within a minute.
DEMO_SIM = """
seed: 7
servers:
  - name: openai-fast
    dialect: openai
    models:
      - {name: fast-chat, decode_tps: 120, prefill_tps: 6000, jitter: 0.05}
  - name: ollama
    dialect: ollama
    models:
      - {name: "llama3.2:3b", decode_tps: 45, prefill_tps: 1500, jitter: 0.04, cold_load_probability: 0.1,
         vram_fraction: 1.0}
  - name: llamacpp
    dialect: llamacpp
    close_after_stream: true
    models:
      - {name: smollm2-135m, decode_tps: 90, prefill_tps: 2500, jitter: 0.03}
  - name: vllm-reasoning
    dialect: vllm
    kv_capacity_tokens: 200000
    models:
      - {name: qwen3-8b, decode_tps: 70, prefill_tps: 8000, jitter: 0.05, think_tokens: 48,
         reasoning_format: reasoning_content, tokens_per_chunk: 2}
  - name: flaky
    dialect: openai
    models:
      - name: flaky-model
        decode_tps: 60
        prefill_tps: 3000
        jitter: 0.25
        faults: {http_429: 0.15, http_5xx: 0.1, stall: 0.05, error_mid_stream: 0.05}
"""


def demo_exporter_config(sim_url: str, listen: str, state_dir: Path) -> Config:
    """The exporter config that probes the demo's simulated endpoints every 20 s."""
    endpoints = [
        {
            "name": "openai-fast",
            "kind": "openai",
            "base_url": f"{sim_url}/openai-fast/v1",
            "model": "fast-chat",
        },
        {"name": "ollama-local", "kind": "ollama", "base_url": f"{sim_url}/ollama", "model": "llama3.2:3b"},
        {
            "name": "llamacpp-local",
            "kind": "llamacpp",
            "base_url": f"{sim_url}/llamacpp",
            "model": "smollm2-135m",
        },
        {
            "name": "vllm-reasoning",
            "kind": "vllm",
            "base_url": f"{sim_url}/vllm-reasoning/v1",
            "model": "qwen3-8b",
            "labels": {"gpu": "sim"},
        },
        {
            "name": "flaky-cloud",
            "kind": "openai",
            "base_url": f"{sim_url}/flaky/v1",
            "model": "flaky-model",
            "timeout": "4s",
        },
    ]
    doc: dict[str, Any] = {
        "listen": listen,
        "probe": {"max_tokens": 64},
        "schedule": {"interval": "20s", "offset": "0s", "window": "1h"},
        "storage": {
            "sqlite_path": str(state_dir / "tokwatch.db"),
            "outbox_path": str(state_dir / "outbox.jsonl"),
        },
        "endpoints": endpoints,
    }
    return validate_yaml(yaml.safe_dump(doc), "<demo config>", Config)


def cmd_demo(args: argparse.Namespace) -> int:
    """Start the simulated server and the exporter probing it; print a table after every round."""
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    web_config = load_web_config(args.web_config) if args.web_config else None
    return asyncio.run(_demo(args.listen or DEFAULT_LISTEN, state_dir, args.rounds, web_config))


async def _demo(
    listen: str, state_dir: Path, rounds: int | None, web_config: tuple[WebConfig, Path] | None = None
) -> int:
    host, port = parse_listen(listen)
    sim_config = load_sim_config_text(DEMO_SIM, "<demo sim config>")
    async with run_sim(sim_config) as sim:
        config = demo_exporter_config(sim.url, listen, state_dir)
        app = App(config, instance="demo")
        done = asyncio.Event()

        def after_round() -> None:
            states = [
                app.probe_metrics.state(ep.name, w.name)
                for ep in app.config.enabled_endpoints
                for w in app.config.workloads_for(ep)
            ]
            runs = [st.last for st in states if st is not None and st.last is not None]
            print_results(runs, title=f"tokwatch demo: round {app.rounds_completed}")
            if rounds is not None and app.rounds_completed >= rounds:
                done.set()

        app.after_round = after_round
        started = await start_exporter(app, host, port, web_config)
        if started is None:
            return 2
        runner, bound = started
        scheme = "https" if web_config is not None and web_config[0].tls_server_config else "http"
        every = int(config.schedule.interval)
        print(f"tokwatch demo: simulated server at {sim.url}, endpoints probed every {every} s")
        base = f"{scheme}://{host}:{bound}"
        print(f"tokwatch demo: status page at {base}/, metrics at {base}/metrics")
        print("tokwatch demo: Ctrl-C to stop")
        try:
            stop = asyncio.create_task(until_signal())
            finished = asyncio.create_task(done.wait())
            await asyncio.wait({stop, finished}, return_when=asyncio.FIRST_COMPLETED)
            for t in (stop, finished):
                t.cancel()
        finally:
            await app.stop()
            await runner.cleanup()
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    """Run the simulated inference server alone until SIGTERM/SIGINT."""
    config = load_sim_config(args.config)
    if args.otlp_endpoint is not None:
        try:
            require_otel()
        except OtelUnavailable as exc:
            print(f"tokwatch sim: --otlp-endpoint: {exc}", file=sys.stderr)
            return 2
        config = config.model_copy(update={"otlp_endpoint": args.otlp_endpoint})

    async def main() -> int:
        stop = asyncio.Event()
        waiter = asyncio.create_task(until_signal())
        waiter.add_done_callback(lambda _t: stop.set())
        try:
            await serve_sim(config, args.listen, stop)
        except OSError as exc:
            print(f"tokwatch sim: cannot listen: {exc.strerror}", file=sys.stderr)
            return 2
        finally:
            waiter.cancel()
        return 0

    return asyncio.run(main())


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `demo` and `sim`."""
    p = sub.add_parser("demo", help="simulated server + exporter probing it: real numbers within a minute")
    p.add_argument(
        "--listen", type=listen_address, help=f"HOST:PORT for the exporter (default {DEFAULT_LISTEN})"
    )
    p.add_argument("--state-dir", default="tokwatch-state", help="where the demo keeps its SQLite history")
    p.add_argument("--rounds", type=int, help="exit after this many probe rounds (default: run until Ctrl-C)")
    add_web_config_option(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("sim", help="run the simulated inference server")
    p.add_argument("--config", "-c", required=True, help="sim.yml (see docs/simulator.md)")
    p.add_argument("--listen", type=listen_address, help="HOST:PORT (default from the config)")
    p.add_argument(
        "--otlp-endpoint",
        type=http_url,
        help="send a server span of each request carrying a traceparent to this OTLP/HTTP receiver "
        "(needs the otel extra; docs/tracing.md)",
    )
    p.set_defaults(func=cmd_sim)
