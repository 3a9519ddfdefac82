"""The KV tiers under the pool through the public API: a worker whose pool
(32 chunks) holds less than the workload's system prompts (10 x 4 chunks)
keeps what it evicts in its host tier, then on disk, and loads it back: the
second round of requests finds its prompts cached where the same cluster
without tiers recomputes them, every greedy output equals the cluster's
without tiers, the tier metrics count the moves, and a tenant's blocks are
never another namespace's hit. The tiers are the `medium` of the KV events
and have their lines in GetCacheStats and `chunkattn stats`. A worker that
restarts comes back without its host tier, and the coordinator forgets it."""
import collections
import os
import random
import subprocess
import unittest

import harness

import kv_events_consumer as kv  # noqa: E402,I100

SYSTEMS = 10
SYSTEM_LEN = 256  # 4 chunks of 64
SUFFIX_LEN = 6
NEW_TOKENS = 6
POOL = ['--kv_cache_mib', '4']  # the demo model's chunk is 128 KiB: 32 chunks
CHUNK = 64
SYNC_S = 30


def kv_args(folder):
    """KV events on ipc:// sockets in `folder` (nothing listens on TCP)."""
    return ['--kv_events_endpoint', 'ipc://%s/pub' % folder, '--kv_events_replay_endpoint', 'ipc://%s/replay' % folder]


def start_consumer(case, folder):
    consumer = kv.KvEventConsumer('ipc://%s/pub' % folder, 'ipc://%s/replay' % folder, hash_seed='0',
                                  block_size=CHUNK).start()
    case.addCleanup(consumer.stop)
    return consumer


def sync(case, cluster, consumer):
    """The consumer brought to the stream's point of a GetKvBlocks."""
    n = cluster.stub.GetKvBlocks(harness.pb.GetKvBlocksRequest(), timeout=30).next_sequence_number
    if n > 0:
        case.assertTrue(consumer.wait_for_seq(n - 1, SYNC_S), 'the consumer is behind: %s' % consumer.stats())
    case.assertEqual(consumer.errors, [], 'the consumer found format or index errors')


def tier_stats(stats):
    return {t.tier: t for t in stats.tiers}


def run_rounds(case, cluster, systems, namespace, rounds=2):
    """Each round asks every system prompt once, one request at a time, with
    the same seeded suffixes in every call: outputs and cached prompt tokens
    per (round, system)."""
    out = {}
    rng = random.Random(7)
    for r in range(rounds):
        for i, system in enumerate(systems):
            prompt = system + harness.random_ids(rng, SUFFIX_LEN)
            req = harness.make_request(prompt_ids=prompt, namespace=namespace, temperature=0.0,
                                       max_new_tokens=NEW_TOKENS, ignore_eos=True)
            s = cluster.generate(req, timeout=120)[0]
            case.assertTrue(s.finished)
            out[(r, i)] = (s.tokens, s.cached_prompt_tokens)
    return out


class KvTiersTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.disk = harness.temp_dir('chunkattn-kv-tiers-')
        cls.plain = cls.start_cluster('tiers-off', worker_args=POOL)
        cls.events = harness.temp_dir('chunkattn-kv-tiers-events-')
        cls.tiered = cls.start_cluster('tiers-on', coordinator_args=kv_args(cls.events), worker_args=POOL + [
            '--host_kv_cache_mib', '2', '--disk_kv_cache_dir', cls.disk, '--disk_kv_cache_mib', '8'])

    def test_evicted_prefixes_load_back_with_the_same_outputs(self):
        rng = random.Random(1)
        systems = [harness.random_ids(rng, SYSTEM_LEN) for _ in range(SYSTEMS)]
        ns = harness.fresh_namespace('tiers')
        before = self.tiered.metrics()
        want = run_rounds(self, self.plain, systems, ns)
        got = run_rounds(self, self.tiered, systems, ns)
        for key in want:
            self.assertEqual(got[key][0], want[key][0], 'round %d system %d' % key)
        # Round 2: the pool alone lost the early prompts; the tiers kept them.
        plain_hits = sum(want[(1, i)][1] for i in range(SYSTEMS))
        tier_hits = sum(got[(1, i)][1] for i in range(SYSTEMS))
        self.assertGreaterEqual(tier_hits, 0.9 * SYSTEMS * (SYSTEM_LEN - 64),
                                'round 2 cached prompt tokens with tiers')
        self.assertLess(plain_hits, tier_hits)
        after = self.tiered.metrics()
        delta = lambda name, **l: after.value(name, **l) - before.value(name, **l)  # noqa: E731
        loads = delta('chunkattn_kv_tier_loads_total', tier='host') + delta('chunkattn_kv_tier_loads_total',
                                                                           tier='disk')
        self.assertGreater(loads, 0)
        self.assertGreater(delta('chunkattn_kv_tier_stores_total'), 0)
        self.assertGreater(after.value('chunkattn_kv_tier_slots', tier='host'), 0)
        self.assertGreater(after.value('chunkattn_kv_tier_slots', tier='disk'), 0)
        self.assertEqual(delta('chunkattn_kv_tier_failed_moves_total'), 0)
        self.assertEqual(self.plain.metrics().value('chunkattn_kv_tier_slots', tier='host'), 0)

        # Another tenant's namespace with the very same prompts: no tier (or
        # pool) block of the first is its hit.
        other = run_rounds(self, self.tiered, systems[:3], harness.fresh_namespace('tiers-other'), rounds=1)
        for i in range(3):
            self.assertEqual(other[(0, i)][1], 0, 'system %d in another namespace' % i)
            self.assertEqual(other[(0, i)][0], got[(0, i)][0])

    def test_tiers_are_the_kv_events_medium_and_in_cache_stats(self):
        """Blocks the pool evicts into a tier are reported in the KV events
        with the tier as their medium (CPU for the host tier, STORAGE for
        disk), by the hashes the pool published: a tier's block of a
        namespace is one of that namespace's chain, never another's. And
        GetCacheStats and `chunkattn stats` have a line per tier that agrees
        with the metrics."""
        consumer = start_consumer(self, self.events)
        sync(self, self.tiered, consumer)
        rng = random.Random(3)
        systems = [harness.random_ids(rng, SYSTEM_LEN) for _ in range(SYSTEMS)]
        namespaces = [harness.fresh_namespace('tier-events-a'), harness.fresh_namespace('tier-events-b')]
        own = {}  # namespace -> the published hashes of its system prompts' blocks
        for ns in namespaces:
            run_rounds(self, self.tiered, systems, ns, rounds=1)
            own[ns] = {h for system in systems
                       for h in kv.chain_hashes('0', [system[i:i + CHUNK] for i in range(0, SYSTEM_LEN, CHUNK)],
                                                salt=ns)[1]}
        self.assertFalse(own[namespaces[0]] & own[namespaces[1]], 'two namespaces share a hash')
        sync(self, self.tiered, consumer)
        self.assertGreater(consumer.stats()['tier_stored'], 0)
        tiers = consumer.tier_blocks()
        self.assertIn('CPU', tiers)
        seen = collections.Counter()
        for medium, by_ns in tiers.items():
            self.assertIn(medium, ('CPU', 'STORAGE'))  # no shared tier here
            for ns, counts in by_ns.items():
                if ns not in own:
                    continue  # an earlier test's block, demoted meanwhile
                stray = set(counts) - own[ns]
                self.assertEqual(stray, set(), '%s blocks of namespace %s that are not its own' % (medium, ns))
                seen[ns] += len(counts)
        for ns in namespaces:
            self.assertGreater(seen[ns], 0, 'no tier block of namespace %s was reported' % ns)

        # GetCacheStats per tier, as the metrics count them.
        stats = self.tiered.cache_stats()
        t = tier_stats(stats)
        self.assertEqual(sorted(t), ['disk', 'host'])
        self.assertEqual((t['host'].medium, t['disk'].medium), ('CPU', 'STORAGE'))
        m = self.tiered.metrics()
        chunk_bytes = self.tiered.model_info().kv_chunk_bytes
        for name in ('host', 'disk'):
            self.assertEqual(t[name].blocks, m.value('chunkattn_kv_tier_blocks', tier=name), name)
            self.assertEqual(t[name].capacity_blocks, m.value('chunkattn_kv_tier_slots', tier=name), name)
            self.assertEqual(t[name].bytes, t[name].blocks * chunk_bytes, name)
            self.assertEqual(t[name].loads_total, m.value('chunkattn_kv_tier_loads_total', tier=name), name)
            self.assertEqual(t[name].hits_total, t[name].loads_total, name)
            self.assertEqual(t[name].fallbacks_total, 0, name)
        self.assertGreater(t['host'].blocks, 0)
        self.assertGreater(t['host'].stores_total, 0)
        self.assertGreater(t['disk'].stores_total, 0)  # the host tier (16 blocks) demoted into it
        self.assertGreater(t['host'].loads_total + t['disk'].loads_total, 0)  # the first test's round 2
        self.assertEqual(t['host'].stores_total + t['disk'].stores_total,
                         m.value('chunkattn_kv_tier_stores_total') + m.value('chunkattn_kv_tier_demotions_total'))
        # The pool alone has no tier lines.
        self.assertEqual(list(self.plain.cache_stats().tiers), [])
        # The command line: a line per tier in `stats`, and in the live panel.
        cli = harness.bin_path('chunkattn')
        server = '127.0.0.1:%d' % self.tiered.port
        r = subprocess.run([cli, 'stats', '--server', server], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('tier.host.medium: CPU\n', r.stdout)
        self.assertRegex(r.stdout, r'(?m)^tier\.disk\.stores_total: [1-9]\d*$')
        r = subprocess.run([cli, 'stats', '--server', server, '--watch', '--count', '2', '--interval_s', '0.1'],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r'(?m)^host      [\d,]+ blocks of [\d,]+ \([\d,]+ MiB\); [\d,]+ hits, '
                                   r'[\d,]+ loads.*; [1-9][\d,]* stores, 0 fallbacks, [\d,]+ drops$')
        self.assertRegex(r.stdout, r'(?m)^disk      [\d,]+ blocks of [\d,]+ ')

    def test_the_disk_tier_file_is_private(self):
        files = [os.path.join(self.disk, f) for f in os.listdir(self.disk)]
        self.assertEqual(len(files), 1, files)
        self.assertEqual(os.stat(files[0]).st_mode & 0o777, 0o600)


class KvTiersWorkerRestartTest(harness.ServiceTestCase):
    """A worker killed and started again has lost its host tier (its memory
    went with it): the coordinator's map of the tiers goes with the worker
    session (a new session, a new map), routers are told (AllBlocksCleared,
    no tier block left in their index), no load is planned from the gone
    tier (no failed move), and the outputs are those from before."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.events = harness.temp_dir('chunkattn-kv-tiers-restart-')
        cls.cluster = cls.start_cluster('tiers-restart', coordinator_args=kv_args(cls.events),
                                        worker_args=POOL + ['--host_kv_cache_mib', '2'])

    def test_a_restarted_worker_leaves_no_tier_behind(self):
        c = self.cluster
        consumer = start_consumer(self, self.events)
        rng = random.Random(11)
        systems = [harness.random_ids(rng, SYSTEM_LEN) for _ in range(SYSTEMS)]
        ns = harness.fresh_namespace('tiers-restart')
        first = run_rounds(self, c, systems, ns, rounds=2)
        host = tier_stats(c.cache_stats())['host']
        self.assertGreater(host.blocks, 0)
        self.assertGreater(host.loads_total, 0)  # round 2 loaded from it
        sync(self, c, consumer)
        self.assertIn('CPU', consumer.tier_blocks())
        cleared = consumer.stats()['cleared']

        c.kill_worker(0)
        c.wait_health(harness.NOT_SERVING, timeout=10, check_alive=False)
        c.start_worker(0)
        c.wait_health(harness.SERVING, timeout=60)
        host = tier_stats(c.cache_stats())['host']
        self.assertEqual((host.blocks, host.loads_total, host.stores_total), (0, 0, 0))
        self.assertGreater(host.capacity_blocks, 0)  # the new worker has a tier, empty
        sync(self, c, consumer)
        self.assertGreater(consumer.stats()['cleared'], cleared)
        self.assertEqual(consumer.tier_blocks(), {}, 'tier blocks left in the index after the restart')

        before = c.metrics()
        again = run_rounds(self, c, systems, ns, rounds=2)
        for key in first:
            self.assertEqual(again[key][0], first[key][0], 'round %d system %d' % key)
        # Round 1 again from nothing: the old tier's blocks are no hit.
        self.assertEqual(sum(again[(0, i)][1] for i in range(SYSTEMS)), 0)
        after = c.metrics_when(lambda m: m.value('chunkattn_kv_tier_loads_total', tier='host')
                               > before.value('chunkattn_kv_tier_loads_total', tier='host'),
                               what='host tier loads in the new session')
        self.assertEqual(after.value('chunkattn_kv_tier_failed_moves_total'),
                         before.value('chunkattn_kv_tier_failed_moves_total'))


if __name__ == '__main__':
    harness.main()
