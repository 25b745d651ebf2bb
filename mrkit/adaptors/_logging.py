"""``LoggingAdaptor`` (RMM-compatible CSV event logs), a log reader and ``replay``."""
from __future__ import annotations

import atexit
import csv
import io
import os
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import datetime

from .._errors import OutOfMemoryError
from .._owned import Closing
from .._resource import MemoryResource, check_pointer
from .._stream import DEFAULT_STREAM, Stream, stream_handle
from ._base import Adaptor

__all__ = ["LoggingAdaptor", "LogEvent", "read_log", "replay", "ReplayReport"]

HEADER = "Thread,Time,Action,Pointer,Size,Stream"
_LINE = "%d,%.6f,%s,%#x,%d,%#x\n"  # Time in seconds since the epoch, as RMM documents it


class LoggingAdaptor(Closing, Adaptor):
    """Writes one CSV line per event in RMM's format (``Thread,Time,Action,Pointer,Size,Stream``;
    actions ``allocate``, ``free`` and ``allocate failure``), so logs interchange with RMM's tools.

    ``sink`` is a path (truncated, like RMM) or a text file object. Each event is one atomic append
    of a tuple to an in-memory buffer (in call order across threads); formatting and writing happen
    on :meth:`flush`, under a lock. Events reach the file:

    - on :meth:`flush` and :meth:`close` (or the end of a ``with`` block), and at interpreter exit for logs never closed;
    - as soon as ``buffer_lines`` events are waiting (the writer that reaches the bound writes);
    - within ``flush_interval`` seconds (a daemon thread shared by all logs), so a process killed
      outright (SIGKILL, a crash in a driver) loses at most the events of the last interval, and at
      most ``buffer_lines`` of them. ``flush_interval=None`` turns the timer off.
    """

    __slots__ = ("_file", "_owns", "_lock", "_buf", "_limit", "_tid", "_time", "_header_written",
                 "flush_interval", "_path", "_reopen")

    def __init__(self, upstream: MemoryResource, sink, *, buffer_lines: int = 4096,
                 flush_interval: float | None = 1.0) -> None:
        super().__init__(upstream)
        if isinstance(buffer_lines, bool) or not isinstance(buffer_lines, int) or buffer_lines < 1:
            raise ValueError(f"buffer_lines must be a positive int, got {buffer_lines!r}")
        if flush_interval is not None:
            if isinstance(flush_interval, bool) or not isinstance(flush_interval, (int, float)) \
                    or not 0 < flush_interval < float("inf"):
                raise ValueError(f"flush_interval must be a positive number of seconds or None, got {flush_interval!r}")
        if isinstance(sink, (str, os.PathLike)):
            self._file = open(sink, "w", encoding="ascii", newline="")
            self._owns, self._path = True, os.fspath(sink)
            _owned_files[id(self)] = self._file
        elif hasattr(sink, "write"):
            self._file, self._owns, self._path = sink, False, None
        else:
            raise TypeError(f"sink must be a path or a text file object, not {type(sink).__name__}")
        self._lock = threading.Lock()
        self._reopen = False  # set at interpreter exit: a file closed by teardown is reopened to append
        self._buf: list[tuple] = []
        self._limit = buffer_lines
        self.flush_interval = None if flush_interval is None else float(flush_interval)
        self._tid = threading.get_ident
        self._time = time.time
        self._header_written = False
        _open_logs.add(self)
        if self.flush_interval is not None:
            _flusher.watch(self.flush_interval)

    # Recording is inlined in both methods — one tuple, one atomic list append per event (the stream's
    # handle resolved now, so the buffer holds only numbers and strings); formatting waits for flush().
    # A closed log serves nothing: close() swaps the buffer for _CLOSED, whose append raises — before
    # the upstream is called in deallocate; allocate tests for it first (its event comes after).
    def allocate(self, nbytes, stream, alignment=256):
        if self._buf is _CLOSED:
            raise ValueError(_CLOSED_MESSAGE)
        try:
            ptr = self._up_alloc(nbytes, stream, alignment)
        except OutOfMemoryError:
            self._buf.append((self._tid(), self._time(), "allocate failure", 0, nbytes, stream_handle(stream)))
            raise
        buf = self._buf
        buf.append((self._tid(), self._time(), "allocate", ptr, nbytes,
                    stream.handle if type(stream) is Stream else stream_handle(stream)))
        if len(buf) >= self._limit:
            self.flush()
        return ptr

    def deallocate(self, ptr, nbytes, stream, alignment=256):
        # Logged before the upstream frees: once it has, another thread may get the pointer again, and
        # its "allocate" must not reach the log ahead of this "free".
        if type(ptr) is not int:  # the log holds ints (a float equal to a live pointer is refused)
            ptr = check_pointer(ptr)
        buf = self._buf
        event = (self._tid(), self._time(), "free", ptr, nbytes,
                 stream.handle if type(stream) is Stream else stream_handle(stream))
        buf.append(event)
        try:
            self._up_free(ptr, nbytes, stream, alignment)
        except BaseException:
            try:
                buf.remove(event)  # the free did not happen (an atomic list operation)
            except ValueError:  # pragma: no cover - a flush wrote it meanwhile
                pass
            raise
        if len(buf) >= self._limit:
            self.flush()

    def _write(self, _format=None, _header=None, _open=None) -> None:
        """Format and write the buffered events (lock held). Events appended meanwhile stay queued.
        (The module's format and header are bound below, as defaults, so writes during interpreter
        teardown still work after module globals are gone.)"""
        buf = self._buf
        n = len(buf)
        events = buf[:n]
        del buf[:n]
        text = "".join(map(_format, events))
        if not self._header_written:
            self._header_written = True
            text = _header + "\n" + text
        if text:
            f = self._file
            if self._reopen and f.closed:  # interpreter teardown finalized our file under us
                f = self._file = _open(self._path, "a", encoding="ascii", newline="")
            f.write(text)

    def flush(self) -> None:
        with self._lock:
            if self._buf is _CLOSED:
                return
            self._write()
            self._file.flush()

    def close(self) -> None:
        """Write what is buffered and close the file (a path's). Afterwards the log refuses to serve:
        ``allocate``/``deallocate`` raise ``ValueError`` (an event it could not log would be lost)."""
        _open_logs.discard(self)
        with self._lock:
            if self._buf is _CLOSED:
                return
            if not self._file.closed:
                self._write()
                self._file.flush()
                if self._owns:
                    self._file.close()
            self._buf = _CLOSED
        _owned_files.pop(id(self), None)

    def __del__(self) -> None:
        # Dropped without close(): the buffered events are written and a path's file closed, as a
        # Python file closes itself. In a garbage cycle the file is not finalized first: _owned_files
        # holds it until then.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter teardown, or a sink its owner closed
            pass

    @property
    def closed(self) -> bool:
        return self._buf is _CLOSED


class _Closed(list):
    """The buffer of a closed log: appending raises."""

    __slots__ = ()

    def append(self, _event) -> None:
        raise ValueError(_CLOSED_MESSAGE)


_CLOSED_MESSAGE = ("this LoggingAdaptor is closed: it serves no more allocations or frees "
                   "(their events could not be logged)")


_CLOSED = _Closed()
LoggingAdaptor._write.__defaults__ = (_LINE.__mod__, HEADER, open)
_open_logs: "weakref.WeakSet[LoggingAdaptor]" = weakref.WeakSet()
_owned_files: dict = {}  # id(log) -> the file of a log given a path, until the log is closed


class _Flusher:
    """One daemon thread for every log with a ``flush_interval``: wakes at the shortest interval
    asked for and writes each log's waiting events (a log with nothing waiting costs a length test)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._period: float | None = None
        self._thread: threading.Thread | None = None
        self.stopped = False

    def watch(self, period: float) -> None:
        with self._lock:
            if self.stopped:
                return
            if self._period is None or period < self._period:
                self._period = period
                self._wake.set()  # re-arm at the shorter period
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="mrkit-log-flusher", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self.stopped:
            self._wake.wait(self._period)
            self._wake.clear()
            if self.stopped:
                return
            _flush_waiting()  # a function: no log stays referenced by this frame while it sleeps

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            self._wake.set()


_flusher = _Flusher()


def _flush_waiting() -> None:
    for log in list(_open_logs):
        if log._buf and log.flush_interval is not None:
            try:
                log.flush()
            except Exception:  # pragma: no cover - a sink closed by its owner meanwhile
                _open_logs.discard(log)


@atexit.register
def _flush_at_exit() -> None:
    """Interpreter exit without close(): every open log gets its buffered events now, and from here on
    writes each event as it comes (frees of objects that die during teardown still reach the log;
    the file is left for the operating system to close)."""
    _flusher.stop()
    for log in list(_open_logs):
        try:
            log._limit, log._reopen = 1, log._owns
            log.flush()
        except Exception:  # pragma: no cover - a sink already closed by its owner
            pass


@dataclass(frozen=True)
class LogEvent:
    """One line of an allocation log."""

    thread: int
    time: float
    """Seconds (since the epoch, or since midnight for ``HH:MM:SS.ffffff`` times)."""
    action: str
    """``allocate``, ``free`` or ``allocate failure`` (RMM's ``deallocate`` reads as ``free``)."""
    pointer: int
    size: int
    stream: int


def _parse_time(text: str) -> float:
    text = text.strip()
    if ":" in text:
        h, m, s = text.split(":", 2)
        return int(h) * 3600 + int(m) * 60 + float(s.replace(":", "."))
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def read_log(source) -> list[LogEvent]:
    """Parse a log written by :class:`LoggingAdaptor` or by RMM (a path, a file object or the text
    itself). Raises ``ValueError`` naming the line of anything it cannot read."""
    if isinstance(source, (str, os.PathLike)) and (not isinstance(source, str) or "\n" not in source):
        try:
            with open(source, encoding="ascii") as f:
                text = f.read()
        except UnicodeDecodeError as exc:
            raise ValueError(f"source {os.fspath(source)!r} is not an allocation log (not ASCII text: "
                             f"byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    elif isinstance(source, str):
        text = source
    elif hasattr(source, "read"):
        text = source.read()
    else:
        raise TypeError(f"source must be a path, a file object or the log's text, not {type(source).__name__}")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("ascii")
        except UnicodeDecodeError as exc:
            raise ValueError(f"source is not an allocation log (not ASCII text: byte "
                             f"{exc.object[exc.start]:#04x} at offset {exc.start})") from None
    if "\0" in text:
        raise ValueError(f"source is not an allocation log (a NUL character at offset {text.index(chr(0))})")
    try:
        return _parse_rows(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise ValueError(f"source is not a readable CSV allocation log: {exc}") from None


def _parse_rows(rows) -> list[LogEvent]:
    header = next(rows, None)
    if header is None or [h.strip() for h in header][:6] != HEADER.split(","):
        raise ValueError(f"line 1: expected the header {HEADER!r}, got {header!r}")
    events = []
    for lineno, row in enumerate(rows, start=2):
        if not row:
            continue
        try:
            thread, t, action, ptr, size, stream = (c.strip() for c in row[:6])
            action = {"deallocate": "free", "allocate_failure": "allocate failure"}.get(action, action)
            if action not in ("allocate", "free", "allocate failure"):
                raise ValueError(f"unknown action {action!r}")
            ev = LogEvent(int(thread), _parse_time(t), action, int(ptr, 16), int(size),
                          int(stream, 16) if stream.startswith("0x") else int(stream))
            if ev.size < 0 or ev.pointer < 0 or ev.stream < 0:
                raise ValueError("negative size, pointer or stream")
            events.append(ev)
        except (ValueError, OverflowError, OSError) as exc:  # OverflowError/OSError: absurd dates
            raise ValueError(f"line {lineno}: cannot read {row!r}: {exc}") from None
    return events


def _check_log(events) -> None:
    """Refuse a log that contradicts itself (``ValueError`` naming the event)."""
    live: dict[int, int] = {}
    for i, ev in enumerate(events, start=1):
        if not isinstance(ev, LogEvent):
            raise TypeError(f"log event {i} must be a LogEvent, not {type(ev).__name__}")
        if ev.size < 0:
            raise ValueError(f"log event {i}: negative size {ev.size}")
        if ev.action == "allocate":
            if ev.pointer in live:
                raise ValueError(f"log event {i}: pointer {ev.pointer:#x} is allocated again while the log "
                                 f"still has it live ({live[ev.pointer]} bytes): the log is inconsistent")
            live[ev.pointer] = ev.size
        elif ev.action == "free":
            n = live.pop(ev.pointer, None)
            if n is not None and n != ev.size:
                raise ValueError(f"log event {i}: pointer {ev.pointer:#x} is freed with size {ev.size}, "
                                 f"but was allocated with {n} bytes: the log is inconsistent")


@dataclass(frozen=True)
class ReplayReport:
    """What :func:`replay` measured."""

    events: int
    """Events re-issued (allocations, frees and failures counted once each)."""
    seconds: float
    """Wall time spent in the resource's allocate/deallocate calls."""
    peak_live_bytes: int
    """Highest sum of live allocation sizes during the replay."""
    failures: int
    """Allocations that raised OutOfMemoryError during the replay (the log's own failures excluded)."""
    held_bytes: int | None
    """What the resource reports holding at the end (``pool_size`` or ``live_bytes``), if it says."""

    @property
    def us_per_event(self) -> float:
        return self.seconds * 1e6 / self.events if self.events else 0.0


def replay(log, resource: MemoryResource, *, streams: dict | None = None, driver=None,
           progress=None) -> ReplayReport:
    """Re-issue a log's events in order against ``resource``.

    Logged pointers map to the new ones; each logged stream maps to a stream of this process
    (``0x0`` to :data:`~mrkit.DEFAULT_STREAM`; others to new streams on the resource's device, or as
    given in ``streams``). Allocations still live at the end are freed. Frees of pointers the log
    never allocated (a log that starts mid-run) are skipped. A free logged on another stream than
    its allocation is ordered after the allocating stream's work (the program did so somehow; the
    log does not record how).

    A log that contradicts itself is refused with ``ValueError`` before anything is allocated: a
    pointer allocated again while the log still has it live, or freed with a size other than the
    one it was allocated with. If the resource raises anything but ``OutOfMemoryError`` midway,
    every allocation made so far is freed before the error propagates.

    ``progress``: called as ``progress(k)`` after every 1 024 events re-issued (and with the rest at
    the end), e.g. a progress bar's advance.
    """
    if not (callable(getattr(resource, "allocate", None)) and callable(getattr(resource, "deallocate", None))):
        raise TypeError(f"resource must be a MemoryResource or a resource spec string (mrkit.replay), "
                        f"not {type(resource).__name__}")
    events = read_log(log) if not isinstance(log, list) else log
    _check_log(events)
    streams = dict(streams or {})
    made: list[Stream] = []
    dev = resource.device_id or 0

    def stream_for(h: int):
        s = streams.get(h)
        if s is None:
            if h in (0, 1):
                s = DEFAULT_STREAM
            elif not resource.device_accessible:
                s = DEFAULT_STREAM
            else:
                s = Stream.create(dev, driver=driver or getattr(resource, "driver", None))
                made.append(s)
            streams[h] = s
        return s

    live: dict[int, tuple[int, int, Stream]] = {}
    cur = peak = failures = n = 0
    elapsed = 0.0
    clock = time.perf_counter
    alloc, free = resource.allocate, resource.deallocate
    try:
        for i, ev in enumerate(events):
            if progress is not None and i & 1023 == 1023:
                progress(1024)
            if ev.action == "allocate failure":
                continue
            s = stream_for(ev.stream)
            n += 1
            if ev.action == "allocate":
                t0 = clock()
                try:
                    p = alloc(ev.size, s)
                except OutOfMemoryError:
                    elapsed += clock() - t0
                    failures += 1
                    continue
                elapsed += clock() - t0
                live[ev.pointer] = (p, ev.size, s)
                cur += ev.size
                peak = max(peak, cur)
            else:
                entry = live.pop(ev.pointer, None)
                if entry is None:
                    continue
                if s is not entry[2] and resource.device_accessible:
                    # a free on another stream: the program ordered it after the allocating stream's
                    # work (the log does not say how), so the replay orders it with one wait
                    s.wait(entry[2])
                t0 = clock()
                free(entry[0], entry[1], s)
                elapsed += clock() - t0
                cur -= entry[1]
        if progress is not None and len(events) & 1023:
            progress(len(events) & 1023)
        while live:
            _, (p, size, s) = live.popitem()
            free(p, size, s)
        held = getattr(resource, "pool_size", None)
        if held is None:
            held = getattr(resource, "live_bytes", None)
    finally:
        for p, size, s in live.values():  # only after a failure: nothing is left behind
            try:
                free(p, size, s)
            except Exception:  # pragma: no cover - the resource is already failing
                pass
        for s in made:
            s.synchronize()
            s.close()
    return ReplayReport(n, elapsed, peak, failures, held)
