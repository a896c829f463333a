"""`tokwatch healthcheck`: one GET of the exporter's health route with the TLS and basic auth of the
server's own `--web-config` file, for the Dockerfile HEALTHCHECK, compose healthchecks and Kubernetes `exec`
probes (docs/security.md, "Health checks").

Exit 0 when the route answers 2xx, 1 otherwise with one line naming the reason (never 2: Docker reserves
it). The password is read from a file and never printed. The request goes straight to the address in the
URL (no proxy from the environment, no redirect), and over TLS it trusts exactly the certificate the web
config's `cert_file` holds, so it needs neither a CA bundle nor a certificate naming 127.0.0.1. An https URL
without `--web-config` is checked against `--ca-file` (pinned the same way) or else the system's CA bundle.

It is exec'd every few seconds by container probes, so it imports neither the exporter nor aiohttp
(`tokwatch.entry` runs it without tokwatch.cli; tests/commands/test_healthcheck.py holds that).
"""

from __future__ import annotations

import argparse
import http.client
import ssl
import sys
from base64 import b64encode
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tokwatch import __version__
from tokwatch.settings.one_line_parser import OneLineErrorParser

if TYPE_CHECKING:
    from tokwatch.settings.webconfig_file import WebConfig

DEFAULT_HOST = "127.0.0.1:9477"
DEFAULT_PATH = "/-/healthy"
HEALTHY, UNHEALTHY = 0, 1
_BODY_SHOWN = 120  # characters of the answer quoted in the one-line result


class CheckError(Exception):
    """Why the check could not be made or failed, as one line without secrets."""


@dataclass(frozen=True)
class Request:
    """What the check sends: where, over which TLS context, with which Authorization header."""

    url: str
    host: str
    port: int
    path: str
    tls: ssl.SSLContext | None
    authorization: str | None
    user: str | None
    # what the server's certificate failed to be, when it fails verification
    untrusted: str = "the web config's cert_file"


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _target(url: str | None, tls: bool) -> tuple[str, str, int, str]:
    """(url, host, port, path) from --url: an absolute http(s) URL, or a path on 127.0.0.1:9477 whose scheme
    follows the web config (https with tls_server_config)."""
    scheme = "https" if tls else "http"
    if not url:
        url = f"{scheme}://{DEFAULT_HOST}{DEFAULT_PATH}"
    elif url.startswith("/"):
        url = f"{scheme}://{DEFAULT_HOST}{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CheckError(f"--url {url!r} must be http(s)://HOST:PORT/PATH or a path such as /-/ready")
    if tls and parts.scheme == "http":
        raise CheckError(f"--url {url} is plain HTTP but the web config serves TLS: use https://")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise CheckError(f"--url {url!r}: the port must be a number from 0 to 65535") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return url, parts.hostname, port, path


def _pinned(cafile: str, flag: str) -> ssl.SSLContext:
    """A client context whose only trust anchor is the certificate in `cafile` (accepted without its
    issuer), so the name in it need not be the address dialled."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    try:
        ctx.load_verify_locations(cafile=cafile)
    except (ssl.SSLError, OSError) as exc:
        raise CheckError(f"cannot load {flag} {cafile}: {exc}") from None
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, client_cert: str | None, client_key: str | None) -> bool:
    """Load --client-cert/--client-key into `ctx`; False when neither was given."""
    if not (client_cert or client_key):
        return False
    if not (client_cert and client_key):
        raise CheckError("--client-cert and --client-key go together")
    try:
        ctx.load_cert_chain(client_cert, client_key)
    except (ssl.SSLError, OSError) as exc:
        raise CheckError(f"cannot load --client-cert/--client-key: {exc}") from None
    return True


def _plain_tls(ca_file: str | None, client_cert: str | None, client_key: str | None) -> ssl.SSLContext:
    """TLS for an https URL without a web config: the server's certificate pinned by --ca-file, else
    verified against the system's CA bundle with its name checked."""
    ctx = _pinned(ca_file, "--ca-file") if ca_file else ssl.create_default_context()
    _load_client_cert(ctx, client_cert, client_key)
    return ctx


def _client_tls(
    cfg: WebConfig, base: Path, client_cert: str | None, client_key: str | None
) -> ssl.SSLContext | None:
    tls = cfg.tls_server_config
    if tls is None:
        return None
    # Pinned to the server's own certificate.
    ctx = _pinned(str(base / tls.cert_file), "the web config's cert_file")
    given = _load_client_cert(ctx, client_cert, client_key)
    if not given and tls.client_auth_type in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        raise CheckError(
            f"the web config requires a client certificate ({tls.client_auth_type}): "
            "pass --client-cert and --client-key"
        )
    return ctx


def _authorization(
    cfg: WebConfig, user: str | None, password_file: str | None
) -> tuple[str | None, str | None]:
    users = cfg.basic_auth_users
    if not users:
        return None, None
    if user is None:
        if len(users) != 1:
            raise CheckError(f"the web config has {len(users)} basic_auth_users: pass --user")
        (user,) = users
    elif user not in users:
        raise CheckError(f"--user {user!r} is not one of the web config's basic_auth_users")
    if password_file is None:
        raise CheckError(f"the web config requires basic auth: pass --password-file (user {user}'s password)")
    try:
        text = Path(password_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckError(f"--password-file: {password_file}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckError(f"--password-file: {password_file}: cannot read: {exc}") from None
    password = text.removesuffix("\n").removesuffix("\r")
    if not password:
        raise CheckError(f"--password-file {password_file} is empty")
    token = b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}", user


def build_request(
    url: str | None = None,
    web_config: str | None = None,
    user: str | None = None,
    password_file: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    ca_file: str | None = None,
) -> Request:
    """The request a check sends; CheckError (one line) when the flags or the web config do not allow one."""
    if web_config is None:
        for flag, value in (("--user", user), ("--password-file", password_file)):
            if value is not None:
                raise CheckError(f"{flag} needs --web-config (the file the server runs with)")
        full, host, port, path = _target(url, tls=False)
        if full.startswith("https://"):
            trust = (
                f"the one --ca-file {ca_file} holds"
                if ca_file
                else "trusted by the system's CA bundle: pass --ca-file with the server's certificate"
            )
            tls = _plain_tls(ca_file, client_cert, client_key)
            return Request(full, host, port, path, tls, None, None, trust)
        if ca_file or client_cert or client_key:
            raise CheckError(f"--url {full} is plain HTTP: --ca-file and --client-cert need https://")
        return Request(full, host, port, path, None, None, None)
    if ca_file is not None:
        raise CheckError("--ca-file is for https URLs without --web-config (which pins its cert_file)")
    # Only a check with a web config reads YAML, so the plain one (most exec probes) loads neither PyYAML
    # nor pydantic: a probe exec'd every few seconds pays for what it uses
    # (tests/commands/test_healthcheck.py).
    from tokwatch.settings.strict_yaml import ConfigError
    from tokwatch.settings.webconfig_file import load_web_config

    try:
        cfg, base = load_web_config(web_config)
    except ConfigError as exc:
        raise CheckError(_one_line(str(exc))) from None
    full, host, port, path = _target(url, tls=cfg.tls_server_config is not None)
    header, who = _authorization(cfg, user, password_file)
    return Request(full, host, port, path, _client_tls(cfg, base, client_cert, client_key), header, who)


def _hint_for_401(req: Request) -> str:
    if req.authorization is None:
        return "the server requires basic auth: pass the --web-config it runs with and --password-file"
    return f"user {req.user} was refused: is --password-file the password whose hash the web config holds?"


def check(req: Request, timeout_s: float) -> str:
    """GET the route once; returns the one-line success message, raises CheckError otherwise."""
    conn: http.client.HTTPConnection
    if req.tls is not None:
        conn = http.client.HTTPSConnection(req.host, req.port, timeout=timeout_s, context=req.tls)
    else:
        conn = http.client.HTTPConnection(req.host, req.port, timeout=timeout_s)
    headers = {"User-Agent": f"tokwatch-healthcheck/{__version__}", "Connection": "close"}
    if req.authorization is not None:
        headers["Authorization"] = req.authorization
    where = f"{req.host}:{req.port}"
    try:
        conn.request("GET", req.path, headers=headers)
        resp = conn.getresponse()
        body = resp.read(4096).decode("utf-8", "replace")
    except ssl.SSLCertVerificationError as exc:
        raise CheckError(
            f"{req.url}: the server's certificate is not {req.untrusted} ({exc.verify_message})"
        ) from None
    except ssl.SSLError as exc:
        reason = exc.reason or exc.__class__.__name__
        raise CheckError(
            f"{req.url}: TLS handshake with {where} failed ({reason}): does the server serve plain HTTP, "
            "or require a client certificate?"
        ) from None
    except (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError) as exc:
        hint = (
            ": a TLS server does that to plain HTTP, pass the --web-config it runs with"
            if req.tls is None
            else ""
        )
        raise CheckError(
            f"{req.url}: connection closed without an HTTP answer ({exc.__class__.__name__}){hint}"
        ) from None
    except ConnectionRefusedError:
        raise CheckError(f"{req.url}: connection refused: nothing listens on {where}") from None
    except TimeoutError:
        raise CheckError(f"{req.url}: no answer within {timeout_s:g}s") from None
    except OSError as exc:
        raise CheckError(f"{req.url}: cannot connect to {where}: {exc.strerror or exc}") from None
    except http.client.HTTPException as exc:
        raise CheckError(f"{req.url}: not an HTTP answer ({exc.__class__.__name__})") from None
    finally:
        conn.close()
    shown = _one_line(body)[:_BODY_SHOWN]
    if 200 <= resp.status < 300:
        return f"ok: {req.url}: {resp.status} {shown}".rstrip()
    if resp.status == 401:
        raise CheckError(f"{req.url}: 401 Unauthorized: {_hint_for_401(req)}")
    raise CheckError(f"{req.url}: {resp.status} {resp.reason} {shown}".rstrip())


def cmd_healthcheck(args: argparse.Namespace) -> int:
    """Exit 0 if the exporter answers its health route with 2xx, 1 (one line on stderr) if not."""
    try:
        req = build_request(
            args.url,
            args.web_config,
            args.user,
            args.password_file,
            args.client_cert,
            args.client_key,
            args.ca_file,
        )
        print(check(req, args.timeout))
    except CheckError as exc:
        print(f"tokwatch healthcheck: unhealthy: {exc}", file=sys.stderr)
        return UNHEALTHY
    return HEALTHY


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 < seconds <= 300:
        raise argparse.ArgumentTypeError(f"{value!r} must be more than 0 and at most 300 seconds")
    return seconds


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `healthcheck`."""
    p = sub.add_parser(
        "healthcheck",
        help="GET the exporter's /-/healthy (or --url) with the web config's TLS and basic auth; exit 0/1",
    )
    p.add_argument(
        "--url",
        help=f"URL to check (default http(s)://{DEFAULT_HOST}{DEFAULT_PATH}); a path such as /-/ready is "
        f"taken on {DEFAULT_HOST}, https when the web config has tls_server_config",
    )
    p.add_argument("--web-config", metavar="FILE", help="the web config file the server runs with")
    p.add_argument("--user", help="basic auth user (default: the web config's only user)")
    p.add_argument("--password-file", metavar="FILE", help="file holding that user's password")
    p.add_argument("--client-cert", metavar="FILE", help="client certificate, when the server requires one")
    p.add_argument("--client-key", metavar="FILE", help="its key")
    p.add_argument(
        "--ca-file",
        metavar="FILE",
        help="without --web-config: the certificate an https server must present (default: the system's CA "
        "bundle, with the host name checked)",
    )
    p.add_argument(
        "--timeout", type=_positive_seconds, default=3.0, help="seconds to wait for the answer (default 3)"
    )
    p.set_defaults(func=cmd_healthcheck)


def main(argv: Sequence[str]) -> int:
    """`tokwatch healthcheck ...` alone (argv from `healthcheck` on): the exporter's command line without
    importing it (tokwatch.entry)."""
    parser = OneLineErrorParser(prog="tokwatch")
    add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    return int(args.func(args))
