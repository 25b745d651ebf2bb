"""Helpers of the thread tests: a record of the blocks handed out and not yet given back, shared by
threads (a test's check that nothing is handed out twice while it is live), and :func:`race`."""
from __future__ import annotations

import threading


class HandOuts:
    def __init__(self) -> None:
        self._live: set[int] = set()
        self._lock = threading.Lock()

    def took(self, ptr: int) -> None:
        """``ptr`` was just handed out: it must not be live already."""
        with self._lock:
            assert ptr not in self._live, f"{ptr:#x} handed out twice"
            self._live.add(ptr)

    def gave(self, ptr: int) -> None:
        """``ptr`` is about to be given back."""
        with self._lock:
            self._live.discard(ptr)


def in_threads(works) -> None:
    """Each of ``works`` (``work(errors)``, appending what it catches) in its own thread; no error."""
    errors: list = []
    ws = [threading.Thread(target=work, args=(errors,)) for work in works]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    assert not errors, errors[0]


def race(works, churn, period=0.0):
    """Each of ``works`` (``work(errors)``, appending what it catches) in its own thread, and one
    thread calling ``churn()`` every ``period`` seconds until they are done; no error."""
    errors: list = []
    stop = threading.Event()

    def churner():
        while not stop.wait(period):
            try:
                churn()
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)
                return

    ws = [threading.Thread(target=work, args=(errors,)) for work in works]
    c = threading.Thread(target=churner)
    c.start()
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    stop.set()
    c.join()
    assert not errors, errors[0]
