"""The metrics endpoint on a busy agent loop: a connection whose whole request has arrived is
answered, never dropped, when the loop gets to it late (the sweep of slow connections, or a
new connection pushing out the oldest)."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator

import pytest

from jupyter_dlsched.agent import scrape
from jupyter_dlsched.agent.scrape import ScrapeEndpoint

REQUEST = b"GET /metrics HTTP/1.0\r\n\r\n"


@pytest.fixture
def endpoint() -> Iterator[ScrapeEndpoint]:
    selector = selectors.DefaultSelector()
    point = ScrapeEndpoint(selector, ("127.0.0.1", 0), lambda: b"dlsched_jobs 1\n", "text/plain")
    yield point
    point.close()
    selector.close()


def connect(point: ScrapeEndpoint) -> socket.socket:
    client = socket.create_connection(point.address, timeout=5)
    for _ in range(100):  # the agent's loop accepts it
        if point.selector.select(timeout=0.05):
            break
    point.event(point, selectors.EVENT_READ)
    return client


def reply(client: socket.socket) -> bytes:
    chunks = []
    while chunk := client.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_request_waiting_unread_when_its_time_is_up_is_answered(endpoint):
    client = connect(endpoint)
    client.sendall(REQUEST)
    time.sleep(0.1)  # the request is in the socket; the loop was busy and did not read it
    endpoint.sweep(time.monotonic() + scrape.REQUEST_TIMEOUT + 1)
    answer = reply(client)
    assert answer.startswith(b"HTTP/1.0 200 OK") and answer.endswith(b"dlsched_jobs 1\n")
    assert endpoint.connections == 0


def test_an_idle_connection_still_goes_when_its_time_is_up(endpoint):
    client = connect(endpoint)
    endpoint.sweep(time.monotonic() + scrape.REQUEST_TIMEOUT + 1)
    assert reply(client) == b""
    assert endpoint.connections == 0


def test_a_full_house_pushes_out_an_idle_connection_not_one_with_its_request_waiting(
    endpoint, monkeypatch
):
    monkeypatch.setattr(scrape, "MAX_SCRAPERS", 3)
    oldest = connect(endpoint)
    oldest.sendall(REQUEST)  # whole, but the loop has not read it yet
    idle = [connect(endpoint) for _ in range(2)]
    time.sleep(0.1)
    connect(endpoint)  # the fourth: someone must make room
    answer = reply(oldest)
    assert answer.startswith(b"HTTP/1.0 200 OK")
    # answering made room: the idle ones are all still there
    assert endpoint.connections == 3
    for client in idle:
        client.setblocking(False)
        with pytest.raises(BlockingIOError):
            client.recv(1)
