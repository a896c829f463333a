import pytest

from tokwatch.bench.config import BenchOptions
from tokwatch.bench.stamping import bench_http_client, receive_stamps
from tokwatch.transport import kernel_stamps, rxwatch

PLAIN, TLS = "http://127.0.0.1:1/v1", "https://127.0.0.1:1/v1"


def _opts(**kw):
    return BenchOptions(url=PLAIN, model="m", number=4, **kw)


@pytest.mark.skipif(not (kernel_stamps.available() and rxwatch.available()), reason="Linux only")
def test_the_summary_names_what_stamped_the_reads():
    assert receive_stamps(_opts(concurrency=8), PLAIN) == "kernel"  # auto: no watcher where the kernel stamps
    assert receive_stamps(_opts(concurrency=8, receive_watcher="on"), PLAIN) == "kernel+watcher_thread"
    assert receive_stamps(_opts(concurrency=8, kernel_stamps="off"), PLAIN) == "watcher_thread"
    assert receive_stamps(_opts(rate=10, kernel_stamps="off"), PLAIN) == "event_loop"
    # Over TLS neither applies: the loop stamps every read, whatever the options ask.
    assert receive_stamps(_opts(concurrency=8, receive_watcher="on"), TLS) == "event_loop"


async def test_the_bench_client_follows_the_options():
    async with bench_http_client(_opts(concurrency=8, kernel_stamps="off", receive_watcher="off")) as http:
        assert not http.kernel_stamps and http.watcher is None
    async with bench_http_client(_opts(concurrency=8)) as http:
        assert http.kernel_stamps == kernel_stamps.available()
