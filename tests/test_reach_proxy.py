"""Proxies against a real CONNECT proxy on 127.0.0.1 (tests/support/connect_proxy.py) and the simulator over
HTTPS and HTTP: probes, counter scrapes and `tokwatch bench` go through it; the tunnel's set-up is its own
phase and not in TTFT; `proxy_from_environment` with NO_PROXY; proxy and key secrets appear nowhere."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import socket
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from tests.bench.processes import bench_ran, tokwatch_cli
from tests.support.connect_proxy import ConnectProxy
from tests.support.pki import Pki, make_chain_pki, make_pki, mtls_server_ssl, not_after, server_ssl
from tests.support.sim import to_sim_config
from tests.support.thread_server import ThreadServer
from tokwatch.counters import ServerCounters
from tokwatch.figures.result import RunResult, Status
from tokwatch.probes.base import ProbeContext, ProbeLog, run_probe
from tokwatch.probes.openai import OpenAIProbe
from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.settings.config import Config, load_config_text
from tokwatch.settings.reach import Reach
from tokwatch.sim.testing import RunningSim, run_sim
from tokwatch.transport.http import HttpClient, TransportError

USER, PASSWORD = "alice", "proxy-pw-7f3a9c"

SIM = """
seed: 1
servers:
  - name: oa
    dialect: openai
    models:
      - {name: m, decode_tps: 400, prefill_tps: 100000}
  - name: vl
    dialect: vllm
    models:
      - {name: m, decode_tps: 400, prefill_tps: 100000}
"""


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


@asynccontextmanager
async def https_sim(pki: Pki, *, mtls: bool = False) -> AsyncIterator[RunningSim]:
    context = mtls_server_ssl(pki) if mtls else server_ssl(pki)
    async with run_sim(to_sim_config((SIM,)), ssl_context=context) as sim:
        yield sim


def _config(base_url: str, reach: str, *, kind: str = "openai", probe: str = "") -> Config:
    return load_config_text(
        f"probe: {{max_tokens: 8, warmup: false{probe}}}\n"
        f"endpoints:\n  - {{name: ep, kind: {kind}, base_url: '{base_url}', model: m{reach}}}\n"
    )


async def _run(client: HttpClient, config: Config) -> RunResult:
    ep = config.endpoints[0]
    ctx = ProbeContext(
        endpoint=ep,
        settings=config.probe_for(ep),
        http=client,
        api_key=None,
        log=ProbeLog(),
        reach=Reach(ep.name, ep),
    )
    return await run_probe(OpenAIProbe(), ctx)


def _with_user(proxy: ConnectProxy, password: str = PASSWORD) -> str:
    return proxy.url.replace("http://", f"http://{USER}:{password}@")


async def test_a_probe_goes_through_the_proxys_tunnel_with_its_own_phase(pki: Pki) -> None:
    async with https_sim(pki) as sim:
        with ConnectProxy((USER, PASSWORD)) as proxy:
            reach = f", proxy_url: '{_with_user(proxy)}', tls_config: {{ca_file: '{pki.ca}'}}"
            async with HttpClient() as client:
                r = await _run(client, _config(f"{sim.base_url('oa')}/v1", reach))
    assert r.status is Status.OK, r.error_message
    assert proxy.counts.tunnels == [sim.url.removeprefix("https://")] and proxy.counts.refused == 0
    # connect: TCP to the proxy; proxy_connect: CONNECT sent to its 200; tls: the handshake through it.
    assert r.proxied and r.phase_proxy_connect_s is not None and r.phase_proxy_connect_s > 0
    assert r.phase_connect_s is not None and r.phase_connect_s > 0 and r.phase_tls_s and r.phase_tls_s > 0
    assert set(r.network_phases()) == {"resolve", "connect", "proxy_connect", "tls", "processing"}
    assert r.network_phases()["proxy_connect"] == r.phase_proxy_connect_s
    # Set-up, tunnel included, is in the send delay, never in TTFT.
    assert r.send_delay_s is not None and r.send_delay_s >= r.phase_proxy_connect_s + r.phase_connect_s


def test_the_tunnel_and_the_chain_the_server_sent_on_uvloop_too(tmp_path: Path) -> None:
    """The probes' measurement loop runs uvloop when installed: the CONNECT on the raw socket, the TLS
    handshake over it and the server's chain (leaf and a shorter-lived intermediate) work there too."""
    pytest.importorskip("uvloop")
    from tokwatch.transport.measurement import loop_name, new_loop

    chain = make_chain_pki(tmp_path, intermediate_valid=dt.timedelta(hours=12))

    async def main() -> tuple[str, RunResult, list[str]]:
        async with https_sim(chain) as sim:
            with ConnectProxy((USER, PASSWORD)) as proxy:
                reach = f", proxy_url: '{_with_user(proxy)}', tls_config: {{ca_file: '{chain.ca}'}}"
                async with HttpClient() as client:
                    r = await _run(client, _config(f"{sim.base_url('oa')}/v1", reach))
        return loop_name(asyncio.get_running_loop()), r, proxy.counts.tunnels

    with asyncio.Runner(loop_factory=new_loop) as runner:
        name, r, tunnels = runner.run(main())
    assert name == "uvloop" and r.status is Status.OK, r.error_message
    assert len(tunnels) == 1 and r.phase_proxy_connect_s is not None and r.phase_proxy_connect_s > 0
    assert r.tls_cert_expiry_s == not_after(chain.server_cert)
    assert r.tls_earliest_cert_expiry_s == not_after(tmp_path / "intermediate.crt")


async def test_the_proxy_refuses_without_credentials_and_the_run_says_so(pki: Pki) -> None:
    async with https_sim(pki) as sim:
        with ConnectProxy((USER, PASSWORD)) as proxy:
            reach = f", proxy_url: '{proxy.url}', tls_config: {{ca_file: '{pki.ca}'}}"
            async with HttpClient() as client:
                r = await _run(client, _config(f"{sim.base_url('oa')}/v1", reach))
    assert proxy.counts.refused == 1 and proxy.counts.tunnels == []
    assert r.status is Status.UNREACHABLE and r.error_class == "proxy"
    assert f"proxy {proxy.url} refused the tunnel" in (r.error_message or "")
    assert "407" in (r.error_message or "")


async def test_plain_http_is_forwarded_in_absolute_form_with_the_password_from_a_file(
    sim: RunningSim, tmp_path: Path
) -> None:
    password_file = tmp_path / "proxy-password"
    password_file.write_text(PASSWORD + "\n")
    with ConnectProxy((USER, PASSWORD)) as proxy:
        good = f", proxy_url: 'http://{USER}@127.0.0.1:{proxy.port}', proxy_password_file: '{password_file}'"
        async with HttpClient() as client:
            r = await _run(client, _config(f"{sim.base_url('oa')}/v1", good))
            refused = await _run(client, _config(f"{sim.base_url('oa')}/v1", f", proxy_url: '{proxy.url}'"))
    assert r.status is Status.OK, r.error_message
    assert proxy.counts.forwarded == [f"{sim.base_url('oa')}/v1/chat/completions"]
    assert r.proxied and r.phase_proxy_connect_s == 0.0  # no tunnel for plain HTTP
    assert refused.status is Status.UNREACHABLE and refused.error_class == "proxy"
    assert "407" in (refused.error_message or "")


async def test_a_counter_scrape_goes_through_the_proxy(pki: Pki) -> None:
    async with https_sim(pki) as sim:
        with ConnectProxy((USER, PASSWORD)) as proxy:
            config = _config(
                f"{sim.base_url('vl')}/v1",
                f", proxy_url: '{_with_user(proxy)}', tls_config: {{ca_file: '{pki.ca}'}}",
                kind="vllm",
            )
            async with HttpClient() as client:
                reading = await ServerCounters(config.endpoints[0], client).scrape_once()
    assert reading is not None  # read and parsed the simulator's /metrics
    assert proxy.counts.tunnels == [sim.url.removeprefix("https://")]


async def test_tokwatch_bench_goes_through_the_proxy(pki: Pki, tmp_path: Path) -> None:
    async with https_sim(pki) as sim:
        with ConnectProxy((USER, PASSWORD)) as proxy:
            cfg = tmp_path / "tokwatch.yml"
            cfg.write_text(
                "endpoints:\n"
                f"  - {{name: ep, kind: vllm, base_url: '{sim.base_url('vl')}/v1', model: m,"
                f" proxy_url: '{_with_user(proxy)}', tls_config: {{ca_file: '{pki.ca}'}}}}\n"
                "storage: {enabled: false}\n"
            )
            code, out, err = await tokwatch_cli(
                "bench", "-c", str(cfg), "--endpoint", "ep", "--number", "4", "--concurrency", "2",
                "--output-tokens", "6", "--input-tokens", "16", "--live-interval", "60",
                "--output-dir", str(tmp_path / "run"),
            )  # fmt: skip
    assert bench_ran(code, err), err  # 6: a host too busy for the client's figures, not the proxy's doing
    # The requests and the server-metrics scrapes (before, during, after) all went through tunnels.
    assert len(proxy.counts.tunnels) >= 2 and proxy.counts.refused == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["requests"]["ok"] == 4, summary["requests"]
    assert PASSWORD not in out + err


async def test_proxy_from_environment_honours_no_proxy(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    async with https_sim(pki) as sim:
        with ConnectProxy((USER, PASSWORD)) as proxy:
            monkeypatch.setenv("HTTPS_PROXY", _with_user(proxy))
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            reach = f", proxy_from_environment: true, tls_config: {{ca_file: '{pki.ca}'}}"
            url = f"{sim.base_url('oa')}/v1"
            async with HttpClient() as client:
                through = await _run(client, _config(url, reach))
                monkeypatch.setenv("NO_PROXY", "internal.corp,127.0.0.0/8")
                straight = await _run(client, _config(url, reach))
                # The endpoint's own no_proxy adds to the environment's.
                monkeypatch.setenv("NO_PROXY", "internal.corp")
                own = await _run(client, _config(url, reach + ", no_proxy: '127.0.0.1'"))
    assert (through.status, straight.status, own.status) == (Status.OK,) * 3
    assert len(proxy.counts.tunnels) == 1  # only the first run: the others matched NO_PROXY
    assert through.proxied and not straight.proxied and not own.proxied


async def test_ttft_through_the_proxy_is_ttft_direct(pki: Pki) -> None:
    """Through a tunnel TTFT stays within 1 ms of a direct run's (medians over alternating runs against one
    simulator, each run's TTFT less the simulator's own time to its first token, so the simulator's
    scheduling does not blur the comparison); the slow tunnel's set-up is reported apart, as proxy_connect.
    Every timed run opens its connection (no warm-up): set-up and tunnel happen inside the measured run."""
    slow_tunnel_s = 0.03
    async with https_sim(pki) as sim:
        with ConnectProxy((USER, PASSWORD), tunnel_delay_s=slow_tunnel_s) as proxy:
            url = f"{sim.base_url('oa')}/v1"
            tls = f", tls_config: {{ca_file: '{pki.ca}'}}"
            configs = {
                "direct": _config(url, tls),
                "proxy": _config(url, tls + f", proxy_url: '{_with_user(proxy)}'"),
            }
            ttft: dict[str, list[float]] = {"direct": [], "proxy": []}
            tunnels: list[float] = []
            async with HttpClient() as client:
                for _ in range(9):
                    for way, config in configs.items():
                        r = await _run(client, config)
                        truth = sim.last_truth("oa")
                        assert r.status is Status.OK and r.ttft_s is not None and truth is not None, (
                            r.error_message
                        )
                        assert r.connection_reused is False and r.proxied is (way == "proxy")
                        ttft[way].append(r.ttft_s - (truth.emitted_at[0] - truth.arrival))
                        if r.phase_proxy_connect_s is not None:
                            tunnels.append(r.phase_proxy_connect_s)
    direct, proxied = statistics.median(ttft["direct"]), statistics.median(ttft["proxy"])
    assert abs(proxied - direct) < 1e-3, ttft
    assert len(tunnels) == 9 and min(tunnels) >= slow_tunnel_s  # reported apart, not in TTFT


async def test_secrets_appear_nowhere(pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The proxy password (in a file and inline), the Proxy-Authorization value and the client key's
    content in none of: logs, /metrics, /probe?debug, the store, `tokwatch report`, bench outputs."""
    password_file = tmp_path / "proxy-password"
    password_file.write_text(PASSWORD)
    wrong = "wrong-pw-55e1d0"
    key_text = pki.client_key.read_text()
    key_body = "".join(line for line in key_text.splitlines() if not line.startswith("-----"))
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    secrets = [PASSWORD, wrong, token, key_body[:40], key_body[-40:]]
    db = tmp_path / "state" / "tw.db"
    async with https_sim(pki, mtls=True) as sim:
        with ConnectProxy((USER, PASSWORD)) as proxy:
            tls = (
                f"tls_config: {{ca_file: '{pki.ca}', cert_file: '{pki.client_cert}', "
                f"key_file: '{pki.client_key}'}}"
            )
            cfg = tmp_path / "tokwatch.yml"
            cfg.write_text(
                "probe: {max_tokens: 8, warmup: true}\n"
                f"storage: {{sqlite_path: '{db}'}}\n"
                "schedule: {interval: 1h, offset: 0s, run_on_start: false}\n"
                "endpoints:\n"
                f"  - {{name: good, kind: vllm, base_url: '{sim.base_url('vl')}/v1', model: m,"
                f" proxy_url: 'http://{USER}@127.0.0.1:{proxy.port}', proxy_password_file: '{password_file}',"
                f" {tls}}}\n"
                f"  - {{name: refused, kind: openai, base_url: '{sim.base_url('oa')}/v1', model: m,"
                f" proxy_url: 'http://{USER}:{wrong}@127.0.0.1:{proxy.port}', {tls}}}\n"
            )
            texts: list[str] = []
            with caplog.at_level(logging.DEBUG):
                app = App(load_config_text(cfg.read_text(), str(cfg)), str(cfg))
                await app.start()
                runner, port = await start_site(app, "127.0.0.1", 0)
                try:
                    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                        for path in (
                            "/probe?target=good&debug=true",
                            "/probe?target=refused&debug=true",
                            "/metrics",
                        ):
                            async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                                assert resp.status == 200, path
                                texts.append(await resp.text())
                finally:
                    await app.stop()
                    await runner.cleanup()
            assert "tokwatch_probe_success" in texts[0] and 'phase="proxy_connect"' in texts[0]
            assert "timed run: unreachable" in texts[1]
            assert "tokwatch_probe_tls_cert_expiry_timestamp_seconds" in texts[2]
            code, report, err = await tokwatch_cli("report", "-c", str(cfg), "--format", "json")
            assert code == 0, err
            texts += [report, err]
            code, out, err = await tokwatch_cli(
                "bench", "-c", str(cfg), "--endpoint", "good", "--number", "2", "--no-store",
                "--output-tokens", "4", "--input-tokens", "16", "--live-interval", "60",
                "--output-dir", str(tmp_path / "bench"),
            )  # fmt: skip
            assert bench_ran(code, err), err  # 6: a host too busy for the client's own figures
            texts += [out, err]
            texts += [p.read_text(errors="replace") for p in (tmp_path / "bench").rglob("*") if p.is_file()]
    assert proxy.counts.tunnels and proxy.counts.refused >= 1
    texts.append(caplog.text)
    assert "refused the tunnel" in caplog.text  # the log says why, without the password
    texts.append(db.read_bytes().decode("latin-1"))
    texts += [p.read_bytes().decode("latin-1") for p in db.parent.glob("*") if p.is_file()]
    found = [(s, i) for s in secrets for i, text in enumerate(texts) if s in text]
    assert found == []


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"", "closed the connection before answering CONNECT"),
        (
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
            "refused the tunnel to 127.0.0.1:9: HTTP 502",
        ),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "answered CONNECT with 'SSH-2.0-OpenSSH_9.6'"),
    ],
)
async def test_a_proxy_that_does_not_open_the_tunnel_is_named_in_the_error(
    answer: bytes, message: str
) -> None:
    def proxy(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(answer)

    with ThreadServer(proxy) as server:
        config = _config("https://127.0.0.1:9/v1", f", proxy_url: '{server.url}'")
        reach = Reach("ep", config.endpoints[0])
        async with HttpClient() as client:
            with pytest.raises(TransportError) as info:
                await client.get_text("https://127.0.0.1:9/metrics", timeout=5, reach=reach)
    assert info.value.kind == "proxy" and info.value.phase == "connect"
    assert str(info.value).startswith(f"proxy {server.url} ") and message in str(info.value)


async def test_a_proxy_that_is_down_is_named_in_the_error(free_port) -> None:  # type: ignore[no-untyped-def]
    proxy = f"http://127.0.0.1:{free_port()}"
    config = _config("http://127.0.0.1:9/v1", f", proxy_url: '{proxy}'")
    async with HttpClient() as client:
        r = await _run(client, config)
    assert r.status is Status.UNREACHABLE and r.error_class == "connect"
    assert (r.error_message or "").startswith(f"proxy {proxy}: cannot connect:")
