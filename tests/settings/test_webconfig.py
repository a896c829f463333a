"""`--web-config`: real TLS handshakes (server and client certificates), real bcrypt, gzip, process_*."""

from __future__ import annotations

import base64
import gzip
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import bcrypt
import pytest

from tests.support.pki import Pki, client_ssl, make_pki
from tokwatch.cli import main
from tokwatch.serve.server import start_site
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.settings.webconfig import BasicAuth, bcrypt_cost, load_web_config

PASSWORD = "s3cret-scrape-pass"
CONFIG = "endpoints: [{name: a, kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m}]\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    return make_pki(tmp_path_factory.mktemp("pki"))


def _web_config(pki: Pki, extra: str = "") -> Path:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path = pki.dir / "web.yml"
    path.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        f"{extra}basic_auth_users:\n  prometheus: '{hashed}'\n"
        "http_server_config:\n  headers: {X-Content-Type-Options: nosniff}\n"
    )
    return path


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


Serve = Callable[[Path], "AsyncIterator[str]"]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[[Path], object]]:
    """Start a real exporter with a web config; returns its https URL."""
    started: list[tuple[App, object]] = []

    async def start(web_yml: Path) -> str:
        app = App(load_config_text(CONFIG.replace("endpoints", "storage: {enabled: false}\nendpoints")))
        await app.start(schedule=False, storage=False)
        runner, port = await start_site(app, "127.0.0.1", 0, load_web_config(web_yml))
        started.append((app, runner))
        return f"https://127.0.0.1:{port}"

    try:
        yield start
    finally:
        for app, runner in started:
            await app.stop()
            await runner.cleanup()  # type: ignore[attr-defined]


async def test_tls_basic_auth_on_every_route_gzip_and_process_metrics(pki: Pki, serve) -> None:  # type: ignore[no-untyped-def]
    url = await serve(_web_config(pki))
    good = _basic("prometheus", PASSWORD)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=client_ssl(pki)), timeout=aiohttp.ClientTimeout(total=20)
    ) as s:
        for method, path in (("GET", "/metrics"), ("GET", "/probe?target=a"), ("POST", "/-/reload"),
                             ("GET", "/-/healthy"), ("GET", "/"), ("GET", "/endpoints/a"),
                             ("GET", "/api/v1/status"), ("GET", "/api/v1/endpoints/a")):  # fmt: skip
            for auth in ({}, _basic("prometheus", "wrong"), _basic("nobody", PASSWORD)):
                async with s.request(method, url + path, headers=auth) as resp:
                    assert resp.status == 401, (path, auth)
                    assert resp.headers["WWW-Authenticate"].startswith('Basic realm="tokwatch"')
        async with s.get(url + "/metrics", headers={**good, "Accept-Encoding": "gzip"}) as resp:
            assert resp.status == 200 and resp.headers["Content-Encoding"] == "gzip"
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
            text = await resp.text()  # aiohttp decompresses
        assert "process_resident_memory_bytes" in text and "python_gc_collections_total" in text
        assert "tokwatch_build_info" in text
        async with s.get(url + "/metrics", headers={**good, "Accept-Encoding": "identity"}) as resp:
            assert "Content-Encoding" not in resp.headers
            raw = await resp.read()
        assert raw.startswith(b"# HELP") and len(gzip.compress(raw)) < len(raw)
        async with s.get(url + "/-/healthy", headers=good) as resp:
            assert resp.status == 200  # the same credentials again: answered from the check cache
        async with s.get(url + "/api/v1/status", headers=good) as resp:  # storage is off here: JSON error
            assert resp.status == 503 and (await resp.json())["kind"] == "error"
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
    # plain HTTP to the TLS port is refused, not served
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(url.replace("https", "http") + "/metrics", headers=good) as resp:
                await resp.read()


async def test_client_certificates_are_required_and_verified(pki: Pki, serve) -> None:  # type: ignore[no-untyped-def]
    extra = "  client_ca_file: ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"
    url = await serve(_web_config(pki, extra))
    good = _basic("prometheus", PASSWORD)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(pki))) as s:
        with pytest.raises(aiohttp.ClientError):  # no client certificate: the handshake fails
            async with s.get(url + "/metrics", headers=good) as resp:
                await resp.read()
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(pki, with_cert=True))) as s,
        s.get(url + "/metrics", headers=good) as resp,
    ):
        assert resp.status == 200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("basic_auth_users:\n  u: plaintext\n", ":2: basic_auth_users.u: the password must be a bcrypt hash"),
        (
            "basic_auth_users:\n  u: $2b$99$" + "a" * 53 + "\n",
            ":2: basic_auth_users.u: the bcrypt hash has no valid cost",
        ),
        (
            "tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n",
            "tls_server_config.cert_file: no such file",
        ),
        ("tls_sever_config: {}\n", ":1: tls_sever_config: unknown setting"),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            "RequireAndVerifyClientCert needs client_ca_file",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: ca.crt\n",
            "cannot load cert_file/key_file",
        ),
    ],
)
def test_bad_web_configs_name_the_file_and_field(pki: Pki, text: str, message: str) -> None:
    path = pki.dir / "bad.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_web_config(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_an_unknown_user_costs_the_highest_configured_bcrypt_cost() -> None:
    """So an unknown user is answered as slowly as a known user's wrong password (no user enumeration by
    timing; benchmarks/auth_timing.py measures it against the real exporter)."""
    users = {
        "cheap": bcrypt.hashpw(b"one", bcrypt.gensalt(rounds=4)).decode(),
        "dear": bcrypt.hashpw(b"two", bcrypt.gensalt(rounds=6)).decode(),
    }
    auth = BasicAuth(users)
    assert auth.unknown_user_cost == 6 == bcrypt_cost(users["dear"])
    assert not auth.check(_basic("nobody", "two")["Authorization"])
    assert not auth.check(_basic("dear", "one")["Authorization"])
    assert auth.check(_basic("dear", "two")["Authorization"])


def test_serve_with_a_bad_web_config_exits_2_without_traceback(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(CONFIG)
    bad = pki.dir / "bad-cli.yml"
    bad.write_text("basic_auth_users:\n  u: hunter2\n")
    assert main(["serve", "--config", str(cfg), "--web-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad-cli.yml:2" in err and "bcrypt hash" in err and "Traceback" not in err
    assert "hunter2" not in err


def test_the_shipped_example_is_a_valid_web_config() -> None:
    import yaml

    from tokwatch.settings.webconfig import WebConfig

    example = Path(__file__).resolve().parents[2] / "deploy" / "web-config.example.yml"
    cfg = WebConfig.model_validate(yaml.safe_load(example.read_text()))
    assert cfg.tls_server_config is not None and set(cfg.basic_auth_users) == {"prometheus"}


async def test_demo_with_a_web_config_serves_tls_and_basic_auth(
    pki: Pki, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    """`tokwatch demo --web-config FILE` as a user runs it: a real process, a real TLS handshake against
    the test CA, bcrypt basic auth on the status page, /metrics and the other routes."""
    import asyncio
    import time

    from tests.support.cli_processes import stop, tokwatch

    port = free_port()
    proc = tokwatch(
        "demo", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"),
        "--web-config", str(_web_config(pki)),
    )  # fmt: skip
    url, good = f"https://127.0.0.1:{port}", _basic("prometheus", PASSWORD)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_ssl(pki)), timeout=aiohttp.ClientTimeout(total=10)
        ) as s:
            deadline = time.monotonic() + 60
            while True:  # bounded: the demo starts its simulator first
                assert proc.poll() is None, "the demo exited"
                try:
                    async with s.get(url + "/-/healthy", headers=good) as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                assert time.monotonic() < deadline, "the demo did not answer over TLS"
                await asyncio.sleep(0.2)
            for path in ("/", "/metrics", "/endpoints/openai-fast", "/-/ready"):
                for auth in ({}, _basic("prometheus", "wrong")):
                    async with s.get(url + path, headers=auth) as resp:
                        assert resp.status == 401, (path, auth)
                        assert resp.headers["WWW-Authenticate"].startswith('Basic realm="tokwatch"')
            async with s.get(url + "/", headers={**good, "Accept": "text/html"}) as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
                assert 'data-endpoint="openai-fast"' in await resp.text()  # the demo's own page
            async with s.get(url + "/metrics", headers={**good, "Accept-Encoding": "gzip"}) as resp:
                assert resp.status == 200 and resp.headers["Content-Encoding"] == "gzip"
                assert "tokwatch_build_info" in await resp.text()
        # the certificate is the one from the web config: a client that does not trust the test CA refuses it
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with s.get(url + "/-/healthy", headers=good) as resp:
                    await resp.read()
            with pytest.raises(aiohttp.ClientError):  # plain HTTP to the TLS port is not served
                async with s.get(url.replace("https", "http") + "/-/healthy", headers=good) as resp:
                    await resp.read()
    finally:
        code, out, err = stop(proc)
    assert code == 0, err
    assert f"status page at {url}/" in out and "Traceback" not in err
