#!/usr/bin/env python3
"""PyTorch baselines for chunkattn-kernel-bench --device cuda: the paper's FlashAttn and Naive columns.

Each of `batch` sequences has its own dense KV of n_p tokens (no sharing: that is what these kernels can
do), one query token per sequence, as in one decode step of one layer:
  flashattn  torch.nn.functional.scaled_dot_product_attention with only the FlashAttention backend
             (falls back to the efficient backend where flash refuses the shape, and says so)
  naive      q @ K^T, softmax, @ V as three PyTorch ops (scores materialized)
Timing as in the C++ bench: CUDA events around the call alone, L2 flushed before every run (a buffer
four times its size rewritten), median of --repeat; the floor is the fewest bytes (each sequence's KV
once, Q and O) at the device-to-device copy bandwidth measured in the same run.

  python3 bench/torch_baseline.py --grid paper --json bench/results/cuda-h100-torch.json
"""

import argparse
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2048, help="prompt tokens per sequence (n_p)")
    p.add_argument("--ns", type=int, default=0, help="shared tokens (recorded only: dense KV cannot share)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=0, help="0 = heads (no GQA)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    p.add_argument("--impl", default="all", help="flashattn | naive | all (comma-separated)")
    p.add_argument("--grid", choices=["", "paper"], default="",
                   help="paper: n_p in 1024/2048/4096 x n_s in 0/1024/2048/4096 (n_s <= n_p)")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", default="", help="write a JSON array of results here")
    args = p.parse_args(argv)
    if args.kv_heads == 0:
        args.kv_heads = args.heads
    impls = ["flashattn", "naive"] if args.impl == "all" else args.impl.split(",")
    for i in impls:
        if i not in ("flashattn", "naive"):
            p.error(f"--impl: unknown {i!r}")
    args.impls = impls
    if args.heads % args.kv_heads or args.repeat < 1 or args.warmup < 0 or args.batch < 1 or args.np < 1:
        p.error("need heads % kv_heads == 0, repeat >= 1, warmup >= 0, batch >= 1, np >= 1")
    return args


def provenance(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*a):
        try:
            return subprocess.run(["git", "-C", root, *a], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    # $CHUNKATTN_COMMIT names the commit where the checkout has no .git (a GPU host).
    commit = os.environ.get("CHUNKATTN_COMMIT", "")
    if not commit:
        commit = git("rev-parse", "HEAD") or "unknown"
        if git("status", "--porcelain", "--untracked-files=no"):
            commit += "-dirty"
    return {
        "machine": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "commit": commit,
        "command": " ".join(shlex.quote(a) for a in [sys.argv[0], *argv]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv):
    args = parse_args(argv)
    import torch  # imported late so --help works without it
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("no CUDA device visible", file=sys.stderr)
        return 2
    dev = torch.device("cuda:0")
    props = torch.cuda.get_device_properties(dev)
    device_name = f"cuda: {props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs (torch {torch.__version__})"
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    flush = torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device=dev)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def time_us(fn, before=None):
        ts = []
        for i in range(args.warmup + args.repeat):
            if before:
                before()
            flush.fill_(i & 0xFF)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            if i >= args.warmup:
                ts.append(start.elapsed_time(stop) * 1e3)
        return statistics.median(ts), min(ts)

    # Device-to-device copy bandwidth: bytes read + written per second.
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy_us, _ = time_us(lambda: b.copy_(a))
    copy_gbps = 2 * a.numel() / (copy_us * 1e3)
    del a, b
    print(f"device: {device_name}\ncopy bandwidth: {copy_gbps:.1f} GB/s (device-to-device, read + write)")

    configs = []
    if args.grid == "paper":
        configs = [(np_, ns) for np_ in (1024, 2048, 4096) for ns in (0, 1024, 2048, 4096) if ns <= np_]
    else:
        configs = [(args.np, args.ns)]
    meta = provenance(argv)
    rows = []
    print(f"{'np':>6} {'ns':>6} {'batch':>5} {'heads':>5} {'kvh':>4} {'d':>4} {'impl':<10} {'median_us':>10} "
          f"{'GB/s':>8} {'floor_us':>9} {'max_diff':>9}")
    gen = torch.Generator(device=dev).manual_seed(1)
    for np_, ns in configs:
        B, H, KV, D = args.batch, args.heads, args.kv_heads, args.head_dim
        q = torch.randn(B, H, 1, D, device=dev, dtype=dtype, generator=gen)
        k = torch.randn(B, KV, np_, D, device=dev, dtype=dtype, generator=gen)
        v = torch.randn(B, KV, np_, D, device=dev, dtype=dtype, generator=gen)
        scale = 1.0 / math.sqrt(D)
        kx = k.repeat_interleave(H // KV, dim=1) if KV != H else k  # the naive path has no GQA
        vx = v.repeat_interleave(H // KV, dim=1) if KV != H else v
        ref = torch.softmax((q.float() @ kx.float().transpose(-1, -2)) * scale, dim=-1) @ vx.float()
        min_bytes = 2 * B * KV * np_ * D * q.element_size() + 2 * q.numel() * q.element_size()
        floor_us = min_bytes / (copy_gbps * 1e3)
        for impl in args.impls:
            backend = "flash"
            if impl == "flashattn":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                def run():
                    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=KV != H)

                try:
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        run()
                        med, lo = time_us(run)
                        out = run()
                except RuntimeError as e:
                    print(f"flash backend refused the shape ({e}); using the efficient backend", file=sys.stderr)
                    backend = "efficient"
                    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                        med, lo = time_us(run)
                        out = run()
            else:
                def run():
                    s = (q @ kx.transpose(-1, -2)) * scale
                    return torch.softmax(s.float(), dim=-1).to(dtype) @ vx

                med, lo = time_us(run)
                out = run()
            diff = (out.float() - ref).abs().max().item()
            gbps = min_bytes / (med * 1e3)
            print(f"{np_:>6} {ns:>6} {B:>5} {H:>5} {KV:>4} {D:>4} {impl:<10} {med:>10.1f} {gbps:>8.1f} "
                  f"{floor_us:>9.1f} {diff:>9.2e}")
            rows.append({**meta, "device": device_name, "impl": f"torch-{impl}", "sdpa_backend": backend if impl == "flashattn" else "",
                         "np": np_, "ns": ns, "batch": B, "heads": H, "kv_heads": KV, "head_dim": D,
                         "dtype": args.dtype, "median_us": round(med, 2), "min_us": round(lo, 2),
                         "min_bytes": min_bytes, "gbps": round(gbps, 2), "floor_us": round(floor_us, 2),
                         "copy_gbps": round(copy_gbps, 2), "max_diff_vs_fp32": diff, "repeat": args.repeat,
                         "l2_flushed": True, "dense_kv": True})
        del q, k, v, kx, vx, ref
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
