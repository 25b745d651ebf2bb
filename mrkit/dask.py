"""``mrkit.dask``: mrkit set up on every Dask worker (``distributed.WorkerPlugin``), and each worker's
statistics gathered into one table.

    from mrkit.dask import MrkitSetup, gather_statistics
    client.register_plugin(MrkitSetup("pool", initial_pool_size=0.5, log_directory="logs", statistics=True))
    ...
    print(gather_statistics(client, table=True))

Works with a plain ``distributed.LocalCluster`` and with dask-cuda's ``LocalCUDACluster`` (one worker
per GPU, each seeing its GPU as device 0). ``pip install 'mrkit[dask]'``."""
from __future__ import annotations

import os
import re

from distributed import WorkerPlugin

from ._current import get_current_resource
from ._resource import upstream_chain
from ._setup import check_arguments, reinitialize

__all__ = ["MrkitSetup", "gather_statistics", "worker_report"]


def _importable(name: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class MrkitSetup(WorkerPlugin):
    """Set up mrkit on each worker when it starts (and again on workers that join later).

    resource: what :func:`mrkit.reinitialize` takes: a kind (``"pool"``, ``"device"`` for the driver's
        pool, ``"vmm"``, ``"managed"``, ``"cuda"``) or a spec string (``"statistics(pool(device))"``).
    initial_pool_size, maximum_pool_size: bytes, ``"8 GiB"`` or a fraction of the GPU's memory.
    release_threshold: for ``"device"`` and ``"vmm"``.
    log_directory: one RMM-format CSV log per worker, ``mrkit-<worker name>.csv``.
    statistics / tracking: wrap the resource in those adaptors (statistics feed :func:`gather_statistics`).
    cupy / numba / torch: make mrkit that library's allocator on the worker; ``None`` (cupy's default):
        where the library is importable. PyTorch is replaced process-wide (``mrkit.torch.install``),
        so it is off unless asked for.
    devices: the device ordinals to set up (default ``[0]``: the GPU a dask-cuda worker sees first).
    """

    idempotent = True
    name = "mrkit"

    def __init__(self, resource="pool", *, initial_pool_size=None, maximum_pool_size=None,
                 release_threshold=None, log_directory=None, statistics: bool = True, tracking: bool = False,
                 cupy: bool | None = None, numba: bool | None = False, torch: bool | None = False,
                 devices=(0,)) -> None:
        # the arguments are checked here, on the client, where a mistake is easy to see
        if not isinstance(resource, str):
            raise TypeError(f"resource must be a kind or a spec string (it is sent to the workers), "
                            f"not {type(resource).__name__}")
        for name, flag in (("cupy", cupy), ("numba", numba), ("torch", torch)):
            if flag is not None and not isinstance(flag, bool):
                raise TypeError(f"{name} must be True, False or None, not {flag!r}")
        if log_directory is not None and not isinstance(log_directory, (str, os.PathLike)):
            raise TypeError(f"log_directory must be a path, not {type(log_directory).__name__}")
        self.devices = check_arguments(resource, devices=devices, initial_pool_size=initial_pool_size,
                                       maximum_pool_size=maximum_pool_size, release_threshold=release_threshold,
                                       statistics=statistics, tracking=tracking)[0]
        self.resource = resource
        self.initial_pool_size, self.maximum_pool_size = initial_pool_size, maximum_pool_size
        self.release_threshold = release_threshold
        self.log_directory = None if log_directory is None else os.fspath(log_directory)
        self.statistics, self.tracking = statistics, tracking
        self.cupy, self.numba, self.torch = cupy, numba, torch

    def setup(self, worker) -> None:
        log_file = None
        if self.log_directory is not None:
            os.makedirs(self.log_directory, exist_ok=True)
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(worker.name))
            log_file = os.path.join(self.log_directory, f"mrkit-{safe}.csv")
        want = {lib: (_importable(lib) if flag is None else flag)
                for lib, flag in (("cupy", self.cupy), ("numba", self.numba), ("torch", self.torch))}
        got = reinitialize(self.resource, devices=self.devices, initial_pool_size=self.initial_pool_size,
                           maximum_pool_size=self.maximum_pool_size, release_threshold=self.release_threshold,
                           log_file=log_file, statistics=self.statistics, tracking=self.tracking,
                           cupy=want["cupy"], numba=want["numba"])
        if want["torch"]:
            from .integrations.torch import install
            install(got.get(0))
        worker.mrkit_resources = got
        worker.mrkit_log = log_file

    def teardown(self, worker) -> None:
        reinitialize()  # flushes and closes this worker's log


def worker_report(dask_worker=None) -> dict:
    """This worker's mrkit resource and counters (what :func:`gather_statistics` runs everywhere)."""
    from .adaptors import StatisticsAdaptor
    out = {}
    resources = getattr(dask_worker, "mrkit_resources", None) or {0: get_current_resource(0)}
    for dev, mr in resources.items():
        row = {"device": dev, "resource": repr(mr), "log": getattr(dask_worker, "mrkit_log", None)}
        found = next((r for r in upstream_chain(mr) if isinstance(r, StatisticsAdaptor)), None)
        if found is not None:
            s = found.statistics
            row.update(current_bytes=s.current_bytes, peak_bytes=s.peak_bytes, total_bytes=s.total_bytes,
                       current_count=s.current_count, total_count=s.total_count)
        out[dev] = row
    return out


def gather_statistics(client, *, table: bool = False):
    """Every worker's :func:`worker_report`: ``{worker address: {device: counters}}``, or with
    ``table=True`` one text table (rich where installed) of all of them."""
    reports = client.run(worker_report)
    if not table:
        return reports
    from ._sizes import format_size
    rows = []
    for addr, devs in sorted(reports.items()):
        for dev, r in devs.items():
            rows.append([addr, str(dev), str(r.get("total_count", "-")),
                         format_size(r["peak_bytes"]) if "peak_bytes" in r else "-",
                         format_size(r["current_bytes"]) if "current_bytes" in r else "-"])
    import io
    from ._ui import grid as _grid
    buf = io.StringIO()
    _grid("mrkit on each Dask worker", ["worker", "device", "allocations", "peak", "in use"], rows, buf)
    return buf.getvalue()
