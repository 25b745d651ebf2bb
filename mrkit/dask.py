"""``mrkit.dask``: mrkit on every Dask worker (see :mod:`mrkit.integrations.dask`; ``pip install 'mrkit[dask]'``)."""
from .integrations.dask import MrkitSetup, gather_statistics, worker_report

__all__ = ["MrkitSetup", "gather_statistics", "worker_report"]
