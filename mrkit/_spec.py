"""Resource specs: a small grammar naming compositions, e.g. ``statistics(limiting(pool(device), 8GiB))``.

::

    spec   := name | name "(" [arg ("," arg)*] ")"
    arg    := spec | size | string | key "=" (spec | size | string)
    size   := digits ["." digits] [unit]        (units: B, KB, MB, GB, KiB, MiB, GiB, TiB ...)
    string := '...' | "..."

Names: ``device[(dev)]`` (driver pool), ``vmm[(dev)]``, ``cuda[(dev)]``, ``managed[(dev)]``, ``pinned``, ``host``,
``pool(upstream[, initial_size[, maximum_size]])``, ``statistics(up)``, ``tracking(up)``,
``limiting(up, limit)``, ``logging(up, path)``. Errors name the position.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ._sizes import parse_size
from .adaptors import LimitingAdaptor, LoggingAdaptor, StatisticsAdaptor, TrackingAdaptor
from .resources import (
    CudaMemoryResource, DeviceMemoryResource, HostMemoryResource, ManagedMemoryResource, PinnedMemoryResource,
    PoolResource, VirtualMemoryResource,
)

__all__ = ["parse_spec", "build_resource", "resource_from_spec"]

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d+)?\s*[A-Za-z]*)|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|"
                    r"(?P<str>'[^']*'|\"[^\"]*\")|(?P<sym>[(),=]))")


@dataclass
class Node:
    name: str
    args: list
    kwargs: dict
    pos: int


class SpecError(ValueError):
    pass


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


_ARITY = {"vmm": (0, 1), "device": (0, 1), "cuda": (0, 1), "managed": (0, 1), "pinned": (0, 0), "host": (0, 0),
          "pool": (0, 3), "statistics": (1, 1), "tracking": (1, 1), "limiting": (2, 2), "logging": (2, 2)}


def _validate(spec: str, node: Node) -> None:
    if node.name not in _ARITY:
        raise _error(spec, node.pos, f"unknown resource {node.name!r} (known: {', '.join(sorted(_ARITY))})")
    lo, hi = _ARITY[node.name]
    n = len(node.args) + len(node.kwargs)
    if not lo <= n <= hi:
        raise _error(spec, node.pos, f"{node.name} takes {lo}..{hi} arguments, got {n}")
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, Node):
            _validate(spec, a)


def build_resource(node: Node, driver=None):
    """Build the resources a parsed spec names."""

    args = [build_resource(a, driver) if isinstance(a, Node) else a for a in node.args]
    kw = {k: build_resource(v, driver) if isinstance(v, Node) else v for k, v in node.kwargs.items()}
    n = node.name
    if n == "device":
        return DeviceMemoryResource(*args, driver=driver, **kw)
    if n == "vmm":
        return VirtualMemoryResource(*args, driver=driver, **kw)
    if n == "cuda":
        return CudaMemoryResource(*args, driver=driver, **kw)
    if n == "managed":
        return ManagedMemoryResource(*args, driver=driver, **kw)
    if n == "pinned":
        return PinnedMemoryResource(driver=driver)
    if n == "host":
        return HostMemoryResource()
    if n == "pool":
        if not args and "upstream" not in kw:
            args = [DeviceMemoryResource(driver=driver)]
        return PoolResource(*args, **kw)
    return {"statistics": StatisticsAdaptor, "tracking": TrackingAdaptor, "limiting": LimitingAdaptor,
            "logging": LoggingAdaptor}[n](*args, **kw)


def resource_from_spec(spec: str, driver=None):
    """``resource_from_spec("statistics(limiting(pool(device), 8GiB))")`` -> the composed resource."""
    return build_resource(parse_spec(spec), driver)
