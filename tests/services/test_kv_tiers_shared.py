"""The shared KV tier (Redis) across two replicas through the public API: two
coordinators, each with its own TP=2 workers, share one redis-server started
here on 127.0.0.1 (with a password). Replica A computes a set of system
prompts; replica B's first request on each loads A's blocks from Redis
instead of recomputing them (its cached prompt tokens and the shared-tier
metrics say so) and its greedy outputs equal A's; another namespace gets no
hit. Then Redis is stopped (a hung store), and killed while B serves: every
request still completes with the outputs A computed. The password appears in
no log. Over TLS (rediss://, a redis-server speaking only TLS and asking for
client certificates): B loads what A computed; a replica trusting another CA
loads nothing and still answers correctly; no key appears in any log."""
import os
import subprocess
import threading
import time
import random
import unittest

import harness
from test_security import make_pki

SYSTEMS = 4
SYSTEM_LEN = 256  # 4 chunks of 64
SUFFIX_LEN = 6
NEW_TOKENS = 6
PASSWORD = 'kv-shared-secret-9f3b'


def start_redis():
    port = harness.free_port()
    p = harness.Process('redis', ['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--requirepass',
                                  PASSWORD, '--save', '', '--appendonly', 'no', '--maxmemory', '256mb',
                                  '--maxmemory-policy', 'allkeys-lru'])
    p.start()
    deadline = time.time() + 10
    while time.time() < deadline:
        if redis_cli(port, 'PING') == 'PONG':
            return p, port
        time.sleep(0.05)
    raise RuntimeError('redis-server did not answer (scripts/install-deps.sh installs it)')


def redis_cli(port, *args):
    try:
        out = subprocess.run(['redis-cli', '-p', str(port), '-a', PASSWORD, '--no-auth-warning'] + list(args),
                             capture_output=True, timeout=5, text=True)
    except subprocess.TimeoutExpired:
        return None
    return out.stdout.strip()


def ask(test, cluster, prompt, namespace):
    """Greedy NEW_TOKENS after `prompt`: (tokens, cached prompt tokens)."""
    req = harness.make_request(prompt_ids=prompt, namespace=namespace, temperature=0.0,
                               max_new_tokens=NEW_TOKENS, ignore_eos=True)
    s = cluster.generate(req, timeout=120)[0]
    test.assertTrue(s.finished)
    return s.tokens, s.cached_prompt_tokens


class SharedKvTierTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.redis, cls.redis_port = start_redis()
        url = 'redis://:%s@127.0.0.1:%d' % (PASSWORD, cls.redis_port)
        args = ['--kv_store_url', url, '--kv_tier_write_policy', 'write_through']
        cls.a = cls.start_cluster('shared-a', tp=2, coordinator_args=args)
        cls.b = cls.start_cluster('shared-b', tp=2, coordinator_args=args)

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.redis.kill()

    ask = ask

    def prompts(self, seed, n=SYSTEMS):
        rng = random.Random(seed)
        return [harness.random_ids(rng, SYSTEM_LEN) + harness.random_ids(rng, SUFFIX_LEN) for _ in range(n)]

    def wait_stored(self, blocks):
        """Until Redis holds `blocks` values (the workers' writers are
        asynchronous)."""
        deadline = time.time() + 20
        while time.time() < deadline:
            n = redis_cli(self.redis_port, 'DBSIZE')
            if n is not None and n.isdigit() and int(n) >= blocks:
                return int(n)
            time.sleep(0.05)
        self.fail('Redis holds %s values, want %d' % (redis_cli(self.redis_port, 'DBSIZE'), blocks))

    def test_1_replica_b_loads_what_replica_a_computed(self):
        prompts = self.prompts(1)
        ns = harness.fresh_namespace('shared')
        before_b = self.b.metrics()
        base = int(redis_cli(self.redis_port, 'DBSIZE') or 0)
        want = [self.ask(self.a, p, ns) for p in prompts]
        for tokens, cached in want:
            self.assertEqual(cached, 0)  # A computed them
        # Every full block before each prompt's last token, one value per rank.
        self.wait_stored(base + SYSTEMS * (SYSTEM_LEN // 64) * 2)
        keys = (redis_cli(self.redis_port, '--scan', '--pattern', 'chunkattn:kv:v2:*') or '').split()
        self.assertTrue(any(':r0of2:' in k for k in keys) and any(':r1of2:' in k for k in keys), keys[:4])
        got = [self.ask(self.b, p, ns) for p in prompts]
        for i, ((tokens, cached), (want_tokens, _)) in enumerate(zip(got, want)):
            self.assertEqual(tokens, want_tokens, 'system %d' % i)
            self.assertGreaterEqual(cached, SYSTEM_LEN, 'system %d: B loaded A\'s blocks' % i)
        after_b = self.b.metrics()
        delta = lambda name, **l: after_b.value(name, **l) - before_b.value(name, **l)  # noqa: E731
        self.assertGreaterEqual(delta('chunkattn_kv_tier_loads_total', tier='shared'), SYSTEMS * SYSTEM_LEN // 64)
        self.assertGreater(delta('chunkattn_kv_tier_shared_hits_total'), 0)
        self.assertEqual(delta('chunkattn_kv_tier_shared_fallbacks_total'), 0)
        self.assertGreater(delta('chunkattn_kv_tier_shared_load_seconds_count'), 0)
        self.assertGreater(self.a.metrics().value('chunkattn_kv_tier_shared_stores_total'), 0)

        # The same prompts in another namespace: not one block is its hit.
        other = harness.fresh_namespace('shared-other')
        before = self.b.metrics().value('chunkattn_kv_tier_loads_total', tier='shared')
        for i, p in enumerate(prompts[:2]):
            tokens, cached = self.ask(self.b, p, other)
            self.assertEqual(cached, 0, 'system %d in another namespace' % i)
            self.assertEqual(tokens, want[i][0])
        self.assertEqual(self.b.metrics().value('chunkattn_kv_tier_loads_total', tier='shared'), before)

    def test_2_a_hung_then_killed_redis_costs_no_request(self):
        ns = harness.fresh_namespace('shared-down')
        hung, killed = self.prompts(2, 3), self.prompts(3, 6)
        want = {tuple(p): self.ask(self.a, p, ns)[0] for p in hung + killed}  # stored in Redis as well
        self.wait_stored(1)
        before = self.b.metrics()
        self.redis.proc.send_signal(19)  # SIGSTOP: connections hang, nothing answers
        try:
            for p in hung:
                self.assertEqual(self.ask(self.b, p, ns)[0], want[tuple(p)])
        finally:
            self.redis.proc.send_signal(18)  # SIGCONT
        # Killed while B serves: requests in flight and after it complete.
        results = {}

        def serve():
            for p in killed:
                results[tuple(p)] = self.ask(self.b, p, ns)[0]
        t = threading.Thread(target=serve)
        t.start()
        time.sleep(0.2)
        self.redis.kill()
        t.join(timeout=300)
        self.assertFalse(t.is_alive())
        for p in killed:
            self.assertEqual(results[tuple(p)], want[tuple(p)])
        # And A, whose stores now fail, still serves.
        fresh = self.prompts(4, 1)[0]
        self.assertEqual(len(self.ask(self.a, fresh, ns)[0]), NEW_TOKENS)
        after = self.b.metrics()
        failures = (after.value('chunkattn_kv_tier_shared_probe_failures_total') -
                    before.value('chunkattn_kv_tier_shared_probe_failures_total') +
                    after.value('chunkattn_kv_tier_shared_fallbacks_total') -
                    before.value('chunkattn_kv_tier_shared_fallbacks_total'))
        self.assertGreater(failures, 0)

    def test_3_the_password_is_in_no_log(self):
        for cluster in (self.a, self.b):
            for p in cluster.processes():
                with open(p.log_path, errors='replace') as f:
                    text = f.read()
                # The command line the harness logs carries the flag; the
                # process's own lines must not.
                lines = [l for l in text.splitlines() if not l.startswith('=== start:')]
                self.assertFalse(any(PASSWORD in l for l in lines), p.name)
        with open(self.a.coordinator.log_path, errors='replace') as f:
            log = f.read()
        self.assertIn('redis://:***@127.0.0.1', log)


class SharedKvTierTlsTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.tmp, cls.pki = make_pki(cls.addClassCleanup)
        _, cls.other_pki = make_pki(cls.addClassCleanup)  # another CA
        for key in (cls.pki['client.key'], cls.other_pki['client.key']):
            os.chmod(key, 0o600)  # a secret's mode, as the coordinator checks
        cls.port = harness.free_port()
        cls.redis = harness.Process('redis-tls', [
            'redis-server', '--port', '0', '--tls-port', str(cls.port), '--bind', '127.0.0.1',
            '--tls-cert-file', cls.pki['server.pem'], '--tls-key-file', cls.pki['server.key'],
            '--tls-ca-cert-file', cls.pki['ca.pem'], '--tls-auth-clients', 'yes', '--requirepass', PASSWORD,
            '--save', '', '--appendonly', 'no']).start()
        cls.addClassCleanup(cls.redis.kill)
        harness.wait_for(lambda: cls.cli('PING') == 'PONG', 10, what='redis-server with TLS')
        url = 'rediss://:%s@127.0.0.1:%d' % (PASSWORD, cls.port)

        def args(pki):
            return ['--kv_store_url', url, '--kv_tier_write_policy', 'write_through',
                    '--kv_store_tls_ca_file', pki['ca.pem'], '--kv_store_tls_cert_file', pki['client.pem'],
                    '--kv_store_tls_key_file', pki['client.key']]
        cls.a = cls.start_cluster('tls-a', tp=1, coordinator_args=args(cls.pki))
        cls.b = cls.start_cluster('tls-b', tp=1, coordinator_args=args(cls.pki))
        cls.c = cls.start_cluster('tls-c', tp=1, coordinator_args=args(cls.other_pki))

    ask = ask

    @classmethod
    def cli(cls, *args):
        try:
            out = subprocess.run(['redis-cli', '-p', str(cls.port), '--tls', '--cacert', cls.pki['ca.pem'],
                                  '--cert', cls.pki['client.pem'], '--key', cls.pki['client.key'],
                                  '-a', PASSWORD, '--no-auth-warning'] + list(args),
                                 capture_output=True, timeout=5, text=True)
        except subprocess.TimeoutExpired:
            return None
        return out.stdout.strip()

    def test_1_replica_b_loads_over_tls_and_another_ca_is_refused(self):
        rng = random.Random(11)
        prompts = [harness.random_ids(rng, SYSTEM_LEN) + harness.random_ids(rng, SUFFIX_LEN) for _ in range(2)]
        ns = harness.fresh_namespace('shared-tls')
        want = [self.ask(self.a, p, ns) for p in prompts]
        blocks = len(prompts) * (SYSTEM_LEN // 64)
        harness.wait_for(lambda: int(self.cli('DBSIZE') or 0) >= blocks, 20, what='A\'s blocks in Redis over TLS')
        for i, p in enumerate(prompts):
            tokens, cached = self.ask(self.b, p, ns)
            self.assertEqual(tokens, want[i][0], 'system %d' % i)
            self.assertGreaterEqual(cached, SYSTEM_LEN, 'system %d: B loaded A\'s blocks over TLS' % i)
        self.assertGreater(self.b.metrics().value('chunkattn_kv_tier_shared_hits_total'), 0)
        # C trusts another CA: every handshake fails, nothing is loaded, and it answers the same.
        for i, p in enumerate(prompts):
            tokens, cached = self.ask(self.c, p, ns)
            self.assertEqual(tokens, want[i][0], 'system %d on C' % i)
            self.assertEqual(cached, 0, 'system %d on C' % i)
        m = self.c.metrics()
        self.assertEqual(m.value('chunkattn_kv_tier_loads_total', tier='shared'), 0)
        self.assertGreater(m.value('chunkattn_kv_tier_shared_probe_failures_total'), 0)

    def test_2_no_key_or_password_in_any_log(self):
        with open(self.pki['client.key']) as f:
            key = f.read()
        body = ''.join(l for l in key.splitlines() if not l.startswith('-----'))[:40]
        for cluster in (self.a, self.b, self.c):
            for p in cluster.processes():
                with open(p.log_path, errors='replace') as f:
                    lines = [l for l in f.read().splitlines() if not l.startswith('=== start:')]
                self.assertFalse(any(PASSWORD in l or body in l for l in lines), p.name)
        with open(self.a.coordinator.log_path, errors='replace') as f:
            self.assertIn('rediss://:***@127.0.0.1', f.read())


if __name__ == '__main__':
    harness.main()
