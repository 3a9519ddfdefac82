"""Normalized latency against request rate, prefix sharing on and off: the
ChunkAttention paper's Figure 7, on this machine's CPU with the demo model.

For sharing on, then off (--prefix_sharing=false), starts a coordinator and
one CPU worker (127.0.0.1), makes one unmeasured warm-up run, then runs
chunkattn-loadgen at each rate: Poisson arrivals, prompts of n_p tokens whose
first n_s are shared, n_c greedy tokens each, every run in a fresh namespace
with the same prompts. Prints normalized latency and TTFT per rate side by
side and writes the loadgen rows as one JSON list (bench/plot.py charts it).

  /usr/bin/python3 bench/e2e_sweep.py --json bench/results/e2e-cpu-2core.json
"""
import argparse
import os
import sys
import tempfile

from fronts import run_loadgen
from run_info import write_result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--source', default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument('--build', default=None)
    p.add_argument('--rates', default='1,2,4,8', help='requests per second, comma-separated')
    p.add_argument('--requests', type=int, default=32)
    p.add_argument('--np', type=int, default=1024)
    p.add_argument('--ns', type=int, default=768)
    p.add_argument('--nc', type=int, default=32)
    p.add_argument('--seed', type=int, default=21)
    p.add_argument('--json', default='')
    args = p.parse_args()
    try:
        rates = [float(r) for r in args.rates.split(',')]
    except ValueError:
        p.error('--rates must be numbers separated by commas')
    if not rates or min(rates) <= 0:
        p.error('--rates must be positive')
    args.build = os.path.abspath(args.build or os.path.join(args.source, 'build'))
    sys.path.insert(0, os.path.join(args.source, 'tests', 'services'))
    import harness  # noqa: E402 (from --source)
    harness.setup(args.source, args.build)
    binary = harness.bin_path('chunkattn-loadgen')
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for sharing in ('on', 'off'):
            cluster = harness.Cluster('e2e-sweep-' + sharing, tp=1,
                                      coordinator_args=[] if sharing == 'on' else ['--prefix_sharing=false'])
            try:
                cluster.start()
                run_loadgen(binary, cluster, 'grpc', argparse.Namespace(**dict(vars(args), rate=rates[0], requests=4)),
                            os.path.join(d, 'warm.json'))
                for rate in rates:
                    row = run_loadgen(binary, cluster, 'grpc', argparse.Namespace(**dict(vars(args), rate=rate)),
                                      os.path.join(d, 'run.json'))
                    rows.append(row)
                    print('sharing %-3s %5.2f req/s: %7.2f ms/token, TTFT p50 %7.1f ms, peak KV %d chunks' % (
                        sharing, rate, row['normalized_latency_ms_per_token'], row['ttft_p50_ms'],
                        row['peak_used_chunks']), flush=True)
            finally:
                cluster.stop()
    by = {(r['prefix_sharing'], r['rate']): r for r in rows}
    print('\n| rate (req/s) | ms/token, sharing on | ms/token, off | off / on | TTFT p50 on | TTFT p50 off |')
    print('|---|---|---|---|---|---|')
    for rate in rates:
        on, off = by[(True, rate)], by[(False, rate)]
        print('| %g | %.2f | %.2f | %.2fx | %.0f ms | %.0f ms |' % (
            rate, on['normalized_latency_ms_per_token'], off['normalized_latency_ms_per_token'],
            off['normalized_latency_ms_per_token'] / on['normalized_latency_ms_per_token'],
            on['ttft_p50_ms'], off['ttft_p50_ms']))
    if args.json:
        write_result(args.json, rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
