"""The load a run put on the server, read back from its summary.json: `bench compare` gives a verdict only
for two runs under the same load (loop, concurrency or rate and arrivals, token lengths) that the server's
prefix cache served alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokwatch.bench.prompt_cache import OUTSIDE_HISTORY_WARN


@dataclass(frozen=True, slots=True)
class LoadShape:
    """What `differences` compares; None where the run's summary does not say."""

    loop: str  # "open" or "closed"
    concurrency: int | None  # closed loop: streams (or parallel conversations)
    rate: float | None  # open loop: requests/s
    arrivals: str | None
    burstiness: float | None  # gamma arrivals only
    max_concurrency: int | None
    conversations: bool
    turns: str | None  # conversations: min..max user turns
    dataset: str | None
    input_tokens: str | None  # synthetic prompts only
    output_tokens: str | None
    reasoning: str | None  # "40 % with 600:6000 think tokens"
    fixed_output: bool | None
    cached_outside_history_share: float | None  # summary prompt_cache (None: not reported or not recorded)

    def describe(self) -> str:
        """`closed loop, concurrency 4` or `open loop 3/s poisson`."""
        if self.loop == "closed":
            what = "parallel conversations" if self.conversations else "concurrency"
            return f"closed loop, {what} {self.concurrency}"
        shape = f" (burstiness {self.burstiness:g})" if self.arrivals == "gamma" else ""
        cap = f", max concurrency {self.max_concurrency}" if self.max_concurrency else ""
        return f"open loop {self.rate:g}/s {self.arrivals}{shape}{cap}"


def shape_of(summary: dict[str, Any]) -> LoadShape | None:
    """The shape recorded in a summary.json; None when it has no options (not a `tokwatch bench` run)."""
    opts = summary.get("options")
    if not isinstance(opts, dict):
        return None
    rate = opts.get("rate")
    conversations = bool(opts.get("multi_turn"))
    cache = summary.get("prompt_cache") if isinstance(summary.get("prompt_cache"), dict) else {}
    ratio = opts.get("reasoning_ratio") or 0
    turns = None
    if conversations:
        turns = f"{opts.get('min_turns', 1)}..{opts.get('max_turns') or 'all'}"
    return LoadShape(
        loop="open" if rate is not None else "closed",
        concurrency=None if rate is not None else (opts.get("parallel") or opts.get("concurrency") or 1),
        rate=rate,
        arrivals=opts.get("arrivals") if rate is not None else None,
        burstiness=opts.get("burstiness") if rate is not None and opts.get("arrivals") == "gamma" else None,
        max_concurrency=opts.get("max_concurrency") if rate is not None else None,
        conversations=conversations,
        turns=turns,
        dataset=opts.get("dataset"),
        input_tokens=None if opts.get("dataset") else opts.get("input_tokens"),
        output_tokens=opts.get("output_tokens"),
        reasoning=f"{ratio:.0%} with {opts.get('reasoning_tokens')} think tokens" if ratio else None,
        fixed_output=opts.get("fixed_output"),
        cached_outside_history_share=(cache or {}).get("cached_outside_history_share"),
    )


_FIELDS = (
    ("max_concurrency", "max concurrency"),
    ("conversations", "conversations (--multi-turn)"),
    ("turns", "turns per conversation"),
    ("dataset", "dataset"),
    ("input_tokens", "prompt tokens (--input-tokens)"),
    ("output_tokens", "output tokens (--output-tokens)"),
    ("reasoning", "reasoning requests"),
    ("fixed_output", "fixed-length output"),
)


def _cache(share: float | None) -> str:
    return "not reported" if share is None else f"{share:.1%}"


def differences(a: LoadShape, b: LoadShape) -> list[str]:
    """One line per way the two loads differ (empty when they are alike)."""
    out = []
    # Rates are the options' own numbers (a sweep's values included), so they compare exactly.
    if (a.loop, a.concurrency, a.rate, a.arrivals, a.burstiness) != (
        b.loop, b.concurrency, b.rate, b.arrivals, b.burstiness
    ):
        out.append(f"load: A {a.describe()}, B {b.describe()}")
    for attr, label in _FIELDS:
        va, vb = getattr(a, attr), getattr(b, attr)
        if va != vb and not (attr == "max_concurrency" and out):
            out.append(f"{label}: A {va if va is not None else '-'}, B {vb if vb is not None else '-'}")
    sa, sb = a.cached_outside_history_share, b.cached_outside_history_share
    if sa is not None and sb is not None and abs(sa - sb) > OUTSIDE_HISTORY_WARN:
        out.append(
            f"prompt cache: the server answered {_cache(sa)} (A) and {_cache(sb)} (B) of the prompt tokens "
            "from its cache beyond conversation history and chat template: their TTFTs measure different "
            "things (`--repeat-prompts` runs, or prompts the server had seen)"
        )
    return out


def cache_notes(a: LoadShape, b: LoadShape) -> list[str]:
    """A line for each run whose own prompts were largely served from cache (alike in both or not)."""
    return [
        f"{label}: {share:.1%} of the prompt tokens came from the server's cache beyond conversation history "
        "and chat template; its TTFT measures cache hits"
        for label, share in (("A", a.cached_outside_history_share), ("B", b.cached_outside_history_share))
        if share is not None and share > OUTSIDE_HISTORY_WARN
    ]
