"""PyTorch training steps with mrkit as PyTorch's allocator beside PyTorch's own, each configuration
in a fresh process (allocators are chosen before PyTorch's first allocation): a transformer encoder
(forward, backward, AdamW step), median ms per step after warm-up, PyTorch's peak reserved bytes and
the driver's peak device memory in use (``cuMemGetInfo``, sampled after every step), and the losses
(which must match PyTorch's own run to float32 rounding: within 1e-5 relative).

    python benchmarks/bench_torch_training.py [--steps 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "torch caching": {},
    "torch expandable segments": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "mrkit pool (install)": {},
    "mrkit vmm (install)": {},
    "mrkit pool (MemPool)": {},
}


def one(config: str, steps: int) -> dict:
    import torch
    import mrkit
    import mrkit.torch as mt
    ctx = None
    if config == "mrkit pool (install)":
        mt.install(mrkit.PoolResource(mrkit.DeviceMemoryResource(0)))
    elif config == "mrkit vmm (install)":
        mt.install(mrkit.VirtualMemoryResource(0))
    elif config == "mrkit pool (MemPool)":
        ctx = mt.pool(mrkit.PoolResource(mrkit.DeviceMemoryResource(0)))
    base = torch.cuda.mem_get_info()
    used0 = base[1] - base[0]
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    if ctx is not None:
        ctx.__enter__()
    model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True),
                                        num_layers=4).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 512, 1024, device="cuda")
    times, losses, peak = [], [], 0
    for i in range(steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss))
        free, total = torch.cuda.mem_get_info()
        peak = max(peak, total - free - used0)
    if ctx is not None:
        ctx.__exit__(None, None, None)
    try:  # PyTorch keeps no statistics when the whole allocator is replaced (install)
        reserved = torch.cuda.max_memory_reserved()
    except RuntimeError:
        reserved = None
    return {"config": config, "ms_per_step": statistics.median(times), "peak_device_bytes": peak,
            "torch_max_reserved": reserved, "losses": losses}


def loss_difference(a: list, b: list) -> float:
    """The largest relative difference between two runs' losses (GPU kernels may sum in another order
    from run to run: PyTorch's own allocator, run twice, differs in the 7th digit)."""
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.config:
        print(json.dumps(one(args.config, args.steps)))
        return
    rows = []
    for name, env in CONFIGS.items():
        r = subprocess.run([sys.executable, __file__, "--config", name, "--steps", str(args.steps)],
                           capture_output=True, text=True, env=dict(os.environ, **env), timeout=300)
        try:
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            rows.append({"config": name, "error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]})
    ref = rows[0]
    print("| configuration | ms per step | peak device memory | vs PyTorch's caching | losses (largest relative difference) |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['config']} | failed: {r['error']} | | | |")
            continue
        print(f"| {r['config']} | {r['ms_per_step']:.2f} | {r['peak_device_bytes'] / 2**30:.2f} GiB | "
              f"{r['ms_per_step'] / ref['ms_per_step']:.2f}× time, "
              f"{r['peak_device_bytes'] / ref['peak_device_bytes']:.2f}× memory | "
              f"{'same' if loss_difference(r['losses'], ref['losses']) <= 1e-5 else 'DIFFERENT'} "
              f"({loss_difference(r['losses'], ref['losses']):.1e}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
