"""Sub-allocators: pure-Python algorithms over any upstream resource."""
from ._pool import PoolResource

__all__ = ["PoolResource"]
