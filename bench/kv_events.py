"""What publishing KV-cache events costs the coordinator, and their rate.

Runs the same chunkattn-loadgen workload (shared-prefix prompts, Poisson
arrivals, a KV pool capped so chunks are evicted all along) on a coordinator
and one CPU worker (127.0.0.1) with KV events off, then on (a ZMQ PUB and a
replay socket on ipc://, a subscriber that reads every message), alternating
the order over --repeats. From the coordinator's own metrics it reports:

  - the engine loop's time making events (chunkattn_kv_events_publish_seconds_total:
    the tree's changes turned into events, block hashes included; msgpack
    and ZMQ run on the publisher's thread) as a share of the step time
    (chunkattn_step_duration_seconds);
  - the mean step time and the workload's throughput, events on over off;
  - blocks stored and removed, batches and bytes per second.

Medians over the repeats. Prints a table and writes JSON with the machine,
the commit and the command:

  /usr/bin/python3 bench/kv_events.py --json bench/results/kv-events-cpu-2core.json
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading

from fronts import run_loadgen
from run_info import machine_info, write_result


class Subscriber:
    """A ZMQ SUB reading every message (as a router would), counting them."""

    def __init__(self, endpoint):
        import zmq
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b'')
        self.socket.setsockopt(zmq.RCVTIMEO, 200)
        self.socket.connect(endpoint)
        self.messages = 0
        self.bytes = 0
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        import zmq
        while not self.stop:
            try:
                frames = self.socket.recv_multipart()
            except zmq.Again:
                continue
            self.messages += 1
            self.bytes += sum(len(f) for f in frames)

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        self.socket.close(linger=0)
        self.context.term()


def one_run(harness, binary, args, events, folder):
    coordinator_args = ['--chunk_size', str(args.chunk_size), '--max_kv_chunks', str(args.max_kv_chunks)]
    if events:
        coordinator_args += ['--kv_events_endpoint', 'ipc://%s/pub' % folder,
                             '--kv_events_replay_endpoint', 'ipc://%s/replay' % folder]
    cluster = harness.Cluster('kv-events-bench-' + ('on' if events else 'off'), tp=1,
                              coordinator_args=coordinator_args)
    subscriber = None
    try:
        cluster.start()
        if events:
            subscriber = Subscriber('ipc://%s/pub' % folder)
        run_loadgen(binary, cluster, 'grpc', argparse.Namespace(**dict(vars(args), requests=4)),
                    os.path.join(folder, 'warm.json'))
        before = harness.scrape_metrics(cluster.metrics_port)
        row = run_loadgen(binary, cluster, 'grpc', args, os.path.join(folder, 'run.json'))
        after = harness.scrape_metrics(cluster.metrics_port)
    finally:
        if subscriber is not None:
            subscriber.close()
        cluster.stop()

    def delta(name, **labels):
        return after.value(name, **labels) - before.value(name, **labels)

    steps = delta('chunkattn_step_duration_seconds_count')
    step_s = delta('chunkattn_step_duration_seconds_sum')
    seconds = row['wall_s']
    out = dict(events=events, steps=steps, step_seconds=step_s, mean_step_ms=1e3 * step_s / max(steps, 1),
               duration_s=seconds, output_tokens_per_s=row['throughput_tokens_per_s'],
               normalized_latency_ms_per_token=row['normalized_latency_ms_per_token'],
               evicted_chunks=delta('chunkattn_kv_evicted_chunks_total'))
    if events:
        publish_s = delta('chunkattn_kv_events_publish_seconds_total')
        stored = delta('chunkattn_kv_event_blocks_total', event='stored')
        removed = delta('chunkattn_kv_event_blocks_total', event='removed')
        out.update(publish_seconds=publish_s, publish_share_of_step_time=publish_s / max(step_s, 1e-9),
                   publish_us_per_step=1e6 * publish_s / max(steps, 1),
                   publish_us_per_block=1e6 * publish_s / max(stored + removed, 1),
                   blocks_stored=stored, blocks_removed=removed,
                   batches=delta('chunkattn_kv_event_batches_total'),
                   blocks_per_s=(stored + removed) / seconds,
                   batches_per_s=delta('chunkattn_kv_event_batches_total') / seconds,
                   subscriber_messages=subscriber.messages, subscriber_bytes_per_s=subscriber.bytes / seconds)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--source', default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument('--build', default=None)
    p.add_argument('--rate', type=float, default=16)
    p.add_argument('--requests', type=int, default=128)
    p.add_argument('--np', type=int, default=512)
    p.add_argument('--ns', type=int, default=256)
    p.add_argument('--nc', type=int, default=16)
    p.add_argument('--seed', type=int, default=5)
    p.add_argument('--chunk_size', type=int, default=16)
    p.add_argument('--max_kv_chunks', type=int, default=512)
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
    runs = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix='kv-events-bench-') as folder:
        for r in range(args.repeats):
            for events in ((False, True) if r % 2 == 0 else (True, False)):
                runs[events].append(one_run(harness, binary, args, events, folder))
                x = runs[events][-1]
                print('repeat %d, events %-3s: %d steps, mean step %.2f ms, %.1f tokens/s%s' % (
                    r, 'on' if events else 'off', x['steps'], x['mean_step_ms'], x['output_tokens_per_s'],
                    ', publish %.3f%% of step time, %.0f blocks/s' % (100 * x['publish_share_of_step_time'],
                                                                      x['blocks_per_s']) if events else ''),
                      flush=True)

    def med(events, key):
        return statistics.median(x[key] for x in runs[events])

    summary = dict(
        publish_share_of_step_time=med(True, 'publish_share_of_step_time'),
        publish_us_per_step=med(True, 'publish_us_per_step'),
        publish_us_per_block=med(True, 'publish_us_per_block'),
        mean_step_ms_on_over_off=med(True, 'mean_step_ms') / med(False, 'mean_step_ms'),
        tokens_per_s_on_over_off=med(True, 'output_tokens_per_s') / med(False, 'output_tokens_per_s'),
        blocks_per_s=med(True, 'blocks_per_s'), batches_per_s=med(True, 'batches_per_s'),
        subscriber_bytes_per_s=med(True, 'subscriber_bytes_per_s'),
        blocks_stored=med(True, 'blocks_stored'), blocks_removed=med(True, 'blocks_removed'),
        evicted_chunks=med(True, 'evicted_chunks'))
    print()
    print('%-44s %12s' % ('KV events (medians of %d)' % args.repeats, ''))
    print('-' * 58)
    print('%-44s %11.3f%%' % ('loop time making events / step time', 100 * summary['publish_share_of_step_time']))
    print('%-44s %12.1f' % ('  per step, microseconds', summary['publish_us_per_step']))
    print('%-44s %12.2f' % ('  per block stored or removed, microseconds', summary['publish_us_per_block']))
    print('%-44s %12.3f' % ('mean step time, on / off', summary['mean_step_ms_on_over_off']))
    print('%-44s %12.3f' % ('output tokens/s, on / off', summary['tokens_per_s_on_over_off']))
    print('%-44s %12.0f' % ('blocks stored + removed per s', summary['blocks_per_s']))
    print('%-44s %12.1f' % ('batches per s', summary['batches_per_s']))
    print('%-44s %12.0f' % ('bytes per s to a subscriber', summary['subscriber_bytes_per_s']))
    print('%-44s %12.0f' % ('blocks stored / removed per run', summary['blocks_stored']))
    print('%-44s %12.0f' % ('', summary['blocks_removed']))
    if args.json:
        doc = machine_info(args.source, ' '.join(['/usr/bin/python3'] + sys.argv))
        doc.update(benchmark='kv_events', parameters={k: v for k, v in vars(args).items()
                                                       if k not in ('source', 'build', 'json')},
                   summary=summary, runs_off=runs[False], runs_on=runs[True])
        write_result(args.json, doc)


if __name__ == '__main__':
    main()
