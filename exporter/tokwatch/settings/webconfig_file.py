"""The `--web-config FILE` settings (exporter-toolkit format, tokwatch.settings.webconfig): the models,
loading and
the server's TLS context, without aiohttp, so `tokwatch healthcheck` reads the file without the web stack."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from tokwatch.settings.strict_yaml import ConfigError, StrictModel, read_config_file, validate_yaml

ClientAuth = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]


class TLSServerConfig(StrictModel):
    """exporter-toolkit's `tls_server_config` (the settings tokwatch supports)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    client_auth_type: ClientAuth = "NoClientCert"
    min_version: Literal["TLS12", "TLS13"] = "TLS12"


class HTTPServerConfig(StrictModel):
    """exporter-toolkit's `http_server_config`: extra response headers."""

    headers: dict[str, str] = Field(default_factory=dict)


def _bcrypt_hash(value: str) -> str:
    if not value.startswith(("$2a$", "$2b$", "$2y$")) or len(value) != 60:
        raise ValueError("the password must be a bcrypt hash ($2b$..., 60 characters), not the password")
    cost = value[4:6]
    if value[6] != "$" or not cost.isdigit() or not 4 <= int(cost) <= 31:
        raise ValueError(f"the bcrypt hash has no valid cost (04-31) after {value[:4]}")
    return value


def bcrypt_cost(hashed: str | bytes) -> int:
    """The cost (log2 rounds) of a validated bcrypt hash: `$2b$12$...` -> 12."""
    return int(hashed[4:6])


BcryptHash = Annotated[str, AfterValidator(_bcrypt_hash)]


class WebConfig(StrictModel):
    """The whole web config file."""

    tls_server_config: TLSServerConfig | None = None
    basic_auth_users: dict[str, BcryptHash] = Field(default_factory=dict)
    http_server_config: HTTPServerConfig = Field(default_factory=HTTPServerConfig)


def load_web_config(path: str | os.PathLike[str]) -> tuple[WebConfig, Path]:
    """Read and validate a web config file; returns it and its directory (base of relative paths)."""
    text, name = read_config_file(path)
    cfg = validate_yaml(text, name, WebConfig)
    base = Path(path).resolve().parent
    tls = cfg.tls_server_config
    if tls is not None:
        files = [("cert_file", tls.cert_file), ("key_file", tls.key_file)]
        if tls.client_ca_file:
            files.append(("client_ca_file", tls.client_ca_file))
        for field, value in files:
            if not (base / value).is_file():
                raise ConfigError(f"{name}: tls_server_config.{field}: no such file: {value}")
        if tls.client_auth_type != "NoClientCert" and not tls.client_ca_file:
            needs_ca = tls.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
            if needs_ca:
                raise ConfigError(
                    f"{name}: tls_server_config.client_auth_type: {tls.client_auth_type} needs client_ca_file"
                )
        ssl_context(cfg, base, name)  # the certificate and key must load now, not at the first connection
    return cfg, base


def ssl_context(cfg: WebConfig, base: Path, name: str = "web config") -> ssl.SSLContext | None:
    """The server TLS context, or None without `tls_server_config`; ConfigError when files do not load."""
    tls = cfg.tls_server_config
    if tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if tls.min_version == "TLS13" else ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(base / tls.cert_file, base / tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{name}: tls_server_config: cannot load cert_file/key_file: {exc}") from None
    if tls.client_ca_file:
        try:
            ctx.load_verify_locations(cafile=str(base / tls.client_ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{name}: tls_server_config.client_ca_file: cannot load: {exc}") from None
    # Python's ssl cannot request a certificate without verifying it, so "any"/"request" verify when given.
    ctx.verify_mode = {
        "NoClientCert": ssl.CERT_NONE,
        "RequestClientCert": ssl.CERT_OPTIONAL,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAnyClientCert": ssl.CERT_REQUIRED,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }[tls.client_auth_type]
    return ctx
