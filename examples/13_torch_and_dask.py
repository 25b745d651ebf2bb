"""One pool for PyTorch too, and a pool on every Dask worker.

Dask: a LocalCluster of two worker processes, mrkit set up on each by the `MrkitSetup` plugin, tasks
allocating through the worker's resource, each worker's statistics gathered into one table (on the
simulator without a GPU). PyTorch (where it and a GPU are present): a training step inside
`mrkit.torch.pool(...)` gives PyTorch's own loss, with mrkit supplying the segments.

Needs: distributed (pip install "mrkit[dask]")."""
import mrkit
from mrkit.driver import CudaDriver

try:
    has_gpu = CudaDriver().device_count() > 0
except mrkit.CUDAUnavailableError:
    has_gpu = False
worker_env = {} if has_gpu else {"MRKIT_BACKEND": "sim"}  # the workers' backend


def task(nbytes):
    mr = mrkit.get_current_resource(0)
    p = mr.allocate(nbytes, mrkit.DEFAULT_STREAM)
    mr.deallocate(p, nbytes, mrkit.DEFAULT_STREAM)
    return nbytes


if __name__ == "__main__":
    import distributed
    from mrkit.dask import MrkitSetup, gather_statistics

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  env=worker_env) as c, \
            distributed.Client(c) as client:
        client.register_plugin(MrkitSetup("statistics(pool(device))", statistics=False))
        sizes = [(i % 5 + 1) << 20 for i in range(20)]
        assert sum(client.gather(client.map(task, sizes, pure=False))) == sum(sizes)
        reports = gather_statistics(client)
        assert sum(r[0]["total_count"] for r in reports.values()) == len(sizes)
        assert all(r[0]["current_bytes"] == 0 for r in reports.values())
        print(gather_statistics(client, table=True))

    try:
        import torch
        torch_gpu = has_gpu and torch.cuda.is_available()
    except ImportError:
        torch_gpu = False
    if torch_gpu:
        import mrkit.torch

        def step():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
            x = torch.randn(512, 64, device="cuda")
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss.item()
        want = step()
        mr = mrkit.StatisticsAdaptor(mrkit.PoolResource(mrkit.DeviceMemoryResource(0)))
        with mrkit.torch.pool(mr):
            got = step()
        assert abs(got - want) <= 1e-5 * abs(want) and mr.statistics.total_count > 0  # float32 rounding
        print(f"PyTorch loss {got:.6f} with mrkit's segments (PyTorch's own: {want:.6f})")
    else:
        print("PyTorch with a GPU not found here: the PyTorch part runs on the GPU machine")
