"""The KV tiers under the pool through the public API: a worker whose pool
(32 chunks) holds less than the workload's system prompts (10 x 4 chunks)
keeps what it evicts in its host tier, then on disk, and loads it back: the
second round of requests finds its prompts cached where the same cluster
without tiers recomputes them, every greedy output equals the cluster's
without tiers, the tier metrics count the moves, and a tenant's blocks are
never another namespace's hit."""
import os
import random
import unittest

import harness

SYSTEMS = 10
SYSTEM_LEN = 256  # 4 chunks of 64
SUFFIX_LEN = 6
NEW_TOKENS = 6
POOL = ['--kv_cache_mib', '4']  # the demo model's chunk is 128 KiB: 32 chunks


class KvTiersTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.disk = harness.temp_dir('chunkattn-kv-tiers-')
        cls.plain = cls.start_cluster('tiers-off', worker_args=POOL)
        cls.tiered = cls.start_cluster('tiers-on', worker_args=POOL + [
            '--host_kv_cache_mib', '2', '--disk_kv_cache_dir', cls.disk, '--disk_kv_cache_mib', '8'])

    def run_rounds(self, cluster, systems, namespace, rounds=2):
        """Each round asks every system prompt once, one request at a time:
        outputs and cached prompt tokens per (round, system)."""
        out = {}
        rng = random.Random(7)
        for r in range(rounds):
            for i, system in enumerate(systems):
                prompt = system + harness.random_ids(rng, SUFFIX_LEN)
                req = harness.make_request(prompt_ids=prompt, namespace=namespace, temperature=0.0,
                                           max_new_tokens=NEW_TOKENS, ignore_eos=True)
                s = cluster.generate(req, timeout=120)[0]
                self.assertTrue(s.finished)
                out[(r, i)] = (s.tokens, s.cached_prompt_tokens)
        return out

    def test_evicted_prefixes_load_back_with_the_same_outputs(self):
        rng = random.Random(1)
        systems = [harness.random_ids(rng, SYSTEM_LEN) for _ in range(SYSTEMS)]
        ns = harness.fresh_namespace('tiers')
        before = self.tiered.metrics()
        want = self.run_rounds(self.plain, systems, ns)
        got = self.run_rounds(self.tiered, systems, ns)
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
        other = self.run_rounds(self.tiered, systems[:3], harness.fresh_namespace('tiers-other'), rounds=1)
        for i in range(3):
            self.assertEqual(other[(0, i)][1], 0, 'system %d in another namespace' % i)
            self.assertEqual(other[(0, i)][0], got[(0, i)][0])

    def test_the_disk_tier_file_is_private(self):
        files = [os.path.join(self.disk, f) for f in os.listdir(self.disk)]
        self.assertEqual(len(files), 1, files)
        self.assertEqual(os.stat(files[0]).st_mode & 0o777, 0o600)


if __name__ == '__main__':
    harness.main()
