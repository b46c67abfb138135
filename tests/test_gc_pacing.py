"""The web workers' garbage collector runs between requests (portal/gc_pacing.py): a request's own objects do not
trigger a collection mid-page, and each request, as it starts, collects the youngest generation, every tenth the
middle one too, every thousandth all of them; what a request leaves in reference cycles is gone by the next one's
end."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from django.test import Client

from portal import gc_pacing


@pytest.fixture
def paced() -> Iterator[list[int]]:
    """Installed for the test; the generations collected, in order."""
    seen: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc_pacing.install()
    gc.callbacks.append(watch)
    try:
        yield seen
    finally:
        gc.callbacks.remove(watch)
        gc_pacing.uninstall()


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_a_page_meets_no_collection_and_its_cycles_go_after_it(db, paced) -> None:
    assert gc.get_threshold()[0] == gc_pacing.THRESHOLD
    client = Client()
    client.get("/accounts/login/")  # warm
    paced.clear()
    left = Node()
    gone = weakref.ref(left)
    del left
    client.get("/accounts/login/")
    assert paced == [0]  # one collection, the youngest generation's, as the page starts
    assert gone() is None


def test_the_older_generations_are_collected_now_and_then(db, paced) -> None:
    client = Client()
    for _ in range(gc_pacing.MIDDLE_EVERY * 2):
        client.get("/accounts/login/")
    assert paced.count(1) == 2 and set(paced) <= {0, 1}


def test_uninstalled_python_paces_it_again(paced) -> None:
    gc_pacing.uninstall()
    assert gc.get_threshold()[0] != gc_pacing.THRESHOLD
    gc_pacing.install()


def test_what_a_request_left_is_collected_by_the_next_one_in_the_youngest_generation(db, paced) -> None:
    """The finished request's cycles are unreachable once the next one starts: the youngest generation's collection
    frees them, and nothing of them reaches the middle generation."""
    client = Client()
    client.get("/accounts/login/")
    freed: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 0:
            freed.append(info["collected"])

    gc.callbacks.append(count)
    try:
        client.get("/accounts/login/")
    finally:
        gc.callbacks.remove(count)
    assert freed and freed[0] > 0  # the page before's cycles (its template contexts, its request)
