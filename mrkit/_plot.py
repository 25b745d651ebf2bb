"""Memory in use over time from an allocation log: the numbers (:func:`memory_timeline`, no
dependency) and the picture (:func:`plot_log`, matplotlib: ``pip install 'mrkit[plot]'``).

Sits beside the snapshot module: it reads logs (adaptors layer) and draws; nothing imports it but
the command line."""
from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path

from ._sizes import format_size
from .adaptors import read_log

__all__ = ["Timeline", "memory_timeline", "plot_log", "plot_timeline"]


@dataclass
class Timeline:
    """Live bytes after each event of a log: ``times`` (seconds from the first event), ``total``, and
    ``per_stream[handle]`` (one value per event, so every series shares ``times``)."""

    times: list[float] = field(default_factory=list)
    total: list[int] = field(default_factory=list)
    per_stream: dict[int, list[int]] = field(default_factory=dict)
    peak: int = 0
    peak_time: float = 0.0
    failures: list[float] = field(default_factory=list)
    """Times of the log's ``allocate failure`` events (out of memory)."""

    def step(self, t: float, stream: int, delta: int) -> None:
        """Record that at ``t`` the live bytes of ``stream`` changed by ``delta``."""
        series = self.per_stream.get(stream)
        if series is None:
            self.per_stream[stream] = [0] * len(self.times)
        total = (self.total[-1] if self.total else 0) + delta
        self.times.append(t)
        self.total.append(total)
        for h, series in self.per_stream.items():
            series.append((series[-1] if series else 0) + (delta if h == stream else 0))
        if total > self.peak:
            self.peak, self.peak_time = total, t


def memory_timeline(log) -> Timeline:
    """The :class:`Timeline` of a log (a path, a file or a list of :class:`~mrkit.LogEvent`). A free
    is counted against the stream its block was allocated on; frees of pointers the log never
    allocated (a log that starts mid-run) are ignored."""
    events = log if isinstance(log, list) else read_log(log)
    tl = Timeline()
    if not events:
        return tl
    t0 = events[0].time
    live: dict[int, tuple[int, int]] = {}
    for ev in events:
        t = ev.time - t0
        if ev.action == "allocate failure":
            tl.failures.append(t)
        elif ev.action == "allocate":
            live[ev.pointer] = (ev.size, ev.stream)
            tl.step(t, ev.stream, ev.size)
        else:
            entry = live.pop(ev.pointer, None)
            if entry is not None:
                tl.step(t, entry[1], -entry[0])
    return tl


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'mrkit[plot]'") from exc
    return plt


def plot_timeline(tl: Timeline, output, title: str = "memory in use") -> Path:
    """Draw ``tl`` (stacked per stream, the total on top, the peak and any out-of-memory marked) to
    ``output``: ``.png``, ``.svg``, ``.pdf`` or ``.html`` (a page holding the picture and a summary)."""
    out = Path(output)
    suffix = out.suffix.lower()
    if suffix not in (".png", ".svg", ".pdf", ".html"):
        raise ValueError(f"output must end in .png, .svg, .pdf or .html, got {str(output)!r}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110)
    try:
        mib = 1 / (1 << 20)
        if tl.times:
            handles = sorted(tl.per_stream)
            ax.stackplot(tl.times, *[[v * mib for v in tl.per_stream[h]] for h in handles],
                         labels=[f"stream {h:#x}" if h else "default stream" for h in handles], alpha=0.75,
                         step="post")
            ax.step(tl.times, [v * mib for v in tl.total], where="post", color="black", lw=0.8, label="total")
            ax.axhline(tl.peak * mib, color="crimson", ls="--", lw=0.8,
                       label=f"peak {format_size(tl.peak)} at {tl.peak_time:.3f} s")
            for i, t in enumerate(tl.failures):
                ax.axvline(t, color="red", lw=1.2, label="out of memory" if i == 0 else None)
            ax.legend(loc="upper left", fontsize=8, ncol=2)
        else:
            ax.text(0.5, 0.5, "no events", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("seconds since the first event")
        ax.set_ylabel("live MiB")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        if suffix == ".html":
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            img = base64.b64encode(buf.getvalue()).decode("ascii")
            rows = [("events", str(len(tl.times) + len(tl.failures))), ("peak live", format_size(tl.peak)),
                    ("at", f"{tl.peak_time:.6f} s"), ("streams", str(len(tl.per_stream))),
                    ("out-of-memory events", str(len(tl.failures)))]
            table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
            out.write_text(f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                           f"<h1>{html.escape(title)}</h1><img alt='memory in use over time' "
                           f"src='data:image/png;base64,{img}'><table>{table}</table>\n", encoding="utf-8")
        else:
            fig.savefig(out)
    finally:
        plt.close(fig)
    return out


def plot_log(log, output, title: str | None = None) -> Timeline:
    """Read an allocation log (mrkit's or RMM's CSV) and draw its memory in use to ``output``;
    returns the :class:`Timeline` drawn."""
    tl = memory_timeline(log)
    plot_timeline(tl, output, title or f"memory in use: {Path(str(log)).name if not isinstance(log, list) else 'log'}")
    return tl
