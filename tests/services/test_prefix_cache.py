"""The prefix cache through the public API: a shared system prompt is
computed once for concurrent requests, outputs do not depend on sharing, the
usage fields agree with the metrics, and finished prompts stay cached per
namespace."""
import random
import threading
import time
import unittest

import harness

SYSTEM_LEN = 1000
SUFFIX_LEN = 8
REQUESTS = 32
NEW_TOKENS = 8


class SharedPrefixTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('shared', shared=True, tp=1)

    def test_concurrent_requests_share_the_system_prompt(self):
        rng = random.Random(1234)
        system = harness.random_ids(rng, SYSTEM_LEN)
        first_tokens = rng.sample(range(3, 2048), REQUESTS)  # distinct: prompts diverge at 1000
        prompts = [system + [first_tokens[i]] + harness.random_ids(rng, SUFFIX_LEN - 1)
                   for i in range(REQUESTS)]
        ns = harness.fresh_namespace('concurrent')

        def request(prompt, namespace):
            return harness.make_request(prompt_ids=prompt, namespace=namespace, temperature=0.0,
                                        max_new_tokens=NEW_TOKENS)

        before = self.cluster.metrics()
        results = [None] * REQUESTS
        errors = []
        barrier = threading.Barrier(REQUESTS, timeout=30)

        def send(i):
            try:
                barrier.wait()
                results[i] = self.cluster.generate(request(prompts[i], ns), timeout=240)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append((i, e))

        threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(REQUESTS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 260
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.assertFalse([t for t in threads if t.is_alive()], 'requests still running after 260 s')
        self.assertEqual(errors, [])

        samples = [r[0] for r in results]
        for i, s in enumerate(samples):
            self.assertEqual(list(results[i]), [0])
            self.assertTrue(s.finished, 'request %d has no finish reason' % i)
            self.assertEqual(s.prompt_tokens, SYSTEM_LEN + SUFFIX_LEN)
            self.assertEqual(s.completion_tokens, len(s.tokens))
        cached = [s.cached_prompt_tokens for s in samples]
        self.assertTrue(all(c in (0, SYSTEM_LEN) for c in cached), cached)
        self.assertEqual(cached.count(0), 1, cached)
        self.assertEqual(sum(cached), (REQUESTS - 1) * SYSTEM_LEN)

        # The metrics count what the usage fields say (they may trail the last
        # response by a moment).
        want = {
            'chunkattn_prompt_tokens_total': sum(s.prompt_tokens for s in samples),
            'chunkattn_prompt_tokens_cached_total': sum(cached),
            'chunkattn_generation_tokens_total': sum(s.completion_tokens for s in samples),
        }

        def deltas():
            after = self.cluster.metrics()
            return {k: after.value(k) - before.value(k) for k in want}

        try:
            harness.wait_for(lambda: deltas() == want, timeout=10, what='metrics to match usage')
        except AssertionError:
            self.assertEqual(deltas(), want)

        # Each output is what the request gets alone, with nothing cached.
        for i in range(REQUESTS):
            alone = self.cluster.generate(request(prompts[i], harness.fresh_namespace('alone')))[0]
            self.assertEqual(alone.cached_prompt_tokens, 0, 'request %d alone' % i)
            self.assertEqual(alone.tokens, samples[i].tokens, 'request %d: shared != alone' % i)
            self.assertEqual(alone.text, samples[i].text, 'request %d' % i)
            self.assertEqual(alone.finish_reason, samples[i].finish_reason, 'request %d' % i)


class CacheSurvivesTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('survives', shared=True, tp=1)

    def test_finished_prompt_stays_cached_in_its_namespace(self):
        rng = random.Random(99)
        for length in (200, 128, 7):
            with self.subTest(prompt_len=length):
                prompt = harness.random_ids(rng, length)
                ns = harness.fresh_namespace('survives')

                def send(namespace):
                    return self.cluster.generate(harness.make_request(
                        prompt_ids=prompt, namespace=namespace, temperature=0.0,
                        max_new_tokens=4))[0]

                first = send(ns)
                self.assertEqual(first.prompt_tokens, length)
                self.assertEqual(first.cached_prompt_tokens, 0)
                # The last prompt token is always recomputed (its logits are needed).
                again = send(ns)
                self.assertEqual(again.cached_prompt_tokens, again.prompt_tokens - 1)
                self.assertEqual(again.tokens, first.tokens)
                other = send(harness.fresh_namespace('other'))
                self.assertEqual(other.cached_prompt_tokens, 0)
                self.assertEqual(other.tokens, first.tokens)


if __name__ == '__main__':
    harness.main()
