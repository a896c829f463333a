"""Keep secrets out of logs, error messages, metrics, reports and the database."""

from __future__ import annotations

import functools
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
    # user:password@ (or :password@) in URLs and DSNs; the last `@` of the authority ends the userinfo, as
    # urllib reads it, so a password with `@` in it is masked whole (not up to its first `@`).
    re.compile(r"(?i)(://[^:/@\s]*:)[^/?#\s]*(@)"),
    re.compile(r"(?i)(password\s*=\s*)'(?:[^'\\]|\\.)*'"),  # libpq key=value DSN, quoted (spaces inside)
    re.compile(r"(?i)(password=)\S+"),
)
MASK = "***"
# A run of this many characters of a known secret is masked wherever it appears: a provider that echoes part
# of a key ("Incorrect API key provided: sk-abc...wxyz") must not put it in a log or the database.
FRAGMENT_CHARS = 8


@functools.lru_cache(maxsize=256)
def _fragments(secret: str) -> re.Pattern[str]:
    """Any FRAGMENT_CHARS-character run of `secret`."""
    grams = {secret[i : i + FRAGMENT_CHARS] for i in range(len(secret) - FRAGMENT_CHARS + 1)}
    return re.compile("|".join(re.escape(g) for g in sorted(grams)))


def _mask_fragments(text: str, secret: str) -> str:
    """`text` with every run of FRAGMENT_CHARS or more characters of `secret` masked, each run whole."""
    pattern = _fragments(secret)
    out: list[str] = []
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        end = m.end()
        while end < len(text) and text[m.start() : end + 1] in secret:
            end += 1
        out.append(text[pos : m.start()])
        out.append(MASK)
        pos = end
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


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
        # Then the fragments, once every whole secret is masked (a fragment shared by two keys must not cut
        # into the other key before it is masked whole).
        for s in self._secrets:
            if len(s) >= FRAGMENT_CHARS and len(text) >= FRAGMENT_CHARS:
                text = _mask_fragments(text, s)
        for pat in _PATTERNS:
            text = pat.sub(lambda m: m.group(1) + MASK + (m.group(2) if m.lastindex == 2 else ""), text)
        return text


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """One-off redaction of `text`."""
    return Redactor(secrets)(text)
