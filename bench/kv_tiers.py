#!/usr/bin/python3
"""The KV tiers under the pool on a multi-turn workload whose working set is
many times the pool: per-tenant system prompts, conversations whose every
turn resends the whole history plus a new user message. Three clusters of
one CPU worker and a coordinator (127.0.0.1), the same requests in the same
order:

  pool        a KV pool --pool_mib big: what the pool evicts is recomputed
  tiers       the same pool over a host tier (--host_mib) and a disk tier
              (--disk_mib): what the pool evicts is loaded back
  unbounded   a pool that holds everything: the hit rate to aim for

The model is the 156M Llama shape of the CPU decode issue (hidden 1024, 8
layers, GQA 16/4, vocab 32000) with seeded dummy weights, so prefill costs
real time. Conversations take turns round-robin, one request at a time, so
between two turns of one conversation every other conversation passes
through the pool. Greedy outputs must be equal in all three; it prints the
prompt-token hit rate, TTFT p50/p90 and the tier counters per cluster, and
the goals' ratios.

Two more rows measure the issue's other goals:

  shared      two replicas (a coordinator and a worker each) sharing one
              redis-server on 127.0.0.1 (write-through): replica A runs every
              conversation's first turn, then replica B, new, runs the same
              requests: B loads A's blocks instead of recomputing them. Its
              hit rate and TTFT p50 against B alone (no shared tier).
  decode      a running batch (--decode_batch sequences decoding) while other
              requests arrive whose prefixes the host tier holds (loads) or
              the pool holds (no loads, the control): the batch's decode step
              time over the --decode_window steps from the arrivals on, the
              same number in both modes (median inter-token gap of its
              streams; the mean gap, which counts the steps that carry loads
              in full; the longest gap, the step carrying the most),
              loads / control, the goal being <= 1.05: the median of
              --repeats paired ratios, each pair in alternating order.
              --decode_max_loads N runs the coordinator with
              --kv_tier_max_loads_per_step N.
  decode_disk the same with a disk tier alone under the pool (no host
              tier): the arrivals' prefixes are read back from the disk
              tier's file while the batch decodes.

  /usr/bin/python3 bench/kv_tiers.py --json bench/results/kv-tiers-cpu-2core.json
  /usr/bin/python3 bench/kv_tiers.py --quick   # a small run that checks it works
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from run_info import machine_info, write_result

CONFIG_156M = {
    'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_size': 1024,
    'intermediate_size': 2816, 'num_hidden_layers': 8, 'num_attention_heads': 16,
    'num_key_value_heads': 4, 'vocab_size': 32000, 'max_position_embeddings': 8192,
    'rms_norm_eps': 1e-5, 'rope_theta': 10000.0, 'bos_token_id': 1, 'eos_token_id': 2,
    'tie_word_embeddings': False, 'torch_dtype': 'float32',
}


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))] if xs else float('nan')


def workload(args):
    """Per turn, per conversation: (namespace, new tokens of its user message)."""
    rng = random.Random(args.seed)
    systems = [[rng.randrange(3, 32000) for _ in range(args.system_len)] for _ in range(args.tenants)]
    users = [[[rng.randrange(3, 32000) for _ in range(args.user_len)] for _ in range(args.conversations)]
             for _ in range(args.turns)]
    return systems, users


def run(harness, pb, cluster, args, systems, users):
    """Runs every turn of every conversation; returns per-request rows and the outputs."""
    history = [list(systems[c % args.tenants]) for c in range(args.conversations)]
    rows, outputs = [], []
    for turn in range(args.turns):
        for c in range(args.conversations):
            history[c] += users[turn][c]
            req = harness.make_request(prompt_ids=history[c], namespace='tenant-%d' % (c % args.tenants),
                                       temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
            start = time.monotonic()
            ttft, tokens, usage = None, [], None
            for r in cluster.stub.Generate(req, timeout=600):
                if ttft is None:
                    ttft = time.monotonic() - start
                tokens.extend(r.token_ids)
                if r.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                    usage = r.usage
            rows.append(dict(turn=turn, conversation=c, prompt_tokens=usage.prompt_tokens,
                             cached_prompt_tokens=usage.cached_prompt_tokens, ttft_s=ttft,
                             total_s=time.monotonic() - start))
            outputs.append(tokens)
            history[c] += tokens
    return rows, outputs


def stream(pb, cluster, req, stamps=None):
    """Runs `req`: (ttft_s, tokens, usage); appends each response's arrival
    time to `stamps`."""
    start = time.monotonic()
    ttft, tokens, usage = None, [], None
    for r in cluster.stub.Generate(req, timeout=600):
        now = time.monotonic()
        if ttft is None:
            ttft = now - start
        if stamps is not None and r.token_ids:
            stamps.append(now)
        tokens.extend(r.token_ids)
        if r.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            usage = r.usage
    return ttft, tokens, usage


def start_redis(harness):
    port = harness.free_port()
    password = 'kv-tiers-bench-%d' % random.randrange(1 << 30)
    p = harness.Process('redis', ['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--requirepass',
                                  password, '--save', '', '--appendonly', 'no', '--maxmemory', '1gb',
                                  '--maxmemory-policy', 'allkeys-lru']).start()
    for _ in range(200):
        r = subprocess.run(['redis-cli', '-p', str(port), '-a', password, '--no-auth-warning', 'PING'],
                           capture_output=True, text=True, timeout=5)
        if r.stdout.strip() == 'PONG':
            return p, 'redis://:%s@127.0.0.1:%d' % (password, port)
        time.sleep(0.05)
    p.kill()
    raise RuntimeError('redis-server did not answer (scripts/install-deps.sh installs it)')


def run_shared(harness, pb, args, model, systems, users):
    """Replica A computes every conversation's first turn; replica B (new)
    then runs the same requests, with the shared tier and without it."""
    redis, url = start_redis(harness)
    reqs = []
    for c in range(args.conversations):
        prompt = list(systems[c % args.tenants]) + users[0][c]
        reqs.append(harness.make_request(prompt_ids=prompt, namespace='tenant-%d' % (c % args.tenants),
                                         temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True))
    url_file = os.path.join(os.path.dirname(model), 'kv-store-url')
    with open(os.open(url_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'w') as f:
        f.write(url + '\n')
    common = ['--load_format', 'dummy', '--kv_tier_write_policy', 'write_through']
    worker = ['--threads', str(args.threads), '--kv_cache_mib', str(args.pool_mib)]
    out, outputs = {}, {}
    try:
        for name, shared in (('A', True), ('B', True), ('B-alone', False)):
            cluster = harness.Cluster('kv-tiers-shared-' + name, model=model, worker_args=worker,
                                      coordinator_args=common + (['--kv_store_url_file', url_file] if shared else []))
            try:
                cluster.start()
                before = cluster.metrics()
                rows, outputs[name] = [], []
                for req in reqs:
                    ttft, tokens, usage = stream(pb, cluster, req)
                    rows.append((ttft, usage.prompt_tokens, usage.cached_prompt_tokens))
                    outputs[name].append(tokens)
                after = cluster.metrics()
            finally:
                cluster.stop()
            out[name] = dict(
                hit_rate=sum(r[2] for r in rows) / sum(r[1] for r in rows),
                ttft_p50_ms=1000 * percentile([r[0] for r in rows], 50),
                shared_loads=after.value('chunkattn_kv_tier_loads_total', tier='shared') -
                before.value('chunkattn_kv_tier_loads_total', tier='shared'),
                shared_stores=after.value('chunkattn_kv_tier_shared_stores_total') -
                before.value('chunkattn_kv_tier_shared_stores_total'))
            print('shared %-8s hit rate %5.1f%%, TTFT p50 %7.0f ms, shared loads %d, stores %d' % (
                name, 100 * out[name]['hit_rate'], out[name]['ttft_p50_ms'], out[name]['shared_loads'],
                out[name]['shared_stores']), flush=True)
    finally:
        redis.kill()
    b, alone = out['B'], out['B-alone']
    return dict(config='shared', requests=len(reqs), replica_a=out['A'], replica_b=b, replica_b_alone=alone,
                hit_rate=b['hit_rate'], hit_rate_alone=alone['hit_rate'], ttft_p50_ms=b['ttft_p50_ms'],
                ttft_p50_alone_ms=alone['ttft_p50_ms'], ttft_p50_speedup=alone['ttft_p50_ms'] / b['ttft_p50_ms'],
                outputs_equal=outputs['A'] == outputs['B'] == outputs['B-alone'])


def run_decode(harness, pb, args, model, disk_dir=None):
    """The running batch's decode step time while other requests arrive whose
    prefixes are loaded from the host tier (or with `disk_dir`, from a disk
    tier alone), against the same arrivals with their prefixes in the pool
    (no loads)."""
    tier = 'disk' if disk_dir else 'host'
    rng = random.Random(args.seed + 1)
    chunk = 64
    prefixes = [[rng.randrange(3, 32000) for _ in range(args.decode_prefix_chunks * chunk)]
                for _ in range(args.decode_arrivals)]
    # Enough filler prompts to pass the whole pool (a 156M chunk is 1 MiB)
    # through, pushing the prefixes into the host tier, which holds them all.
    fillers = [[rng.randrange(3, 32000) for _ in range(args.system_len)]
               for _ in range(args.decode_pool_mib // max(1, args.system_len // chunk) + 4)]
    tier_args = (['--disk_kv_cache_dir', disk_dir, '--disk_kv_cache_mib', str(4 * args.decode_pool_mib)]
                 if disk_dir else ['--host_kv_cache_mib', str(4 * args.decode_pool_mib)])
    bound = ['--kv_tier_max_loads_per_step', str(args.decode_max_loads)] if args.decode_max_loads >= 0 else []
    cluster = harness.Cluster('kv-tiers-decode-' + tier, model=model,
                              coordinator_args=['--load_format', 'dummy'] + bound,
                              worker_args=['--threads', str(args.threads), '--kv_cache_mib', str(args.decode_pool_mib)]
                              + tier_args)
    # Per repeat and mode, the window's median batch gap and its mean: the
    # mean counts the few steps that carry loads in full (over the same
    # number of steps in both modes, it is the batch's progress), the median
    # shows the typical step.
    ratios, mean_ratios, gaps, means = [], [], {'loads': [], 'pool': []}, {'loads': [], 'pool': []}
    # And the window's longest gap: the step that carries the most loads.
    max_ratios, maxes = [], {'loads': [], 'pool': []}
    loads_seen = 0.0
    try:
        cluster.start()
        one = lambda prompt, ns, n=1: stream(pb, cluster, harness.make_request(  # noqa: E731
            prompt_ids=prompt, namespace=ns, temperature=0.0, max_new_tokens=n, ignore_eos=True))
        for rep in range(args.repeats):
            # Alternating which goes first, so the VM's drift within a repeat favours neither.
            for mode in ('loads', 'pool') if rep % 2 == 0 else ('pool', 'loads'):
                ns = 'decode-%d-%s' % (rep, mode)
                for p in prefixes:  # cached ...
                    one(p, ns)
                if mode == 'loads':  # ... then pushed out of the pool into the tier
                    for f in fillers:
                        one(f, ns + '-filler')
                before = cluster.metrics()
                stamps = [[] for _ in range(args.decode_batch)]
                batch = [threading.Thread(target=stream, args=(pb, cluster, harness.make_request(
                    prompt_ids=[rng.randrange(3, 32000) for _ in range(32)], namespace=ns + '-batch',
                    temperature=0.0, max_new_tokens=args.decode_tokens, ignore_eos=True), stamps[i]))
                    for i in range(args.decode_batch)]
                for t in batch:
                    t.start()
                while min(len(s) for s in stamps) < 8:  # the batch is decoding
                    time.sleep(0.01)
                t0 = time.monotonic()
                arrivals = [threading.Thread(target=one, args=(p + [rng.randrange(3, 32000)], ns))
                            for p in prefixes]
                for t in arrivals:
                    t.start()
                for t in arrivals:
                    t.join()
                t1 = time.monotonic()
                for t in batch:
                    t.join()
                after = cluster.metrics()
                loads = after.value('chunkattn_kv_tier_loads_total', tier=tier) - \
                    before.value('chunkattn_kv_tier_loads_total', tier=tier)
                if mode == 'loads':
                    loads_seen += loads
                # The same number of steps in both modes, from the arrivals on:
                # a window that ends with the arrivals would hold their prefill
                # step and little else without loads, and that step plus pure
                # decode steps with them (the loads spread over steps).
                window, late = [], 0
                for s in stamps:
                    ends = [i for i in range(1, len(s)) if s[i] >= t0][:args.decode_window]
                    window += [s[i] - s[i - 1] for i in ends]
                    late += len(ends) < args.decode_window or s[ends[-1]] < t1
                if late:
                    print('decode (%s) repeat %d %s: %d streams\' windows ended before the arrivals did '
                          '(raise --decode_window)' % (tier, rep, mode, late), flush=True)
                gaps[mode].append(statistics.median(window) if window else float('nan'))
                means[mode].append(statistics.mean(window) if window else float('nan'))
                maxes[mode].append(max(window) if window else float('nan'))
                print('decode (%s) repeat %d %-5s: %d batch gaps while %d arrivals ran, median %.1f ms, mean %.1f, '
                      'max %.1f; %s loads %d' % (tier, rep, mode, len(window), len(prefixes), 1000 * gaps[mode][-1],
                                                 1000 * means[mode][-1], 1000 * maxes[mode][-1], tier, loads),
                      flush=True)
            ratios.append(gaps['loads'][-1] / gaps['pool'][-1])  # the paired repeat's
            mean_ratios.append(means['loads'][-1] / means['pool'][-1])
            max_ratios.append(maxes['loads'][-1] / maxes['pool'][-1])
    finally:
        cluster.stop()
    return dict(config='decode_disk' if disk_dir else 'decode', tier=tier, decode_batch=args.decode_batch,
                arrivals=args.decode_arrivals, arrival_prefix_chunks=args.decode_prefix_chunks, repeats=args.repeats,
                max_loads_per_step=args.decode_max_loads, window_steps=args.decode_window,
                step_ms_with_loads=1000 * statistics.median(gaps['loads']),
                step_ms_without_loads=1000 * statistics.median(gaps['pool']),
                step_ratio=statistics.median(ratios), step_ratios=ratios,
                mean_step_ms_with_loads=1000 * statistics.median(means['loads']),
                mean_step_ms_without_loads=1000 * statistics.median(means['pool']),
                mean_step_ratio=statistics.median(mean_ratios), mean_step_ratios=mean_ratios,
                max_step_ms_with_loads=1000 * statistics.median(maxes['loads']),
                max_step_ms_without_loads=1000 * statistics.median(maxes['pool']),
                max_step_ratio=statistics.median(max_ratios), max_step_ratios=max_ratios, loads=loads_seen)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--source', default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument('--build', default=None)
    p.add_argument('--tenants', type=int, default=4)
    p.add_argument('--conversations', type=int, default=16)
    p.add_argument('--turns', type=int, default=4)
    p.add_argument('--system_len', type=int, default=512)
    p.add_argument('--user_len', type=int, default=64)
    p.add_argument('--new_tokens', type=int, default=8)
    p.add_argument('--pool_mib', type=int, default=32, help='the pool (a 156M chunk is 1 MiB)')
    p.add_argument('--host_mib', type=int, default=160)
    p.add_argument('--disk_mib', type=int, default=512)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--seed', type=int, default=5)
    p.add_argument('--configs', default='pool,tiers,unbounded,shared,decode,decode_disk')
    p.add_argument('--decode_batch', type=int, default=8, help='decode: sequences decoding while loads happen')
    p.add_argument('--decode_tokens', type=int, default=96, help='decode: tokens each batch sequence generates')
    p.add_argument('--decode_arrivals', type=int, default=4, help='decode: requests arriving during the batch')
    p.add_argument('--decode_prefix_chunks', type=int, default=8, help='decode: cached chunks of each arrival')
    p.add_argument('--decode_pool_mib', type=int, default=96, help='decode: the pool (the batch and the prefixes)')
    p.add_argument('--decode_window', type=int, default=8,
                   help='decode: batch steps measured from the arrivals on, the same in both modes')
    p.add_argument('--decode_max_loads', type=int, default=-1,
                   help='decode: the coordinator\'s --kv_tier_max_loads_per_step (-1: its default)')
    p.add_argument('--repeats', type=int, default=7, help='decode rows: paired repeats (the median ratio)')
    p.add_argument('--quick', action='store_true', help='a small, fast run that checks the script works')
    p.add_argument('--json', default='')
    args = p.parse_args()
    if args.quick:
        args.conversations, args.turns, args.system_len, args.user_len = 4, 2, 128, 16
        args.new_tokens, args.decode_batch, args.decode_tokens, args.decode_arrivals = 2, 2, 24, 2
        args.decode_prefix_chunks, args.decode_pool_mib, args.repeats = 2, 32, 1
    args.build = os.path.abspath(args.build or os.path.join(args.source, 'build'))
    sys.path.insert(0, os.path.join(args.source, 'tests', 'services'))
    import harness  # noqa: E402 (from --source)
    harness.setup(args.source, args.build)
    pb = harness.pb
    systems, users = workload(args)
    results, outputs = {}, {}
    with tempfile.TemporaryDirectory(prefix='chunkattn-kv-tiers-bench-') as d:
        model = os.path.join(d, 'model')
        os.mkdir(model)
        with open(os.path.join(model, 'config.json'), 'w') as f:
            json.dump(CONFIG_156M, f)
        disk = os.path.join(d, 'disk')
        os.mkdir(disk)
        worker = {'pool': ['--kv_cache_mib', str(args.pool_mib)],
                  'tiers': ['--kv_cache_mib', str(args.pool_mib), '--host_kv_cache_mib', str(args.host_mib),
                            '--disk_kv_cache_dir', disk, '--disk_kv_cache_mib', str(args.disk_mib)],
                  'unbounded': ['--kv_cache_mib', '4096']}
        for name in args.configs.split(','):
            if name == 'shared':
                results[name] = run_shared(harness, pb, args, model, systems, users)
                continue
            if name in ('decode', 'decode_disk'):
                results[name] = run_decode(harness, pb, args, model, disk if name == 'decode_disk' else None)
                continue
            cluster = harness.Cluster('kv-tiers-' + name, model=model, coordinator_args=['--load_format', 'dummy'],
                                      worker_args=['--threads', str(args.threads)] + worker[name])
            try:
                cluster.start()
                before = cluster.metrics()
                rows, outputs[name] = run(harness, pb, cluster, args, systems, users)
                after = cluster.metrics()
            finally:
                cluster.stop()
            delta = lambda m, **l: after.value(m, **l) - before.value(m, **l)  # noqa: E731
            later = [r for r in rows if r['turn'] > 0]  # turn 0 is cold in every config
            res = dict(
                config=name, requests=len(rows),
                hit_rate=sum(r['cached_prompt_tokens'] for r in rows) / sum(r['prompt_tokens'] for r in rows),
                hit_rate_later_turns=(sum(r['cached_prompt_tokens'] for r in later) /
                                      max(1, sum(r['prompt_tokens'] for r in later))),
                ttft_p50_ms=1000 * percentile([r['ttft_s'] for r in later], 50),
                ttft_p90_ms=1000 * percentile([r['ttft_s'] for r in later], 90),
                prompt_tokens=sum(r['prompt_tokens'] for r in rows),
                host_loads=delta('chunkattn_kv_tier_loads_total', tier='host'),
                disk_loads=delta('chunkattn_kv_tier_loads_total', tier='disk'),
                stores=delta('chunkattn_kv_tier_stores_total'),
                demotions=delta('chunkattn_kv_tier_demotions_total'),
                failed_moves=delta('chunkattn_kv_tier_failed_moves_total'),
                evicted_chunks=delta('chunkattn_kv_evicted_chunks_total'),
                worker_args=worker[name])
            results[name] = res
            print('%-9s hit rate %5.1f%% (turns 2+: %5.1f%%), TTFT p50 %7.0f ms p90 %7.0f ms, loads %d host + %d '
                  'disk, stores %d, demotions %d, failed %d, evicted %d' % (
                      name, 100 * res['hit_rate'], 100 * res['hit_rate_later_turns'], res['ttft_p50_ms'],
                      res['ttft_p90_ms'], res['host_loads'], res['disk_loads'], res['stores'], res['demotions'],
                      res['failed_moves'], res['evicted_chunks']), flush=True)
    extra = {n: results.pop(n) for n in ('shared', 'decode', 'decode_disk') if n in results}
    names = list(results)
    same = all(outputs[n] == outputs[names[0]] for n in names) and extra.get('shared', {}).get('outputs_equal', True)
    print('\ngreedy outputs equal in every config: %s' % same)
    print('\n| config | hit rate | hit rate, turns 2+ | TTFT p50 | TTFT p90 | tier loads |')
    print('|---|---|---|---|---|---|')
    for n in names:
        r = results[n]
        print('| %s | %.1f%% | %.1f%% | %.0f ms | %.0f ms | %d |' % (
            n, 100 * r['hit_rate'], 100 * r['hit_rate_later_turns'], r['ttft_p50_ms'], r['ttft_p90_ms'],
            r['host_loads'] + r['disk_loads']))
    if {'pool', 'tiers', 'unbounded'} <= set(results):
        hit = results['tiers']['hit_rate'] / results['unbounded']['hit_rate']
        ttft = results['pool']['ttft_p50_ms'] / results['tiers']['ttft_p50_ms']
        print('\ngoals: hit rate with tiers / unbounded pool %.3f (>= 0.95); TTFT p50 pool alone / with tiers '
              '%.2fx (>= 3x)' % (hit, ttft))
        for r in results.values():
            r['hit_rate_vs_unbounded'] = r['hit_rate'] / results['unbounded']['hit_rate']
            r['ttft_p50_speedup_vs_pool'] = results['pool']['ttft_p50_ms'] / r['ttft_p50_ms']
    if 'shared' in extra:
        r = extra['shared']
        print('\n| two replicas, one Redis | hit rate | TTFT p50 |\n|---|---|---|')
        print('| replica B, its first requests on A\'s prefixes | %.1f%% | %.0f ms |' % (100 * r['hit_rate'],
                                                                                      r['ttft_p50_ms']))
        print('| replica B without the shared tier | %.1f%% | %.0f ms |' % (100 * r['hit_rate_alone'],
                                                                          r['ttft_p50_alone_ms']))
        print('goal: B loads A\'s blocks: TTFT p50 %.2fx better; outputs equal: %s' % (r['ttft_p50_speedup'],
                                                                                       r['outputs_equal']))
    for n in ('decode', 'decode_disk'):
        if n not in extra:
            continue
        r = extra[n]
        print('\ndecode step time of a batch of %d while %d requests arrive (%d %s loads over %d repeats, at most '
              '%s a step): median step %.1f ms with loads, %.1f ms with the prefixes in the pool: ratio %.3f; mean '
              'step %.1f and %.1f ms: ratio %.3f; longest step %.1f and %.1f ms: ratio %.3f (goal <= 1.05; ratios '
              'are the medians of the paired repeats\')' % (
                  r['decode_batch'], r['arrivals'], r['loads'], r['tier'], r['repeats'],
                  r['max_loads_per_step'] if r['max_loads_per_step'] > 0 else 'any number',
                  r['step_ms_with_loads'], r['step_ms_without_loads'], r['step_ratio'], r['mean_step_ms_with_loads'],
                  r['mean_step_ms_without_loads'], r['mean_step_ratio'], r['max_step_ms_with_loads'],
                  r['max_step_ms_without_loads'], r['max_step_ratio']))
    results.update(extra)
    if args.json:
        for r in results.values():
            r.update(machine_info(args.source, ' '.join(['/usr/bin/python3'] + sys.argv)))
            r.update(benchmark='kv_tiers', outputs_equal=same, tenants=args.tenants,
                     conversations=args.conversations, turns=args.turns, system_len=args.system_len,
                     user_len=args.user_len, new_tokens=args.new_tokens, pool_mib=args.pool_mib)
        write_result(args.json, list(results.values()))
    return 0 if same else 1


if __name__ == '__main__':
    sys.exit(main())
