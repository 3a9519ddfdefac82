"""Who may see what (SECURITY.md, "Who may see what"), through real processes:
one coordinator with bearer tokens bound to tenants (two whose names are
prefixes of one another), two unbound tokens, a router and an operator
credential, KV events on, and all three fronts (chunkattn.v1, the vLLM engine
API and OpenAI HTTP).

The sweep: tenant A sends a prompt; tenant B then calls every RPC and HTTP
route a tenant may call, on every front, and no reply (bodies, errors,
trailers) holds a byte of A's prompt (its token ids as protobuf varints and as
JSON, its text). The router's KV-event stream, which must carry A's token ids,
is the control that shows the detector finds them.
"""
import json
import random
import socket
import time

import grpc

import harness
import test_vllm_engine as vllm
from test_openai import Http

CHUNK = 64  # the harness coordinator's --chunk_size default
TOKENS = ('a-1 acme\na-2 acme\nb-1 acme2\nu-1\nu-2\n'
          'router-1 role:router\nops-1 role:operator\n')
DENIED = grpc.StatusCode.PERMISSION_DENIED


class TenantIsolationTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        tokens = harness.token_file(TOKENS, 'chunkattn-tenancy-', cls.addClassCleanup)
        cls.cluster = cls.start_cluster('tenancy', tp=1, coordinator_args=[
            '--auth_token_file', tokens, '--kv_events=true', '--served_model_name', 'demo'])
        vllm.generate_vllm_stubs(harness.SOURCE)
        cls.v = vllm.vpb_grpc.VllmEngineStub(cls.cluster.channel)

    def md(self, token):
        return [('authorization', 'Bearer ' + token)]

    def code_of(self, fn):
        try:
            fn()
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    def generate(self, token, prompt, namespace='', max_new_tokens=2, request_id=''):
        req = harness.make_request(prompt_ids=prompt, namespace=namespace, temperature=0.0,
                                   max_new_tokens=max_new_tokens, ignore_eos=True)
        if request_id:
            req.request_id = request_id
        return harness.collect(self.cluster.stub.Generate(req, metadata=self.md(token), timeout=60))[0]

    def cached(self, token, prompt, namespace=''):
        return self.generate(token, prompt, namespace).cached_prompt_tokens

    def subscribe(self, token):
        """The KV-event stream replayed from its first batch (1: 0 is live
        only), read for a moment: (batches, error code)."""
        call = self.v.SubscribeKvEvents(vllm.cpb.SubscribeKvEventsRequest(start_sequence_number=1),
                                        metadata=self.md(token), timeout=3)
        batches = []
        try:
            for b in call:
                batches.append(b)
        except grpc.RpcError as e:
            return batches, e.code()
        return batches, grpc.StatusCode.OK

    def test_derived_data_by_role(self):
        rng = random.Random(1)
        prompt = harness.random_ids(rng, 3 * CHUNK + 5)
        self.generate('a-1', prompt, namespace='x')
        # Per-tenant figures: series for the tenant that ran, idle again (0).
        m = harness.scrape_metrics(self.cluster.metrics_port)
        for state in ('running', 'waiting'):
            self.assertEqual(m.get('chunkattn_tenant_requests', tenant='t:acme', state=state), 0.0)
        self.assertEqual(m.get('chunkattn_tenant_running_sequences', tenant='t:acme'), 0.0)
        # Its prompt's chunks stay cached in its namespace 't:acme/x' and count as its own.
        self.assertGreaterEqual(m.get('chunkattn_tenant_kv_chunks', tenant='t:acme'), 4.0)
        stub, v = self.cluster.stub, self.v
        for token in ('a-1', 'b-1', 'u-1', 'ops-1'):
            with self.subTest(token=token):
                self.assertEqual(self.subscribe(token)[1], DENIED)
                self.assertEqual(self.code_of(lambda: stub.GetKvBlocks(
                    harness.pb.GetKvBlocksRequest(), metadata=self.md(token), timeout=30)), DENIED)
        for token in ('a-1', 'b-1', 'u-1'):
            with self.subTest(token=token):
                self.assertEqual(self.code_of(lambda: stub.GetCacheStats(
                    harness.pb.GetCacheStatsRequest(), metadata=self.md(token), timeout=30)), DENIED)
                self.assertEqual(self.code_of(lambda: v.GetLoads(
                    vllm.vpb.GetLoadsRequest(), metadata=self.md(token), timeout=30)), DENIED)
                info = v.GetServerInfo(vllm.vpb.GetServerInfoRequest(), metadata=self.md(token), timeout=30)
                self.assertEqual((info.active_requests, info.last_receive_timestamp), (0, 0))
                self.assertEqual(info.server_type, 'vllm-grpc')
        for token in ('router-1', 'ops-1'):
            with self.subTest(token=token):
                stats = stub.GetCacheStats(harness.pb.GetCacheStatsRequest(), metadata=self.md(token), timeout=30)
                self.assertGreater(stats.capacity_chunks, 0)
                v.GetLoads(vllm.vpb.GetLoadsRequest(), metadata=self.md(token), timeout=30)
                # Reading roles send no requests.
                self.assertEqual(self.code_of(lambda: self.generate(token, prompt)), DENIED)
        blocks = stub.GetKvBlocks(harness.pb.GetKvBlocksRequest(), metadata=self.md('router-1'), timeout=30)
        self.assertIn('t:acme/x', [g.cache_namespace for g in blocks.namespaces])
        batches, code = self.subscribe('router-1')
        self.assertIn(code, (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED))
        stream = b''.join(b.SerializeToString() for b in batches)
        self.assertIn(harness.varints(prompt[:CHUNK]), stream, 'the router sees the blocks with their token ids')

    def test_no_reply_to_another_tenant_holds_its_prompt(self):
        rng = random.Random(2)
        secret = harness.random_ids(rng, 3 * CHUNK + 7)
        words = 'quixotic zephyr marmalade obelisk ' * 8
        self.generate('a-1', secret, namespace='s', request_id='a-secret')
        http_a = Http(self.cluster.http_port, 'a-1')
        status, _, _ = http_a.request('POST', '/v1/completions', {
            'model': 'demo', 'prompt': words, 'max_tokens': 2, 'cache_salt': 's'})
        self.assertEqual(status, 200)

        replies = []  # every byte tenant B gets back

        def keep(fn):
            try:
                r = fn()
                if hasattr(r, 'SerializeToString'):
                    replies.append(r.SerializeToString())
                else:
                    for item in r:
                        replies.append(item.SerializeToString())
            except grpc.RpcError as e:
                replies.append((e.details() or '').encode())

        md = self.md('b-1')
        stub, v, pb, vpb, cpb = self.cluster.stub, self.v, harness.pb, vllm.vpb, vllm.cpb
        keep(lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=md, timeout=30))
        keep(lambda: stub.Tokenize(pb.TokenizeRequest(text='hello there'), metadata=md, timeout=30))
        keep(lambda: stub.GetCacheStats(pb.GetCacheStatsRequest(), metadata=md, timeout=30))
        keep(lambda: stub.GetKvBlocks(pb.GetKvBlocksRequest(), metadata=md, timeout=30))
        keep(lambda: stub.Abort(pb.AbortRequest(request_ids=['a-secret']), metadata=md, timeout=30))
        # B asks for A's prompt in A's namespace name: a miss (cached_prompt_tokens 0).
        responses = list(stub.Generate(harness.make_request(prompt_ids=secret[:CHUNK * 3], namespace='s',
                                                            max_new_tokens=2, temperature=0.0),
                                       metadata=md, timeout=60))
        replies.extend(r.SerializeToString() for r in responses)
        self.assertEqual(max(r.usage.cached_prompt_tokens for r in responses), 0)
        keep(lambda: v.GetModelInfo(vpb.GetModelInfoRequest(), metadata=md, timeout=30))
        keep(lambda: v.GetServerInfo(vpb.GetServerInfoRequest(), metadata=md, timeout=30))
        keep(lambda: v.GetLoads(vpb.GetLoadsRequest(), metadata=md, timeout=30))
        keep(lambda: v.HealthCheck(vpb.HealthCheckRequest(), metadata=md, timeout=30))
        keep(lambda: list(v.GetTokenizer(cpb.GetTokenizerRequest(), metadata=md, timeout=30)))
        keep(lambda: list(v.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(start_sequence_number=0),
                                              metadata=md, timeout=3)))
        keep(lambda: v.Abort(vpb.AbortRequest(request_ids=['a-secret']), metadata=md, timeout=30))
        keep(lambda: list(v.Generate(vllm.vreq(prompt_ids=secret[:CHUNK * 3], max_tokens=2, temperature=0.0),
                                     metadata=md, timeout=60)))
        http_b = Http(self.cluster.http_port, 'b-1')
        for method, path, body in (
                ('GET', '/v1/models', None), ('GET', '/v1/models/demo', None), ('GET', '/health', None),
                ('GET', '/version', None), ('GET', '/metrics', None),
                ('POST', '/tokenize', {'model': 'demo', 'prompt': 'hello there'}),
                ('POST', '/detokenize', {'model': 'demo', 'tokens': [5, 6, 7]}),
                ('POST', '/v1/completions', {'model': 'demo', 'prompt': words, 'max_tokens': 2,
                                             'cache_salt': 's', 'return_token_ids': True}),
                ('POST', '/v1/completions', {'model': 'demo', 'prompt': secret[:CHUNK * 3 + 1], 'max_tokens': 2,
                                             'cache_salt': 's-http'})):
            status, _, payload = http_b.request(method, path, body)
            self.assertLess(status, 500, (path, payload[:300]))
            replies.append(payload)
            if path == '/v1/completions':
                usage = json.loads(payload)['usage']
                self.assertEqual(usage.get('prompt_tokens_details', {}).get('cached_tokens', 0), 0,
                                 'another tenant hit A\'s cache: %s' % usage)
        # Detectors: A's ids as varints (a block's token_ids, a packed field)
        # and as JSON lists; A's words.
        probes = [harness.varints(secret[i:i + 8]) for i in (0, CHUNK, 2 * CHUNK)]
        json_probes = [','.join(str(x) for x in secret[i:i + 8]).encode() for i in (0, CHUNK)]
        for reply in replies:
            for p in probes:
                self.assertNotIn(p, reply)
            squeezed = reply.replace(b' ', b'')
            for p in json_probes:
                self.assertNotIn(p, squeezed)
            self.assertNotIn(b'quixotic zephyr', reply)
        # The detector finds A's ids where they are: the router's stream.
        batches, _ = self.subscribe('router-1')
        self.assertIn(probes[1], b''.join(b.SerializeToString() for b in batches))

    def test_bad_ids_are_refused_naming_what_was_sent(self):
        """A request id past 256 bytes, on every front; a token id past
        int32 on the vLLM API, reported as sent (not clamped)."""
        md = self.md('a-1')
        req = harness.make_request(prompt_ids=[5, 6, 7], max_new_tokens=1)
        req.request_id = 'x' * 4096
        with self.assertRaises(grpc.RpcError) as e:
            list(self.cluster.stub.Generate(req, metadata=md, timeout=30))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn('request_id', e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            list(self.v.Generate(vllm.vreq(prompt_ids=[5, 6], request_id='y' * 4096, max_tokens=1),
                                 metadata=md, timeout=30))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(grpc.RpcError) as e:
            list(self.v.Generate(vllm.vreq(prompt_ids=[5, 2 ** 32 - 1], max_tokens=1), metadata=md, timeout=30))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(str(2 ** 32 - 1), e.exception.details())
        status, _, payload = Http(self.cluster.http_port, 'a-1').request(
            'POST', '/v1/completions', {'model': 'demo', 'prompt': 'hi', 'max_tokens': 1},
            headers={'X-Request-Id': 'z' * 4096})
        self.assertEqual(status, 400, payload)
        self.assertEqual(json.loads(payload)['error']['param'], 'X-Request-Id')

    def test_tenants_with_prefix_names_and_unbound_tokens(self):
        rng = random.Random(3)
        prompt = harness.random_ids(rng, 2 * CHUNK + 3)
        # acme and acme2: one name starts the other; nothing is shared.
        self.assertEqual(self.cached('a-1', prompt, 'n'), 0)
        self.assertEqual(self.cached('b-1', prompt, 'n'), 0)
        self.assertEqual(self.cached('b-1', prompt, ''), 0)
        self.assertEqual(self.cached('b-1', prompt, '2/n'), 0)
        self.assertGreater(self.cached('a-2', prompt, 'n'), 0)  # acme's other token: the same tenant
        # Two unbound tokens are two tenants: no shared cache, no Abort of the other's request.
        other = harness.random_ids(rng, 2 * CHUNK + 3)
        self.assertEqual(self.cached('u-1', other), 0)
        self.assertEqual(self.cached('u-2', other), 0)
        self.assertGreater(self.cached('u-1', other), 0)
        req = harness.make_request(prompt_ids=other, temperature=0.0, max_new_tokens=2000, ignore_eos=True)
        req.request_id = 'u-job'
        call = self.cluster.stub.Generate(req, metadata=self.md('u-1'), timeout=120)
        next(call)
        aborted = self.cluster.stub.Abort(harness.pb.AbortRequest(request_ids=['u-job']), metadata=self.md('u-2'),
                                          timeout=30)
        self.assertEqual(list(aborted.aborted_request_ids), [])
        aborted = self.cluster.stub.Abort(harness.pb.AbortRequest(request_ids=['u-job']), metadata=self.md('u-1'),
                                          timeout=30)
        self.assertEqual(list(aborted.aborted_request_ids), ['u-job'])
        with self.assertRaises(grpc.RpcError):
            for _ in call:
                pass


class HttpGuardTest(harness.ServiceTestCase):
    """The HTTP front's guard through a real coordinator limited to 1,024
    descriptors (soft and hard, as `ulimit -n 1024`), its connection caps at
    their defaults: an unauthenticated body is refused from its head, 1,100
    idle connections cannot take the HTTP port or gRPC's away, and every port
    serves again within 2 s of the flood's end."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        tokens = harness.token_file('t-1 acme\no-1 role:operator\n', 'chunkattn-guard-', cls.addClassCleanup)
        cls.cluster = cls.start_cluster('http-guard', tp=1, coordinator_prefix=['prlimit', '--nofile=1024:1024', '--'],
                                        coordinator_args=['--auth_token_file', tokens, '--served_model_name', 'demo',
                                                          '--http_header_timeout_s', '2', '--http_body_timeout_s', '3'])

    def raw(self, data, until=b'\r\n\r\n', timeout=10):
        with socket.create_connection(('127.0.0.1', self.cluster.http_port), timeout=timeout) as s:
            s.sendall(data)
            got = b''
            while until not in got:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            return got

    def test_unauthenticated_body_is_refused_from_the_head(self):
        t0 = time.monotonic()
        got = self.raw(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                       b'Content-Length: 16000000\r\n\r\n')
        self.assertTrue(got.startswith(b'HTTP/1.1 401'), got[:200])
        self.assertLess(time.monotonic() - t0, 2.0)  # not after a body deadline: the body was never awaited
        got = self.raw(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t-1\r\n'
                       b'Content-Length: 99999999999\r\n\r\n')
        self.assertTrue(got.startswith(b'HTTP/1.1 413'), got[:200])
        self.assertIn(b'invalid_request_error', self.raw(
            b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t-1\r\n'
            b'Transfer-Encoding: chunked\r\n\r\n', until=b'}}'))

    def stats(self):
        return self.cluster.stub.GetCacheStats(harness.pb.GetCacheStatsRequest(),
                                               metadata=[('authorization', 'Bearer o-1')], timeout=10)

    def test_a_plain_request_ends_when_its_client_leaves(self):
        """Not streamed: no byte of the reply is written before the end, and the
        request still stops (and frees its KV) once its client has gone."""
        before = self.stats().generation_tokens_total
        body = json.dumps({'model': 'demo', 'prompt': list(range(5, 25)),
                           'max_tokens': 4000, 'ignore_eos': True}).encode()
        s = socket.create_connection(('127.0.0.1', self.cluster.http_port), timeout=10)
        s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t-1\r\n'
                  b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
        s.settimeout(0.02)

        def running():
            try:
                early = s.recv(4096)  # a reply now would be a refusal: show it
                raise AssertionError('answered before it ran: %r' % early[:300])
            except socket.timeout:
                pass
            return self.stats().running_requests == 1
        harness.wait_for(running, timeout=30, interval=0.02, what='the request running')
        s.close()
        harness.wait_for(lambda: (lambda st: st.running_requests == 0 and st.used_chunks == 0)(self.stats()),
                         timeout=5, interval=0.05, what='the request cancelled and its KV freed')
        self.assertLess(self.stats().generation_tokens_total - before, 4000)

    def test_idle_flood_leaves_every_port_serving(self):
        socks = []
        try:
            for _ in range(1100):  # past the descriptor limit itself
                try:
                    socks.append(socket.create_connection(('127.0.0.1', self.cluster.http_port), timeout=5))
                except OSError:
                    break
            # gRPC keeps serving while the flood is held.
            self.assertEqual(harness.health(self.cluster.channel), harness.SERVING)
            self.cluster.stub.GetModelInfo(harness.pb.GetModelInfoRequest(),
                                           metadata=[('authorization', 'Bearer t-1')], timeout=10)
        finally:
            for s in socks:
                s.close()
        # Every port serves again within 2 s of the flood's end.
        t0 = time.monotonic()
        status = None
        while time.monotonic() - t0 < 2.0:
            try:
                status = Http(self.cluster.http_port).request('GET', '/health')[0]
                break
            except OSError:
                time.sleep(0.05)
        self.assertEqual(status, 200)
        with grpc.insecure_channel('127.0.0.1:%d' % self.cluster.port,
                                   options=[('grpc.use_local_subchannel_pool', 1)]) as fresh:
            self.assertEqual(harness.health(fresh), harness.SERVING)  # a new connection, accepted
        metrics = harness.scrape_metrics(self.cluster.metrics_port)
        self.assertGreater(metrics.value('chunkattn_http_guard_events_total', event='refused_connection'), 0)


class GrpcListenerTest(harness.ServiceTestCase):
    """Idle connections to the gRPC port past the descriptor limit (prlimit
    256): gRPC 1.51's listener may stop accepting for good after a failed
    accept. Either it serves again within 2 s of the flood's end, or the
    coordinator's own probe (listener_probe.h) turns liveness NOT_SERVING on
    the health port, so that Kubernetes restarts the pod."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.health_port = harness.free_port()
        cls.cluster = cls.start_cluster('grpc-listener', tp=1,
                                        coordinator_prefix=['prlimit', '--nofile=256:256', '--'],
                                        coordinator_args=['--health_port', str(cls.health_port)])

    def liveness(self):
        with grpc.insecure_channel('127.0.0.1:%d' % self.health_port,
                                   options=[('grpc.use_local_subchannel_pool', 1)]) as ch:
            return harness.health(ch, service='liveness')

    def serves_on_a_new_connection(self):
        """gRPC shares connections between channels to one target unless told
        not to: this one opens its own, so the listener must accept it."""
        with grpc.insecure_channel('127.0.0.1:%d' % self.cluster.port,
                                   options=[('grpc.use_local_subchannel_pool', 1)]) as ch:
            return harness.health(ch, timeout=0.5) == harness.SERVING

    def test_flooded_listener_serves_or_liveness_fails(self):
        self.assertEqual(self.liveness(), harness.SERVING)
        socks = []
        try:
            for _ in range(400):
                socks.append(socket.create_connection(('127.0.0.1', self.cluster.port), timeout=5))
            time.sleep(1.0)  # gRPC accepts what it can, then fails
        finally:
            for s in socks:
                s.close()
        t0 = time.monotonic()
        served = False
        while time.monotonic() - t0 < 2.0 and not served:
            served = self.serves_on_a_new_connection()
        if served:
            self.assertEqual(self.liveness(), harness.SERVING)
            return
        # The listener is gone: liveness must say so (3 probes 5 s apart, 2 s each).
        harness.wait_for(lambda: self.liveness() == harness.NOT_SERVING, timeout=25, interval=0.5,
                         what='liveness NOT_SERVING after the API listener stopped accepting')


if __name__ == '__main__':
    harness.main()
