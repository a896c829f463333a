"""One schedule split into segments (k6's execution segments, equal parts): segment k of n takes every n-th
request of the one schedule the seed defines, starting at the k-th.

The arrival offsets, the request contents and the request ids are functions of a request's index in the one
schedule (with the seed, and for the text the run's prompt salt, which every process of one run shares), so
n processes that each run their segment send, between them, exactly the requests one process
would send alone: the same planned instants, the same prompts, the same ids; no two send the same one.
`--workers N` (processes on one host) and `--segment K/N` (one process per machine, e.g. a Kubernetes
Indexed Job pod) both split this way, and a segment split again is a segment of the whole (`split`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tokwatch.bench.prompt_salt import SaltedPrompts
from tokwatch.bench.workload import RequestSpec, SyntheticWorkload

T = TypeVar("T")

JOB_INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes in every pod of an Indexed Job
AUTO_INDEX = "auto"


class SegmentError(ValueError):
    """A `--segment` value that names no segment."""


@dataclass(frozen=True, slots=True)
class Segment:
    """Segment `index` of `count` equal segments: the requests whose schedule index is `index` mod `count`."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise SegmentError(f"segment {self.index}/{self.count}: needs 0 <= K < N")

    @property
    def whole(self) -> bool:
        """True for the one segment that is the whole schedule."""
        return self.count == 1

    @property
    def label(self) -> str:
        """`K/N`, as `--segment` takes it."""
        return f"{self.index}/{self.count}"

    def share(self, total: int) -> int:
        """How many of the schedule's first `total` requests are this segment's."""
        return total // self.count + (1 if self.index < total % self.count else 0)

    def take(self, items: Iterable[T]) -> Iterator[tuple[int, T]]:
        """(schedule index, item) of this segment's items of the one sequence `items`."""
        return itertools.islice(enumerate(items), self.index, None, self.count)

    def indices(self, start: int = 0) -> Iterator[int]:
        """This segment's schedule indices from `start` on (`start` counts as index 0 of the stride)."""
        return itertools.count(start + self.index, self.count)

    def split(self, part: int, parts: int) -> Segment:
        """Part `part` of `parts` of this segment, as a segment of the whole schedule."""
        return Segment(self.index + part * self.count, self.count * parts)


WHOLE = Segment()


def parse_segment(text: str, env: Mapping[str, str] | None = None) -> Segment:
    """`K/N`, or `auto/N` taking K from JOB_COMPLETION_INDEX; raises SegmentError naming the problem."""
    env = os.environ if env is None else env
    k_text, slash, n_text = str(text).strip().partition("/")
    if not slash:
        raise SegmentError(f"segment {text!r}: expected K/N (segment K of N, 0 <= K < N) or {AUTO_INDEX}/N")
    try:
        n = int(n_text)
    except ValueError:
        raise SegmentError(f"segment {text!r}: N must be an integer") from None
    if n < 1:
        raise SegmentError(f"segment {text!r}: N must be at least 1")
    if k_text.strip() == AUTO_INDEX:
        k_text = env.get(JOB_INDEX_ENV, "")
        if not k_text.strip():
            raise SegmentError(
                f"segment {text!r}: {AUTO_INDEX} takes K from {JOB_INDEX_ENV} (set in the pods of a "
                "Kubernetes Indexed Job), which is not set here"
            )
        where = f" ({JOB_INDEX_ENV}={k_text})"
    else:
        where = ""
    try:
        k = int(k_text)
    except ValueError:
        raise SegmentError(f"segment {text!r}{where}: K must be an integer") from None
    if not 0 <= k < n:
        raise SegmentError(f"segment {text!r}{where}: K must be in 0..{n - 1}")
    return Segment(k, n)


def spec_at(source: SyntheticWorkload | SaltedPrompts | list[RequestSpec], index: int) -> RequestSpec:
    """Request `index` of the one schedule, built from the seed, the run's prompt salt and the index alone (a
    plain list of requests cycles as it is)."""
    if isinstance(source, list):
        return source[index % len(source)]
    return source.request_at(index)


def planned_arrivals(
    segment: Segment, offsets: Iterable[float], number: int | None, duration: float | None
) -> int:
    """How many of the schedule's arrivals (`offsets`, endless) fall to this segment within the first `number`
    of them and before `duration` seconds (at least one bound given)."""
    if number is None and duration is None:
        raise ValueError("an endless schedule has no planned count: give number or duration")
    count = 0
    for i, offset in segment.take(offsets):
        if (number is not None and i >= number) or (duration is not None and offset >= duration):
            break
        count += 1
    return count
