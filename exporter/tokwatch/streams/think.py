"""`<think>` tags: split generated text into think and output phases, and turn it into `TextDelta` events."""

from __future__ import annotations

from tokwatch.figures.result import Phase
from tokwatch.figures.timing import apportion
from tokwatch.streams.events import TextDelta

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ThinkTagSplitter:
    """Strips `<think>`/`</think>` from content and tracks the phase across chunk boundaries.

    A chunk ending in a possible tag prefix (e.g. `"<thi"`) holds those characters back until the next
    chunk decides; tags count as think-phase characters.
    """

    def __init__(self) -> None:
        self.phase: Phase = "output"
        self._held = ""

    def feed(self, text: str) -> list[tuple[Phase, str, int]]:
        """Split `text` into `(phase, visible text, generated chars)` segments."""
        if not self._held and "<" not in text:
            return [(self.phase, text, len(text))] if text else []  # fast path: no tag can start here
        buf = self._held + text
        self._held = ""
        out: list[tuple[Phase, str, int]] = []
        while buf:
            tag = THINK_OPEN if self.phase == "output" else THINK_CLOSE
            idx = buf.find(tag)
            if idx >= 0:
                if idx:
                    out.append((self.phase, buf[:idx], idx))
                out.append(("think", "", len(tag)))
                self.phase = "think" if tag == THINK_OPEN else "output"
                buf = buf[idx + len(tag) :]
                continue
            hold = _partial_suffix(buf, tag)
            if hold:
                self._held = buf[-hold:]
                buf = buf[:-hold]
            if buf:
                out.append((self.phase, buf, len(buf)))
            break
        return _merge(out)

    def flush(self) -> list[tuple[Phase, str, int]]:
        """Release held-back characters at the end of the stream."""
        held, self._held = self._held, ""
        return [(self.phase, held, len(held))] if held else []


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `buf` ends with."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0


def _merge(segs: list[tuple[Phase, str, int]]) -> list[tuple[Phase, str, int]]:
    """Join adjacent segments of one phase so a chunk yields at most one event per phase change."""
    merged: list[tuple[Phase, str, int]] = []
    for phase, text, chars in segs:
        if merged and merged[-1][0] == phase:
            p, t, c = merged[-1]
            merged[-1] = (p, t + text, c + chars)
        else:
            merged.append((phase, text, chars))
    return merged


def text_deltas(
    t: float, reasoning: str, content: str, think: ThinkTagSplitter, chunk_tokens: int | None, chunk: int
) -> list[TextDelta]:
    """One chunk's reasoning and content as deltas per phase; the server's token count shared by chars."""
    if not reasoning and not think._held and "<" not in content:
        # The common chunk: plain content, one delta in the splitter's phase (what the general path gives:
        # one segment, all of the chunk's tokens).
        if not content:
            return []
        n = None if chunk_tokens is None else max(chunk_tokens, 0)
        return [TextDelta(t, content, think.phase, len(content), n, chunk)]
    return general_text_deltas(t, reasoning, content, think, chunk_tokens, chunk)


def general_text_deltas(
    t: float, reasoning: str, content: str, think: ThinkTagSplitter, chunk_tokens: int | None, chunk: int
) -> list[TextDelta]:
    """`text_deltas` without its fast path (the reference the fast path must equal)."""
    segs: list[tuple[Phase, str, int]] = [("think", reasoning, len(reasoning))] if reasoning else []
    if content:
        segs.extend(think.feed(content))
    segs = _merge([s for s in segs if s[2] > 0])
    if chunk_tokens is None or not segs:
        return [TextDelta(t, text, phase, chars, None, chunk) for phase, text, chars in segs]
    shares = apportion(chunk_tokens, [c for _, _, c in segs], at_least_one=False)
    return [TextDelta(t, text, ph, c, n, chunk) for (ph, text, c), n in zip(segs, shares, strict=True)]


def flushed_deltas(think: ThinkTagSplitter, t: float, chunk: int) -> list[TextDelta]:
    """The text the splitter still holds back, at the end of the stream."""
    return [TextDelta(t, text, ph, c, None, chunk) for ph, text, c in think.flush()]
