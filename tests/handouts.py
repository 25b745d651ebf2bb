"""A record of the blocks handed out and not yet given back, shared by threads: a test's check that
nothing is handed out twice while it is live."""
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
