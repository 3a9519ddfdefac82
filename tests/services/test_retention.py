"""KV retention (issue 41) through real servers: a tenant's retained prompt
survives another tenant's flood that evicts an unretained copy, with the same
greedy tokens; a tenant retaining every prompt holds at most
--max_retained_chunks_per_tenant raised chunks and the other tenant is still
served; bad retention fields are INVALID_ARGUMENT (gRPC) or 400 naming the
field (HTTP), never a crash. Two tenants by bearer token: acme on the gRPC
API, globex on the OpenAI HTTP API."""
import json
import random
import unittest

import grpc

import harness
from test_openai import Http

CHUNK = 16   # --chunk_size
POOL = 40    # --max_kv_chunks
BOUND = 8    # --max_retained_chunks_per_tenant
ACME = [('authorization', 'Bearer a-1')]


class RetentionTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        tokens = harness.token_file('a-1 acme\nb-1 globex\n', 'chunkattn-retention-', cls.addClassCleanup)
        cls.cluster = cls.start_cluster('retention', tp=1, coordinator_args=[
            '--auth_token_file', tokens, '--chunk_size', str(CHUNK), '--max_kv_chunks', str(POOL),
            '--max_retained_chunks_per_tenant', str(BOUND)])
        cls.http = Http(cls.cluster.http_port, 'b-1')

    def acme(self, ids, namespace='', retention=None, max_new_tokens=4):
        req = harness.make_request(prompt_ids=ids, namespace=namespace, temperature=0.0,
                                   max_new_tokens=max_new_tokens, ignore_eos=True)
        if retention is not None:
            req.retention.CopyFrom(retention)
        return harness.collect(self.cluster.stub.Generate(req, metadata=ACME, timeout=120))[0]

    def globex(self, ids, **extra):
        body = {'prompt': ids, 'max_tokens': 4, 'temperature': 0, 'ignore_eos': True}
        body.update(extra)
        return self.http.json('POST', '/v1/completions', body)

    def flood(self, rng, prompts=12):
        """globex's distinct prompts: 60 chunks through a pool of 40."""
        for _ in range(prompts):
            status, body = self.globex(harness.random_ids(rng, 4 * CHUNK))
            self.assertEqual(status, 200, body)
            self.assertEqual(len(body['choices'][0]['text']) >= 0 and body['usage']['completion_tokens'], 4)

    def test_a_retained_prompt_survives_another_tenants_flood(self):
        rng = random.Random(41)
        system = harness.random_ids(rng, 4 * CHUNK)
        keep = harness.pb.KvRetention(priority=90, duration_ms=3600 * 1000)
        first = self.acme(system, 'kept', keep)
        plain = self.acme(system, 'plain')  # the same prompt in another namespace, not retained
        self.assertEqual(first.tokens, plain.tokens)  # retention changes no output
        self.flood(rng)
        again = self.acme(system, 'kept')
        self.assertEqual(again.cached_prompt_tokens, 4 * CHUNK - 1)  # all of it (the last token recomputed)
        self.assertEqual(again.tokens, first.tokens)
        plain_again = self.acme(system, 'plain')
        self.assertLess(plain_again.cached_prompt_tokens, CHUNK)  # plain LRU lost it to the flood
        self.assertEqual(plain_again.tokens, first.tokens)
        m = self.cluster.metrics_when(
            lambda m: m.value('chunkattn_tenant_kv_retained_chunks', tenant='t:acme') >= 4,
            what='acme holding its 4 retained chunks')
        self.assertGreaterEqual(m.value('chunkattn_kv_retention_chunks', band='high'), 4)
        self.assertEqual(m.value('chunkattn_tenant_kv_retained_chunks', tenant='t:globex'), 0)
        self.assertGreater(m.value('chunkattn_kv_retention_evictions_total', band='default'), 0)

    def test_a_tenant_pinning_everything_is_bounded(self):
        rng = random.Random(7)
        before = self.cluster.metrics().value('chunkattn_kv_retention_capped_chunks_total')
        keep = harness.pb.KvRetention(priority=100)  # no end: until evicted
        for k in range(6):  # 24 chunks asked, BOUND granted: the rest run at the default
            s = self.acme(harness.random_ids(rng, 4 * CHUNK), 'pins', keep)
            self.assertEqual(s.completion_tokens, 4)
        # globex is still served, and its own prefix is found again.
        mine = harness.random_ids(rng, 3 * CHUNK)
        self.assertEqual(self.globex(mine)[0], 200)
        status, body = self.globex(mine)
        self.assertEqual(status, 200, body)
        self.assertGreaterEqual(body['usage']['prompt_tokens_details']['cached_tokens'], 2 * CHUNK)
        self.flood(rng, prompts=8)
        m = self.cluster.metrics_when(
            lambda m: m.value('chunkattn_kv_retention_capped_chunks_total') > before,
            what='capped grants counted')
        self.assertLessEqual(m.value('chunkattn_tenant_kv_retained_chunks', tenant='t:acme'), BOUND)
        self.assertLessEqual(m.value('chunkattn_kv_retention_chunks', band='high'), BOUND)

    def test_bad_retention_is_invalid_argument_on_grpc(self):
        ok = [5, 6, 7, 8]
        R = harness.pb.KvRetention
        cases = [
            (R(), 'retention.priority'),  # priority is required
            (R(priority=-1), 'retention.priority'),
            (R(priority=34), 'retention.priority'),  # below the default: refused, not evicted sooner
            (R(priority=101), 'retention.priority'),
            (R(priority=50, duration_ms=0), 'retention.duration_ms'),
            (R(priority=50, duration_ms=-5), 'retention.duration_ms'),
            (R(priority=50, duration_ms=30 * 86400 * 1000 + 1), 'retention.duration_ms'),
            (R(priority=50, token_end=0), 'retention.token_end'),
            (R(priority=50, token_end=5), 'retention.token_end'),  # past the 4-token prompt
            (R(priority=50, token_end=-1), 'retention.token_end'),
        ]
        for retention, field in cases:
            with self.subTest(retention=str(retention).replace('\n', ' ')):
                req = harness.make_request(prompt_ids=ok, max_new_tokens=2)
                req.retention.CopyFrom(retention)
                with self.assertRaises(grpc.RpcError) as e:
                    harness.collect(self.cluster.stub.Generate(req, metadata=ACME, timeout=30))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
                self.assertIn(field, e.exception.details())
        s = self.acme(ok, retention=R(priority=35, duration_ms=1, token_end=4))  # the edges are valid
        self.assertEqual(s.completion_tokens, 4)

    def test_bad_retention_is_400_naming_the_field_on_http(self):
        ok = [5, 6, 7, 8]
        cases = [
            (5, 'retention'),
            ([50], 'retention'),
            ({'priority': 'high'}, 'retention.priority'),
            ({'priority': 50.5}, 'retention.priority'),
            ({'priority': 101}, 'retention.priority'),
            ({'priority': 0}, 'retention.priority'),
            ({'duration_ms': 1000}, 'retention.priority'),
            ({'priority': 50, 'duration_s': 60}, 'retention'),  # unknown fields are refused, not ignored
            ({'priority': 50, 'duration_ms': -1}, 'retention.duration_ms'),
            ({'priority': 50, 'duration_ms': 10 ** 30}, 'retention.duration_ms'),
            ({'priority': 50, 'token_end': 10 ** 6}, 'retention.token_end'),
        ]
        for retention, param in cases:
            with self.subTest(retention=json.dumps(retention)):
                status, body = self.globex(ok, retention=retention)
                self.assertEqual(status, 400, body)
                self.assertEqual(body['error']['param'], param, body)
        # (The chat route reads the same field: the demo model has no chat template to try it with.)
        status, reply = self.globex(ok, retention={'priority': 80, 'duration_ms': 60000, 'token_end': 4})
        self.assertEqual(status, 200, reply)


if __name__ == '__main__':
    harness.main()
