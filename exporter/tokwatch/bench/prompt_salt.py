"""Fresh prompts for every run, so two identical commands measure the server and not its prefix cache.

Each run has a salt (from its run id; none with --repeat-prompts), the same in every `--workers` process and
every `--segment` of one run, which all run under its one id: request i's text is the same whichever process
sends it. Synthetic text (random words, trace
turns synthesised to their lengths) is drawn from an RNG keyed by the seed and the salt, so its lengths are
the seed's and its words the run's own. Text a dataset gives verbatim cannot be redrawn: each request (each
conversation, each send of a cycled prompt) gets a short nonce of `NONCE_TOKENS` random words before its
first message — the system prompt when there is one — so its whole prompt differs from the first token on,
as the probe's unique prefix does. A conversation keeps its nonce in every turn: the history it resends is
still a prefix the server may reuse (seed 003). Docs: docs/bench.md ("Fresh prompts").
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tokwatch.bench.workload import Conversation, EndlessConversations, RequestSpec
from tokwatch.figures.tokens import TokenCounter

NONCE_TOKENS = 3  # random single-token words: 1 in ~8 million that two requests share them all
SALT_CHARS = 12  # hex characters of the run id's digest used as the salt


def run_salt(run_id: str, repeat_prompts: bool) -> str | None:
    """The salt of a run: from a digest of its whole id (ids given with --run-id often share a prefix, e.g.
    a date), or None when the user asked for repeatable prompts."""
    if repeat_prompts:
        return None
    return hashlib.sha256(run_id.encode()).hexdigest()[:SALT_CHARS]


@dataclass(frozen=True, slots=True)
class PromptSalt:
    """The run's salt, the (worker's) seed and the token counter that writes nonces."""

    salt: str | None
    seed: int
    counter: TokenCounter

    def nonce(self, index: int) -> str:
        """`NONCE_TOKENS` random words and a newline, unique to (salt, seed, index); '' without a salt."""
        if self.salt is None:
            return ""
        rng = random.Random(f"{self.salt}:{self.seed}:nonce:{index}")
        return self.counter.text_of(NONCE_TOKENS, rng) + "\n"

    def spec(self, spec: RequestSpec, index: int) -> RequestSpec:
        """The request with the nonce of send `index` before its first message."""
        nonce = self.nonce(index)
        if not nonce:
            return spec
        first, *rest = spec.messages
        target = spec.prompt_tokens_target
        return dataclasses.replace(
            spec,
            messages=({**first, "content": nonce + first["content"]}, *rest),
            prompt_tokens_target=None if target is None else target + self.counter.count(nonce),
        )

    def conversation(self, conv: Conversation, index: int) -> Conversation:
        """The conversation with the nonce of run-index `index` before its system prompt or first turn."""
        nonce = self.nonce(index)
        if not nonce:
            return conv
        if conv.system:
            return dataclasses.replace(conv, system=nonce + conv.system)
        first, *rest = conv.turns
        tokens = None if first.tokens is None else first.tokens + self.counter.count(nonce)
        return dataclasses.replace(
            conv, turns=(dataclasses.replace(first, text=nonce + first.text, tokens=tokens), *rest)
        )


class SaltedPrompts:
    """Dataset requests in file order, cycled, each send with its own nonce (fresh even when cycled)."""

    def __init__(self, specs: Sequence[RequestSpec], salt: PromptSalt) -> None:
        self._specs = tuple(specs)
        self._salt = salt

    def request_at(self, index: int) -> RequestSpec:
        """Send `index` of the run: file entry `index` mod n with the nonce of `index` (any process builds
        any send, so segments of one schedule send its very requests, tokwatch.bench.segments)."""
        return self._salt.spec(self._specs[index % len(self._specs)], index)


class SaltedConversations(EndlessConversations):
    """Dataset conversations cycled endlessly: item i is conversation i mod n with the nonce of i."""

    def __init__(self, conversations: Sequence[Conversation], salt: PromptSalt) -> None:
        self._base = conversations
        self._salt = salt

    def conversation(self, index: int) -> Conversation:
        """File entry `index` mod n, with its own nonce."""
        return self._salt.conversation(self._base[index % len(self._base)], index)
