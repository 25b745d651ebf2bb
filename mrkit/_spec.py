"""Resource specs: a small grammar naming compositions, e.g. ``statistics(limiting(pool(device), 8GiB))``.

::

    spec   := name | name "(" [arg ("," arg)*] ")"
    arg    := spec | size | string | key "=" (spec | size | string)
    size   := digits ["." digits] [unit]        (units: B, KB, MB, GB, KiB, MiB, GiB, TiB ...)
    string := '...' | "..."

Names: ``device[(dev)]`` (driver pool), ``vmm[(dev)]``, ``cuda[(dev)]``, ``managed[(dev)]``, ``pinned``, ``host``,
``pool(upstream[, initial_size[, maximum_size]])``, ``statistics(up)``, ``tracking(up)``,
``binning(up[, max_bin], chunk_size=)``, ``limiting(up, limit)``, ``logging(up, path, buffer_lines=,
flush_interval=)``. Every error (grammar, unknown names, wrong kinds of argument, non-positive
limits) is a ``SpecError`` (a ``ValueError``) raised by :func:`parse_spec`, naming the position,
before anything is built.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ._sizes import parse_size
from .adaptors import LimitingAdaptor, LoggingAdaptor, StatisticsAdaptor, TrackingAdaptor
from .adaptors import replay as _replay
from .resources import (
    BinningResource, CudaMemoryResource, DeviceMemoryResource, HostMemoryResource, ManagedMemoryResource, PinnedMemoryResource,
    PoolResource, VirtualMemoryResource,
)

__all__ = ["parse_spec", "build_resource", "resource_from_spec", "spec_devices", "SpecError", "replay"]

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d+)?\s*[A-Za-z]*)|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|"
                    r"(?P<str>'[^']*'|\"[^\"]*\")|(?P<sym>[(),=]))")


@dataclass
class Node:
    name: str
    args: list
    kwargs: dict
    pos: int


class SpecError(ValueError):
    """A resource spec that cannot be read; the message names the position."""


def _error(spec: str, pos: int, msg: str) -> SpecError:
    return SpecError(f"resource spec: {msg} at position {pos}\n  {spec}\n  {' ' * pos}^")


class _Parser:
    def __init__(self, spec: str) -> None:
        self.spec, self.pos = spec, 0
        self.toks = []
        i = 0
        while i < len(spec):
            if spec[i:].strip() == "":
                break
            m = _TOKEN.match(spec, i)
            if not m or m.end() == i:
                j = i + len(spec[i:]) - len(spec[i:].lstrip())
                raise _error(spec, j, f"unexpected character {spec[j]!r}")
            kind = m.lastgroup
            start = m.start(kind)
            self.toks.append((kind, m.group(kind).strip(), start))
            i = m.end()
        self.toks.append(("end", "", len(spec)))
        self.i = 0

    def peek(self):
        return self.toks[self.i]

    def take(self, kind=None, value=None):
        tok = self.toks[self.i]
        if (kind and tok[0] != kind) or (value and tok[1] != value):
            want = value or kind
            got = "the end" if tok[0] == "end" else repr(tok[1])
            raise _error(self.spec, tok[2], f"expected {want!r}, found {got}")
        self.i += 1
        return tok

    def value(self):
        kind, text, pos = self.peek()
        if kind == "num":
            self.i += 1
            if re.fullmatch(r"\d+\.\d+", text):  # a plain fraction: a factor or a number of seconds
                return float(text)
            try:
                return parse_size(text.replace(" ", ""), "size")
            except ValueError as exc:
                raise _error(self.spec, pos, str(exc)) from None
        if kind == "str":
            self.i += 1
            return text[1:-1]
        if kind == "name":
            return self.node()
        raise _error(self.spec, pos, "expected a resource, a size or a string, found "
                     + ("the end" if kind == "end" else repr(text)))

    def node(self) -> Node:
        _, name, pos = self.take("name")
        node = Node(name, [], {}, pos)
        if self.peek()[1] == "(":
            self.take("sym", "(")
            if self.peek()[1] != ")":
                while True:
                    kind, text, p = self.peek()
                    if kind == "name" and self.toks[self.i + 1][1] == "=":
                        if text in node.kwargs:
                            raise _error(self.spec, p, f"{node.name} got the keyword {text!r} twice")
                        self.i += 2
                        node.kwargs[text] = self.value()
                    else:
                        if node.kwargs:
                            raise _error(self.spec, p, "positional argument after a keyword argument")
                        node.args.append(self.value())
                    if self.peek()[1] == ",":
                        self.take("sym", ",")
                        continue
                    break
            self.take("sym", ")")
        return node


def parse_spec(spec: str) -> Node:
    """Parse ``spec`` into a tree (no driver is touched). Raises ``ValueError`` naming the position."""
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a str, not {type(spec).__name__}")
    p = _Parser(spec)
    node = p.node()
    kind, text, pos = p.peek()
    if kind != "end":
        raise _error(spec, pos, f"unexpected {text!r} after the resource")
    _validate(spec, node)
    return node


# What each name takes: positional parameter names in order, then keyword-only ones; the kind of
# each ("mr": a resource, "size": a byte count, "device": an ordinal, "path": a string, "number").
_SCHEMA: dict[str, tuple[tuple[str, ...], tuple[str, ...], int]] = {
    # name: (positional, keyword-only, required positionals)
    "device": (("device",), (), 0), "vmm": (("device",), (), 0), "cuda": (("device",), (), 0),
    "managed": (("device",), (), 0), "pinned": ((), (), 0), "host": ((), (), 0),
    "pool": (("upstream", "initial_size", "maximum_size"), ("min_chunk", "large_chunk", "growth_factor"), 0),
    "binning": (("upstream", "max_bin"), ("chunk_size",), 1),
    "statistics": (("upstream",), (), 1), "tracking": (("upstream",), (), 1),
    "limiting": (("upstream", "limit"), (), 2), "logging": (("upstream", "path"), ("buffer_lines", "flush_interval"), 2),
}
_KIND = {"device": "device", "upstream": "mr", "initial_size": "size", "maximum_size": "size", "min_chunk": "size",
         "large_chunk": "size",
         "max_bin": "size", "chunk_size": "size", "limit": "size", "path": "path", "buffer_lines": "size",
         "growth_factor": "number", "flush_interval": "number"}
_LEAVES = ("device", "vmm", "cuda", "managed")
_MAX_SIZE = 1 << 62


def _validate(spec: str, node: Node) -> None:
    """Everything that can be known without a driver: names, arities, and the kind of each argument."""
    if node.name not in _SCHEMA:
        raise _error(spec, node.pos, f"unknown resource {node.name!r} (known: {', '.join(sorted(_SCHEMA))})")
    pos_names, kw_only, required = _SCHEMA[node.name]
    if len(node.args) > len(pos_names):
        raise _error(spec, node.pos, f"{node.name} takes at most {len(pos_names)} positional arguments "
                     f"({', '.join(pos_names) or 'none'}), got {len(node.args)}")
    given = dict(zip(pos_names, node.args))
    for key, value in node.kwargs.items():
        if key not in pos_names and key not in kw_only:
            raise _error(spec, node.pos, f"{node.name} has no argument {key!r} "
                         f"(it takes: {', '.join(pos_names + kw_only) or 'none'})")
        if key in given:
            raise _error(spec, node.pos, f"{node.name} got {key!r} twice")
        given[key] = value
    missing = [k for k in pos_names[:required] if k not in given]
    if missing:
        raise _error(spec, node.pos, f"{node.name} needs {' and '.join(missing)}")
    for key, value in given.items():
        kind = _KIND[key]
        where = f"{node.name}'s {key}"
        if kind == "mr":
            if not isinstance(value, Node):
                raise _error(spec, node.pos, f"{where} must be a resource, got {value!r}")
            _validate(spec, value)
        elif isinstance(value, Node):
            raise _error(spec, value.pos, f"{where} must be {'a string' if kind == 'path' else 'a number'}, "
                         f"got the resource {value.name!r}")
        elif kind == "path":
            if not isinstance(value, str) or not value:
                raise _error(spec, node.pos, f"{where} must be a non-empty quoted string, got {value!r}")
        elif isinstance(value, str):
            raise _error(spec, node.pos, f"{where} must be a number, got the string {value!r}")
        elif kind == "device" and not float(value).is_integer():
            raise _error(spec, node.pos, f"{where} must be a device ordinal, got {value!r}")
        elif key in ("limit", "buffer_lines", "max_bin", "chunk_size", "flush_interval") and value <= 0:
            raise _error(spec, node.pos, f"{where} must be positive, got {value!r}")
        elif kind == "size" and value > _MAX_SIZE:
            raise _error(spec, node.pos, f"{where} of {value} bytes is out of range (at most 2**62)")
        elif kind == "number" and not value < float("inf"):
            raise _error(spec, node.pos, f"{where} must be finite, got {value!r}")
        elif kind == "device" and value >= 1 << 16:
            raise _error(spec, node.pos, f"{where} {value!r} is out of range")
    lo, hi = given.get("initial_size"), given.get("maximum_size")
    if node.name == "pool" and isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > hi:
        raise _error(spec, node.pos, f"pool's initial_size ({lo} bytes) exceeds its maximum_size ({hi} bytes)")


def spec_devices(node: Node) -> set[int]:
    """The device ordinals a parsed spec names explicitly (``device(1)`` names 1; ``device`` none)."""
    found = {int(node.args[0])} if node.name in _LEAVES and node.args else set()
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, Node):
            found |= spec_devices(a)
    return found


def _device_path(path: str, device: int | None) -> str:
    """``path`` for ``device``: ``{device}`` is replaced; otherwise devices other than 0 get their own
    file (``log.csv`` -> ``log.device1.csv``) so one device never truncates another's log."""
    if "{device}" in path:
        return path.replace("{device}", str(device or 0))
    if not device:
        return path
    root, dot, ext = path.rpartition(".")
    if not dot or "/" in ext:
        return f"{path}.device{device}"
    return f"{root}.device{device}.{ext}"


def build_resource(node: Node, driver=None, device: int | None = None):
    """Build the resources a parsed spec names; ``device`` is the ordinal of leaves that name none
    (and the log file of each device is its own, see :func:`_device_path`)."""

    def sub(v):
        return build_resource(v, driver, device) if isinstance(v, Node) else v

    args = [sub(a) for a in node.args]
    kw = {k: sub(v) for k, v in node.kwargs.items()}
    n = node.name
    if n in _LEAVES:
        if not args and device is not None:
            args = [device]
        if args:
            args[0] = int(args[0])
        cls = {"device": DeviceMemoryResource, "vmm": VirtualMemoryResource, "cuda": CudaMemoryResource,
               "managed": ManagedMemoryResource}[n]
        return cls(*args, driver=driver, **kw)
    if n == "pinned":
        return PinnedMemoryResource(driver=driver)
    if n == "host":
        return HostMemoryResource()
    if n == "pool":
        if not args and "upstream" not in kw:
            args = [DeviceMemoryResource(device or 0, driver=driver)]
        return PoolResource(*args, **kw)
    if n == "binning":
        return BinningResource(*args, **kw)
    if n == "logging":
        args[1] = _device_path(args[1], device)
    return {"statistics": StatisticsAdaptor, "tracking": TrackingAdaptor, "limiting": LimitingAdaptor,
            "logging": LoggingAdaptor}[n](*args, **kw)


def resource_from_spec(spec: str, driver=None, device: int | None = None):
    """``resource_from_spec("statistics(limiting(pool(device), 8GiB))")`` -> the composed resource.
    With ``device``, leaves that name no device are built on it."""
    return build_resource(parse_spec(spec), driver, device)


def replay(log, resource, **options):
    if isinstance(resource, str):
        resource = resource_from_spec(resource, options.get("driver"))
    return _replay(log, resource, **options)


replay.__doc__ = (_replay.__doc__ or "") + ("\n    ``resource`` may also be a spec string "
                                            "(``\"statistics(pool(device))\"``), built on ``driver=`` first.")
