"""The credentials of the configured endpoints (API keys, basic-auth passwords, header values): resolved at
(re)load time, their files followed through rotation, every secret in the redactor."""

from __future__ import annotations

import logging

from tokwatch.probes import probe_class
from tokwatch.settings.access import (
    Credentials,
    header_files,
    query_secrets,
    resolve_headers,
    secret_header_names,
)
from tokwatch.settings.config import Config, ConfigError, EndpointSettings
from tokwatch.settings.file_version import file_version
from tokwatch.settings.reach import reach_secrets
from tokwatch.settings.redact import Redactor

log = logging.getLogger("tokwatch")

FileVersion = tuple[int, int, int] | None


class Keys:
    """Credentials resolved at (re)load time, so a missing env var is a config error, not a failed probe.

    A file the credentials come from (`api_key_file`, `auth.password_file`, a header's `value_file`) is
    re-read when it changes (a rotated secret needs no restart or reload); while a rotation leaves it
    unreadable, the last value read is used. Every secret ever read stays in the redactor, and so do the
    endpoints' proxy credentials (tokwatch.settings.reach: read here, so an unreadable `proxy_password_file`
    or a broken environment proxy is a config error too).
    """

    def __init__(self, config: Config) -> None:
        self._endpoints: dict[str, EndpointSettings] = {}
        self._creds: dict[str, Credentials] = {}
        self._files: dict[str, dict[str, FileVersion]] = {}  # endpoint -> followed file -> version read
        problems = []
        secrets: list[str | None] = []
        for ep in config.endpoints:
            self._endpoints[ep.name] = ep
            files = followed_files(ep)
            if files:
                self._files[ep.name] = {path: file_version(path) for path in files}
            try:
                self._creds[ep.name] = resolve_credentials(ep)
                secrets.extend(reach_secrets(ep.name, ep))
            except ConfigError as exc:
                if ep.enabled:
                    problems.append(str(exc))
                self._creds[ep.name] = Credentials()
            secrets.extend(self._creds[ep.name].secrets())
            secrets.extend(query_secrets(ep.query))
        if problems:
            raise ConfigError("\n".join(problems))
        self.redactor = Redactor(secrets)

    def get(self, name: str) -> str | None:
        """Key for one endpoint (None when it needs none); re-reads a changed credential file."""
        return self.credentials(name).api_key

    def credentials(self, name: str) -> Credentials:
        """Everything one endpoint's requests carry besides the body, re-read from any changed file."""
        if name in self._files:
            self._refresh(name)
        return self._creds.get(name, Credentials())

    def headers(self, name: str) -> dict[str, str]:
        """The endpoint's request headers now: its custom headers, then its credential header."""
        ep = self._endpoints.get(name)
        if ep is None:
            return {}
        return probe_class(ep.kind).endpoint_headers(ep, self.credentials(name))

    def _refresh(self, name: str) -> None:
        ep, seen = self._endpoints[name], self._files[name]
        now = {path: file_version(path) for path in seen}
        if now == seen:
            return
        gone = [path for path, version in now.items() if version is None]
        if gone:
            if any(seen[p] is not None for p in gone):
                log.warning("endpoint %s: %s unreadable; using the last value read", name, ", ".join(gone))
            return  # the versions seen stay: the file is read again once it is back
        try:
            creds = resolve_credentials(ep)
        except ConfigError as exc:
            log.warning("%s; using the last value read", exc)
            return
        self._files[name] = now
        changed = [path for path in now if now[path] != seen[path]]
        if creds != self._creds.get(name):
            self._creds[name] = creds
            for secret in creds.secrets():
                self.redactor = self.redactor.with_secret(secret)
            log.info("endpoint %s: %s changed; the new value is used", name, ", ".join(changed))


def followed_files(ep: EndpointSettings) -> list[str]:
    """The files an endpoint's credentials are read from."""
    files = [ep.api_key_file] if ep.api_key_file is not None else []
    if ep.auth is not None and ep.auth.password_file is not None:
        files.append(ep.auth.password_file)
    files.extend(header_files(ep.headers).values())
    return files


def resolve_credentials(ep: EndpointSettings) -> Credentials:
    """The endpoint's key, password and header values now; raises ConfigError naming what is unreadable."""
    what = f"endpoint {ep.name}"
    password = ep.auth.resolve_password(what) if ep.auth is not None else None
    headers = resolve_headers(ep.headers, what)
    return Credentials(
        api_key=ep.resolve_api_key(),
        password=password,
        headers=headers,
        secret_headers=frozenset(secret_header_names(ep.headers, ep.secret_headers)),
        username=ep.auth.username if ep.auth is not None else None,
    )


def endpoint_secrets(ep: EndpointSettings) -> list[str]:
    """Every secret an endpoint's requests carry now (key, password, secret header and query values)."""
    return [*resolve_credentials(ep).secrets(), *query_secrets(ep.query)]

