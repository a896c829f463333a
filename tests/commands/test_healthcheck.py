"""`tokwatch healthcheck` against a real `tokwatch serve` process with TLS and basic auth on 127.0.0.1, run
as the Dockerfile HEALTHCHECK, the compose healthcheck and the Kubernetes exec probes run it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.bench.processes import tokwatch_cli
from tests.settings.test_webconfig import PASSWORD, Pki, _web_config, pki  # noqa: F401 (pki is a fixture)

CONFIG = "storage: {enabled: false}\nendpoints: []\n"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def exporter(tmp_path: Path, web_config: Path | None) -> AsyncIterator[int]:
    """`tokwatch serve` in its own process (with `--web-config` when given) until it accepts connections."""
    port = _port()
    config = tmp_path / "tokwatch.yml"
    config.write_text(CONFIG)
    extra = ["--web-config", str(web_config)] if web_config else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tokwatch", "serve", "--config", str(config),
        "--listen", f"127.0.0.1:{port}", *extra,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        for _ in range(200):  # 20 s at most
            assert proc.returncode is None, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            writer.close()
            await writer.wait_closed()
            break
        else:
            pytest.fail("tokwatch serve did not listen within 20 s")
        yield port
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _password_file(tmp_path: Path, password: str) -> Path:
    path = tmp_path / "health.password"
    path.write_text(password + "\n")  # as `echo PASSWORD > file` or a Kubernetes Secret key with a newline
    return path


@pytest.mark.slow
async def test_tls_and_basic_auth_the_container_check_passes_wrong_ones_fail(
    pki: Pki,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    web = _web_config(pki)
    good = _password_file(tmp_path, PASSWORD)
    async with exporter(tmp_path, web) as port:
        base = f"https://127.0.0.1:{port}"
        # as the Docker/compose/Kubernetes checks run it: the server's own web config and a password file
        code, out, err = await tokwatch_cli(
            "healthcheck",
            "--web-config",
            str(web),
            "--password-file",
            str(good),
            "--url",
            f"{base}/-/healthy",
        )
        assert (code, err) == (0, ""), err
        assert out == f"ok: {base}/-/healthy: 200 tokwatch is healthy\n"
        # readiness; the certificate is pinned, not matched by name (it names 127.0.0.1, not localhost)
        code, out, err = await tokwatch_cli(
            "healthcheck", "--web-config", str(web), "--password-file", str(good),
            "--url", f"https://localhost:{port}/-/ready",
        )  # fmt: skip
        assert code == 0, err
        assert out.startswith(f"ok: https://localhost:{port}/-/ready: 200")

        wrong = tmp_path / "wrong.password"
        wrong.write_text("not-the-password")
        code, out, err = await tokwatch_cli(
            "healthcheck",
            "--web-config",
            str(web),
            "--password-file",
            str(wrong),
            "--url",
            f"{base}/-/healthy",
        )
        assert code == 1 and out == ""
        assert err == (
            f"tokwatch healthcheck: unhealthy: {base}/-/healthy: 401 Unauthorized: user prometheus was "
            "refused: is --password-file the password whose hash the web config holds?\n"
        )

        # the old shipped check: plain HTTP, no credentials
        code, out, err = await tokwatch_cli("healthcheck", "--url", f"http://127.0.0.1:{port}/-/healthy")
        assert code == 1
        assert err == (
            f"tokwatch healthcheck: unhealthy: http://127.0.0.1:{port}/-/healthy: connection closed "
            "without an HTTP answer (RemoteDisconnected): a TLS server does that to plain HTTP, pass the "
            "--web-config it runs with\n"
        )
        # the web config without the password
        code, _, err = await tokwatch_cli("healthcheck", "--web-config", str(web), "--url", f"{base}/-/ready")
        assert code == 1
        assert "requires basic auth: pass --password-file (user prometheus's password)" in err
        # a different certificate than the server's: refused, never trusted
        other = tmp_path / "other"
        other.mkdir()
        (other / "server.crt").write_bytes(pki.client_cert.read_bytes())
        (other / "server.key").write_bytes(pki.client_key.read_bytes())
        (other / "web.yml").write_text(web.read_text())
        code, _, err = await tokwatch_cli(
            "healthcheck", "--web-config", str(other / "web.yml"), "--password-file", str(good),
            "--url", f"{base}/-/healthy",
        )  # fmt: skip
        assert code == 1 and "the server's certificate is not the web config's cert_file" in err
        for text in (out, err):
            assert PASSWORD not in text
    # nothing listening any more
    code, _, err = await tokwatch_cli("healthcheck", "--url", f"http://127.0.0.1:{port}/-/healthy")
    assert code == 1 and "connection refused" in err


async def test_client_certificate_required_by_the_server(pki: Pki, tmp_path: Path) -> None:  # noqa: F811
    web = _web_config(pki, "  client_ca_file: ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n")
    good = _password_file(tmp_path, PASSWORD)
    async with exporter(tmp_path, web) as port:
        args = ["healthcheck", "--web-config", str(web), "--password-file", str(good), "--url", "/-/ready"]
        code, _, err = await tokwatch_cli(*args)
        assert code == 1 and "requires a client certificate (RequireAndVerifyClientCert)" in err
        code, out, err = await tokwatch_cli(
            *args, "--url", f"https://127.0.0.1:{port}/-/ready",
            "--client-cert", str(pki.client_cert), "--client-key", str(pki.client_key),
        )  # fmt: skip
        assert code == 0, err
        assert out.startswith(f"ok: https://127.0.0.1:{port}/-/ready: 200")


async def test_plain_server_and_the_default_url(tmp_path: Path, pki: Pki) -> None:  # noqa: F811
    async with exporter(tmp_path, None) as port:
        code, out, err = await tokwatch_cli("healthcheck", "--url", f"http://127.0.0.1:{port}/-/ready")
        assert code == 0, err
        assert out == f"ok: http://127.0.0.1:{port}/-/ready: 200 tokwatch is ready\n"
        # TLS expected, plain HTTP served
        web = _web_config(pki)
        good = _password_file(tmp_path, PASSWORD)
        code, _, err = await tokwatch_cli(
            "healthcheck", "--web-config", str(web), "--password-file", str(good),
            "--url", f"https://127.0.0.1:{port}/-/healthy",
        )  # fmt: skip
        assert code == 1 and "TLS handshake with 127.0.0.1" in err and "plain HTTP" in err
        code, _, err = await tokwatch_cli(
            "healthcheck", "--web-config", str(web), "--url", f"http://127.0.0.1:{port}/-/healthy"
        )
        assert code == 1 and "is plain HTTP but the web config serves TLS: use https://" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "127.0.0.1:9477"], "must be http(s)://HOST:PORT/PATH or a path such as /-/ready"),
        (["--url", "http://127.0.0.1:99999/"], "the port must be a number from 0 to 65535"),
        (["--password-file", "pw"], "--password-file needs --web-config"),
        (["--web-config", "{dir}/missing.yml"], "missing.yml: no such file"),
        (
            ["--web-config", "{dir}/bad.yml"],
            "bad.yml:1: basic_auth_users.u: the password must be a bcrypt hash",
        ),
        (
            ["--web-config", "{dir}/two.yml", "--password-file", "{dir}/pw"],
            "has 2 basic_auth_users: pass --user",
        ),
        (["--web-config", "{dir}/two.yml", "--user", "c"], "--user 'c' is not one of the web config's"),
        (["--web-config", "{dir}/two.yml", "--user", "a", "--password-file", "{dir}/empty"], "is empty"),
    ],
)
def test_mistakes_exit_1_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    """Docker reserves exit 2: a check that cannot run is unhealthy (1), with one line, no traceback."""
    hashed = "$2b$04$" + "a" * 53
    (tmp_path / "bad.yml").write_text("basic_auth_users: {u: plaintext}\n")
    (tmp_path / "two.yml").write_text(f"basic_auth_users: {{a: '{hashed}', b: '{hashed}'}}\n")
    (tmp_path / "empty").write_text("\n")
    code, out, err = asyncio.run(tokwatch_cli("healthcheck", *(a.format(dir=tmp_path) for a in args)))
    assert code == 1 and out == ""
    assert err.startswith("tokwatch healthcheck: unhealthy: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err


async def test_https_url_without_web_config_speaks_tls(pki: Pki, tmp_path: Path) -> None:  # noqa: F811
    """An https URL is checked over TLS without `--web-config`: the server's certificate pinned by
    `--ca-file`, or the system's CA bundle (which does not trust the test CA: refused, naming the fix)."""
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.dir / 'server.key'}\n"
    )
    async with exporter(tmp_path, web) as port:
        url = f"https://127.0.0.1:{port}/-/healthy"
        code, out, err = await tokwatch_cli("healthcheck", "--url", url, "--ca-file", str(pki.ca))
        assert (code, err) == (0, ""), err
        assert out == f"ok: {url}: 200 tokwatch is healthy\n"
        code, out, err = await tokwatch_cli("healthcheck", "--url", url, "--ca-file", str(pki.server_cert))
        assert code == 0, err
        code, out, err = await tokwatch_cli("healthcheck", "--url", url)
        assert code == 1 and out == ""
        assert "the server's certificate is not trusted by the system's CA bundle: pass --ca-file" in err
        code, _, err = await tokwatch_cli("healthcheck", "--url", url, "--ca-file", str(pki.client_cert))
        assert code == 1 and f"is not the one --ca-file {pki.client_cert} holds" in err
    code, _, err = await tokwatch_cli(
        "healthcheck", "--url", f"http://127.0.0.1:{port}/", "--ca-file", str(pki.ca)
    )
    assert code == 1 and "is plain HTTP: --ca-file and --client-cert need https://" in err


HEAVY_MODULES = (
    "tokwatch.cli", "tokwatch.service.app", "aiohttp", "prometheus_client", "tokwatch.storage.base",
    "pydantic", "yaml",
)  # fmt: skip


def test_healthcheck_imports_only_what_it_needs(tmp_path: Path) -> None:
    """Container probes exec it every few seconds: neither the exporter nor aiohttp is imported, and without
    a web config neither PyYAML nor pydantic (docs/security.md: 0.1 s CPU and 22 MB instead of 0.95 s and
    80 MB; 0.2 s and 32 MB with a web config)."""
    script = (
        "import sys, runpy\n"
        "sys.argv = ['tokwatch', 'healthcheck', '--url', sys.argv[1]]\n"
        "try:\n    runpy.run_module('tokwatch', run_name='__main__')\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        f"print(code, [m for m in {HEAVY_MODULES!r} if m in sys.modules])\n"
    )
    port = _port()  # nothing listens: the check runs to its end and fails
    code, out, err = asyncio.run(_python(script, f"http://127.0.0.1:{port}/-/healthy"))
    assert code == 0, err
    assert out == "1 []\n" and "connection refused" in err
    # the same script proves the module list would be seen: the full command line imports them all
    full = script.replace("'healthcheck', '--url'", "'--log-level', 'info', 'healthcheck', '--url'")
    code, out, err = asyncio.run(_python(full, f"http://127.0.0.1:{port}/-/healthy"))
    assert out.startswith("1 [") and "tokwatch.cli" in out and "aiohttp" in out, (out, err)
    # with a web config: the YAML loader and pydantic, still not the exporter
    web = tmp_path / "web.yml"
    web.write_text("http_server_config: {headers: {X-A: b}}\n")
    with_web = script.replace("'--url', sys.argv[1]]", "'--url', sys.argv[1], '--web-config', sys.argv[2]]")
    code, out, err = asyncio.run(_python(with_web, f"http://127.0.0.1:{port}/-/healthy", str(web)))
    assert out == "1 ['pydantic', 'yaml']\n" and "connection refused" in err, (out, err)


async def _python(script: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
