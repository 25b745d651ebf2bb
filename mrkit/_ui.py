"""Terminal output shared by the command line and the integrations: progress bars and tables, with
rich where it is installed (``mrkit[cli]``) and plain text otherwise."""
from __future__ import annotations

__all__ = ["progress", "table", "grid"]


class _PlainProgress:
    """Progress as plain lines on stderr (``label: 40/100 (40%)``) at every tenth, for terminals and
    logs without rich."""

    def __init__(self, total: int, label: str) -> None:
        import sys
        self.total, self.label, self.done, self.shown = max(0, total), label, 0, -1
        self.err = sys.stderr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.done != self.shown:
            self._show()
        return False

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.total and self.done * 10 // self.total > max(self.shown, 0) * 10 // self.total:
            self._show()

    def _show(self) -> None:
        self.shown = self.done
        pct = f" ({self.done * 100 // self.total}%)" if self.total else ""
        print(f"{self.label}: {self.done}/{self.total}{pct}", file=self.err, flush=True)


def progress(total: int, label: str, quiet: bool):
    """A rich progress bar where rich is installed, plain lines on stderr otherwise; nothing when
    ``quiet``. Returns (context manager, advance(n) function)."""
    import contextlib
    if quiet:
        return contextlib.nullcontext(), lambda n=1: None
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        plain = _PlainProgress(total, label)
        return plain, plain.advance
    from rich.console import Console
    prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False,
                    console=Console(stderr=True))  # stdout stays the command's output (--json)
    task = prog.add_task(label, total=total)
    return prog, lambda n=1: prog.advance(task, n)


def table(title: str, rows: list[tuple[str, str]], out) -> None:
    """Two-column summary: a rich table when rich is installed, plain aligned text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title, file=out)
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"  {k:<{width}}  {v}", file=out)
        return
    t = Table(title=title, title_justify="left")
    t.add_column("measure")
    t.add_column("value", justify="right")
    for k, v in rows:
        t.add_row(k, v)
    Console(file=out, width=100).print(t)


def grid(title: str, columns: list[str], rows: list[list[str]], out) -> None:
    """A table with several columns: rich where installed, plain aligned text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title, file=out)
        widths = [max(len(str(r[i])) for r in [columns] + rows) for i in range(len(columns))]
        for r in [columns] + rows:
            print("  " + "  ".join(f"{str(c):<{w}}" for c, w in zip(r, widths)), file=out)
        return
    console = Console(file=out, width=160)
    console.print(f"[bold]{title}[/bold]", highlight=False)
    t = Table()
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*map(str, r))
    console.print(t)
