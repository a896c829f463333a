"""How a request reaches an endpoint beyond its URL: custom headers, query parameters and the way the API key
(or a basic-auth password) is presented. Typed settings and pure helpers; no I/O but reading secret files.

The endpoint's key still comes from `api_key`/`api_key_env`/`api_key_file`; `auth` only says where it goes
(`Authorization: Bearer`, a header of its own such as Azure's `api-key`, or basic auth with a password).
Which headers are secret is decided here once, so every redactor masks the same values.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import SecretStr, field_validator, model_validator

from tokwatch.settings.strict_yaml import ConfigError, StrictModel

# A header name is a token (RFC 9110): no spaces, colons or line breaks, which would split the request.
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Header names that carry a credential whatever the config says (lower-cased substrings or whole names).
_CREDENTIAL_NAMES = frozenset({"authorization", "proxy-authorization", "cookie", "api-key", "x-api-key"})
_CREDENTIAL_PARTS = ("key", "token", "secret", "auth", "password", "signature", "credential", "session")
# Set by tokwatch itself: a custom header may not replace them (they frame the request).
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def credential_name(name: str) -> bool:
    """True when a header or query parameter of this name carries a credential (always treated as secret)."""
    low = name.lower()
    return low in _CREDENTIAL_NAMES or any(part in low for part in _CREDENTIAL_PARTS)


def _read_secret_file(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None


def _read_env(name: str, what: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"{what}: environment variable {name} is not set")
    return value.strip()


class HeaderValue(StrictModel):
    """A header value read from the environment or a file (re-read when the file changes, like a key file);
    exactly one of `value`, `value_env` and `value_file`."""

    value: SecretStr | None = None
    value_env: str | None = None
    value_file: str | None = None

    @model_validator(mode="after")
    def _one(self) -> HeaderValue:
        given = [n for n in ("value", "value_env", "value_file") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                f"set exactly one of value, value_env and value_file (got {', '.join(given) or 'none'})"
            )
        return self

    @property
    def file(self) -> str | None:
        """The file the value is read from (followed through rotation), None otherwise."""
        return self.value_file

    def resolve(self, what: str) -> str:
        """The value now; raises ConfigError naming `what` when its variable or file is missing."""
        if self.value is not None:
            return self.value.get_secret_value()
        if self.value_env is not None:
            return _read_env(self.value_env, f"{what}.value_env")
        assert self.value_file is not None
        return _read_secret_file(self.value_file, f"{what}.value_file")


class AuthSettings(StrictModel):
    """How the endpoint's credential is presented.

    `bearer`: `Authorization: Bearer <api key>` (the default of OpenAI-style kinds). `header`: the api key
    as the value of `header` (Azure's `api-key`, Anthropic's `x-api-key`). `basic`: `Authorization: Basic`
    of `username` and a password from `password`, `password_env` or `password_file` (no api key).
    """

    type: Literal["bearer", "header", "basic"]
    header: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    password_env: str | None = None
    password_file: str | None = None

    @field_validator("header")
    @classmethod
    def _header(cls, v: str | None) -> str | None:
        return v if v is None else check_header_name(v)

    @model_validator(mode="after")
    def _check(self) -> AuthSettings:
        passwords = [n for n in ("password", "password_env", "password_file") if getattr(self, n) is not None]
        if self.type == "header" and self.header is None:
            raise ValueError("type header needs `header:` (e.g. api-key for Azure, x-api-key for Anthropic)")
        if self.type != "header" and self.header is not None:
            raise ValueError(f"`header:` applies only to type header, not {self.type}")
        if self.type == "basic":
            if self.username is None:
                raise ValueError("type basic needs `username:`")
            if ":" in self.username:
                raise ValueError("a basic-auth username cannot contain ':'")
            if len(passwords) != 1:
                got = ", ".join(passwords) or "none"
                raise ValueError(
                    f"type basic needs exactly one of password, password_env and password_file (got {got})"
                )
        elif self.username is not None or passwords:
            raise ValueError(f"username and password apply only to type basic, not {self.type}")
        return self

    def resolve_password(self, what: str) -> str | None:
        """The basic-auth password now (None for other types); raises ConfigError when unreadable."""
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_env is not None:
            return _read_env(self.password_env, f"{what}: auth.password_env")
        if self.password_file is not None:
            return _read_secret_file(self.password_file, f"{what}: auth.password_file")
        return None


def check_header_name(name: str) -> str:
    """`name` if it is a valid HTTP header name; ValueError otherwise."""
    if not _HEADER_NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a valid HTTP header name")
    return name


def check_headers(v: dict[str, Any]) -> dict[str, Any]:
    """Header names valid, none twice (case-insensitively), none that tokwatch itself frames."""
    seen: set[str] = set()
    for name, value in v.items():
        check_header_name(name)
        low = name.lower()
        if low in seen:
            raise ValueError(f"header {name!r} is given twice (header names are case-insensitive)")
        if low in _RESERVED_HEADERS:
            raise ValueError(f"header {name!r} is set by tokwatch itself")
        if isinstance(value, str) and ("\r" in value or "\n" in value):
            raise ValueError(f"header {name!r}: a value cannot contain a line break")
        if isinstance(value, str) and not value.isascii():
            raise ValueError(f"header {name!r}: a value is ASCII text (HTTP/1.1 sends no other)")
        seen.add(low)
    return v


def check_path(v: str | None) -> str | None:
    """A request path override: starts with '/', no query (that is `query:`)."""
    if v is None:
        return v
    if not v.startswith("/"):
        raise ValueError(f"must start with '/', got {v!r}")
    if "?" in v or "#" in v:
        raise ValueError("cannot carry a query string: put its parameters under the endpoint's `query:`")
    return v


def check_base_url_parts(url: str) -> None:
    """A base_url never carries a query string or credentials: each has its own key, named in the error."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "has credentials (user:password@) in it, which tokwatch never sends from a URL: remove them and "
            "set `auth: {type: basic, username: ..., password_file: ...}`"
        )
    if parts.query or url.endswith("?"):
        names = ", ".join(dict.fromkeys(name for name, _ in parse_qsl(parts.query, keep_blank_values=True)))
        raise ValueError(
            f"has a query string ({names or '?'}), which would land before the request path: remove it and "
            "put its parameters under `query:` (e.g. query: {api-version: 2024-10-21})"
        )
    if parts.fragment:
        raise ValueError("has a fragment (#...), which is never sent: remove it")


def with_query(url: str, query: Mapping[str, str]) -> str:
    """`url` with `query`'s parameters appended (percent-encoded), after any the URL already has."""
    if not query:
        return url
    joiner = "&" if urlsplit(url).query else "?"
    return f"{url}{joiner}{urlencode(list(query.items()))}"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What an endpoint's requests carry besides the body, resolved now: its api key, a basic-auth password,
    and its custom header values (files and variables read)."""

    api_key: str | None = None
    password: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    secret_headers: frozenset[str] = frozenset()  # lower-cased names of the headers whose values are secret
    username: str | None = None  # basic auth's

    def secrets(self) -> list[str]:
        """Every value to mask: the key, the password (and the basic-auth token it makes), and the values of
        secret headers."""
        out = [s for s in (self.api_key, self.password) if s]
        if self.password is not None and self.username is not None:
            out.append(basic_token(self.username, self.password))
        out.extend(
            v for k, v in self.headers.items() if k.lower() in self.secret_headers or credential_name(k)
        )
        return out


def basic_token(username: str, password: str) -> str:
    """The base64 of `username:password` that `Authorization: Basic` carries."""
    return base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def auth_headers(
    auth: AuthSettings | None, default_header: str | None, api_key: str | None, password: str | None
) -> dict[str, str]:
    """The credential header: `auth`'s way, else the kind's default (`default_header`, None: bearer)."""
    if auth is not None and auth.type == "basic":
        return {"Authorization": f"Basic {basic_token(auth.username or '', password or '')}"}
    if not api_key:
        return {}
    header = auth.header if auth is not None and auth.type == "header" else None
    if auth is None:
        header = default_header
    if header is None:
        return {"Authorization": f"Bearer {api_key}"}
    return {header: api_key}


def merge_headers(*layers: Mapping[str, str]) -> dict[str, str]:
    """Later layers win, names compared case-insensitively (the later spelling is kept)."""
    out: dict[str, tuple[str, str]] = {}
    for layer in layers:
        for name, value in layer.items():
            out[name.lower()] = (name, value)
    return dict(out.values())


def _scalar_text(value: Any) -> Any:
    """A YAML scalar as the text it was written as: `2024-10-21` is read as a date, `1` as a number."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, date | int | float):
        return value.isoformat() if isinstance(value, date) else str(value)
    return value


def _texts(v: Any) -> Any:
    return {k: _scalar_text(x) for k, x in v.items()} if isinstance(v, dict) else v


def text_fields(*names: str) -> Any:
    """Mappings whose scalar values are read as text, so `api-version: 2024-10-21` is a string, not a date."""
    return field_validator(*names, mode="before")(_texts)


def headers_fields(*names: str) -> Any:
    """The validator of a `headers:` mapping: names valid, none twice, none tokwatch frames itself."""
    return field_validator(*names)(check_headers)


def path_fields(*names: str) -> Any:
    """The validator of a request `path:` override."""
    return field_validator(*names)(check_path)


def base_url_fields(*names: str) -> Any:
    """The validator refusing a base_url with a query string or credentials in it."""

    def check(v: str | None) -> str | None:
        if v is not None:
            check_base_url_parts(v)
        return v

    return field_validator(*names)(check)


def check_endpoint_reach(
    headers: Mapping[str, Any],
    secret_headers: Iterable[str],
    auth: AuthSettings | None,
    key_fields: list[str],
) -> None:
    """What the reach fields must agree on; ValueError naming the field. `key_fields`: api key fields set."""
    configured = {h.lower() for h in headers}
    for name in secret_headers:
        if name.lower() not in configured:
            raise ValueError(f"secret_headers names {name!r}, which is not one of the endpoint's headers")
    if auth is not None and auth.type == "basic" and key_fields:
        raise ValueError(
            f"auth type basic sends a username and password, not an api key: remove {', '.join(key_fields)}"
        )
    if (
        auth is not None
        and auth.type != "basic"
        and auth.header is not None
        and auth.header.lower() in configured
    ):
        raise ValueError(f"header {auth.header!r} is both in headers and auth.header: keep it in one place")


def header_files(headers: Mapping[str, str | HeaderValue]) -> dict[str, str]:
    """Header name -> the file its value is read from, for the headers read from files."""
    return {k: v.file for k, v in headers.items() if isinstance(v, HeaderValue) and v.file is not None}


def resolve_headers(headers: Mapping[str, str | HeaderValue], what: str) -> dict[str, str]:
    """The header values now (variables and files read); raises ConfigError naming `what` and the header."""
    return {k: v if isinstance(v, str) else v.resolve(f"{what}: headers.{k}") for k, v in headers.items()}


def secret_header_names(headers: Mapping[str, str | HeaderValue], secret_headers: Iterable[str]) -> set[str]:
    """Lower-cased names of the headers whose values are secret: named in `secret_headers`, credential-named,
    or read from a variable or a file (a value kept out of the config file is a secret)."""
    out = {h.lower() for h in secret_headers}
    out.update(k.lower() for k, v in headers.items() if isinstance(v, HeaderValue) or credential_name(k))
    return out


def query_secrets(query: Mapping[str, str]) -> list[str]:
    """Values of credential-named query parameters (`key`, `sig`, `token`, ...): secrets like a key."""
    return [v for k, v in query.items() if credential_name(k)]
