"""KV-cache events in vLLM's wire format (issue 24), checked from the outside.

A consumer that follows vLLM's documented format (kv_events_consumer.py,
written from the format, not from the publisher) subscribes to a coordinator's
ZMQ PUB socket and replays missed batches from its ROUTER socket. It keeps a
block index per namespace (the cache salt of block 0's extra_keys) and checks
every BlockStored against its own recomputation of vLLM's sha256_cbor chain.

KvEventsConsistencyTest drives a seeded random workload (shared prefixes that
split inside and at chunk boundaries, exact repeats, unshared prompts, five
namespaces including "", 1-4 new tokens, some n=2) in waves through a small
pool (--max_kv_chunks, so chunks are evicted all the time). At every quiet
point (after each wave) the consumer's index equals GetKvBlocks, namespace by
namespace, with multiplicity; every indexed block is a full chunk of computed
tokens of some request of that namespace; and a request run alone reuses the
prefix the index predicts, to the chunk (what a precise-prefix router relies
on). Mid-run the consumer drops its
subscription for a second (healed by replay) and a worker is SIGKILLed and
restarted (AllBlocksCleared: the index is empty, then consistent again). It
prints the event rate and the engine loop's time making events against the
step time (chunkattn_kv_events_publish_seconds_total; reported, not
asserted: bench/kv_events.py measures the cost, events on against off).

Sizes: --requests N or CHUNKATTN_KV_EVENTS_REQUESTS (default 10,000: 130 to
150 s on 2 cores with an optimized build); the seed: --seed or
CHUNKATTN_KV_EVENTS_SEED (1). A failure names the seed and the point of the
stream where the indexes differ.
"""
import argparse
import collections
import concurrent.futures
import os
import random
import subprocess
import sys
import threading
import time
import unittest

import harness  # first: it sets gRPC's environment

import grpc  # noqa: E402,I100
import zmq  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_events_consumer as kv  # noqa: E402

CHUNK = 16          # --chunk_size of these clusters (the block size)
POOL_CHUNKS = 96    # --max_kv_chunks: far below the workload's distinct chunks
MAX_STEP_TOKENS = 256
NAMESPACES = ('', 'tenant-a', 'tenant-b', 'tenant-c', 'tenant-d')
CONCURRENCY = 12    # requests in flight at once
WAVE = 250          # requests between two quiet points
HASH_SEED = '0'
RPC_S = 120
SYNC_S = 30         # bound on the consumer catching up with a GetKvBlocks

# Set from the command line / environment in __main__.
REQUESTS = int(os.environ.get('CHUNKATTN_KV_EVENTS_REQUESTS', '10000'))
SEED = int(os.environ.get('CHUNKATTN_KV_EVENTS_SEED', '1'))


# --- workload ----------------------------------------------------------------

class Job:
    __slots__ = ('index', 'prompt', 'namespace', 'max_new_tokens', 'n', 'temperature', 'seed', 'cancel_after')

    def __init__(self, index, prompt, namespace, max_new_tokens, n, temperature, seed, cancel_after=None):
        self.index, self.prompt, self.namespace = index, prompt, namespace
        self.max_new_tokens, self.n, self.temperature, self.seed = max_new_tokens, n, temperature, seed
        self.cancel_after = cancel_after  # seconds after the call the client cancels it; None: never

    def request(self):
        return harness.make_request(prompt_ids=self.prompt, namespace=self.namespace,
                                    temperature=self.temperature, seed=self.seed,
                                    max_new_tokens=self.max_new_tokens, ignore_eos=True, n=self.n)


class Workload:
    """A seeded stream of short requests. Prefixes form a tree: each new one
    keeps a token-granular start of an older one (often ending inside a
    chunk) and goes on for 1-6 chunks, sometimes plus a partial chunk."""

    def __init__(self, seed):
        rng = self.rng = random.Random(seed)
        prefixes = [harness.random_ids(rng, rng.randint(1, 3) * CHUNK) for _ in range(4)]
        for _ in range(12):
            base = rng.choice(prefixes)
            keep = rng.randint(1, len(base))
            total = rng.randint(1, 6) * CHUNK + rng.choice([0, 0, rng.randint(1, CHUNK - 1)])
            prefixes.append(base[:keep] + harness.random_ids(rng, max(0, total - keep)))
        self.prefixes = prefixes
        self.recent = collections.deque(maxlen=64)
        self.count = 0

    def next(self):
        rng = self.rng
        r = rng.random()
        if r < 0.1 and self.recent:      # an exact repeat, same namespace: a cache hit
            prompt, ns = rng.choice(self.recent)
        else:
            ns = rng.choice(NAMESPACES)
            if r < 0.2:                   # nothing shared
                prompt = harness.random_ids(rng, rng.randint(1, 3 * CHUNK))
            else:                         # a shared prefix and a suffix, sometimes none
                suffix = 0 if rng.random() < 0.25 else rng.randint(1, 2 * CHUNK)
                prompt = rng.choice(self.prefixes) + harness.random_ids(rng, suffix)
        self.recent.append((prompt, ns))
        greedy = rng.random() < 0.5
        cancel = rng.uniform(0.0, 0.1) if rng.random() < 0.03 else None  # often mid-prefill
        job = Job(self.count, list(prompt), ns, rng.randint(1, 4), 2 if rng.random() < 0.05 else 1,
                  0.0 if greedy else 0.8, None if greedy else rng.randrange(1 << 31), cancel)
        self.count += 1
        return job

    def take(self, n):
        return [self.next() for _ in range(n)]


class Outcome:
    __slots__ = ('job', 'samples', 'code', 'details', 'streamed', 'cached')

    def __init__(self, job):
        self.job, self.samples, self.code, self.details, self.streamed = job, None, None, '', {}
        self.cached = None  # usage.cached_prompt_tokens of sample 0


def run_job(stub, job):
    out = Outcome(job)
    call = stub.Generate(job.request(), timeout=RPC_S)
    timer = None
    if job.cancel_after is not None:
        timer = threading.Timer(job.cancel_after, call.cancel)
        timer.start()
    try:
        for r in call:
            out.streamed.setdefault(r.index, []).extend(r.token_ids)
            if r.index == 0 and r.finish_reason != harness.pb.FINISH_REASON_UNSPECIFIED:
                out.cached = r.usage.cached_prompt_tokens
        out.samples = out.streamed
    except grpc.RpcError as e:
        out.code, out.details = e.code(), e.details()
    finally:
        if timer is not None:
            timer.cancel()
    return out


def unexpected(outcomes):
    """The failures other than the cancellations the workload asked for."""
    return ['%s %s' % (o.code, o.details) for o in outcomes if o.code is not None and not (
        o.code == grpc.StatusCode.CANCELLED and o.job.cancel_after is not None)]


# --- what a block can be -----------------------------------------------------

class PossibleBlocks:
    """Per namespace, the published hashes of every full chunk of computed
    tokens some request had: its prompt and all its generated tokens but the
    last (never fed back). A failed request may have computed anything it was
    sent. Hashes by kv.chain_hashes, the consumer's own sha256_cbor chain."""

    def __init__(self):
        self.by_ns = collections.defaultdict(set)
        self._seen = set()

    def add(self, ns, tokens):
        full = len(tokens) // CHUNK
        if full == 0:
            return
        key = (ns, tuple(tokens[:full * CHUNK]))
        if key in self._seen:
            return
        self._seen.add(key)
        _, hashes = kv.chain_hashes(HASH_SEED, [tokens[i * CHUNK:(i + 1) * CHUNK] for i in range(full)],
                                    salt=ns)
        self.by_ns[ns].update(hashes)

    def add_outcome(self, o):
        if o.samples is not None:
            for tokens in o.samples.values():
                self.add(o.job.namespace, o.job.prompt + tokens[:-1])
        else:
            self.add(o.job.namespace, o.job.prompt)
            for tokens in o.streamed.values():
                self.add(o.job.namespace, o.job.prompt + tokens)


# --- process figures ---------------------------------------------------------

class Figures:
    """The coordinator's step histogram and event-making time at one moment."""

    def __init__(self, cluster):
        m = cluster.metrics()
        self.steps = m.value('chunkattn_step_duration_seconds_count')
        self.step_s = m.value('chunkattn_step_duration_seconds_sum')
        self.publish_s = m.value('chunkattn_kv_events_publish_seconds_total')

    def since(self, before):
        steps = max(self.steps - before.steps, 1)
        return {'steps': self.steps - before.steps,
                'step_ms': 1e3 * (self.step_s - before.step_s) / steps,
                'publish_share': (self.publish_s - before.publish_s) / max(self.step_s - before.step_s, 1e-9)}


# --- tests -------------------------------------------------------------------

def kv_args(folder, *extra):
    """Coordinator flags for KV events on ipc:// sockets in `folder`
    (loopback only: nothing listens on a TCP port)."""
    return ['--kv_events_endpoint', 'ipc://%s/pub' % folder,
            '--kv_events_replay_endpoint', 'ipc://%s/replay' % folder] + list(extra)


def pool_args():
    return ['--chunk_size', str(CHUNK), '--max_kv_chunks', str(POOL_CHUNKS),
            '--max_tokens_per_step', str(MAX_STEP_TOKENS)]


class KvEventsTestCase(harness.ServiceTestCase):

    def start_consumer(self, folder, **kw):
        consumer = kv.KvEventConsumer('ipc://%s/pub' % folder, 'ipc://%s/replay' % folder,
                                      hash_seed=HASH_SEED, block_size=CHUNK, **kw).start()
        self.addCleanup(consumer.stop)
        return consumer

    def run_wave(self, cluster, jobs, at=None, hook=None):
        """Runs `jobs` CONCURRENCY at a time; hook() (from this thread) once
        `at` of them are done. The outcomes, in job order."""
        outcomes = []
        with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
            futures = [pool.submit(run_job, cluster.stub, j) for j in jobs]
            done = 0
            for f in concurrent.futures.as_completed(futures, timeout=RPC_S * 4):
                done += 1
                if hook is not None and done == at:
                    hook()
            outcomes = [f.result() for f in futures]
        return outcomes

    def kv_blocks(self, cluster):
        kb = cluster.stub.GetKvBlocks(harness.pb.GetKvBlocksRequest(), timeout=30)
        self.assertEqual([g.cache_namespace for g in kb.namespaces],
                         sorted(g.cache_namespace for g in kb.namespaces), 'namespaces sorted')
        for g in kb.namespaces:
            self.assertEqual(list(g.block_hashes), sorted(g.block_hashes), 'hashes sorted')
        return kb

    def check_prediction(self, cluster, consumer, job, possible, what):
        """What a precise-prefix router does with the index: the blocks of
        the prompt's full chunks present from block 0 on predict the cached
        prefix. Run alone at a quiet point, the request's cached prompt tokens
        (token-granular) lie in [predicted, predicted + one chunk), or are
        all but the last prompt token when every chunk is predicted. The
        prediction in blocks."""
        full = len(job.prompt) // CHUNK
        _, hashes = kv.chain_hashes(HASH_SEED, [job.prompt[i * CHUNK:(i + 1) * CHUNK] for i in range(full)],
                                    salt=job.namespace)
        index = consumer.blocks().get(job.namespace, {})
        hit = 0
        while hit < full and index.get(hashes[hit], 0) > 0:
            hit += 1
        o = run_job(cluster.stub, job)
        self.assertIsNone(o.code, '%s: %s' % (what, o.details))
        possible.add_outcome(o)
        low = min(hit * CHUNK, len(job.prompt) - 1)
        self.assertTrue(low <= o.cached < (hit + 1) * CHUNK,
                        '%s (seed %d): the index has %d of the %d full chunks of a %d-token prompt in namespace %r '
                        'from block 0 on, so %d to %d cached tokens; the coordinator reused %d'
                        % (what, SEED, hit, full, len(job.prompt), job.namespace, low, (hit + 1) * CHUNK - 1,
                           o.cached))
        return hit

    def check_consistent(self, cluster, consumer, what, possible=None):
        """GetKvBlocks, the consumer brought to exactly that point of the
        stream, the two indexes equal namespace by namespace. The coordinator's
        index."""
        for _ in range(10):
            kb = self.kv_blocks(cluster)
            n = kb.next_sequence_number
            if n > 0 and not consumer.wait_for_seq(n - 1, SYNC_S):
                self.fail('%s: the consumer is at seq %d, not %d, %d s after GetKvBlocks; errors %s; stats %s'
                          % (what, consumer.last_seq, n - 1, SYNC_S, consumer.errors[:5], consumer.stats()))
            got = consumer.blocks()
            if consumer.last_seq == n - 1:
                break  # got is the index at exactly seq n-1
        else:
            self.fail('%s: batches kept coming after every GetKvBlocks' % what)
        self.assertEqual(consumer.errors, [], '%s: the consumer found format or index errors' % what)
        want = {g.cache_namespace: collections.Counter(g.block_hashes) for g in kb.namespaces if g.block_hashes}
        if got != want:
            lines = []
            for ns in sorted(set(got) | set(want)):
                g, w = got.get(ns, collections.Counter()), want.get(ns, collections.Counter())
                missing, extra = w - g, g - w
                if missing or extra:
                    lines.append('namespace %r: coordinator %d blocks, consumer %d; missing in the consumer %d %s; '
                                 'extra in the consumer %d %s' % (
                                     ns, sum(w.values()), sum(g.values()), sum(missing.values()),
                                     sorted(missing.items())[:5], sum(extra.values()), sorted(extra.items())[:5]))
            self.fail('%s (seed %d, next_sequence_number %d): the block indexes differ:\n  %s'
                      % (what, SEED, n, '\n  '.join(lines)))
        if possible is not None:
            for ns, counts in want.items():
                stray = [h for h in counts if h not in possible.by_ns.get(ns, ())]
                self.assertEqual(stray, [], '%s: namespace %r holds blocks that are no full chunk of computed '
                                 'tokens of any request in it' % (what, ns))
        return want


class KvEventsConsistencyTest(KvEventsTestCase):
    """The consumer against GetKvBlocks under the seeded workload; its
    figures are printed as a table at the end."""
    figures = {}

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.figures = {}
        cls.folder = harness.temp_dir('chunkattn-kvev-', cls.addClassCleanup)
        cls.cluster = cls.start_cluster('kv-events', tp=1, coordinator_args=pool_args() + kv_args(cls.folder))

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.print_table()

    def test_a_consumer_follows_the_cache(self):
        c = self.cluster
        self.assertIn('coordinator: KV events on ipc://%s/pub, replay on ipc://%s/replay, topic kv@'
                      % (self.folder, self.folder), c.coordinator.log_tail(200))
        consumer = self.start_consumer(self.folder)
        workload, possible = Workload(SEED), PossibleBlocks()
        probe_rng = random.Random(SEED + 1000)

        def probe(outcomes):
            """A start of one of the wave's last prompts, likely still cached,
            and a few tokens more, in its namespace."""
            done = [o for o in outcomes[-8:] if o.code is None] or outcomes[-1:]
            base = probe_rng.choice(done).job
            keep = probe_rng.randint(min(CHUNK, len(base.prompt)), len(base.prompt))
            prompt = base.prompt[:keep] + harness.random_ids(probe_rng, probe_rng.randint(0, 8))
            return Job(-1, prompt, base.namespace, 1, 1, 0.0, None)

        waves = max(1, (REQUESTS + WAVE - 1) // WAVE)
        # The disruptions need a wave before and after them.
        disconnect_wave = 1 if waves >= 3 else None
        failure_wave = max(2, waves // 2) if waves >= 4 else None
        counts = collections.Counter()
        namespaces_seen, most_copies = set(), 1
        self.check_consistent(c, consumer, 'at start')
        started = time.monotonic()
        first = Figures(c)
        for w in range(waves):
            jobs = workload.take(min(WAVE, REQUESTS - w * WAVE))
            hook, at, before = None, None, consumer.stats()
            if w == disconnect_wave:
                hook, at = (lambda: self.assertTrue(consumer.disconnect(1.0), 'disconnect')), len(jobs) // 5
            if w == failure_wave:
                hook, at = (lambda: c.kill_worker(0)), len(jobs) // 3
            outcomes = self.run_wave(c, jobs, at, hook)
            for o in outcomes:
                possible.add_outcome(o)
                counts['requests'] += 1
                if o.code is None:
                    counts['completed'] += 1
                elif o.code == grpc.StatusCode.CANCELLED and o.job.cancel_after is not None:
                    counts['cancelled'] += 1
                elif o.code == grpc.StatusCode.UNAVAILABLE and w == failure_wave:
                    counts['unavailable'] += 1  # only the worker failure's wave may fail, and only so
                else:
                    self.fail('wave %d: request %d failed: %s %s' % (w, o.job.index, o.code, o.details))
            for o in outcomes:
                if o.code == grpc.StatusCode.CANCELLED and o.job.cancel_after is not None and w != failure_wave:
                    # (The failure's wave: the restart clears every block.) The cancel can meet a step in flight: the request computed
                    # tokens it never streamed (seen under ctest's parallel
                    # load). Its rerun to the end (greedy or seeded: the same
                    # tokens) names those blocks; its own are the same ones.
                    again = run_job(c.stub, Job(o.job.index, o.job.prompt, o.job.namespace, o.job.max_new_tokens,
                                                o.job.n, o.job.temperature, o.job.seed))
                    self.assertIsNone(again.code, 'the rerun of cancelled request %d: %s %s'
                                      % (o.job.index, again.code, again.details))
                    possible.add_outcome(again)
            if w == failure_wave:
                self.after_worker_failure(c, consumer, before, possible)
            index = self.check_consistent(c, consumer, 'after wave %d' % w, possible)
            if w != failure_wave:  # a request alone: the index predicts its cache hit
                counts['predicted_blocks'] += self.check_prediction(c, consumer, probe(outcomes), possible,
                                                                    'probe after wave %d' % w)
                counts['probes'] += 1
                index = self.check_consistent(c, consumer, 'after the probe of wave %d' % w, possible)
            namespaces_seen.update(index)
            most_copies = max([most_copies] + [n for counter in index.values() for n in counter.values()])
            if w == disconnect_wave:
                after = consumer.stats()
                self.assertGreater(after['gaps_healed'], before['gaps_healed'], 'no gap healed by replay: %s' % after)
                self.assertGreater(after['replays'], before['replays'])
            if w % 4 == 3 or w == waves - 1:
                s = consumer.stats()
                sys.stderr.write('wave %d/%d: %d requests, seq %d, %d events, %d stored, %d removed, %.0f s\n'
                                 % (w + 1, waves, counts['requests'], consumer.last_seq, s['events'],
                                    s['stored'], s['removed'], time.monotonic() - started))
        elapsed = time.monotonic() - started
        last = Figures(c)
        stats = consumer.stats()
        cache = c.cache_stats()
        self.assertEqual(counts['requests'], REQUESTS)
        self.assertEqual(stats['resets'], 0, consumer.last_reset_reason)
        self.assertEqual(consumer.errors, [])
        self.assertGreater(cache.evicted_chunks_total, 0, 'no chunk was evicted')
        if REQUESTS >= 1000:
            self.assertLessEqual(set(NAMESPACES), namespaces_seen, 'a namespace never held a block')
            self.assertGreater(stats['stored'], REQUESTS, 'few blocks stored')
            self.assertGreater(stats['removed'], REQUESTS // 2, 'few blocks removed')
            self.assertGreater(cache.evicted_chunks_total, REQUESTS // 2, 'few chunks evicted')
            self.assertGreater(counts['predicted_blocks'], 0, 'no probe hit the cache')
        type(self).figures['run'] = {
            'requests': counts['requests'], 'completed': counts['completed'], 'cancelled': counts['cancelled'],
            'unavailable': counts['unavailable'], 'elapsed_s': elapsed, 'stats': stats,
            'evicted': cache.evicted_chunks_total, 'preemptions': cache.preemptions_total,
            'most_copies': most_copies, 'probes': counts['probes'], 'predicted': counts['predicted_blocks'],
            'next_seq': self.kv_blocks(c).next_sequence_number,
            'figures': last.since(first)}

    def after_worker_failure(self, c, consumer, before, possible):
        """The worker is dead: the coordinator published AllBlocksCleared, its
        index and the consumer's are empty; back, both are consistent again."""
        harness.wait_for(lambda: consumer.stats()['cleared'] > before['cleared'], timeout=30, interval=0.05,
                         what='AllBlocksCleared after the worker was killed')
        self.assertEqual(self.check_consistent(c, consumer, 'worker down', possible), {})
        self.assertEqual(consumer.blocks(), {}, 'the index is not empty after AllBlocksCleared')
        c.start_worker(0)
        c.wait_health(harness.SERVING, timeout=60)
        self.assertEqual(self.check_consistent(c, consumer, 'worker back', possible), {})
        # A probe: the cache works again and the stream follows.
        o = run_job(c.stub, Job(-1, list(range(3, 3 + 3 * CHUNK + 5)), 'after-failure', 2, 1, 0.0, None))
        self.assertIsNone(o.code, o.details)
        possible.add_outcome(o)
        got = self.check_consistent(c, consumer, 'after the probe', possible)
        self.assertEqual(sum(got.get('after-failure', {}).values()), 3, got.get('after-failure'))

    @classmethod
    def print_table(cls):
        f, out = cls.figures, []
        if 'run' in f:
            r, s = f['run'], f['run']['stats']
            e = r['elapsed_s']
            out += ['KV events, seed %d: tp=1, --chunk_size %d, --max_kv_chunks %d, %d namespaces, '
                    '%d requests in flight' % (SEED, CHUNK, POOL_CHUNKS, len(NAMESPACES), CONCURRENCY),
                    '  requests          %8d  (completed %d, cancelled by the client %d, UNAVAILABLE at the '
                    'worker failure %d) in %.1f s' % (r['requests'], r['completed'], r['cancelled'],
                                                      r['unavailable'], e),
                    '  steps             %8d  (%.1f ms each on the workers)' % (r['figures']['steps'],
                                                                              r['figures']['step_ms']),
                    '  making events     %7.3f%% of the step time (the engine loop\'s, hashes included)'
                    % (100 * r['figures']['publish_share']),
                    '  batches           %8d  (%.1f /s; next_sequence_number %d)' % (s['batches'], s['batches'] / e,
                                                                                    r['next_seq']),
                    '  events            %8d  (%.1f /s)' % (s['events'], s['events'] / e),
                    '  blocks stored     %8d  (%.1f /s)' % (s['stored'], s['stored'] / e),
                    '  blocks removed    %8d  (%.1f /s)' % (s['removed'], s['removed'] / e),
                    '  all cleared       %8d' % s['cleared'],
                    '  chunks evicted    %8d  (preemptions %d)' % (r['evicted'], r['preemptions']),
                    '  replays           %8d  (gaps healed %d)' % (s['replays'], s['gaps_healed']),
                    '  probes            %8d  (run alone; %d cached blocks predicted from the index, all right)'
                    % (r['probes'], r['predicted']),
                    '  most copies of a block at a quiet point: %d' % r['most_copies']]
        if out:
            sys.stderr.write('\n' + '\n'.join(out) + '\n')


class KvEventsArrayFormatTest(KvEventsTestCase):
    """--kv_events_format array (vLLM before 0.26), a custom topic, and ZMQ
    CURVE with one admitted client key: that client follows the cache, a
    plaintext one and one with another key hear nothing."""
    TOPIC = 'kv@pod@demo'

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.folder = harness.temp_dir('chunkattn-kvarr-', cls.addClassCleanup)
        server_public, server_secret = (k.decode() for k in zmq.curve_keypair())
        cls.client = tuple(k.decode() for k in zmq.curve_keypair())  # (public, secret)
        cls.curve = (server_public,) + cls.client
        cls.server_public = server_public
        for name, text in (('server.key', server_secret), ('clients.txt', '\n%s\n' % cls.client[0])):
            with open(os.path.join(cls.folder, name), 'w') as f:
                f.write(text)
        cls.cluster = cls.start_cluster('kv-array', tp=1, coordinator_args=pool_args() + kv_args(
            cls.folder, '--kv_events_format', 'array', '--kv_events_topic', cls.TOPIC,
            '--kv_events_curve_secret_key_file', os.path.join(cls.folder, 'server.key'),
            '--kv_events_curve_client_keys_file', os.path.join(cls.folder, 'clients.txt')))

    def test_array_events_and_topic(self):
        c = self.cluster
        self.assertIn('replay on ipc://%s/replay, topic %s, CURVE (server public key %s, client keys: 1)'
                      % (self.folder, self.TOPIC, self.server_public), c.coordinator.log_tail(200))
        consumer = self.start_consumer(self.folder, topic_filter=self.TOPIC, curve=self.curve)
        workload, possible = Workload(SEED + 2), PossibleBlocks()
        for w in range(2):
            outcomes = self.run_wave(c, workload.take(120))
            self.assertEqual(unexpected(outcomes), [])
            for o in outcomes:
                possible.add_outcome(o)
            self.check_consistent(c, consumer, 'array wave %d' % w, possible)
        stats = consumer.stats()
        self.assertGreater(stats['array_events'], 0, stats)
        self.assertEqual(stats['map_events'], 0, stats)
        self.assertGreater(stats['stored'], 0, stats)
        self.assertEqual(consumer.last_topic, self.TOPIC)
        # A subscriber to another topic hears nothing.
        other = self.start_consumer(self.folder, topic_filter='kv@other@', curve=self.curve)
        outcomes = self.run_wave(c, workload.take(10))
        self.assertEqual(unexpected(outcomes), [])
        self.check_consistent(c, consumer, 'array, last')
        time.sleep(0.5)
        self.assertIsNone(other.last_topic)

    def test_curve_admits_only_the_known_key(self):
        c = self.cluster
        admitted = self.start_consumer(self.folder, topic_filter=self.TOPIC, curve=self.curve)
        plaintext = self.start_consumer(self.folder, topic_filter=self.TOPIC)
        stranger_keys = tuple(k.decode() for k in zmq.curve_keypair())
        stranger = self.start_consumer(self.folder, topic_filter=self.TOPIC,
                                       curve=(self.server_public,) + stranger_keys)
        outcomes = self.run_wave(c, Workload(SEED + 3).take(10))
        self.assertEqual(unexpected(outcomes), [])
        self.check_consistent(c, admitted, 'CURVE, admitted key')
        self.assertGreaterEqual(admitted.last_seq, 0)
        time.sleep(0.5)
        for name, consumer in (('plaintext', plaintext), ('another key', stranger)):
            self.assertEqual(consumer.last_seq, -1, name)  # no batch, live or replayed
            self.assertIsNone(consumer.last_topic, name)
            self.assertEqual(consumer.stats()['batches'], 0, name)


class KvEventsFlagsTest(unittest.TestCase):
    """Bad KV-event flags stop the coordinator with a message; GetKvBlocks
    without KV events is FAILED_PRECONDITION."""

    def argv(self, *args, port=0):
        return [harness.bin_path('chunkattn-coordinator'), '--listen', '127.0.0.1:%d' % port,
                '--metrics_port', '0', '--http_port', '0', '--workers', '127.0.0.1:%d' % harness.free_port(),
                '--model', harness.model_dir()] + list(args)

    def test_bad_flags(self):
        tmp = harness.temp_dir('chunkattn-kvflags-', self.addCleanup)
        pub = 'ipc://%s/pub' % tmp
        keys = {}
        for name, text in (('good.key', zmq.curve_keypair()[1].decode()), ('bad.key', 'not a key\n'),
                           ('clients.txt', zmq.curve_keypair()[0].decode())):
            keys[name] = os.path.join(tmp, name)
            with open(keys[name], 'w') as f:
                f.write(text)
        curve = '--kv_events_curve_secret_key_file'
        cases = [  # (flags, what stderr says)
            (['--kv_events_endpoint', pub, '--kv_events_format', 'json'], '--kv_events_format: KV-event format "json"'),
            (['--kv_events=true', '--kv_events_format', 'msgpack'], '--kv_events_format'),
            (['--kv_events_endpoint', pub, '--kv_events_buffer_steps', '0'], '--kv_events_buffer_steps must be in'),
            (['--kv_events_endpoint', pub, '--kv_events_buffer_steps', '1000001'], '--kv_events_buffer_steps'),
            (['--kv_events_replay_endpoint', 'ipc://%s/replay' % tmp], '--kv_events_replay_endpoint needs'),
            (['--kv_events=true', '--kv_events_replay_endpoint', 'ipc://%s/replay' % tmp],
             '--kv_events_replay_endpoint needs --kv_events_endpoint'),
            (['--kv_events_endpoint', pub, '--kv_events_replay_endpoint', pub], 'are the same'),
            (['--kv_events_endpoint', 'not-an-endpoint'], 'not-an-endpoint: Invalid argument'),
            (['--kv_events_endpoint', 'tcp://127.0.0.1'], 'tcp://127.0.0.1: Invalid argument'),
            (['--kv_events_endpoint', 'tcp://*:notaport', '--kv_events_allow_plaintext_remote'],
             'tcp://*:notaport: Invalid argument'),
            # A wildcard host is an explicit choice: CURVE or --kv_events_allow_plaintext_remote.
            (['--kv_events_endpoint', 'tcp://*:5556'],
             '--kv_events_endpoint: tcp://*:5556 binds every address'),
            (['--kv_events_endpoint', pub, '--kv_events_replay_endpoint', 'tcp://0.0.0.0:5557'],
             '--kv_events_allow_plaintext_remote'),
            (['--kv_events_endpoint', 'tcp://[::]:5556'], '--kv_events_endpoint: tcp://[::]:5556 binds every address'),
            (['--kv_events_endpoint', pub, curve, os.path.join(tmp, 'missing.key')],
             '--kv_events_curve_secret_key_file: cannot open'),
            (['--kv_events_endpoint', pub, curve, keys['bad.key']],
             '--kv_events_curve_secret_key_file: %s line 1 is not a Z85 CURVE key' % keys['bad.key']),
            (['--kv_events_endpoint', pub, curve, keys['good.key'], '--kv_events_curve_client_keys_file',
              keys['bad.key']], '--kv_events_curve_client_keys_file: %s line 1' % keys['bad.key']),
            (['--kv_events_endpoint', pub, '--kv_events_curve_client_keys_file', keys['clients.txt']],
             '--kv_events_curve_client_keys_file needs --kv_events_curve_secret_key_file'),
            (['--kv_events=true', curve, keys['good.key']],
             '--kv_events_curve_secret_key_file needs --kv_events_endpoint'),
            (['--kv_events_endpoint', 'bogus://*:5556'], 'Protocol not supported'),
            (['--kv_events_endpoint', 'ipc://%s/missing/pub' % tmp], 'No such file or directory'),
            (['--kv_events_endpoint', pub, '--kv_events_replay_endpoint', 'nonsense'],
             '--kv_events_replay_endpoint: cannot bind nonsense: Invalid argument'),
        ]
        for args, message in cases:
            r = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn('error: ', r.stderr, args)
            self.assertIn(message, r.stderr, args)

    def test_curve_keygen(self):
        r = subprocess.run([harness.bin_path('chunkattn-coordinator'), '--kv_events_curve_keygen'],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = dict(line.split('=', 1) for line in r.stdout.splitlines())
        self.assertEqual(sorted(lines), ['public_key', 'secret_key'])
        self.assertEqual(zmq.curve_public(lines['secret_key'].encode()).decode(), lines['public_key'])

    def test_get_kv_blocks(self):
        # No worker ever answers: the API port serves all the same. Both
        # processes are started before this process opens a gRPC channel
        # (a fork beside gRPC's threads can hang in its fork handlers).
        started = {}
        for name, args in (('kv-off', ()), ('kv-in-process', ('--kv_events=true',))):
            port = harness.free_port()
            p = harness.Process(name, self.argv(*args, port=port)).start()
            self.addCleanup(p.stop)
            started[name] = (p, port)
        stubs = {}
        for name, (p, port) in started.items():
            harness.wait_for(lambda: harness.port_open(port) or not p.alive(), 60, what='%s listening' % name)
            self.assertTrue(p.alive(), p.log_tail())
            channel = grpc.insecure_channel('127.0.0.1:%d' % port)
            self.addCleanup(channel.close)
            stubs[name] = harness.pb_grpc.GenerationStub(channel)
        with self.assertRaises(grpc.RpcError) as e:
            stubs['kv-off'].GetKvBlocks(harness.pb.GetKvBlocksRequest(), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION, e.exception.details())
        self.assertIn('--kv_events', e.exception.details())
        # In process only: no socket, and no cache yet: nothing listed.
        kb = stubs['kv-in-process'].GetKvBlocks(harness.pb.GetKvBlocksRequest(), timeout=30)
        self.assertEqual(list(kb.namespaces), [])
        p = started['kv-in-process'][0]
        harness.wait_for(lambda: 'coordinator: KV events' in p.log_tail(), 10, what='the KV-events log line')
        self.assertIn('coordinator: KV events in process only, topic kv@', p.log_tail())


if __name__ == '__main__':
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--requests', type=int, default=REQUESTS)
    parser.add_argument('--seed', type=int, default=SEED)
    known, rest = parser.parse_known_args()
    REQUESTS, SEED = known.requests, known.seed
    sys.argv = [sys.argv[0]] + rest
    harness.main()
