"""Keep secrets out of logs, error messages, metrics, reports and the database."""

from __future__ import annotations

import re
from collections.abc import Iterable

_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{4,}"),
    re.compile(r"(?i)(basic\s+)[A-Za-z0-9+/=]{4,}"),  # Authorization: Basic base64(user:password)
    # query-string credentials (?key=, &sig=, ?token=, &access_token=, ...) of any length
    re.compile(
        r"(?i)([?&;](?:key|api[_-]?key|apikey|sig|signature|token|access[_-]?token|auth|password|secret|"
        r"code|x-api-key)=)[^&#\s\"']+"
    ),
    re.compile(r"(?i)((?:api[_-]?key|token|password|secret)[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,}]{4,}"),
    re.compile(r"(?i)(://[^:/@\s]*:)[^@\s]+(@)"),  # user:password@ (or :password@) in URLs and DSNs
    re.compile(r"(?i)(password\s*=\s*)'(?:[^'\\]|\\.)*'"),  # libpq key=value DSN, quoted (spaces inside)
    re.compile(r"(?i)(password=)\S+"),
)
MASK = "***"


class Redactor:
    """Masks known secret values and anything shaped like a credential."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Longest first so a secret containing another is masked whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def with_secret(self, secret: str | None) -> Redactor:
        """A redactor that also masks `secret`."""
        return Redactor([*self._secrets, secret])

    def with_secrets(self, secrets: Iterable[str | None]) -> Redactor:
        """A redactor that also masks every one of `secrets`."""
        return Redactor([*self._secrets, *secrets])

    def __call__(self, text: str) -> str:
        """`text` with every secret masked."""
        for s in self._secrets:
            text = text.replace(s, MASK)
        for pat in _PATTERNS:
            text = pat.sub(lambda m: m.group(1) + MASK + (m.group(2) if m.lastindex == 2 else ""), text)
        return text


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """One-off redaction of `text`."""
    return Redactor(secrets)(text)
