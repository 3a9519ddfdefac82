"""The same load through both fronts of one coordinator: gRPC and the
OpenAI-compatible HTTP API, compared in one run.

Starts a coordinator and one CPU worker on the demo model (127.0.0.1), then
runs chunkattn-loadgen's workload (Poisson arrivals, a shared prefix, greedy
ignore_eos completions) through each front in turn, alternating the order
each repeat, each run in a fresh cache namespace with the same prompts.
Reports per front the median over repeats of normalized latency, TTFT,
inter-token latency and throughput, the HTTP/gRPC ratios, and whether both
fronts returned the same tokens (loadgen's completion digest).

  /usr/bin/python3 bench/fronts.py --json bench/results/fronts-cpu-2core.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid

from run_info import machine_info, write_result

METRICS = [('normalized_latency_ms_per_token', 'normalized latency (ms/token)'),
           ('ttft_p50_ms', 'TTFT p50 (ms)'), ('ttft_p99_ms', 'TTFT p99 (ms)'),
           ('itl_p50_ms', 'inter-token p50 (ms)'), ('itl_p99_ms', 'inter-token p99 (ms)'),
           ('throughput_tokens_per_s', 'throughput (tokens/s)')]


def run_loadgen(binary, cluster, front, args, json_path):
    """One chunkattn-loadgen run of `args` (rate, requests, np, ns, nc, seed)
    through `front` ('grpc' or 'http') in a fresh cache namespace: its JSON row.
    bench/e2e_sweep.py runs its grid through this too."""
    cmd = [binary, '--server', '127.0.0.1:%d' % cluster.port, '--rate', str(args.rate),
           '--requests', str(args.requests), '--np', str(args.np), '--ns', str(args.ns), '--nc', str(args.nc),
           '--seed', str(args.seed), '--cache_namespace', 'run-%s-%s' % (front, uuid.uuid4().hex[:12]),
           '--json', json_path]
    if front == 'http':
        cmd += ['--http', 'http://127.0.0.1:%d' % cluster.http_port]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError('%s failed (%d):\n%s\n%s' % (' '.join(cmd), out.returncode, out.stdout, out.stderr))
    with open(json_path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--source', default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument('--build', default=None)
    p.add_argument('--rate', type=float, default=12)
    p.add_argument('--requests', type=int, default=96)
    p.add_argument('--np', type=int, default=512)
    p.add_argument('--ns', type=int, default=384)
    p.add_argument('--nc', type=int, default=32)
    p.add_argument('--seed', type=int, default=11)
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--json', default='')
    args = p.parse_args()
    if args.repeats < 1:
        p.error('--repeats must be >= 1')
    args.build = os.path.abspath(args.build or os.path.join(args.source, 'build'))
    sys.path.insert(0, os.path.join(args.source, 'tests', 'services'))
    import harness  # noqa: E402 (from --source)
    harness.setup(args.source, args.build)
    binary = harness.bin_path('chunkattn-loadgen')
    cluster = harness.Cluster('fronts-bench', tp=1)
    runs = {'grpc': [], 'http': []}
    try:
        cluster.start()
        with tempfile.TemporaryDirectory() as d:
            # One unmeasured warm-up run: first-touch costs belong to neither front.
            run_loadgen(binary, cluster, 'grpc', argparse.Namespace(**dict(vars(args), requests=4)),
                        os.path.join(d, 'warm.json'))
            for r in range(args.repeats):
                for front in (('grpc', 'http') if r % 2 == 0 else ('http', 'grpc')):
                    row = run_loadgen(binary, cluster, front, args, os.path.join(d, '%s-%d.json' % (front, r)))
                    runs[front].append(row)
                    print('repeat %d %-4s: %.2f ms/token, TTFT p50 %.1f ms, %.1f tokens/s' % (
                        r, front, row['normalized_latency_ms_per_token'], row['ttft_p50_ms'],
                        row['throughput_tokens_per_s']), flush=True)
    finally:
        cluster.stop()
    digests = {row['completion_digest'] for rows in runs.values() for row in rows}
    medians = {front: {key: statistics.median(row[key] for row in rows) for key, _ in METRICS}
               for front, rows in runs.items()}
    print('\n| metric (median of %d) | gRPC | HTTP | HTTP / gRPC |' % args.repeats)
    print('|---|---|---|---|')
    for key, label in METRICS:
        g, h = medians['grpc'][key], medians['http'][key]
        print('| %s | %.2f | %.2f | %.2fx |' % (label, g, h, h / g if g else float('nan')))
    same = len(digests) == 1
    print('same completions through both fronts: %s' % ('yes' if same else 'NO (%d digests)' % len(digests)))
    if args.json:
        doc = dict(machine_info(args.source, ' '.join([sys.executable] + sys.argv)), benchmark='fronts',
                   model='demo', rate=args.rate, requests=args.requests, np=args.np, ns=args.ns, nc=args.nc,
                   seed=args.seed, repeats=args.repeats, medians=medians,
                   ratios_http_over_grpc={k: medians['http'][k] / medians['grpc'][k] for k, _ in METRICS
                                          if medians['grpc'][k]},
                   same_completions=same, runs=runs)
        write_result(args.json, doc)
    return 0 if same else 1


if __name__ == '__main__':
    sys.exit(main())
