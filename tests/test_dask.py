"""mrkit on each worker of a real Dask LocalCluster (2 worker processes, simulated backend)."""
from __future__ import annotations

import pytest

distributed = pytest.importorskip("distributed")

import mrkit  # noqa: E402
from mrkit.dask import MrkitSetup, gather_statistics  # noqa: E402


def _work(nbytes: int) -> int:
    """A task that allocates through the worker's current resource, writes it, frees it."""
    mr = mrkit.get_current_resource(0)
    p = mr.allocate(nbytes, mrkit.DEFAULT_STREAM)
    mrkit.get_driver().memset_async(p, 1, nbytes, 0)
    mr.deallocate(p, nbytes, mrkit.DEFAULT_STREAM)
    return nbytes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import os
    old = os.environ.get("MRKIT_BACKEND")
    os.environ["MRKIT_BACKEND"] = "sim"  # the worker processes inherit it
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                      worker_dashboard_address=":0") as c, distributed.Client(c) as client:
            yield client, tmp_path_factory.mktemp("logs")
    finally:
        if old is None:
            os.environ.pop("MRKIT_BACKEND", None)
        else:
            os.environ["MRKIT_BACKEND"] = old


def test_each_worker_gets_its_resource_statistics_and_log(cluster):
    client, logs = cluster
    client.register_plugin(MrkitSetup("pool", initial_pool_size="64 MiB", log_directory=logs, statistics=True))
    sizes = [1 << 20, 3 << 20, 5000, 7 << 20] * 4
    assert sum(client.gather(client.map(_work, sizes, pure=False))) == sum(sizes)
    reports = gather_statistics(client)
    assert len(reports) == 2
    total = 0
    for addr, devs in reports.items():
        r = devs[0]
        assert r["resource"].startswith("StatisticsAdaptor(LoggingAdaptor(PoolResource(")
        assert r["current_bytes"] == 0 and r["log"].endswith(".csv")
        total += r["total_count"]
    assert total == len(sizes)
    text = gather_statistics(client, table=True)
    assert "mrkit on each Dask worker" in text and text.count("tcp://") == 2
    client.unregister_worker_plugin("mrkit")  # teardown: each worker closes its log
    events = [e for f in sorted(logs.glob("mrkit-*.csv")) for e in mrkit.read_log(f)]
    assert sorted(e.size for e in events if e.action == "allocate") == sorted(sizes)


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"resource": lambda d: None}, TypeError, "resource must be a kind or a spec string"),
    ({"resource": "pool(nothing)"}, ValueError, "resource: .*unknown resource 'nothing'"),
    ({"initial_pool_size": -1}, ValueError, "initial_pool_size"),
    ({"initial_pool_size": 1.5}, ValueError, "initial_pool_size as a fraction"),
    ({"initial_pool_size": "2 GiB", "maximum_pool_size": "1 GiB"}, ValueError, "exceeds maximum_pool_size"),
    ({"resource": "vmm", "maximum_pool_size": "1 GiB"}, ValueError, "do not apply to resource='vmm'"),
    ({"devices": [0, 0]}, ValueError, "devices: 0 is given twice"),
    ({"devices": 0}, TypeError, "devices must be a list"),
    ({"statistics": "yes"}, TypeError, "statistics must be True or False"),
    ({"cupy": 1}, TypeError, "cupy must be True, False or None"),
    ({"log_directory": 5}, TypeError, "log_directory must be a path"),
])
def test_the_plugin_checks_its_arguments_on_the_client(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        MrkitSetup(**kwargs)
