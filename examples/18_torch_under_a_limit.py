"""PyTorch under a memory limit: memory freed by tensors is usable again for another size.

`mrkit.torch.pool(LimitingAdaptor(..., 256 MiB))`: 64 MiB tensors until PyTorch raises
`torch.cuda.OutOfMemoryError` (with mrkit's reason as a note), all of them freed, then one tensor of
200 MiB. PyTorch keeps freed memory cached in its `MemPool`; in the compiled build mrkit has PyTorch
give those segments back before a refusal stands, so the 200 MiB tensor fits, as it does under
PyTorch's own allocator with `set_per_process_memory_fraction`. Without a GPU it says so and stops.

Needs: torch (pip install torch)."""
import torch

import mrkit.torch
from mrkit import DeviceMemoryResource, LimitingAdaptor, PoolResource
from mrkit._engine import core_name

MiB = 1 << 20

if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU for PyTorch; nothing to show on this machine")
        raise SystemExit(0)
    limit = LimitingAdaptor(PoolResource(DeviceMemoryResource(0)), 256 * MiB)
    with mrkit.torch.pool(limit) as mp:
        held = []
        try:
            while True:
                held.append(torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError as exc:
            print(f"{len(held)} x 64 MiB fit under the 256 MiB limit; the next: {str(exc).splitlines()[0][:70]}")
        del held  # PyTorch caches the freed segments in the pool
        try:
            big = torch.ones(200 * MiB, dtype=torch.uint8, device="cuda")
            probe = big[::4096]  # a strided view: checking it allocates kilobytes under the limit
            assert int(probe.sum(dtype=torch.int64)) == probe.numel() and int(big[-1]) == 1
            print(f"200 MiB after freeing them: fits and reads back (core: {core_name()})")
            del big, probe
        except torch.cuda.OutOfMemoryError:
            # only where PyTorch got ctypes callbacks, which must take the GIL: the Python build, or
            # past the compiled build's 64 C pairs in one process
            assert not mp.mrkit.queues_frees, "C callbacks: PyTorch's cached segments go back"
            print("200 MiB after freeing them: refused (ctypes callbacks leave them cached in PyTorch's pool)")
    mrkit.torch.apply_queued_frees()
    assert limit.used_bytes == mp.mrkit.live_bytes <= 256 * MiB  # all mrkit holds is PyTorch's segments
    print(f"mrkit holds {limit.used_bytes // MiB} MiB for PyTorch's pool, within the limit")
