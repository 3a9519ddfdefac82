"""The public API's contract on one coordinator and one worker: cancelling,
argument checks, parallel samples, stop strings, the metrics' format."""
import collections
import os
import random
import re
import shutil
import subprocess
import threading
import time
import unittest

import grpc

import harness


class CancelTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('cancel', shared=True, tp=1)

    def test_cancel_mid_stream_releases_everything(self):
        before = self.cluster.metrics().value('chunkattn_requests_finished_total', reason='cancelled')
        rng = random.Random(5)
        call = self.cluster.stub.Generate(harness.make_request(
            prompt_ids=harness.random_ids(rng, 300), namespace=harness.fresh_namespace('cancel'),
            temperature=0.0, max_new_tokens=2000, ignore_eos=True), timeout=120)
        got = 0
        for response in call:
            got += len(response.token_ids)
            self.assertEqual(response.finish_reason, harness.pb.FINISH_REASON_UNSPECIFIED)
            if got >= 3:
                break
        self.assertGreaterEqual(got, 3)
        call.cancel()
        with self.assertRaises(grpc.RpcError) as e:
            for _ in call:
                pass
        self.assertEqual(e.exception.code(), grpc.StatusCode.CANCELLED)

        def released():
            m = self.cluster.metrics()
            state = (m.get('chunkattn_kv_chunks', state='used'),
                     m.get('chunkattn_requests', state='running'),
                     m.value('chunkattn_requests_finished_total', reason='cancelled'))
            return state if state[0] == 0 and state[1] == 0 and state[2] > before else None

        harness.wait_for(released, timeout=30, interval=0.2,
                         what='used chunks and running requests 0, a cancelled request counted')
        stats = self.cluster.cache_stats()
        self.assertEqual(stats.used_chunks, 0)
        self.assertEqual(stats.running_requests, 0)


class AbortTest(harness.ServiceTestCase):
    """Abort(request_ids): a caller ends its own running and waiting requests
    by their request_id, never another tenant's; GetCacheStats' load figures."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        tokens = harness.token_file('a-1 acme\na-2 acme\nb-1 globex\nops-1 role:operator\n', 'chunkattn-abort-',
                                    cls.addClassCleanup)
        cls.cluster = cls.start_cluster('abort', tp=1, coordinator_args=[
            '--auth_token_file', tokens, '--max_batch_size', '1'])

    def md(self, token):
        return [('authorization', 'Bearer ' + token)]

    def abort(self, token, ids):
        reply = self.cluster.stub.Abort(harness.pb.AbortRequest(request_ids=ids), metadata=self.md(token), timeout=30)
        return sorted(reply.aborted_request_ids)

    def stats(self):
        return self.cluster.stub.GetCacheStats(harness.pb.GetCacheStatsRequest(), metadata=self.md('ops-1'), timeout=30)

    def test_abort_running_and_waiting_only_for_the_owner(self):
        rng = random.Random(9)
        ns = harness.fresh_namespace('abort')
        long_call = self.cluster.stub.Generate(harness.make_request(
            prompt_ids=harness.random_ids(rng, 200), namespace=ns, request_id='job-long', temperature=0.0,
            max_new_tokens=3000, ignore_eos=True), metadata=self.md('a-1'), timeout=120)
        first = next(long_call)
        self.assertEqual(first.finish_reason, harness.pb.FINISH_REASON_UNSPECIFIED)
        # Batch size 1: the second request waits behind the first.
        wait_call = self.cluster.stub.Generate(harness.make_request(
            prompt_ids=harness.random_ids(rng, 123), namespace=ns, request_id='job-wait', max_new_tokens=5),
            metadata=self.md('a-2'), timeout=120)
        stats = harness.wait_for(lambda: (lambda s: s if s.waiting_requests == 1 else None)(self.stats()),
                                 timeout=30, interval=0.05, what='one waiting request')
        self.assertEqual(stats.waiting_prompt_tokens, 123)
        self.assertEqual(stats.running_requests, 1)
        self.assertGreater(stats.kv_cache_usage, 0)
        self.assertAlmostEqual(stats.kv_cache_usage, stats.used_chunks / stats.capacity_chunks, places=9)
        # Another tenant finds neither; the owner's other token finds both.
        self.assertEqual(self.abort('b-1', ['job-long', 'job-wait']), [])
        self.assertEqual(self.abort('a-1', ['job-wait', 'never-sent', 'job-wait']), ['job-wait'])
        with self.assertRaises(grpc.RpcError) as e:
            for _ in wait_call:
                pass
        self.assertEqual(e.exception.code(), grpc.StatusCode.CANCELLED)
        self.assertIn('aborted by an Abort call', e.exception.details())
        self.assertEqual(self.abort('a-2', ['job-long']), ['job-long'])
        got = len(first.token_ids)
        with self.assertRaises(grpc.RpcError) as e:
            for r in long_call:
                got += len(r.token_ids)
        self.assertEqual(e.exception.code(), grpc.StatusCode.CANCELLED)
        self.assertLess(got, 3000)
        harness.wait_for(lambda: (lambda s: s.used_chunks == 0 and s.running_requests == 0 and
                                  s.waiting_requests == 0 and s.waiting_prompt_tokens == 0)(self.stats()),
                         timeout=30, interval=0.1, what='nothing running, waiting or held')
        self.assertEqual(self.stats().kv_cache_usage, 0)
        self.assertEqual(self.abort('a-1', ['job-long']), [])  # ended: not found again
        # A request of the other tenant with the same id is its own.
        done = self.cluster.stub.Generate(harness.make_request(
            prompt_ids=harness.random_ids(rng, 50), namespace=ns, request_id='job-long', max_new_tokens=3),
            metadata=self.md('b-1'), timeout=120)
        self.assertEqual(self.abort('a-1', ['job-long']), [])
        self.assertEqual(sum(len(r.token_ids) for r in done), 3)
        # The command-line client, with the token from the environment.
        cli = harness.bin_path('chunkattn')
        env = dict(os.environ, CHUNKATTN_AUTH_TOKEN='a-1')
        call = self.cluster.stub.Generate(harness.make_request(
            prompt_ids=harness.random_ids(rng, 40), namespace=ns, request_id='cli-job', max_new_tokens=3000,
            ignore_eos=True), metadata=self.md('a-1'), timeout=120)
        next(call)
        r = subprocess.run([cli, 'abort', '--server', '127.0.0.1:%d' % self.cluster.port, 'cli-job', 'other'],
                           capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual((r.returncode, r.stdout), (0, 'aborted cli-job\n'), r.stderr)
        with self.assertRaises(grpc.RpcError):
            for _ in call:
                pass
        r = subprocess.run([cli, 'abort', '--server', '127.0.0.1:%d' % self.cluster.port], capture_output=True,
                           text=True, timeout=60, env=env)
        self.assertEqual(r.returncode, 2, r.stderr)

    def test_bad_abort_requests(self):
        for ids in ([], ['x'] * 1025, [''], ['y' * 257]):
            with self.assertRaises(grpc.RpcError) as e:
                self.abort('a-1', ids)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, ids[:2])
        with self.assertRaises(grpc.RpcError) as e:
            self.cluster.stub.Abort(harness.pb.AbortRequest(request_ids=['x']), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as e:
            self.abort('wrong', ['x'])
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)


class BadInputTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('badinput', tp=1)

    def assert_invalid(self, request, mention=None):
        with self.assertRaises(grpc.RpcError) as e:
            self.cluster.generate(request, timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
        if mention is not None:
            self.assertIn(mention, e.exception.details().lower())

    def test_bad_requests_are_invalid_argument(self):
        ok = [5, 6, 7, 8]
        mk = harness.make_request
        with self.subTest('empty prompt'):
            self.assert_invalid(mk(prompt_ids=[]), 'prompt')
            self.assert_invalid(mk(text=''), 'prompt')
            self.assert_invalid(harness.pb.GenerateRequest(), 'prompt')
        with self.subTest('token id outside the vocabulary'):
            self.assert_invalid(mk(prompt_ids=[5, 999999, 6]))
            self.assert_invalid(mk(prompt_ids=[5, -1]))
        with self.subTest('temperature -1'):
            self.assert_invalid(mk(prompt_ids=ok, temperature=-1.0), 'temperature')
        for top_p in (0.0, 1.5):
            with self.subTest(top_p=top_p):
                self.assert_invalid(mk(prompt_ids=ok, top_p=top_p), 'top_p')
        with self.subTest('prompt + max_new_tokens over the context'):
            self.assert_invalid(mk(prompt_ids=[5] * 100, max_new_tokens=4000))
            self.assert_invalid(mk(prompt_ids=[5] * 4097, max_new_tokens=1))
        with self.subTest('n = 1000'):
            self.assert_invalid(mk(prompt_ids=ok, n=1000))
        for priority in (1000001, -1000001, 2**31 - 1):
            with self.subTest(priority=priority):
                self.assert_invalid(mk(prompt_ids=ok, priority=priority), 'priority')

    def test_long_text_is_refused_before_it_is_tokenized(self):
        """Finding 4 of the reliability issue: 4 MB prompts were tokenized whole
        on the reactor threads (3.3 GB, a normal stream stalled). Text beyond
        the context's worth of bytes (32 per token) is refused unread; text
        within it is tokenized on the coordinator's text pool, with bounded
        memory, while a normal stream goes on."""
        c = self.cluster
        status_path = '/proc/%d/status' % c.coordinator.proc.pid

        def rss_mib(field):
            with open(status_path) as f:
                return int(re.search(field + r':\s+(\d+) kB', f.read()).group(1)) / 1024
        limit = 4096 * 32  # the demo model's context
        prose = ('It was the best of times, it was the worst of times; ' * (limit // 50 + 1))[:limit]
        for text in (prose + 'x', 'y' * (1 << 20)):
            with self.assertRaises(grpc.RpcError) as e:
                c.generate(harness.make_request(text=text, max_new_tokens=1), timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn('at most %d' % limit, e.exception.details())
            with self.assertRaises(grpc.RpcError) as e:
                c.stub.Tokenize(harness.pb.TokenizeRequest(text=text), timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        tokens = c.stub.Tokenize(harness.pb.TokenizeRequest(text=prose), timeout=60).token_ids
        self.assertGreater(len(tokens), 4096)  # at the byte bound, still over the context
        before = rss_mib('VmHWM')
        normal = {}

        def stream():
            normal['samples'] = c.generate(harness.make_request(prompt_ids=[5, 6, 7], max_new_tokens=200,
                                                                ignore_eos=True), timeout=120)
        t = threading.Thread(target=stream)
        t.start()
        futures = [c.stub.Tokenize.future(harness.pb.TokenizeRequest(text=prose), timeout=120) for _ in range(24)]
        streams = [c.stub.Generate(harness.make_request(text=prose, max_new_tokens=1), timeout=120) for _ in range(24)]
        codes = collections.Counter()
        for f in futures:
            try:
                self.assertEqual(list(f.result().token_ids), list(tokens))
                codes['OK'] += 1
            except grpc.RpcError as e:
                codes[e.code().name] += 1
        for call in streams:
            with self.assertRaises(grpc.RpcError) as e:
                list(call)
            codes[e.exception.code().name] += 1
            if e.exception.code() == grpc.StatusCode.INVALID_ARGUMENT:
                self.assertIn('exceed the context', e.exception.details())
        t.join(120)
        self.assertEqual(normal['samples'][0].completion_tokens, 200)
        self.assertEqual(set(codes) - {'OK', 'INVALID_ARGUMENT', 'RESOURCE_EXHAUSTED'}, set(), codes)
        self.assertGreater(codes['OK'], 0, codes)
        self.assertLess(rss_mib('VmHWM') - before, 256, 'tokenizing 48 prompts at the bound raised the peak RSS')
        # glibc kept what tokenizing freed in each text thread's arena: the
        # idle RSS stayed at the flood's peak (seen as the soak's RSS check
        # failing). The idle pool trims it (17+ MiB below the peak here).
        peak = rss_mib('VmHWM')
        deadline = time.monotonic() + 15
        idle = [rss_mib('VmRSS')]
        while idle[-1] > peak - 10 and time.monotonic() < deadline:
            time.sleep(0.25)
            idle.append(rss_mib('VmRSS'))
        self.assertLessEqual(idle[-1], peak - 10, 'the idle coordinator kept what tokenizing freed: '
                             'peak %.1f MiB, then %s MiB' % (peak, ['%.1f' % m for m in idle[::8]]))

    def test_unparseable_bodies_are_named_not_logged(self):
        """Finding 8 of the reliability issue: a body that is not the method's
        message got UNIMPLEMENTED with no message (and a log line each)."""
        c = self.cluster
        garbage = b'\xff\xff\xff\xff\x0f not a protobuf'
        raw = lambda channel, method, streaming=False: (channel.unary_stream if streaming else channel.unary_unary)(
            method, request_serializer=lambda x: x, response_deserializer=lambda x: x)
        worker = grpc.insecure_channel('127.0.0.1:%d' % c.worker_ports[0])
        self.addCleanup(worker.close)
        def log_lines(process):
            with open(process.log_path, 'rb') as f:
                return len(f.read().splitlines())
        before = log_lines(c.coordinator), log_lines(c.workers[0])
        for _ in range(50):
            for channel, method, streaming in ((c.channel, '/chunkattn.v1.Generation/Generate', True),
                                               (c.channel, '/chunkattn.v1.Generation/Tokenize', False),
                                               (c.channel, '/chunkattn.v1.Generation/GetCacheStats', False),
                                               (worker, '/chunkattn.internal.v1.Worker/Join', False),
                                               (worker, '/chunkattn.internal.v1.Worker/StoreGet', False)):
                with self.assertRaises(grpc.RpcError) as e:
                    result = raw(channel, method, streaming)(garbage, timeout=10)
                    if streaming:
                        list(result)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, method)
                self.assertIn('not a valid message for ' + method, e.exception.details())
        for channel, method in ((c.channel, '/chunkattn.v1.Generation/Nope'),
                                (worker, '/chunkattn.internal.v1.Worker/Nope')):
            with self.assertRaises(grpc.RpcError) as e:
                raw(channel, method)(b'', timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
            self.assertIn(method + ' is not served here', e.exception.details())
        after = log_lines(c.coordinator), log_lines(c.workers[0])
        self.assertLess(after[0] - before[0], 5)
        self.assertLess(after[1] - before[1], 5)
        samples = c.generate(harness.make_request(prompt_ids=[5, 6, 7], max_new_tokens=3, ignore_eos=True))
        self.assertEqual(samples[0].completion_tokens, 3)

    def test_a_hostile_sampling_request_fails_no_other(self):
        """Finding 1 of the reliability issue: repetition_penalty = 1e-38 on a
        prompt that repeats a token overflowed a logit on the worker, failed the
        step and every request in flight with it."""
        import concurrent.futures
        hostile = harness.make_request(text='hello world hello', repetition_penalty=1e-38,
                                       max_new_tokens=8, ignore_eos=True, seed=1)
        normal = harness.make_request(prompt_ids=[5, 6, 7, 8, 9], temperature=0.0, max_new_tokens=24,
                                      ignore_eos=True)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(self.cluster.generate, hostile if i % 2 else normal) for i in range(16)]
            results = [f.result(timeout=120) for f in futures]  # raises on any failed call
        for i, samples in enumerate(results):
            self.assertEqual(len(samples[0].tokens), 8 if i % 2 else 24, i)
        self.assertEqual(harness.health(self.cluster.channel), harness.SERVING)

    def test_edges_that_are_valid(self):
        with self.subTest('the priority bounds'):
            for priority in (-1000000, 1000000):
                s = self.cluster.generate(harness.make_request(
                    prompt_ids=[5, 6, 7], temperature=0.0, max_new_tokens=2, priority=priority))[0]
                self.assertTrue(s.finished)
        with self.subTest('n = 0 means 1'):
            samples = self.cluster.generate(harness.make_request(
                prompt_ids=[5, 6, 7], n=0, temperature=0.0, max_new_tokens=3))
            self.assertEqual(list(samples), [0])
            self.assertTrue(samples[0].finished)
        with self.subTest('prompt + max_new_tokens == context'):
            samples = self.cluster.generate(harness.make_request(
                prompt_ids=[5] * 4090, temperature=0.0, max_new_tokens=6))
            self.assertTrue(samples[0].finished)
        with self.subTest('serves after the errors'):
            self.assertEqual(harness.health(self.cluster.channel), harness.SERVING)
            s = self.cluster.generate(harness.make_request(
                prompt_ids=[5, 6, 7], temperature=0.0, max_new_tokens=4, ignore_eos=True))[0]
            self.assertEqual(s.finish_reason, harness.pb.FINISH_REASON_LENGTH)
            self.assertEqual(len(s.tokens), 4)

    def test_tokenize_and_model_info(self):
        info = self.cluster.model_info()
        self.assertEqual(info.tensor_parallel_size, 1)
        self.assertEqual(info.chunk_size, 64)
        self.assertEqual(info.max_context, 4096)
        self.assertEqual(info.vocab_size, 2048)
        self.assertTrue(info.eos_token_ids)
        self.assertGreater(info.kv_chunk_bytes, 0)
        self.assertGreater(info.kv_capacity_chunks, 0)
        self.assertEqual(info.kv_capacity_tokens, info.kv_capacity_chunks * info.chunk_size)
        self.assertTrue(info.prefix_sharing)
        tok = self.cluster.stub.Tokenize(harness.pb.TokenizeRequest(text='To be, or not to be'),
                                         timeout=30)
        self.assertGreater(len(tok.token_ids), 1)
        self.assertEqual(len(tok.pieces), len(tok.token_ids))
        self.assertTrue(all(0 <= t < info.vocab_size for t in tok.token_ids))
        no_bos = self.cluster.stub.Tokenize(
            harness.pb.TokenizeRequest(text='To be, or not to be', add_bos=False), timeout=30)
        self.assertEqual(list(no_bos.token_ids), list(tok.token_ids[1:]))
        # A text prompt is its tokenization.
        s = self.cluster.generate(harness.make_request(text='To be, or not to be',
                                                       temperature=0.0, max_new_tokens=2))[0]
        self.assertEqual(s.prompt_tokens, len(tok.token_ids))

    def test_health_and_reflection(self):
        self.assertEqual(harness.health(self.cluster.channel), harness.SERVING)
        raw = harness.reflection_list_services(self.cluster.channel)
        self.assertIn(b'chunkattn.v1.Generation', raw)


class QueueBoundTest(harness.ServiceTestCase):
    """--max_waiting_requests: beyond it a request is refused at once."""

    @classmethod
    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('queue', tp=1, coordinator_args=[
            '--max_waiting_requests', '2', '--max_batch_size', '1'])

    def test_full_queue_is_resource_exhausted(self):
        import concurrent.futures
        request = harness.make_request(prompt_ids=[5, 6, 7, 8], temperature=0.0, max_new_tokens=200,
                                       ignore_eos=True)

        def call():
            try:
                return self.cluster.generate(request, timeout=120)
            except grpc.RpcError as e:
                return e
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            outcomes = list(pool.map(lambda _: call(), range(10)))
        refused = [o for o in outcomes if isinstance(o, grpc.RpcError)]
        served = [o for o in outcomes if not isinstance(o, grpc.RpcError)]
        # At most one runs (batch size 1) and two wait; the rest find the
        # queue full (two or three are served, by how the calls interleave).
        self.assertGreaterEqual(len(refused), 5, [o for o in refused])
        self.assertGreaterEqual(len(served), 2)
        for e in refused:
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
            self.assertIn('queue is full', e.details())
        for samples in served:
            self.assertEqual(len(samples[0].tokens), 200)
        self.assertEqual(harness.health(self.cluster.channel), harness.SERVING)


class ParallelSamplesTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('samples', shared=True, tp=1)

    def test_n3_seeded(self):
        prompt = harness.random_ids(random.Random(3), 90)

        def run():
            return self.cluster.generate(harness.make_request(
                prompt_ids=prompt, namespace=harness.fresh_namespace('n3'), n=3, temperature=1.0, seed=42,
                max_new_tokens=16))

        first = run()
        self.assertEqual(sorted(first), [0, 1, 2])
        for i, s in first.items():
            self.assertTrue(s.finished, 'sample %d' % i)
            self.assertIn(s.finish_reason, (harness.pb.FINISH_REASON_LENGTH,
                                            harness.pb.FINISH_REASON_STOP_TOKEN), 'sample %d' % i)
            self.assertEqual(s.prompt_tokens, len(prompt))
            self.assertEqual(s.completion_tokens, len(s.tokens))
            self.assertGreaterEqual(s.completion_tokens, 1)
        self.assertFalse(first[0].tokens == first[1].tokens == first[2].tokens,
                         'three samples at temperature 1 are identical')
        second = run()
        self.assertEqual(sorted(second), [0, 1, 2])
        for i in range(3):
            self.assertEqual(second[i].tokens, first[i].tokens, 'sample %d' % i)
            self.assertEqual(second[i].text, first[i].text, 'sample %d' % i)


class StopStringTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('stop', shared=True, tp=1)

    def test_text_ends_before_the_stop_string(self):
        prompt = 'To be, or not to be, that is the question:'
        full = self.cluster.generate(harness.make_request(
            text=prompt, temperature=0.0, max_new_tokens=40, ignore_eos=True))[0]
        text = full.text
        self.assertGreater(len(text.strip()), 8, repr(text))
        k = len(text) // 2
        stop = text[k:k + 4]
        expected = text[:text.find(stop)]
        got = self.cluster.generate(harness.make_request(
            text=prompt, temperature=0.0, max_new_tokens=40, ignore_eos=True, stop=[stop]))[0]
        self.assertEqual(got.finish_reason, harness.pb.FINISH_REASON_STOP_STRING,
                         'stop %r in %r' % (stop, text))
        self.assertEqual(got.text, expected, 'stop %r in %r' % (stop, text))
        self.assertNotIn(stop, got.text)
        self.assertLessEqual(got.completion_tokens, full.completion_tokens)


class MetricsFormatTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.cluster = cls.start_cluster('metrics', shared=True, tp=1)

    def test_metrics_are_exported(self):
        before = self.cluster.metrics()
        self.cluster.generate(harness.make_request(prompt_ids=[5, 6, 7, 8], temperature=0.0,
                                                   max_new_tokens=4, ignore_eos=True))
        count = 'chunkattn_request_duration_seconds_count'
        m = self.cluster.metrics_when(lambda m: m.value(count) > before.value(count),
                                      what='the request to be counted')
        names = m.names()
        for name in ('chunkattn_prompt_tokens_total', 'chunkattn_prompt_tokens_cached_total',
                     'chunkattn_generation_tokens_total', 'chunkattn_kv_chunks',
                     'chunkattn_kv_chunk_bytes', 'chunkattn_kv_shared_chunks',
                     'chunkattn_kv_logical_tokens', 'chunkattn_kv_physical_tokens',
                     'chunkattn_kv_evicted_chunks_total', 'chunkattn_kv_oldest_cached_seconds',
                     'chunkattn_requests', 'chunkattn_requests_finished_total', 'chunkattn_preemptions_total',
                     'chunkattn_time_to_first_token_seconds_bucket',
                     'chunkattn_inter_token_latency_seconds_bucket',
                     'chunkattn_request_duration_seconds_bucket',
                     'chunkattn_step_duration_seconds_bucket'):
            self.assertIn(name, names)
        for state in ('used', 'cached', 'free'):
            self.assertIsNotNone(m.get('chunkattn_kv_chunks', state=state), state)
        for state in ('running', 'waiting'):
            self.assertIsNotNone(m.get('chunkattn_requests', state=state), state)
        info = self.cluster.model_info()
        self.assertEqual(m.get('chunkattn_kv_chunk_bytes'), info.kv_chunk_bytes)
        self.assertEqual(sum(m.get('chunkattn_kv_chunks', state=s) for s in ('used', 'cached', 'free')),
                         info.kv_capacity_chunks)

        def delta(name, **labels):
            return m.value(name, **labels) - before.value(name, **labels)

        self.assertEqual(delta('chunkattn_prompt_tokens_total'), 4)
        self.assertEqual(delta('chunkattn_generation_tokens_total'), 4)
        self.assertEqual(delta('chunkattn_requests_finished_total', reason='length'), 1)
        self.assertEqual(delta('chunkattn_request_duration_seconds_count'), 1)
        self.assertEqual(delta('chunkattn_time_to_first_token_seconds_count'), 1)

    def test_promtool_check_metrics(self):
        promtool = shutil.which('promtool') or shutil.which('promtool', path='/usr/bin')
        if promtool is None:
            self.skipTest('promtool is not installed')
        self.cluster.generate(harness.make_request(prompt_ids=[9, 10, 11], temperature=0.0,
                                                   max_new_tokens=3))
        text = harness.scrape_text(self.cluster.metrics_port)
        r = subprocess.run([promtool, 'check', 'metrics'], input=text.encode(),
                           capture_output=True, timeout=60)
        out = r.stdout.decode() + r.stderr.decode()
        # The vllm:* series keep vLLM's names, which routers read; promtool's
        # naming lint (exit 3) flags their colon, and may flag nothing else.
        problems = [line for line in out.splitlines() if line.strip()]
        colons = [p for p in problems if re.fullmatch(r"vllm:\w+ metric names should not contain ':'", p)]
        self.assertIn(r.returncode, (0, 3), 'promtool: ' + out)
        self.assertEqual(problems, colons, 'promtool: ' + out)
        self.assertEqual(r.returncode == 0, not problems, 'promtool: ' + out)


if __name__ == '__main__':
    harness.main()
