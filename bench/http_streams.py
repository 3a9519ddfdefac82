"""Concurrent streaming connections on the OpenAI-compatible HTTP front.

Starts a coordinator and one CPU worker on the demo model (127.0.0.1), then
for each concurrency level opens that many connections at once, each
streaming one /v1/completions request (distinct prompts, max_tokens fixed,
ignore_eos), and reports per level: streams completed, time to first token
p50/p99 (client side, from the request's send to its first text event),
generated tokens/s over the level, and the coordinator's RSS (now and its
peak, VmHWM). One asyncio loop drives every client socket.

  /usr/bin/python3 bench/http_streams.py --levels 1,64,1000 --json bench/results/http-streams-cpu-2core.json
"""
import argparse
import asyncio
import json
import os
import sys
import time

from run_info import machine_info, write_result


def rss_kib(pid):
    out = {}
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith(('VmRSS:', 'VmHWM:')):
                out[line.split(':')[0]] = int(line.split()[1])
    return out


def percentile(values, q):
    values = sorted(values)
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


async def one_stream(port, prompt, max_tokens, start_barrier):
    """(ok, ttft_s, tokens, error)."""
    body = json.dumps({'prompt': prompt, 'max_tokens': max_tokens, 'stream': True, 'ignore_eos': True,
                       'temperature': 0, 'stream_options': {'include_usage': True}}).encode()
    await start_barrier.wait()
    try:
        reader, writer = await asyncio.open_connection('127.0.0.1', port)
    except OSError as e:
        return False, None, 0, str(e)
    sent = time.monotonic()
    writer.write(b'POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n'
                 b'Content-Length: %d\r\n\r\n' % len(body) + body)
    await writer.drain()
    ttft, tokens, buf, done = None, 0, b'', False
    try:
        while not done:
            chunk = await asyncio.wait_for(reader.read(65536), timeout=600)
            if not chunk:
                break
            buf += chunk
            while b'\n\n' in buf:
                event, buf = buf.split(b'\n\n', 1)
                line = event[event.find(b'data: '):] if b'data: ' in event else b''
                if not line:
                    continue
                data = line[len(b'data: '):]
                if data == b'[DONE]':
                    done = True
                    break
                msg = json.loads(data)
                if 'error' in msg:
                    return False, ttft, tokens, msg['error']['message']
                if msg.get('usage'):
                    tokens = msg['usage']['completion_tokens']
                elif msg['choices'] and msg['choices'][0].get('text') and ttft is None:
                    ttft = time.monotonic() - sent
    except (asyncio.TimeoutError, OSError) as e:
        return False, ttft, tokens, repr(e)
    finally:
        writer.close()
    return done and tokens == max_tokens, ttft, tokens, None if done else 'no [DONE]'


async def level(port, n, words, max_tokens, pid, offset):
    barrier = asyncio.Event()
    tasks = [asyncio.create_task(one_stream(port, ' '.join(words[(offset + i) * 7 % (len(words) - 40):][:32]),
                                            max_tokens, barrier)) for i in range(n)]
    peak = [0]

    async def sample_rss():
        while True:
            peak[0] = max(peak[0], rss_kib(pid)['VmRSS'])
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample_rss())
    start = time.monotonic()
    barrier.set()
    results = await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    sampler.cancel()
    ok = [r for r in results if r[0]]
    ttfts = [r[1] for r in ok if r[1] is not None]
    errors = sorted({str(r[3]) for r in results if not r[0]})[:5]
    return dict(concurrency=n, completed=len(ok), failed=n - len(ok), errors=errors, seconds=elapsed,
                ttft_p50_ms=1000 * percentile(ttfts, 0.5) if ttfts else None,
                ttft_p99_ms=1000 * percentile(ttfts, 0.99) if ttfts else None,
                tokens_per_s=sum(r[2] for r in ok) / elapsed, rss_peak_mib=peak[0] / 1024)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--source', default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument('--build', default=None)
    p.add_argument('--levels', default='1,64,1000')
    p.add_argument('--max_tokens', type=int, default=16)
    p.add_argument('--repeats', type=int, default=3, help='runs per level; the table shows the median run')
    p.add_argument('--json', default='')
    args = p.parse_args()
    args.build = os.path.abspath(args.build or os.path.join(args.source, 'build'))
    sys.path.insert(0, os.path.join(args.source, 'tests', 'services'))
    import harness  # noqa: E402 (from --source)
    harness.setup(args.source, args.build)
    with open(os.path.join(args.source, 'data', 'demo', 'shakespeare.txt'), encoding='utf-8') as f:
        words = f.read().split()
    cluster = harness.Cluster('http-bench', tp=1, coordinator_args=['--max_waiting_requests', '0'])
    try:
        cluster.start()
        pid = cluster.coordinator.proc.pid
        idle = rss_kib(pid)
        rows = []
        offset = 0
        for n in [int(x) for x in args.levels.split(',')]:
            runs = []
            for _ in range(args.repeats):
                runs.append(asyncio.run(level(cluster.http_port, n, words, args.max_tokens, pid, offset)))
                offset += n
            runs.sort(key=lambda r: r['tokens_per_s'])
            row = dict(runs[len(runs) // 2], runs=runs)
            rows.append(row)
            print("%s" % row["errors"]); print('%6d streams: %d/%d completed, TTFT p50 %s ms p99 %s ms, %.0f tokens/s, coordinator RSS peak '
                  '%.1f MiB' % (n, row['completed'], n, '%.0f' % row['ttft_p50_ms'] if row['ttft_p50_ms'] else '-',
                                '%.0f' % row['ttft_p99_ms'] if row['ttft_p99_ms'] else '-', row['tokens_per_s'],
                                row['rss_peak_mib']), flush=True)
        after = rss_kib(pid)
        print('\n| streams | completed | TTFT p50 ms | TTFT p99 ms | tokens/s | RSS peak MiB |')
        print('|---|---|---|---|---|---|')
        for r in rows:
            print('| %d | %d | %.0f | %.0f | %.0f | %.1f |' % (r['concurrency'], r['completed'], r['ttft_p50_ms'] or 0,
                                                              r['ttft_p99_ms'] or 0, r['tokens_per_s'],
                                                              r['rss_peak_mib']))
        print('coordinator RSS: %.1f MiB idle before, %.1f MiB after, VmHWM %.1f MiB' % (
            idle['VmRSS'] / 1024, after['VmRSS'] / 1024, after['VmHWM'] / 1024))
        ok = all(r['failed'] == 0 for r in rows)
        if args.json:
            doc = dict(machine_info(args.source, ' '.join([sys.executable] + sys.argv)), benchmark='http_streams',
                       model='demo', max_tokens=args.max_tokens, repeats=args.repeats,
                       rss_idle_mib=idle['VmRSS'] / 1024, rss_after_mib=after['VmRSS'] / 1024,
                       rss_hwm_mib=after['VmHWM'] / 1024, levels=rows)
            write_result(args.json, doc)
        return 0 if ok else 1
    finally:
        cluster.stop()


if __name__ == '__main__':
    sys.exit(main())
