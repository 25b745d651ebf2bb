"""A Dask array computation on dask-cuda's LocalCUDACluster, with mrkit set up on the worker."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numba-cuda imported by distributed's cupy serializer
def test_dask_array_on_a_local_cuda_cluster_uses_mrkit(gpu):
    cupy = pytest.importorskip("cupy")
    dask_cuda = pytest.importorskip("dask_cuda", reason="dask-cuda not installed (the GPU run installs it)")
    import dask.array as da
    from distributed import Client

    from mrkit.dask import MrkitSetup, gather_statistics
    x = da.random.RandomState(0).random_sample((3000, 3000), chunks=(1000, 1000))
    want = float((x @ x.T).sum().compute(scheduler="threads"))
    with dask_cuda.LocalCUDACluster(n_workers=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        client.register_plugin(MrkitSetup("pool", initial_pool_size=0.02, statistics=True))
        g = x.map_blocks(cupy.asarray)
        got = float((g @ g.T).sum().compute())
        reports = gather_statistics(client)
        print(gather_statistics(client, table=True))
    assert np.isclose(got, want, rtol=1e-9)
    (worker,) = reports.values()
    assert worker[0]["resource"].startswith("StatisticsAdaptor(PoolResource(")
    assert worker[0]["total_count"] > 9  # the worker's CuPy blocks came from mrkit
