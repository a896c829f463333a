"""Every secret an endpoint's requests carry (a gateway header read from a file, a header named in
`secret_headers`, a basic-auth password, an Anthropic x-api-key, a credential-named query parameter) stays out
of every surface: logs, /metrics, /probe?debug, the store, `tokwatch report` and the bench's outputs and
stored run. The endpoints refuse each request and quote back every header they were sent, as some gateways
do, so a secret reaches tokwatch's error paths and has to be masked there."""

from __future__ import annotations

import asyncio
import base64
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from tests.support.cli_logging import own_root_handlers
from tests.support.echo import EchoEndpoint
from tokwatch.cli import main
from tokwatch.figures.result import Status
from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.settings.config import load_config


@pytest.fixture(autouse=True)
def _root_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests call `tokwatch.cli.main`, which sets up the process's logging."""
    own_root_handlers(monkeypatch)


GATEWAY_KEY = "gw-file-Secret-7781"
TAG = "inline-Tag-Secret-4412"  # not credential-named: secret only because secret_headers names it
PASSWORD = "basic-Pass-Secret-5530"
BASIC_TOKEN = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
ANTHROPIC_KEY = "ant-Key-Secret-0092"
QUERY_KEY = "query-Sig-Secret-6615"
TENANT = "tenant-Env-Secret-3318"  # not credential-named: secret because it is read from the environment
SECRETS = (GATEWAY_KEY, TAG, PASSWORD, BASIC_TOKEN, ANTHROPIC_KEY, QUERY_KEY, TENANT)


def leaks(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [s for s in SECRETS if s.encode() in data]


async def test_no_secret_reaches_any_surface(
    serve: Callable[..., Awaitable[str]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TENANT_ID", TENANT)
    echo = EchoEndpoint(require_headers={"X-Required": "never-sent"})  # refuses all, quoting every header
    url = await serve(echo.routes())
    key_file = tmp_path / "gateway-key"
    key_file.write_text(GATEWAY_KEY + "\n")
    state = tmp_path / "state"
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(f"""
probe: {{max_tokens: 8, warmup: false}}
schedule: {{interval: 1h, run_on_start: false}}
storage: {{sqlite_path: '{state}/tokwatch.db', outbox_path: '{state}/outbox'}}
endpoints:
  - name: gw
    kind: openai
    base_url: {url}/v1
    model: m
    query: {{sig: {QUERY_KEY}}}
    headers:
      X-Gateway-Key: {{value_file: '{key_file}'}}
      X-Tag: {TAG}
    secret_headers: [X-Tag]
  - name: basic
    kind: vllm
    base_url: {url}/v1
    model: m
    auth: {{type: basic, username: alice, password: {PASSWORD}}}
    headers: {{X-Tenant-Id: {{value_env: TENANT_ID}}}}   # also on its /metrics scrapes, which fail too
  - name: claude
    kind: anthropic
    base_url: {url}
    model: claude-x
    api_key: {ANTHROPIC_KEY}
""")
    app = App(load_config(cfg), str(cfg))
    await app.start(schedule=False)
    runner, port = await start_site(app, "127.0.0.1", 0)
    pages: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            for name in ("gw", "basic", "claude"):
                async with session.get(f"http://127.0.0.1:{port}/probe?target={name}&debug=true") as resp:
                    pages.append(await resp.text())
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                pages.append(await resp.text())
            async with session.get(f"http://127.0.0.1:{port}/endpoints/gw") as resp:
                pages.append(await resp.text())
        runs = [outcome.result for outcome in app.probes.last_outcomes.values()]
    finally:
        await app.stop()
        await runner.cleanup()
    # every request carried its secrets, and the endpoint quoted them back in its refusal
    assert {s.headers.get("x-gateway-key") for s in echo.posts()} >= {GATEWAY_KEY}
    assert any(s.headers.get("authorization") == f"Basic {BASIC_TOKEN}" for s in echo.posts())
    assert any(s.headers.get("x-api-key") == ANTHROPIC_KEY for s in echo.posts())
    assert any(s.method == "GET" and s.headers.get("x-tenant-id") == TENANT for s in echo.seen)
    assert len(runs) == 3 and all(r.status is Status.AUTH_FAILURE for r in runs)
    assert all("received" in (r.error_message or "") for r in runs)

    await asyncio.to_thread(main, ["report", "--config", str(cfg), "--format", "json"])
    await asyncio.to_thread(main, ["report", "--config", str(cfg)])
    # the bench as users run it: its own process (it installs signal handlers), stored through --config
    bench = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tokwatch", "bench", "--config", str(cfg), "--endpoint", "gw", "--number", "2",
        "--live-interval", "60", "--output-dir", str(tmp_path / "bench"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    bench_out, _ = await asyncio.wait_for(bench.communicate(), 120)
    assert bench.returncode != 0 and b"stored: bench run" in bench_out, bench_out.decode()
    await asyncio.to_thread(main, ["report", "--config", str(cfg), "--bench", "--format", "json"])
    out = capsys.readouterr()
    assert '"endpoint": "gw"' in out.out and "auth_failure" in out.out + out.err

    surfaces: dict[str, str | bytes] = {
        # tokwatch's own lines (the test endpoint's access log is its own and shows what it was sent)
        "logs": "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("aiohttp.access")),
        "stdout/stderr": out.out + out.err,
        "bench output": bench_out,
        **{f"page {i}": page for i, page in enumerate(pages)},
    }
    stored = [p for p in [*state.rglob("*"), *(tmp_path / "bench").rglob("*")] if p.is_file()]
    assert any(p.suffix == ".db" for p in stored) and any(
        p.name == "request_level_metrics.jsonl" for p in stored
    )
    surfaces.update({str(p): p.read_bytes() for p in stored})
    found = {where: leaked for where, text in surfaces.items() if (leaked := leaks(text))}
    assert found == {}
