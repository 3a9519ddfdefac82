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

  /usr/bin/python3 bench/kv_tiers.py --json bench/results/kv-tiers-cpu-2core.json
"""
import argparse
import json
import os
import random
import sys
import tempfile
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
    p.add_argument('--configs', default='pool,tiers,unbounded')
    p.add_argument('--json', default='')
    args = p.parse_args()
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
    names = list(results)
    same = all(outputs[n] == outputs[names[0]] for n in names)
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
