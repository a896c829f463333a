"""Reaching endpoints beyond their URL: custom headers (inline, from the environment, from files followed
through rotation), query parameters, auth (bearer, header, basic), Azure OpenAI URLs, and the config errors
for a base_url that carries a query or credentials. Probes, counter scrapes and the bench all go through a
real endpoint on 127.0.0.1 that checks what it was sent."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from rich.console import Console

from tests.support.cli_logging import own_root_handlers
from tests.support.echo import EchoEndpoint
from tokwatch.bench.config import build_options
from tokwatch.bench.session import run_bench
from tokwatch.cli import main
from tokwatch.figures.result import Status
from tokwatch.probes import probe_class
from tokwatch.service.app import App
from tokwatch.settings.config import load_config_text
from tokwatch.settings.strict_yaml import ConfigError


@pytest.fixture(autouse=True)
def _root_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests call `tokwatch.cli.main`, which sets up the process's logging."""
    own_root_handlers(monkeypatch)


Serve = Callable[..., Awaitable[str]]


def config_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "t.yml")
    return str(info.value)


def endpoint_yaml(**fields: str) -> str:
    lines = "".join(f"    {k}: {v}\n" for k, v in fields.items())
    return f"endpoints:\n  - name: e\n    kind: openai\n    model: m\n{lines}"


@asynccontextmanager
async def running(text: str) -> AsyncIterator[App]:
    app = App(load_config_text(text))
    await app.start(schedule=False)
    try:
        yield app
    finally:
        await app.stop()


HEAD = "probe: {max_tokens: 8, warmup: false}\nstorage: {enabled: false}\nschedule: {interval: 1h}\n"

# --- config errors -------------------------------------------------------------------------------------


def test_base_url_with_a_query_string_names_the_query_key(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    text = endpoint_yaml(
        base_url="'https://x.openai.azure.com/openai/deployments/gpt-4o?api-version=2024-10-21'"
    )
    assert config_error(text) == (
        "t.yml:5: endpoints[0].base_url: has a query string (api-version), which would land before the "
        "request path: remove it and put its parameters under `query:` "
        "(e.g. query: {api-version: 2024-10-21})"
    )
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(text)
    assert main(["check-config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}:5: endpoints[0].base_url: has a query string (api-version)" in err
    assert "Traceback" not in err


def test_base_url_with_credentials_names_basic_auth_and_never_echoes_the_password() -> None:
    message = config_error(endpoint_yaml(base_url="'http://alice:pw-Secret-42@127.0.0.1:8000/v1'"))
    assert message == (
        "t.yml:5: endpoints[0].base_url: has credentials (user:password@) in it, which tokwatch never sends "
        "from a URL: remove them and set `auth: {type: basic, username: ..., password_file: ...}`"
    )
    assert "pw-Secret-42" not in message and "alice" not in message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"auth": "{type: header}"}, "endpoints[0].auth: type header needs `header:`"),
        (
            {"auth": "{type: basic, username: u}"},
            "endpoints[0].auth: type basic needs exactly one of password",
        ),
        ({"auth": "{type: bearer, username: u}"}, "username and password apply only to type basic"),
        (
            {"auth": "{type: basic, username: u, password: p}", "api_key": "k"},
            "auth type basic sends a username",
        ),
        ({"headers": "{'Bad Name': x}"}, "endpoints[0].headers: 'Bad Name' is not a valid HTTP header name"),
        ({"headers": "{Host: x}"}, "header 'Host' is set by tokwatch itself"),
        ({"headers": "{X-A: 1, x-a: 2}"}, "header 'x-a' is given twice"),
        (
            {"headers": "{X-A: {value_file: /f, value_env: E}}"},
            "set exactly one of value, value_env and value_file",
        ),
        (
            {"secret_headers": "[X-Nope]"},
            "secret_headers names 'X-Nope', which is not one of the endpoint's headers",
        ),
        ({"headers": "{X-Title: café}"}, "header 'X-Title': a value is ASCII text"),
        ({"path": "chat"}, "endpoints[0].path: must start with '/'"),
        ({"path": "/chat?x=1"}, "endpoints[0].path: cannot carry a query string"),
    ],
)
def test_reach_settings_are_checked(fields: dict[str, str], message: str) -> None:
    assert message in config_error(endpoint_yaml(base_url="http://127.0.0.1:9/v1", **fields))


def test_query_values_are_text_as_written() -> None:
    cfg = load_config_text(
        endpoint_yaml(base_url="http://127.0.0.1:9/v1", query="{api-version: 2024-10-21, n: 1}")
    )
    assert cfg.endpoints[0].query == {"api-version": "2024-10-21", "n": "1"}


def test_an_unreadable_header_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    text = HEAD + endpoint_yaml(
        base_url="http://127.0.0.1:9/v1", headers=f"{{X-Gateway-Key: {{value_file: '{tmp_path}/missing'}}}}"
    )
    with pytest.raises(
        ConfigError, match=r"endpoint e: headers.X-Gateway-Key.value_file: cannot read .*missing"
    ):
        App(load_config_text(text))


# --- requests ------------------------------------------------------------------------------------------


async def test_azure_deployment_url_sends_the_exact_request_line(serve: Serve) -> None:
    echo = EchoEndpoint(
        require_headers={"api-key": "azure-key-0001"}, require_query={"api-version": "2024-10-21"}
    )
    url = await serve(echo.routes())
    text = (
        HEAD
        + f"""endpoints:
  - name: azure
    kind: openai
    base_url: {url}/openai/deployments/gpt-4o
    model: gpt-4o
    api_key: azure-key-0001
    query: {{api-version: 2024-10-21}}
    auth: {{type: header, header: api-key}}
  - name: azure-v1
    kind: openai
    base_url: {url}/openai/v1
    model: gpt-4o
    api_key: azure-key-0001
    auth: {{type: header, header: api-key}}
    query: {{api-version: 2024-10-21}}
"""
    )
    async with running(text) as app:
        result = (await app.probe("azure")).result
        assert result.ok, result.error_message
        assert (
            echo.posts()[-1].line == "POST /openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"
        )
        assert "authorization" not in echo.posts()[-1].headers  # the key goes in api-key only
        assert (await app.probe("azure-v1")).result.ok
        assert echo.posts()[-1].line == "POST /openai/v1/chat/completions?api-version=2024-10-21"


async def test_gateway_headers_openrouter_headers_and_a_path_override(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GW_TENANT", "tenant-7")
    echo = EchoEndpoint(
        require_headers={
            "X-Tenant": "tenant-7",
            "HTTP-Referer": "https://tokwatch.example",
            "X-Title": "tokwatch",
            "Authorization": "Bearer or-key-0002",
        }
    )
    url = await serve(echo.routes())
    text = (
        HEAD
        + f"""endpoints:
  - name: gw
    kind: openai
    base_url: {url}/api
    path: /llm/chat
    model: m
    api_key: or-key-0002
    headers:
      X-Tenant: {{value_env: GW_TENANT}}
      HTTP-Referer: https://tokwatch.example
      X-Title: tokwatch
"""
    )
    async with running(text) as app:
        result = (await app.probe("gw")).result
        assert result.ok, result.error_message
        assert echo.posts()[-1].line == "POST /api/llm/chat"
        # a header read from the environment is a secret; a plain X-Title is not
        assert app.keys.redactor("tenant-7 tokwatch") == "*** tokwatch"


async def test_basic_auth_with_a_rotated_password_file(serve: Serve, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("old-pass-0001\n")
    want = "Basic " + base64.b64encode(b"alice:new-pass-0002").decode()
    echo = EchoEndpoint(require_headers={"Authorization": want})
    url = await serve(echo.routes())
    text = (
        HEAD
        + f"""endpoints:
  - name: b
    kind: openai
    base_url: {url}/v1
    model: m
    auth: {{type: basic, username: alice, password_file: '{password}'}}
"""
    )
    async with running(text) as app:
        before = (await app.probe("b")).result
        assert before.status is Status.AUTH_FAILURE
        assert "old-pass-0001" not in (before.error_message or "")
        new = tmp_path / "password.new"
        new.write_text("new-pass-0002\n")
        new.replace(password)
        after = (await app.probe("b")).result
        assert after.ok, after.error_message
        assert app.keys.redactor("old-pass-0001 new-pass-0002") == "*** ***"
        token = want.removeprefix("Basic ")
        assert app.keys.redactor(f"sent {token} as") == "sent *** as"  # the token alone, too


async def test_a_header_from_a_file_follows_rotation_in_probes_and_counter_scrapes(
    serve: Serve, tmp_path: Path
) -> None:
    key_file = tmp_path / "gw-key"
    key_file.write_text("gw-key-OLD-0001\n")
    echo = EchoEndpoint(require_headers={"X-Gateway-Key": "gw-key-NEW-0002"}, require_query={"tenant": "a b"})
    url = await serve(echo.routes())
    text = (
        HEAD
        + f"""endpoints:
  - name: v
    kind: vllm
    base_url: {url}/v1
    model: m
    scrape_interval: 1h
    query: {{tenant: a b}}
    headers:
      X-Gateway-Key: {{value_file: '{key_file}'}}
"""
    )
    async with running(text) as app:
        assert (await app.probe("v")).result.status is Status.AUTH_FAILURE
        new = tmp_path / "gw-key.new"
        new.write_text("gw-key-NEW-0002\n")
        new.replace(key_file)
        result = (await app.probe("v")).result
        assert result.ok, result.error_message
        assert echo.posts()[-1].line == "POST /v1/chat/completions?tenant=a+b"
        scrapes = [s for s in echo.seen if s.method == "GET"]
        assert scrapes and scrapes[-1].line == "GET /metrics?tenant=a+b"
        assert scrapes[-1].headers["x-gateway-key"] == "gw-key-NEW-0002"  # the counter window's own reads
        assert app.keys.redactor("gw-key-OLD-0001 gw-key-NEW-0002") == "*** ***"


async def test_bench_sends_the_endpoints_headers_query_and_auth(serve: Serve, tmp_path: Path) -> None:
    echo = EchoEndpoint(
        require_headers={"api-key": "bench-key-0003", "X-Gateway-Key": "bench-gw-0004"},
        require_query={"api-version": "2024-10-21"},
    )
    url = await serve(echo.routes())
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(f"""endpoints:
  - name: azure
    kind: openai
    base_url: {url}/openai/deployments/gpt-4o
    model: gpt-4o
    api_key: bench-key-0003
    auth: {{type: header, header: api-key}}
    query: {{api-version: 2024-10-21}}
    headers: {{X-Gateway-Key: bench-gw-0004}}
""")
    opts = build_options(
        {"endpoint": "azure", "config": str(cfg), "number": 2, "plots": False, "live_interval": 60}
    )
    outcome, out_dir = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
    assert all(r.ok for r in outcome.records), [r.error_message for r in outcome.records]
    assert {s.line for s in echo.posts()} == {
        "POST /openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"
    }
    for path in out_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"bench-key-0003" not in data and b"bench-gw-0004" not in data, path


# --- the documented examples ---------------------------------------------------------------------------

DOCUMENTED = ("Gateways (custom headers)", "Azure OpenAI", "Anthropic", "OpenRouter headers")


def documented_examples() -> dict[str, list[str]]:
    """The YAML blocks of docs/configuration.md's "Reaching endpoints" subsections, by subsection."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    section = text.split("## Reaching endpoints", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[str]] = {}
    for part in section.split("\n### ")[1:]:
        title, body = part.split("\n", 1)
        out[title.strip()] = [block.split("```", 1)[0] for block in body.split("```yaml\n")[1:]]
    return out


@pytest.mark.parametrize("title", DOCUMENTED)
def test_the_documented_examples_load_and_build_the_documented_requests(title: str) -> None:
    blocks = documented_examples()[title]
    assert blocks, title
    urls = {}
    for block in blocks:
        for ep in load_config_text(block, title).endpoints:
            urls[ep.name] = probe_class(ep.kind).endpoint_url(ep)
    if title == "Azure OpenAI":
        assert urls == {
            "azure-gpt-4o": "https://my-resource.openai.azure.com/openai/deployments/gpt-4o/chat/completions"
            "?api-version=2024-10-21",
            "azure-v1": "https://my-resource.openai.azure.com/openai/v1/chat/completions",
        }
    if title == "Anthropic":
        assert set(urls.values()) == {"https://api.anthropic.com/v1/messages"}


async def test_bench_scrapes_the_endpoints_own_server_with_its_headers_and_query(
    serve: Serve, tmp_path: Path
) -> None:
    echo = EchoEndpoint(require_headers={"X-Gateway-Key": "bench-gw-0005"}, require_query={"tenant": "t1"})
    url = await serve(echo.routes())
    cfg = tmp_path / "tokwatch.yml"
    cfg.write_text(f"""endpoints:
  - name: v
    kind: vllm
    base_url: {url}/v1
    model: m
    query: {{tenant: t1}}
    headers: {{X-Gateway-Key: bench-gw-0005}}
""")
    opts = build_options(
        {"endpoint": "v", "config": str(cfg), "number": 1, "plots": False, "live_interval": 60}
    )
    outcome, _ = await run_bench(opts, console=Console(quiet=True), out_dir=tmp_path / "run")
    assert all(r.ok for r in outcome.records), [r.error_message for r in outcome.records]
    scrapes = [s for s in echo.seen if s.method == "GET"]
    assert scrapes and {s.line for s in scrapes} == {"GET /metrics?tenant=t1"}
    assert all(s.headers["x-gateway-key"] == "bench-gw-0005" for s in scrapes)


async def test_ollama_ps_polls_carry_the_endpoints_headers_and_query(serve: Serve) -> None:
    echo = EchoEndpoint(require_headers={"X-Gateway-Key": "ollama-gw-0006"}, require_query={"t": "1"})
    url = await serve(echo.routes())
    text = (
        HEAD
        + f"""endpoints:
  - name: o
    kind: ollama
    base_url: {url}
    model: m
    scrape_interval: 1h
    query: {{t: 1}}
    headers: {{X-Gateway-Key: ollama-gw-0006}}
"""
    )
    async with running(text) as app:
        await app.watchers.ollama["o"].poll()
    polls = [s for s in echo.seen if s.method == "GET"]
    assert polls and polls[-1].line == "GET /api/ps?t=1"
    assert polls[-1].headers["x-gateway-key"] == "ollama-gw-0006"


def test_bench_url_with_a_query_string_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = "http://127.0.0.1:9/openai/deployments/gpt-4o?api-version=2024-10-21"
    assert main(["bench", "--url", url, "--model", "m"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokwatch bench: command line: url: has a query string (api-version)")
    assert err.endswith("the bench takes them from an endpoint of --config FILE: --endpoint NAME")
    assert "\n" not in err
