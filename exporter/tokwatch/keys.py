"""API keys of the configured endpoints: resolved at (re)load time, key files followed through rotation."""

from __future__ import annotations

import logging

from tokwatch.config import Config, ConfigError, EndpointSettings
from tokwatch.file_version import file_version
from tokwatch.reach import reach_secrets
from tokwatch.redact import Redactor

log = logging.getLogger("tokwatch")


class Keys:
    """API keys resolved at (re)load time, so a missing env var is a config error, not a failed probe.

    An `api_key_file` is re-read when the file changes (a rotated key needs no restart or reload); while a
    rotation leaves it unreadable, the last key read is used. Every key ever read stays in the redactor, and
    so do the endpoints' proxy credentials (tokwatch.reach: read here, so an unreadable
    `proxy_password_file` or a broken environment proxy is a config error too).
    """

    def __init__(self, config: Config) -> None:
        self._keys: dict[str, str | None] = {}
        self._files: dict[str, tuple[EndpointSettings, tuple[int, int, int] | None]] = {}
        problems = []
        secrets: list[str] = []
        for ep in config.endpoints:
            try:
                if ep.api_key_file is not None:
                    self._files[ep.name] = (ep, file_version(ep.api_key_file))
                self._keys[ep.name] = ep.resolve_api_key()
                secrets += reach_secrets(ep.name, ep)
            except ConfigError as exc:
                if ep.enabled:
                    problems.append(str(exc))
                self._keys.setdefault(ep.name, None)
        if problems:
            raise ConfigError("\n".join(problems))
        self.redactor = Redactor([*self._keys.values(), *secrets])

    def get(self, name: str) -> str | None:
        """Key for one endpoint (None when it needs none); re-reads a changed `api_key_file`."""
        if name in self._files:
            self._refresh(name)
        return self._keys.get(name)

    def _refresh(self, name: str) -> None:
        ep, seen = self._files[name]
        assert ep.api_key_file is not None
        version = file_version(ep.api_key_file)
        if version == seen or version is None:
            if version is None and seen is not None:
                log.warning("endpoint %s: api_key_file %s is unreadable; using the last key read",
                            name, ep.api_key_file)  # fmt: skip
            return
        try:
            key = ep.resolve_api_key()
        except ConfigError as exc:
            log.warning("%s; using the last key read", exc)
            return
        self._files[name] = (ep, version)
        if key != self._keys.get(name):
            self._keys[name] = key
            self.redactor = self.redactor.with_secret(key)
            log.info("endpoint %s: api_key_file %s changed; the new key is used", name, ep.api_key_file)
