"""Issue 26: load without lies. A report says ``recorded`` only for a record known to have
landed; a busy timeline waits for a call slot and is never read as unreadable (R15)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scratchbank.adapters.event_store import EventStoreTimeline


def test_the_in_flight_bound_is_one_setting_with_a_default_per_store(tmp_path: Path) -> None:
    """SQLite's default, the URL's ``in_flight``, and SQLite's pool sized from it."""
    default = EventStoreTimeline(f"sqlite:///{tmp_path}/a.db")
    given = EventStoreTimeline(f"sqlite:///{tmp_path}/b.db?in_flight=7")
    assert (default.in_flight, given.in_flight) == (8, 7)
    pool = given._factory.datastore.pool  # type: ignore[attr-defined]
    assert (pool.pool_size, pool.max_overflow, pool.pool_timeout) == (7, 0, given.call_seconds)
    with pytest.raises(ValueError, match="in_flight"):
        EventStoreTimeline(f"sqlite:///{tmp_path}/c.db?in_flight=0")


def test_the_s3_stores_client_keeps_a_connection_for_each_call_in_flight() -> None:
    """30 S3 calls at once, twice: the second wave reuses the first wave's 30 connections
    (botocore's default pool of 10 dropped 20 of them and opened 20 more), issue 26."""
    import http.server
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from scratchbank.adapters.s3_bank import S3BankStore, s3_client

    calls = 30
    together = threading.Barrier(calls, timeout=60.0)
    connections: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as S3

        def setup(self) -> None:
            super().setup()
            connections.append(1)

        def do_HEAD(self) -> None:
            together.wait()  # every call of the wave is in flight at once
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        client = s3_client(
            endpoint,
            in_flight=calls,
            region_name="us-east-1",
            aws_access_key_id="k",
            aws_secret_access_key="s",
        )
        store = S3BankStore("bucket", client=client)
        with ThreadPoolExecutor(calls) as pool:
            for _wave in range(2):
                list(pool.map(lambda i: store.client.head_object(Bucket="bucket", Key=f"k{i}"), range(calls)))
                together.reset()
        assert len(connections) == calls
        assert S3BankStore("b", endpoint_url=endpoint).client.meta.config.max_pool_connections >= calls
        with pytest.raises(ValueError, match="in_flight"):
            s3_client(endpoint, in_flight=0)
    finally:
        server.shutdown()
        server.server_close()


def test_the_s3_stores_client_lists_without_loading_botocores_paginators_at_the_call() -> None:
    """The client comes with its paginators loaded: a listing loads no botocore model file (200
    teardowns' first LISTs at once each loaded and parsed it, ~13 ms of the GIL apiece: issue 26)."""
    from scratchbank.adapters.s3_bank import s3_client

    client = s3_client(
        "http://127.0.0.1:9", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    loaded: list[tuple[object, ...]] = []
    load = client._loader.load_service_model

    def counted(*args: object, **kwargs: object) -> object:
        loaded.append(args)
        return load(*args, **kwargs)

    client._loader.load_service_model = counted
    client.get_paginator("list_objects_v2")  # what every listing of a store calls first
    assert loaded == []


def test_an_s3_bank_urls_in_flight_sizes_its_client_and_a_bad_one_is_named() -> None:
    """``s3://bucket/prefix?in_flight=N`` (default 64): 0, negative, not a number, huge, twice
    or an unknown setting is CONFIG_INVALID naming it, no store built (issue 26)."""
    from scratchbank.adapters.config import open_bank_store
    from scratchbank.domain.errors import ConfigInvalid

    given = open_bank_store("s3://bucket/team/x?in_flight=8")
    assert given.prefix == "team/x"  # type: ignore[attr-defined]
    assert given.client.meta.config.max_pool_connections == 8  # type: ignore[attr-defined]
    assert open_bank_store("s3://bucket/p").client.meta.config.max_pool_connections == 64  # type: ignore[attr-defined]
    for bad in ("0", "-1", "ten", "", "1025", "9" * 5000, "1e3", "8&in_flight=9"):
        with pytest.raises(ConfigInvalid, match="in_flight"):
            open_bank_store(f"s3://bucket/p?in_flight={bad}")
    with pytest.raises(ConfigInvalid, match="inflight"):
        open_bank_store("s3://bucket/p?inflight=8")
