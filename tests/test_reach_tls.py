"""Per-endpoint TLS against real TLS servers on 127.0.0.1 with certificates made here: a private CA
(`ca_file`), mutual TLS (`cert_file`/`key_file`), a client certificate renewed while the exporter runs,
`server_name`, `insecure_skip_verify`, the certificates' expiry; config errors as `file:line: field`."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from tests.probes.test_openai import sse_handler
from tests.support.pki import (
    Pki,
    make_chain_pki,
    make_pki,
    mtls_server_ssl,
    not_after,
    renew_client,
    server_ssl,
)
from tokwatch.figures.result import RunResult, Status
from tokwatch.metrics.probe import ProbeMetrics
from tokwatch.probes.base import ProbeContext, ProbeLog, run_probe
from tokwatch.probes.keys import Keys
from tokwatch.probes.openai import OpenAIProbe
from tokwatch.settings.config import Config, load_config_text
from tokwatch.settings.reach import Reach, warn_insecure
from tokwatch.settings.strict_yaml import ConfigError
from tokwatch.transport.http import HttpClient

Serve = Callable[..., Awaitable[str]]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


def _answer_with_client_name(seen: list[str]) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An OpenAI-style streamed answer that notes the common name of the client certificate, if any."""
    answer = sse_handler(["a ", "b ", "c ", "d "], gap=0.005)

    async def handler(request: web.Request) -> web.StreamResponse:
        cert = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(pair for rdn in (cert or {}).get("subject", ()) for pair in rdn)
        seen.append(str(subject.get("commonName", "")))
        return await answer(request)

    return handler


def _config(url: str, tls: str) -> Config:
    return load_config_text(
        f"probe: {{max_tokens: 4, warmup: false}}\n"
        f"endpoints:\n  - name: ep\n    kind: openai\n    base_url: {url}/v1\n    model: m\n{tls}"
    )


async def _run(client: HttpClient, config: Config, reach: Reach | None = None) -> RunResult:
    ep = config.endpoints[0]
    ctx = ProbeContext(
        endpoint=ep,
        settings=config.probe_for(ep),
        http=client,
        api_key=None,
        log=ProbeLog(),
        reach=reach if reach is not None else Reach(ep.name, ep),
    )
    return await run_probe(OpenAIProbe(), ctx)


def _tls(**files: object) -> str:
    return "    tls_config:\n" + "".join(f"      {k}: {v}\n" for k, v in files.items())


async def test_a_private_ca_endpoint_is_reached_with_ca_file(serve: Serve, pki: Pki) -> None:
    url = await serve(
        {"/v1/chat/completions": sse_handler(["a ", "b ", "c ", "d "])}, ssl_context=server_ssl(pki)
    )
    async with HttpClient() as client:
        before = await _run(client, _config(url, ""))
        after = await _run(client, _config(url, _tls(ca_file=pki.ca)))
    # As the issue found it: the system trust store does not know the private CA.
    assert before.status is Status.UNREACHABLE and before.error_class == "tls"
    assert "certificate verify failed" in (before.error_message or "")
    assert after.status is Status.OK, after.error_message
    assert after.phase_tls_s is not None and after.phase_tls_s > 0


async def test_mutual_tls_passes_with_the_client_certificate_and_fails_without(
    serve: Serve, pki: Pki
) -> None:
    seen: list[str] = []
    url = await serve(
        {"/v1/chat/completions": _answer_with_client_name(seen)}, ssl_context=mtls_server_ssl(pki)
    )
    async with HttpClient() as client:
        without = await _run(client, _config(url, _tls(ca_file=pki.ca)))
        with_cert = await _run(
            client, _config(url, _tls(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key))
        )
    assert without.status is Status.UNREACHABLE, without.error_message  # the server refuses the handshake
    assert with_cert.status is Status.OK, with_cert.error_message
    assert seen == ["client"]  # only the run with the certificate reached the handler


async def test_a_renewed_client_certificate_is_used_without_a_restart(serve: Serve, pki: Pki) -> None:
    seen: list[str] = []
    url = await serve(
        {"/v1/chat/completions": _answer_with_client_name(seen)}, ssl_context=mtls_server_ssl(pki)
    )
    config = _config(url, _tls(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key))
    reach = Reach("ep", config.endpoints[0])  # built once, as the exporter does at start
    async with HttpClient() as client:
        first = await _run(client, config, reach)
        renew_client(pki, "client-renewed")  # the files rewritten in place, as cert-manager or certbot do
        second = await _run(client, config, reach)
    assert (first.status, second.status) == (Status.OK, Status.OK), (
        first.error_message,
        second.error_message,
    )
    # The renewed certificate went out on a new connection (the old one was set up with the old context).
    assert seen == ["client", "client-renewed"]
    assert second.connection_reused is False


async def test_a_half_done_rotation_keeps_the_last_certificate_that_loaded(
    serve: Serve, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []
    url = await serve(
        {"/v1/chat/completions": _answer_with_client_name(seen)}, ssl_context=mtls_server_ssl(pki)
    )
    config = _config(url, _tls(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key))
    reach = Reach("ep", config.endpoints[0])
    key = pki.client_key.read_bytes()
    renew_client(pki, "client-renewed")
    pki.client_key.write_bytes(key)  # the new certificate, the old key: a rotation caught half way
    with caplog.at_level(logging.WARNING, logger="tokwatch"):
        async with HttpClient() as client:
            r = await _run(client, config, reach)
    assert r.status is Status.OK, r.error_message
    assert seen == ["client"]
    assert (
        "the key does not match the certificate" in caplog.text and "previous ones stay in use" in caplog.text
    )
    assert key.decode() not in caplog.text


async def test_server_name_is_the_name_checked(serve: Serve, pki: Pki) -> None:
    url = await serve(
        {"/v1/chat/completions": sse_handler(["a ", "b ", "c ", "d "])}, ssl_context=server_ssl(pki)
    )
    async with HttpClient() as client:
        right = await _run(client, _config(url, _tls(ca_file=pki.ca, server_name="localhost")))
        wrong = await _run(client, _config(url, _tls(ca_file=pki.ca, server_name="other.example")))
    assert right.status is Status.OK, right.error_message
    assert wrong.status is Status.UNREACHABLE and "other.example" in (wrong.error_message or "")


async def test_insecure_skip_verify_reaches_an_untrusted_server_warns_and_labels_its_info(
    serve: Serve, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    url = await serve(
        {"/v1/chat/completions": sse_handler(["a ", "b ", "c ", "d "])}, ssl_context=server_ssl(pki)
    )
    config = load_config_text(
        "probe: {max_tokens: 4, warmup: false}\nendpoints:\n"
        f"  - {{name: ep, kind: openai, base_url: {url}/v1, model: m,"
        " tls_config: {insecure_skip_verify: true}}\n"
        f"  - {{name: other, kind: openai, base_url: {url}/v1, model: m}}\n"
    )
    async with HttpClient() as client:
        r = await _run(client, config)
    assert r.status is Status.OK, r.error_message
    with caplog.at_level(logging.WARNING, logger="tokwatch"):
        warn_insecure({ep.name: ep for ep in config.endpoints})
    warnings = [rec.getMessage() for rec in caplog.records if "insecure_skip_verify" in rec.getMessage()]
    assert len(warnings) == 1 and "endpoint ep:" in warnings[0]
    metrics = ProbeMetrics()
    metrics.set_endpoints(config.endpoints)
    info = {
        s.labels["endpoint"]: s.labels["tls_insecure_skip_verify"]
        for fam in metrics.collect()
        if fam.name == "tokwatch_endpoint_info"
        for s in fam.samples
    }
    assert info == {"ep": "true", "other": "false"}
    # Without an insecure endpoint the info series keep the labels they always had.
    metrics.set_endpoints(config.endpoints[1:])
    info_fam = next(f for f in metrics.collect() if f.name == "tokwatch_endpoint_info")
    assert "tls_insecure_skip_verify" not in info_fam.samples[0].labels


async def test_certificate_expiry_of_the_leaf_and_of_the_chain_it_came_with(
    serve: Serve, tmp_path: Path
) -> None:
    chain = make_chain_pki(tmp_path, intermediate_valid=dt.timedelta(hours=12))
    url = await serve(
        {"/v1/chat/completions": sse_handler(["a ", "b ", "c ", "d "])}, ssl_context=server_ssl(chain)
    )
    config = _config(url, _tls(ca_file=chain.ca))
    async with HttpClient() as client:
        r = await _run(client, config)
    assert r.status is Status.OK, r.error_message
    leaf, intermediate = not_after(chain.server_cert), not_after(tmp_path / "intermediate.crt")
    assert intermediate < leaf
    assert r.tls_cert_expiry_s == leaf
    # The earliest of what the server sent: its intermediate (Python 3.13's get_unverified_chain, or the
    # same method of the C object on 3.11-3.12).
    assert r.tls_earliest_cert_expiry_s == intermediate
    assert r.peer_chain == ()  # parsed after the run and let go

    metrics = ProbeMetrics()
    metrics.set_endpoints(config.endpoints, {"ep": ["seed000", "long"]})
    metrics.record(r)
    fams = {f.name: f for f in metrics.collect()}
    for name, value in (
        ("tokwatch_probe_tls_cert_expiry_timestamp_seconds", leaf),
        ("tokwatch_probe_tls_earliest_cert_expiry_timestamp_seconds", intermediate),
    ):
        # One series per endpoint, whatever its workloads.
        assert [(s.labels, s.value) for s in fams[name].samples] == [({"endpoint": "ep"}, value)]


async def test_plain_http_has_no_certificate_figures(serve: Serve) -> None:
    url = await serve({"/v1/chat/completions": sse_handler(["a ", "b ", "c ", "d "])})
    config = _config(url, "")
    async with HttpClient() as client:
        r = await _run(client, config)
    assert r.status is Status.OK and r.tls_cert_expiry_s is None and r.tls_earliest_cert_expiry_s is None
    metrics = ProbeMetrics()
    metrics.set_endpoints(config.endpoints)
    metrics.record(r)
    assert not any("cert_expiry" in f.name for f in metrics.collect())


def _config_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "tokwatch.yml")
    return str(info.value)


def test_unusable_tls_files_are_config_errors_naming_file_line_and_field(pki: Pki, tmp_path: Path) -> None:
    def endpoint(tls: str) -> str:
        return (
            "endpoints:\n  - name: ep\n    kind: openai\n    base_url: https://x.example\n    model: m\n"
            + tls
        )

    missing = tmp_path / "nope.pem"
    assert _config_error(endpoint(_tls(ca_file=missing))) == (
        f"tokwatch.yml:7: endpoints[0].tls_config.ca_file: cannot read {missing}: No such file or directory"
    )
    assert _config_error(endpoint(_tls(ca_file=pki.client_key))) == (
        f"tokwatch.yml:7: endpoints[0].tls_config.ca_file: {pki.client_key} holds no usable PEM CA "
        "certificate (NO_CERTIFICATE_OR_CRL_FOUND)"
    )
    mismatched = _config_error(endpoint(_tls(cert_file=pki.client_cert, key_file=pki.server_key)))
    assert mismatched == (
        f"tokwatch.yml:6: endpoints[0].tls_config: cert_file/key_file: cannot load the client certificate "
        f"{pki.client_cert} with the key {pki.server_key}: the key does not match the certificate"
    )
    assert _config_error(endpoint(_tls(cert_file=pki.client_cert))) == (
        "tokwatch.yml:6: endpoints[0].tls_config: cert_file and key_file go together: set both or neither"
    )
    unreadable = _config_error(endpoint(_tls(cert_file=pki.client_cert, key_file=tmp_path)))
    assert (
        unreadable
        == f"tokwatch.yml:8: endpoints[0].tls_config.key_file: cannot read {tmp_path}: Is a directory"
    )


async def test_check_config_prints_one_line_for_a_bad_tls_file(tmp_path: Path, pki: Pki) -> None:
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(
        "endpoints:\n  - name: ep\n    kind: openai\n    base_url: https://x.example\n    model: m\n"
        + _tls(cert_file=pki.client_cert, key_file=pki.server_key)
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tokwatch", "check-config", str(cfg),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().strip().splitlines()
    # The command's heading, then one line for the one problem.
    assert proc.returncode == 2 and lines[0] == "tokwatch: configuration error:" and len(lines) == 2, lines
    assert "tokwatch.yml:6: endpoints[0].tls_config: cert_file/key_file:" in lines[1]
    assert "the key does not match the certificate" in lines[1] and "Traceback" not in err.decode()


def test_probe_level_tls_and_proxy_are_every_endpoints_default(pki: Pki) -> None:
    config = load_config_text(
        f"probe:\n  tls_config: {{ca_file: {pki.ca}}}\n  proxy_url: http://proxy.corp:3128\n"
        "  no_proxy: internal.corp\nendpoints:\n"
        "  - {name: a, kind: openai, base_url: https://a.example, model: m}\n"
        "  - {name: b, kind: openai, base_url: https://b.example, model: m,"
        " tls_config: {server_name: b.corp}, proxy_from_environment: false}\n"
        "  - {name: c, kind: openai, base_url: https://c.example, model: m, proxy_url: 'http://other:8080',"
        " no_proxy: c.example}\n"
    )
    a, b, c = config.endpoints
    assert a.tls_config is not None and a.tls_config.ca_file == str(pki.ca)
    assert (a.proxy_url, a.no_proxy) == ("http://proxy.corp:3128", "internal.corp")
    # An endpoint's own tls_config replaces the default whole; `proxy_from_environment: false` turns the
    # default proxy off for it.
    assert b.tls_config is not None and (b.tls_config.ca_file, b.tls_config.server_name) == (None, "b.corp")
    assert (b.proxy_url, b.proxy_from_environment) == (None, False)
    assert (c.proxy_url, c.no_proxy) == ("http://other:8080", "c.example")
    assert Reach("c", c).proxy_for("https", "c.example", 443) is None
    hop = Reach("a", a).proxy_for("https", "a.example", 443)
    assert hop is not None and (hop.host, hop.port) == ("proxy.corp", 3128)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ("proxy_url: https://p:3128", "https:// proxies are not supported"),
        ("proxy_url: socks5://p:1080", "socks5 scheme"),
        ("proxy_url: http://p:3128/path", "has no path or query"),
        (
            "{proxy_url: 'http://p:1', proxy_from_environment: true}",
            "set proxy_url or proxy_from_environment",
        ),
        ("{proxy_url: 'http://p:1', proxy_password_file: /etc/hostname}", "needs the user name in proxy_url"),
        ("{proxy_url: 'http://u:pw@p:1', proxy_password_file: /etc/hostname}", "carries a password already"),
        ("no_proxy: '10.0.0.0/99'", "not a valid CIDR block"),
    ],
)
def test_proxy_settings_that_cannot_work_are_config_errors(settings: str, message: str) -> None:
    probe = f"probe: {settings}\n" if settings.startswith("{") else f"probe:\n  {settings}\n"
    text = _config_error(probe)
    assert text.startswith("tokwatch.yml:") and message in text and "\n" not in text


async def test_ssl_cert_file_trusts_a_private_ca_for_the_whole_process(
    serve: Serve, pki: Pki, tmp_path: Path
) -> None:
    """The documented alternative to `ca_file`: OpenSSL's SSL_CERT_FILE replaces the system trust store of
    every connection the process opens (here `tokwatch probe` as a separate process)."""
    url = await serve(
        {"/v1/chat/completions": sse_handler(["a ", "b ", "c ", "d "])}, ssl_context=server_ssl(pki)
    )
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(
        "probe: {max_tokens: 4, warmup: false}\nstorage: {enabled: false}\n"
        f"endpoints:\n  - {{name: ep, kind: openai, base_url: '{url}/v1', model: m}}\n"
    )

    async def probe(env: dict[str, str]) -> tuple[int | None, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tokwatch", "probe", "--config", str(cfg),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, out.decode()

    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    code, out = await probe(env)
    assert code == 1 and "certificate verify failed" in out, out
    code, out = await probe({**env, "SSL_CERT_FILE": str(pki.ca)})
    assert code == 0, out


def test_a_broken_environment_proxy_is_a_config_error_without_its_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://bob:hunter2-pw@p:1080")
    config = load_config_text(
        "endpoints:\n  - {name: ep, kind: openai, base_url: 'https://x.example', model: m,"
        " proxy_from_environment: true}\n"
    )
    with pytest.raises(ConfigError) as info:
        Keys(config)  # at start, reload and check-config
    assert str(info.value) == (
        "endpoint ep: proxy_from_environment: the https proxy socks5://bob:***@p:1080: socks5 scheme: a "
        "proxy_url is http://[user[:password]@]host:port"
    )
    # A password file that went away after the config was read: named, with the endpoint.
    password = tmp_path / "pw"
    password.write_text("pw-1234")
    config = load_config_text(
        "endpoints:\n  - {name: ep, kind: openai, base_url: 'https://x.example', model: m,"
        f" proxy_url: 'http://bob@p:3128', proxy_password_file: '{password}'}}\n"
    )
    assert Keys(config).redactor("pw-1234 Basic Ym9iOnB3LTEyMzQ= Ym9iOnB3LTEyMzQ=") == "*** *** ***"
    password.unlink()
    with pytest.raises(
        ConfigError, match=f"endpoint ep: cannot read proxy_password_file {password}: No such"
    ):
        Keys(config)
