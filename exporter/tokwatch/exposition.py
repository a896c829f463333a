"""/metrics from pre-rendered pieces: each endpoint's samples are rendered once per change, not per scrape.

Rendering the whole registry on every scrape cost 0.15-0.37 s at 200 endpoints, all of it on the loop
that serves the scrape. Here a collector that knows its parts (one per endpoint) says which part changed
(a revision token); only those are rendered again, and a scrape joins cached bytes family by family. Small
collectors without parts (the exporter's own figures) are rendered whole each scrape, which costs little.
The output is the Prometheus text format 0.0.4 (what every Prometheus accepts).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@runtime_checkable
class PartitionedCollector(Protocol):
    """A collector whose samples split into parts (e.g. one per endpoint) that change independently."""

    def parts(self) -> Iterable[tuple[Hashable, Hashable]]:
        """(key, revision) of every part now; a new revision means the part must be rendered again."""
        ...

    def collect_part(self, key: Hashable) -> Iterable[Metric]:
        """The families of one part (the same family names in every part, each with that part's samples)."""
        ...


@dataclass(frozen=True, slots=True)
class _Rendered:
    revision: Hashable
    headers: dict[str, bytes]  # "name type" -> "# HELP ...\n# TYPE ...\n"
    samples: dict[str, bytes]  # "name type" -> sample lines


class _One:
    """A collector of exactly one family, so prometheus_client formats it (escaping, float format)."""

    __slots__ = ("metric",)

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def render_families(metrics: Iterable[Metric]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Headers and sample lines per family ("name type"), in the text format 0.0.4."""
    headers: dict[str, bytes] = {}
    samples: dict[str, bytes] = {}
    labels_memo: dict[tuple[tuple[str, str], ...], str] = {}
    for metric in metrics:
        key = f"{metric.name} {metric.type}"  # a counter and a gauge may share a base name
        rendered = _fast_family(metric, labels_memo)
        if rendered is None:
            text = generate_latest(_One(metric))
            cut = text.index(b"\n", text.index(b"\n") + 1) + 1  # after "# HELP" and "# TYPE"
            rendered = text[:cut], text[cut:]
        headers.setdefault(key, rendered[0])
        samples[key] = samples.get(key, b"") + rendered[1]
    return headers, samples


_TEXT_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "unknown": "untyped"}


def _fast_family(
    metric: Metric, memo: dict[tuple[tuple[str, str], ...], str]
) -> tuple[bytes, bytes] | None:
    """prometheus_client's text-format output for the plain families tokwatch builds, without its per-sample
    validation (names and labels here are ours, fixed in code); None for anything else (info, created,
    timestamps, exemplars), which `generate_latest` formats."""
    typ = _TEXT_TYPES.get(metric.type)
    if typ is None:
        return None
    name = metric.name + "_total" if metric.type == "counter" else metric.name
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    header = f"# HELP {name} {doc}\n# TYPE {name} {typ}\n"
    lines = []
    for sample in metric.samples:
        if sample.timestamp is not None or sample.exemplar is not None or sample.name.endswith("_created"):
            return None
        items = tuple(sorted(sample.labels.items()))
        labels = memo.get(items)
        if labels is None:
            labels = memo[items] = (
                "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}" if items else ""
            )
        lines.append(f"{sample.name}{labels} {floatToGoString(sample.value)}\n")
    return header.encode(), "".join(lines).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


class Exposition(CollectorRegistry):
    """The app's one registry: builds /metrics bodies from partitioned collectors (cached per part) and
    plain ones (each scrape).

    Being a `CollectorRegistry`, it also answers what client_python's tools ask of one (`generate_latest`,
    `get_sample_value`) from the same collectors, so each collector is registered once, here."""

    def __init__(self) -> None:
        super().__init__(auto_describe=False)
        self._partitioned: list[PartitionedCollector] = []
        self._plain: list[Collector] = []
        self._cache: dict[tuple[int, Hashable], _Rendered] = {}
        self.parts_rendered = 0  # how many part renders happened (self-metric, and for tests)

    def register(self, collector: Collector) -> None:
        """Serve `collector`; partitioned ones are cached per part."""
        super().register(collector)
        if isinstance(collector, PartitionedCollector):
            self._partitioned.append(collector)
        else:
            self._plain.append(collector)

    def unregister(self, collector: Collector) -> None:
        """Stop serving `collector`."""
        super().unregister(collector)
        if any(c is collector for c in self._partitioned):
            self._partitioned = [c for c in self._partitioned if c is not collector]
            self._cache = {k: v for k, v in self._cache.items() if k[0] != id(collector)}
        elif collector in self._plain:
            self._plain.remove(collector)

    def _part(self, collector: PartitionedCollector, key: Hashable, revision: Hashable) -> _Rendered:
        ck = (id(collector), key)
        cached = self._cache.get(ck)
        if cached is None or cached.revision != revision:
            h, s = render_families(collector.collect_part(key))
            cached = self._cache[ck] = _Rendered(revision, h, s)
            self.parts_rendered += 1
        return cached

    def prerender(self) -> int:
        """Render the parts that changed since they were last rendered, without building a body.

        Called in the background (every second by the app), so a scrape finds almost every part ready: a
        fleet whose server counters all move every 15 s would otherwise re-render them all in one scrape.
        Returns how many parts were rendered."""
        before = self.parts_rendered
        for collector in self._partitioned:
            for key, revision in collector.parts():
                self._part(collector, key, revision)
        return self.parts_rendered - before

    def render(self) -> bytes:
        """The whole exposition; parts whose revision is unchanged are not rendered again."""
        headers: dict[str, bytes] = {}
        bodies: dict[str, list[bytes]] = {}
        live: set[tuple[int, Hashable]] = set()
        for collector in self._partitioned:
            cid = id(collector)
            for key, revision in collector.parts():
                live.add((cid, key))
                cached = self._part(collector, key, revision)
                for name, lines in cached.samples.items():
                    if name not in headers:
                        headers[name] = cached.headers[name]
                        bodies[name] = []
                    bodies[name].append(lines)
        if len(self._cache) != len(live):
            self._cache = {k: v for k, v in self._cache.items() if k in live}
        out: list[bytes] = []
        for name, header in headers.items():
            out.append(header)
            out.extend(bodies[name])
        for plain in self._plain:
            out.append(generate_latest(plain))
        return b"".join(out)
