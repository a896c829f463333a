"""/metrics from pre-rendered pieces: each endpoint's samples are rendered once per change, not per scrape.

Rendering the whole registry on every scrape cost 0.15-0.37 s at 200 endpoints, all of it on the loop
that serves the scrape. Here a collector that knows its parts (one per endpoint) says which part changed
(a revision token); only those are rendered again, and a scrape joins cached bytes family by family. Small
collectors without parts (the exporter's own figures) are rendered whole each scrape, which costs little.

Two formats are served, chosen from the scraper's Accept header (`negotiate`): OpenMetrics 1.0.0, which
Prometheus asks for first, and the Prometheus text format 0.0.4 otherwise. A part is rendered in both at
once: the sample lines of tokwatch's families are the same bytes in both (only the HELP/TYPE lines
differ), so the second format costs a header per family, not a second render (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

Format = Literal["text", "openmetrics"]
CONTENT_TYPES: dict[Format, str] = {
    "text": "text/plain; version=0.0.4; charset=utf-8",
    "openmetrics": "application/openmetrics-text; version=1.0.0; charset=utf-8",
}
_EOF = b"# EOF\n"


def negotiate(accept: str) -> Format:
    """The format the Accept header ranks highest: OpenMetrics 1.0.0 (version omitted counts as 1.0.0) or
    text 0.0.4 (`text/plain` of any version, `*/*`); text when nothing matches. Ties go to the first."""
    best: tuple[float, Format] | None = None
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        options = {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in params)}
        try:
            q = float(options.get("q", "1"))
        except ValueError:
            continue
        media = media.lower()
        fmt: Format
        if media == "application/openmetrics-text" and options.get("version", "1.0.0") == "1.0.0":
            fmt = "openmetrics"
        elif media in ("text/plain", "text/*", "*/*"):
            fmt = "text"
        else:
            continue
        if q > 0 and (best is None or q > best[0]):
            best = (q, fmt)
    return best[1] if best is not None else "text"


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
class Families:
    """Rendered families of one format: family key ("name type") -> HELP/TYPE lines, and -> sample lines."""

    headers: dict[str, bytes] = field(default_factory=dict)
    samples: dict[str, bytes] = field(default_factory=dict)

    def add(self, key: str, header: bytes, samples: bytes) -> None:
        """Append one family's lines (a family seen again keeps its first header)."""
        self.headers.setdefault(key, header)
        self.samples[key] = self.samples.get(key, b"") + samples


@dataclass(frozen=True, slots=True)
class _Rendered:
    revision: Hashable
    formats: dict[Format, Families]


class _One:
    """A collector of exactly one family, so prometheus_client formats it (escaping, float format)."""

    __slots__ = ("metric",)

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def render_families(metrics: Iterable[Metric]) -> dict[Format, Families]:
    """Headers and sample lines per family ("name type"), in the text format 0.0.4 and in OpenMetrics."""
    text, om = Families(), Families()
    labels_memo: dict[tuple[tuple[str, str], ...], str] = {}
    for metric in metrics:
        key = f"{metric.name} {metric.type}"  # a counter and a gauge may share a base name
        fast = _fast_family(metric, labels_memo)
        if fast is None:
            text.add(key, *_split(generate_latest(_One(metric)), 2))
            om_body = openmetrics.generate_latest(_One(metric)).removesuffix(_EOF)
            om.add(key, *_split(om_body, 3 if metric.unit else 2))
        else:
            text_header, om_header, samples = fast
            text.add(key, text_header, samples)
            om.add(key, om_header, samples)  # the same bytes: sample lines do not differ between formats
    return {"text": text, "openmetrics": om}


def _split(body: bytes, header_lines: int) -> tuple[bytes, bytes]:
    """(the first `header_lines` lines, the rest)."""
    cut = 0
    for _ in range(header_lines):
        cut = body.index(b"\n", cut) + 1
    return body[:cut], body[cut:]


_TEXT_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "unknown": "untyped"}


def _fast_family(
    metric: Metric, memo: dict[tuple[tuple[str, str], ...], str]
) -> tuple[bytes, bytes, bytes] | None:
    """prometheus_client's output for the plain families tokwatch builds, without its per-sample validation
    (names and labels here are ours, fixed in code): (text header, OpenMetrics header, sample lines, the
    same in both formats); None for anything else (info, created, timestamps, exemplars), which
    prometheus_client formats."""
    typ = _TEXT_TYPES.get(metric.type)
    if typ is None:
        return None
    name = metric.name + "_total" if metric.type == "counter" else metric.name
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    header = f"# HELP {name} {doc}\n# TYPE {name} {typ}\n"
    unit = f"# UNIT {metric.name} {metric.unit}\n" if metric.unit else ""
    # OpenMetrics names the family without `_total` and escapes quotes in HELP too.
    om_doc = doc.replace('"', r"\"")
    om_header = f"# HELP {metric.name} {om_doc}\n# TYPE {metric.name} {metric.type}\n{unit}"
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
    return header.encode(), om_header.encode(), "".join(lines).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


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
            cached = self._cache[ck] = _Rendered(revision, render_families(collector.collect_part(key)))
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

    def render(self, fmt: Format = "text") -> bytes:
        """The whole exposition in `fmt`; parts whose revision is unchanged are not rendered again."""
        headers: dict[str, bytes] = {}
        bodies: dict[str, list[bytes]] = {}
        live: set[tuple[int, Hashable]] = set()
        for collector in self._partitioned:
            cid = id(collector)
            for key, revision in collector.parts():
                live.add((cid, key))
                families = self._part(collector, key, revision).formats[fmt]
                for name, lines in families.samples.items():
                    if name not in headers:
                        headers[name] = families.headers[name]
                        bodies[name] = []
                    bodies[name].append(lines)
        if len(self._cache) != len(live):
            self._cache = {k: v for k, v in self._cache.items() if k in live}
        out: list[bytes] = []
        for name, header in headers.items():
            out.append(header)
            out.extend(bodies[name])
        if fmt == "text":
            out.extend(generate_latest(plain) for plain in self._plain)
        else:
            out.extend(openmetrics.generate_latest(plain).removesuffix(_EOF) for plain in self._plain)
            out.append(_EOF)
        return b"".join(out)
