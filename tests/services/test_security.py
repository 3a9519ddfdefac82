"""TLS, mutual TLS and bearer tokens on the public API, and the plaintext
health port that Kubernetes' gRPC probes use (they cannot speak TLS)."""
import collections
import os
import random
import re
import subprocess
import unittest

import grpc

import harness

SERVING, NOT_SERVING = harness.SERVING, harness.NOT_SERVING
TOKEN = 'tok-3f9a1c0e7b'


def openssl(*args, cwd):
    subprocess.run(['openssl'] + list(args), cwd=cwd, check=True, capture_output=True, timeout=60)


WORKER_TLS_NAME = 'chunkattn-worker'  # the workers' and the coordinator's --worker_tls_server_name default


def make_pki(add_cleanup=None):
    """A CA, a server certificate for localhost / 127.0.0.1, a client
    certificate, and a worker certificate for the name every worker is
    checked against (WORKER_TLS_NAME: it serves as server and client
    certificate, as the chart's does), all signed by the CA, in a new folder
    (removed by add_cleanup, and at exit in any case). Returns
    (folder, {name: path})."""
    folder = harness.temp_dir('chunkattn-pki-', add_cleanup)
    openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=test-ca',
            '-keyout', 'ca.key', '-out', 'ca.pem', cwd=folder)
    with open(os.path.join(folder, 'san.ext'), 'w') as f:
        f.write('subjectAltName=DNS:localhost,IP:127.0.0.1\n')
    with open(os.path.join(folder, 'worker.ext'), 'w') as f:
        f.write('subjectAltName=DNS:%s\n' % WORKER_TLS_NAME)
    for name, ext in (('server', 'san.ext'), ('client', 'san.ext'), ('worker', 'worker.ext')):
        openssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=%s' % name,
                '-keyout', '%s.key' % name, '-out', '%s.csr' % name, cwd=folder)
        openssl('x509', '-req', '-in', '%s.csr' % name, '-CA', 'ca.pem', '-CAkey', 'ca.key',
                '-CAcreateserial', '-days', '2', '-extfile', ext, '-out', '%s.pem' % name,
                cwd=folder)
    return folder, {n: os.path.join(folder, n) for n in
                    ('ca.pem', 'server.pem', 'server.key', 'client.pem', 'client.key',
                     'worker.pem', 'worker.key')}


def read(path):
    with open(path, 'rb') as f:
        return f.read()


def run_cli(*args, env=None, timeout=120):
    return subprocess.run([harness.bin_path('chunkattn')] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout, env=env)


class TlsTokenTest(harness.ServiceTestCase):
    """TLS on the API port, bearer tokens, and the plaintext health port."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.tmp, cls.pki = make_pki(cls.addClassCleanup)
        cls.tokens = os.path.join(cls.tmp, 'tokens')
        with open(cls.tokens, 'w') as f:
            f.write('# one per line\n\nother-token\n%s\n' % TOKEN)
        cls.health_port = harness.free_port()
        creds = grpc.ssl_channel_credentials(root_certificates=read(cls.pki['ca.pem']))
        cls.cluster = cls.start_cluster(
            'tls', tp=1, credentials=creds,
            coordinator_args=['--tls_cert_file', cls.pki['server.pem'],
                              '--tls_key_file', cls.pki['server.key'],
                              '--auth_token_file', cls.tokens,
                              '--health_port', str(cls.health_port)])
        cls.auth = [('authorization', 'Bearer ' + TOKEN)]

    def request(self):
        return harness.make_request(prompt_ids=[5, 6, 7, 8], temperature=0.0, max_new_tokens=3,
                                    ignore_eos=True)

    def assert_code(self, code, fn):
        with self.assertRaises(grpc.RpcError) as e:
            fn()
        self.assertEqual(e.exception.code(), code, e.exception.details())
        return e.exception

    def test_token_required_on_every_api_call(self):
        stub = self.cluster.stub
        e = self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                             lambda: list(stub.Generate(self.request(), timeout=30)))
        self.assertIn('authorization', e.details())
        self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                         lambda: stub.GetModelInfo(harness.pb.GetModelInfoRequest(), timeout=30))
        self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                         lambda: stub.GetCacheStats(harness.pb.GetCacheStatsRequest(), timeout=30))
        self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                         lambda: stub.Tokenize(harness.pb.TokenizeRequest(text='hi'), timeout=30))
        for bad in ('Bearer wrong', 'Bearer ' + TOKEN + 'x', 'Basic ' + TOKEN, TOKEN):
            self.assert_code(grpc.StatusCode.UNAUTHENTICATED,
                             lambda: stub.GetModelInfo(harness.pb.GetModelInfoRequest(), timeout=30,
                                                       metadata=[('authorization', bad)]))

    def test_valid_token_generates(self):
        samples = harness.collect(self.cluster.stub.Generate(self.request(), timeout=60,
                                                             metadata=self.auth))
        self.assertEqual(len(samples[0].tokens), 3)
        # The second token in the file works too; the scheme is case-insensitive.
        info = self.cluster.stub.GetModelInfo(harness.pb.GetModelInfoRequest(), timeout=30,
                                              metadata=[('authorization', 'bearer other-token')])
        self.assertGreater(info.vocab_size, 0)

    def assert_handshake_fails(self, channel):
        """A call on `channel` fails with UNAVAILABLE (no TLS session), token or not."""
        try:
            stub = harness.pb_grpc.GenerationStub(channel)
            self.assert_code(grpc.StatusCode.UNAVAILABLE,
                             lambda: stub.GetModelInfo(harness.pb.GetModelInfoRequest(), timeout=10,
                                                       metadata=self.auth))
        finally:
            channel.close()

    def test_plaintext_client_is_refused(self):
        self.assert_handshake_fails(grpc.insecure_channel('127.0.0.1:%d' % self.cluster.port))

    def test_untrusted_certificate_is_refused(self):
        # The system roots do not know the test CA.
        self.assert_handshake_fails(self.cluster.open_channel(grpc.ssl_channel_credentials()))

    def test_health_is_open_and_on_the_plaintext_port(self):
        self.assertEqual(harness.health(self.cluster.channel), SERVING)  # TLS, no token
        plain = grpc.insecure_channel('127.0.0.1:%d' % self.health_port)
        try:
            for service in ('', 'chunkattn.v1.Generation', 'liveness'):
                self.assertEqual(harness.health(plain, service=service), SERVING, service)
            # An unknown service fails the call (NOT_FOUND), as the health protocol says.
            self.assertIsNone(harness.health(plain, service='no.such.Service'))
            # Only health is served there.
            stub = harness.pb_grpc.GenerationStub(plain)
            self.assert_code(grpc.StatusCode.UNIMPLEMENTED,
                             lambda: stub.GetModelInfo(harness.pb.GetModelInfoRequest(), timeout=10,
                                                       metadata=self.auth))
        finally:
            plain.close()

    def test_cli_with_tls_and_token(self):
        server = '127.0.0.1:%d' % self.cluster.port
        token_file = os.path.join(self.tmp, 'client-token')
        with open(token_file, 'w') as f:
            f.write(TOKEN + '\n')
        r = run_cli('info', '--server', server, '--tls_ca_file', self.pki['ca.pem'],
                    '--auth_token_file', token_file)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('chunk_size', r.stdout)
        env = dict(os.environ, CHUNKATTN_AUTH_TOKEN=TOKEN)
        r = run_cli('generate', '--server', server, '--tls_ca_file', self.pki['ca.pem'],
                    '--tls_server_name', 'localhost', '--prompt_ids', '5,6,7', '--max_new_tokens', 2,
                    env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        env.pop('CHUNKATTN_AUTH_TOKEN')
        r = run_cli('info', '--server', server, '--tls_ca_file', self.pki['ca.pem'], env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertRegex(r.stderr, r'(?m)^error: UNAUTHENTICATED: ')
        r = run_cli('info', '--server', server, '--tls_server_name', 'x', env=env)
        self.assertEqual(r.returncode, 2, r.stderr)


class MutualTlsTest(harness.ServiceTestCase):
    """--tls_client_ca_file: a client must present a certificate the CA signed."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.tmp, cls.pki = make_pki(cls.addClassCleanup)
        cls.with_cert = grpc.ssl_channel_credentials(root_certificates=read(cls.pki['ca.pem']),
                                                     private_key=read(cls.pki['client.key']),
                                                     certificate_chain=read(cls.pki['client.pem']))
        cls.cluster = cls.start_cluster(
            'mtls', tp=1, credentials=cls.with_cert,
            coordinator_args=['--tls_cert_file', cls.pki['server.pem'],
                              '--tls_key_file', cls.pki['server.key'],
                              '--tls_client_ca_file', cls.pki['ca.pem']])

    def test_client_certificate_required(self):
        info = self.cluster.model_info()
        self.assertGreater(info.vocab_size, 0)
        channel = self.cluster.open_channel(
            grpc.ssl_channel_credentials(root_certificates=read(self.pki['ca.pem'])))
        try:
            stub = harness.pb_grpc.GenerationStub(channel)
            with self.assertRaises(grpc.RpcError) as e:
                stub.GetModelInfo(harness.pb.GetModelInfoRequest(), timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        finally:
            channel.close()


class ProbeSemanticsTest(harness.ServiceTestCase):
    """Liveness stays SERVING while the workers are missing (so Kubernetes does
    not restart a coordinator that waits for them); readiness follows them."""

    def test_liveness_before_workers_readiness_after(self):
        cluster = harness.Cluster('probes', tp=1)
        type(self).clusters = type(self).clusters + [cluster]
        cluster.worker_ports = [harness.free_port()]
        cluster.port, cluster.metrics_port = harness.free_port(), harness.free_port()
        health_port = harness.free_port()
        cluster.coordinator_args = ['--health_port', str(health_port)]
        cluster.coordinator = harness.Process('probes-coordinator', cluster.coordinator_argv()).start()
        cluster.channel = cluster.open_channel()
        probe = grpc.insecure_channel('127.0.0.1:%d' % health_port)
        try:
            harness.wait_for(lambda: harness.health(probe, service='liveness') == SERVING, 30,
                             what='liveness SERVING without workers')
            for service in ('', 'chunkattn.v1.Generation'):
                self.assertEqual(harness.health(probe, service=service), NOT_SERVING, service)
            self.assertEqual(harness.health(cluster.channel), NOT_SERVING)
            cluster.start_worker(0)
            harness.wait_for(lambda: harness.health(probe) == SERVING, harness.STARTUP_TIMEOUT_S,
                             what='readiness once the worker joined')
            self.assertEqual(harness.health(cluster.channel), SERVING)
            self.assertEqual(harness.health(probe, service='liveness'), SERVING)
        finally:
            probe.close()


WORKER_TOKEN = 'wtok-8c41d2e09a7f'


def write_file(folder, name, text):
    path = os.path.join(folder, name)
    with open(path, 'w') as f:
        f.write(text)
    return path


class WorkerTrustTest(harness.ServiceTestCase):
    """The worker port: every call but health needs the worker token; a worker
    serves one live coordinator and a refused Join changes nothing; models load
    only from under --model_root; the rendezvous store is bounded. Probed as an
    attacker would, with two ranks (their rendezvous carries the token too)."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.tmp = harness.temp_dir('chunkattn-worker-trust-', cls.addClassCleanup)
        cls.token_file = write_file(cls.tmp, 'worker-token', '# shared secret\n%s\n' % WORKER_TOKEN)
        cls.cluster = cls.start_cluster(
            'trust', tp=2,
            worker_args=['--worker_token_file', cls.token_file, '--model_root', harness.model_dir()],
            coordinator_args=['--worker_token_file', cls.token_file])

    def worker_stub(self, rank=0):
        channel = grpc.insecure_channel('127.0.0.1:%d' % self.cluster.worker_ports[rank])
        self.addCleanup(channel.close)
        return harness.wpb_grpc.WorkerStub(channel)

    def auth(self, token=WORKER_TOKEN):
        return (('authorization', 'Bearer ' + token),)

    def join_request(self, **fields):
        req = harness.wpb.JoinRequest(session='s-intruder', rank=0, world_size=1, model=harness.model_dir(),
                                      chunk_size=64, coordinator='c-intruder')
        for k, v in fields.items():
            setattr(req, k, v)
        return req

    def assert_code(self, code, fn, message=None):
        with self.assertRaises(grpc.RpcError) as e:
            fn()
        self.assertEqual(e.exception.code(), code, e.exception.details())
        if message:
            self.assertIn(message, e.exception.details())
        return e.exception.details()

    def assert_serves(self):
        """A normal request completes in full."""
        req = harness.make_request(prompt_ids=harness.random_ids(random.Random(7), 40), max_new_tokens=4,
                                   ignore_eos=True, namespace=harness.fresh_namespace('trust'))
        samples = self.cluster.generate(req, timeout=60)
        self.assertEqual(len(samples[0].tokens), 4)

    def test_every_call_but_health_needs_the_token(self):
        stub = self.worker_stub()
        get = harness.wpb.StoreGetRequest(keys=['k'], timeout_ms=10)
        calls = {
            'Join': lambda md: stub.Join(self.join_request(), timeout=10, metadata=md),
            'StoreSet': lambda md: stub.StoreSet(harness.wpb.StoreSetRequest(key='k', value=b'v'),
                                                 timeout=10, metadata=md),
            'StoreGet': lambda md: stub.StoreGet(get, timeout=10, metadata=md),
            'Execute': lambda md: list(stub.Execute(iter([harness.wpb.StepPlan()]), timeout=10, metadata=md)),
        }
        for name, call in calls.items():
            for md in (None, self.auth('wrong-token'), (('authorization', WORKER_TOKEN),)):
                with self.subTest(call=name, metadata=md):
                    self.assert_code(grpc.StatusCode.UNAUTHENTICATED, lambda: call(md))
        channel = grpc.insecure_channel('127.0.0.1:%d' % self.cluster.worker_ports[0])
        self.addCleanup(channel.close)
        self.assertEqual(harness.health(channel), SERVING)
        self.assert_serves()

    def test_another_coordinators_join_changes_nothing(self):
        """With the token (a second coordinator, misconfigured): refused while
        the owner is live, whatever the Join says; bad models are refused before
        anything; a stream naming another session is refused. The service is
        unaffected throughout."""
        stub = self.worker_stub(1)
        outside = os.path.dirname(harness.model_dir())
        cases = [
            (self.join_request(), grpc.StatusCode.FAILED_PRECONDITION, 'another coordinator'),
            (self.join_request(model='/etc'), grpc.StatusCode.PERMISSION_DENIED, '--model_root'),
            (self.join_request(model=outside), grpc.StatusCode.PERMISSION_DENIED, '--model_root'),
            (self.join_request(model=harness.model_dir() + '/..'), grpc.StatusCode.PERMISSION_DENIED,
             '--model_root'),
            (self.join_request(model=harness.model_dir() + '/missing'), grpc.StatusCode.NOT_FOUND, 'does not exist'),
            (self.join_request(coordinator=''), grpc.StatusCode.INVALID_ARGUMENT, 'coordinator'),
            (self.join_request(chunk_size=3), grpc.StatusCode.INVALID_ARGUMENT, 'chunk_size'),
        ]
        for _ in range(3):
            for req, code, message in cases:
                with self.subTest(model=req.model, coordinator=req.coordinator):
                    self.assert_code(code, lambda: stub.Join(req, timeout=30, metadata=self.auth()), message)
            md = self.auth() + (('chunkattn-session', 's-not-this-one'),)
            self.assert_code(grpc.StatusCode.FAILED_PRECONDITION,
                             lambda: list(stub.Execute(iter([harness.wpb.StepPlan()]), timeout=10, metadata=md)),
                             'session')
            self.assert_serves()
        self.assertEqual(harness.health(self.cluster.channel), SERVING)
        self.assertEqual(self.cluster.cache_stats().used_chunks, 0)

    def test_the_store_is_bounded(self):
        stub = self.worker_stub(0)
        md = self.auth()
        put = lambda key, value: stub.StoreSet(harness.wpb.StoreSetRequest(key=key, value=value), timeout=30,
                                               metadata=md)
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: put('big', b'x' * ((1 << 20) + 1)), 'at most')
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: put('k' * 1025, b''), 'key')
        self.assert_code(grpc.StatusCode.INVALID_ARGUMENT, lambda: put('', b'v'), 'key')
        # Bytes: 64 MiB in all. Overwriting a key does not count twice.
        for _ in range(3):
            put('same', b'y' * (1 << 20))
        refused = None
        for i in range(80):
            try:
                put('mib-%d' % i, b'z' * (1 << 20))
            except grpc.RpcError as e:
                refused = (i, e)
                break
        self.assertIsNotNone(refused, 'the store took 80 MiB')
        self.assertEqual(refused[1].code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn('bytes held', refused[1].details())
        self.assertGreaterEqual(refused[0], 60)
        # Waiters: at most 64 StoreGet calls wait at once; the rest are refused
        # at once, and the worker's thread count stays bounded.
        get = harness.wpb.StoreGetRequest(keys=['never-set'], timeout_ms=4000)
        futures = [stub.StoreGet.future(get, timeout=30, metadata=md) for _ in range(300)]
        codes = collections.Counter()
        for f in futures:
            try:
                f.result()
                codes['OK'] += 1
            except grpc.RpcError as e:
                codes[e.code().name] += 1
        self.assertEqual(codes['OK'], 0, codes)
        self.assertLessEqual(codes['DEADLINE_EXCEEDED'], 64, codes)
        self.assertGreaterEqual(codes['RESOURCE_EXHAUSTED'], 300 - 64, codes)
        status = read('/proc/%d/status' % self.cluster.workers[0].proc.pid).decode()
        threads = int(re.search(r'Threads:\s+(\d+)', status).group(1))
        self.assertLess(threads, 600)
        # A full store does not stop recovery: a re-join (rank 1 restarted)
        # clears every key but the new session's.
        self.cluster.kill_worker(1)
        self.cluster.start_worker(1)

        def serves():
            try:
                self.assert_serves()
                return True
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())
                return None
        harness.wait_for(serves, harness.STARTUP_TIMEOUT_S, interval=0.5, what='service after rank 1 restarted')
        put('after-rejoin', b'w' * (1 << 20))

    def test_a_live_owner_keeps_its_workers_until_it_is_gone(self):
        """A second coordinator with the token cannot take the workers while the
        first serves; once the first stops, it takes over. One with a wrong
        token never joins."""
        wrong = write_file(self.tmp, 'wrong-token', 'not-the-secret\n')
        intruder = harness.Cluster('trust-wrong', tp=2)
        intruder.worker_ports = self.cluster.worker_ports
        intruder.port, intruder.metrics_port = harness.free_port(), harness.free_port()
        intruder.coordinator_args = ['--worker_token_file', wrong]
        intruder.coordinator = harness.Process('trust-wrong-coordinator', intruder.coordinator_argv()).start()
        self.addCleanup(intruder.coordinator.stop)
        second = harness.Cluster('trust-second', tp=2)
        second.worker_ports = self.cluster.worker_ports
        second.port, second.metrics_port = harness.free_port(), harness.free_port()
        second.coordinator_args = ['--worker_token_file', self.token_file]
        second.coordinator = harness.Process('trust-second-coordinator', second.coordinator_argv()).start()
        self.addCleanup(second.stop)
        second.channel = second.open_channel()
        second.stub = harness.pb_grpc.GenerationStub(second.channel)
        logged = lambda process, text: text in read(process.log_path).decode() or None
        harness.wait_for(lambda: logged(second.coordinator, 'another coordinator'), 60,
                         what='the second coordinator to be refused')
        harness.wait_for(lambda: logged(intruder.coordinator, 'unknown bearer token'), 60,
                         what='the wrong-token coordinator to be refused')
        for _ in range(3):
            self.assert_serves()
            self.assertEqual(harness.health(second.channel), NOT_SERVING)
        # The first goes (a rollout); the second takes over, the intruder never.
        self.cluster.coordinator.stop()
        harness.wait_for(lambda: harness.health(second.channel) == SERVING, harness.STARTUP_TIMEOUT_S,
                         what='the second coordinator to take over')
        req = harness.make_request(prompt_ids=harness.random_ids(random.Random(8), 30), max_new_tokens=3,
                                   ignore_eos=True)
        samples = harness.collect(second.stub.Generate(req, timeout=60))
        self.assertEqual(len(samples[0].tokens), 3)
        self.assertIn('unknown bearer token', intruder.coordinator.log_tail())
        # Give the class's cluster back its coordinator for the other tests.
        second.stop()
        self.cluster.coordinator = harness.Process('trust-coordinator-again', self.cluster.coordinator_argv()).start()
        self.cluster.channel.close()
        self.cluster.channel = self.cluster.open_channel()
        self.cluster.stub = harness.pb_grpc.GenerationStub(self.cluster.channel)
        harness.wait_for(lambda: harness.health(self.cluster.channel) == SERVING, harness.STARTUP_TIMEOUT_S,
                         what='the first coordinator back')


class WorkerMutualTlsTest(harness.ServiceTestCase):
    """The worker port over mutual TLS, as the chart runs it: every worker
    serves with one certificate (SAN WORKER_TLS_NAME), which is also the
    client certificate the ranks show rank 0's rendezvous store and the one
    the coordinator shows the workers; the worker token on top. A caller
    without a certificate the CA signed is refused at the handshake, before
    any token is looked at."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.tmp, cls.pki = make_pki(cls.addClassCleanup)
        cls.token_file = write_file(cls.tmp, 'worker-token', WORKER_TOKEN + '\n')
        cls.worker_args = ['--tls_cert_file', cls.pki['worker.pem'], '--tls_key_file', cls.pki['worker.key'],
                           '--tls_client_ca_file', cls.pki['ca.pem'], '--worker_token_file', cls.token_file]
        cls.cluster = cls.start_cluster('worker-mtls', tp=2, worker_args=cls.worker_args,
                                        coordinator_args=cls.coordinator_args(client_certificate=True))

    @classmethod
    def coordinator_args(cls, client_certificate):
        args = ['--worker_tls_ca_file', cls.pki['ca.pem'], '--worker_token_file', cls.token_file]
        if client_certificate:
            args += ['--worker_tls_cert_file', cls.pki['worker.pem'], '--worker_tls_key_file', cls.pki['worker.key']]
        return args

    def worker_channel(self, rank, credentials=None):
        """A channel to a worker's port: plaintext without credentials, else TLS
        checking the workers' name."""
        target = '127.0.0.1:%d' % self.cluster.worker_ports[rank]
        if credentials is None:
            channel = grpc.insecure_channel(target)
        else:
            channel = grpc.secure_channel(target, credentials,
                                          options=[('grpc.ssl_target_name_override', WORKER_TLS_NAME)])
        self.addCleanup(channel.close)
        return channel

    def credentials(self, pki):
        """Trusts this class's CA; shows pki's worker certificate."""
        return grpc.ssl_channel_credentials(root_certificates=read(self.pki['ca.pem']),
                                            private_key=read(pki['worker.key']),
                                            certificate_chain=read(pki['worker.pem']))

    def store_get(self, channel):
        """A StoreGet with the token and no keys (answered at once)."""
        stub = harness.wpb_grpc.WorkerStub(channel)
        return stub.StoreGet(harness.wpb.StoreGetRequest(), timeout=10,
                             metadata=(('authorization', 'Bearer ' + WORKER_TOKEN),))

    def assert_refused(self, channel):
        with self.assertRaises(grpc.RpcError) as e:
            self.store_get(channel)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, e.exception.details())

    def test_serves_with_both_ranks_over_mutual_tls(self):
        # Two ranks: rank 1 (and rank 0) met in rank 0's store over TLS, with certificates.
        self.assertEqual(self.cluster.model_info().tensor_parallel_size, 2)
        req = harness.make_request(prompt_ids=harness.random_ids(random.Random(11), 40), max_new_tokens=4,
                                   ignore_eos=True, namespace=harness.fresh_namespace('worker-mtls'))
        samples = self.cluster.generate(req, timeout=60)
        self.assertEqual(len(samples[0].tokens), 4)
        for rank, worker in enumerate(self.cluster.workers):
            self.assertIn('(mutual TLS, ', read(worker.log_path).decode(), rank)
            self.store_get(self.worker_channel(rank, self.credentials(self.pki)))  # the CA's certificate passes
        self.assertIn('worker(s) over mutual TLS', read(self.cluster.coordinator.log_path).decode())

    def test_plaintext_caller_is_refused(self):
        for rank in (0, 1):
            channel = self.worker_channel(rank)
            self.assert_refused(channel)
            self.assertIsNone(harness.health(channel), 'health over plaintext on a TLS port')

    def test_certificate_of_another_ca_is_refused(self):
        _, other = make_pki(self.addCleanup)
        self.assert_refused(self.worker_channel(0, self.credentials(other)))
        # No client certificate at all.
        self.assert_refused(self.worker_channel(
            1, grpc.ssl_channel_credentials(root_certificates=read(self.pki['ca.pem']))))
        # A worker of the other CA is not trusted either (the client checks the server too).
        self.assert_refused(self.worker_channel(0, grpc.ssl_channel_credentials(
            root_certificates=read(other['ca.pem']), private_key=read(self.pki['worker.key']),
            certificate_chain=read(self.pki['worker.pem']))))
        self.assertEqual(harness.health(self.cluster.channel), SERVING)

    def test_coordinator_without_client_certificate_never_joins(self):
        """Its handshake fails, so it stays NOT_SERVING (a bounded wait); the
        same worker then takes a coordinator with the certificate."""
        cluster = harness.Cluster('worker-mtls-nocert', tp=1, worker_args=self.worker_args,
                                  coordinator_args=self.coordinator_args(client_certificate=False))
        type(self).clusters = type(self).clusters + [cluster]
        cluster.worker_ports = [harness.free_port()]
        cluster.port, cluster.metrics_port = harness.free_port(), harness.free_port()
        worker = cluster.start_worker(0)
        harness.wait_for(lambda: 'listening' in worker.log_tail() or None, 30, what='the worker to listen')
        cluster.coordinator = harness.Process('worker-mtls-nocert-coordinator', cluster.coordinator_argv()).start()
        cluster.channel = cluster.open_channel()
        harness.wait_for(lambda: 'waiting for the workers' in cluster.coordinator.log_tail() or None, 30,
                         what='the coordinator to fail to reach the worker')
        # StartupError (not caught) if a process exits meanwhile.
        self.assertRaisesRegex(AssertionError, 'did not become SERVING', cluster.wait_health, SERVING, 10)
        self.assertTrue(worker.alive())
        cluster.coordinator.stop()
        cluster.channel.close()
        cluster.coordinator_args = self.coordinator_args(client_certificate=True)
        cluster.coordinator = harness.Process('worker-mtls-cert-coordinator', cluster.coordinator_argv()).start()
        cluster.channel = cluster.open_channel()
        cluster.wait_health(SERVING, harness.STARTUP_TIMEOUT_S)


class BadSecurityFlagsTest(unittest.TestCase):
    """Wrong TLS / token flags stop the coordinator at start with a message."""

    def start(self, *args):
        argv = [harness.bin_path('chunkattn-coordinator'), '--listen', '127.0.0.1:0',
                '--metrics_port', '0', '--http_port', '0', '--workers', '127.0.0.1:1',
                '--model', harness.model_dir()]
        return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=60)

    def test_rejected(self):
        tmp = harness.temp_dir('chunkattn-badsec-', self.addCleanup)
        empty = os.path.join(tmp, 'empty')
        with open(empty, 'w') as f:
            f.write('# no token here\n\n')
        not_pem = os.path.join(tmp, 'not.pem')
        with open(not_pem, 'w') as f:
            f.write('hello\n')
        spaced = os.path.join(tmp, 'spaced')  # a token, its tenant, and one field too many
        with open(spaced, 'w') as f:
            f.write('tok acme extra\n')
        bad_tenant = os.path.join(tmp, 'bad-tenant')
        with open(bad_tenant, 'w') as f:
            f.write('tok acme/corp\n')
        cases = [
            (['--tls_cert_file', not_pem], 'go together'),
            (['--tls_client_ca_file', not_pem], 'needs --tls_cert_file'),
            (['--tls_cert_file', not_pem, '--tls_key_file', not_pem], 'no PEM block'),
            (['--tls_cert_file', os.path.join(tmp, 'missing'), '--tls_key_file', not_pem], 'cannot read'),
            (['--auth_token_file', empty], 'has no token'),
            (['--auth_token_file', spaced], "'TOKEN' or 'TOKEN TENANT'"),
            (['--auth_token_file', bad_tenant], 'a tenant is 1 to 64'),
            (['--auth_token_file', os.path.join(tmp, 'missing')], 'cannot read'),
            (['--health_port', '70000'], '--health_port'),
            (['--priority_aging_s', '-1'], '--priority_aging_s'),
            (['--priority_aging_s', 'nan'], '--priority_aging_s'),
            (['--priority_aging_s', '90000'], '--priority_aging_s'),
            (['--step_timeout_s', '-2'], '--step_timeout_s'),
            (['--tenant_max_batch_share', '0'], '--tenant_max_batch_share'),
            (['--http_max_connections', '100000000'], '--http_max_connections'),
            (['--max_sequences_per_request', '0'], '--max_sequences_per_request'),
            (['--metrics_token_file', empty], '--metrics_token_file'),
            (['--tokenize_threads', '0'], '--tokenize_threads'),
            (['--drain_timeout_s', 'nan'], '--drain_timeout_s'),
            (['--drain_timeout_s', '1e9'], '--drain_timeout_s'),
            (['--kv_tier_max_loads_per_step', '-1'], '--kv_tier_max_loads_per_step'),
        ]
        for args, message in cases:
            r = self.start(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(message, r.stderr, args)
        r = self.start('--worker_token_file', empty)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn('--worker_token_file', r.stderr)
        worker_cases = [
            (['--worker_token_file', empty], 'has no token'),
            (['--worker_token_file', os.path.join(tmp, 'missing')], 'cannot read'),
            (['--model_root', os.path.join(tmp, 'missing')], 'is not a folder'),
            (['--model_root', not_pem], 'is not a folder'),
        ]
        for args, message in worker_cases:
            r = subprocess.run([harness.bin_path('chunkattn-worker'), '--listen', '127.0.0.1:0'] + args,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(message, r.stderr, args)

    def test_worker_tls_flags_rejected(self):
        """The worker port's TLS flags, on the worker and the coordinator."""
        tmp = harness.temp_dir('chunkattn-badsec-', self.addCleanup)
        not_pem = write_file(tmp, 'not.pem', 'hello\n')
        missing = os.path.join(tmp, 'missing')
        worker_cases = [
            (['--tls_cert_file', not_pem], 'go together'),
            (['--tls_key_file', not_pem], 'go together'),
            (['--tls_client_ca_file', not_pem], 'needs --tls_cert_file'),
            (['--tls_cert_file', not_pem, '--tls_key_file', not_pem], 'no PEM block'),
            (['--tls_cert_file', missing, '--tls_key_file', not_pem], 'cannot read'),
            (['--health_port', '70000'], '--health_port'),
        ]
        for args, message in worker_cases:
            r = subprocess.run([harness.bin_path('chunkattn-worker'), '--listen', '127.0.0.1:0'] + args,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(message, r.stderr, args)
        coordinator_cases = [
            (['--worker_tls_cert_file', not_pem, '--worker_tls_key_file', not_pem], 'need --worker_tls_ca_file'),
            (['--worker_tls_ca_file', not_pem, '--worker_tls_cert_file', not_pem],
             '--worker_tls_cert_file and --worker_tls_key_file go together'),
            (['--worker_tls_ca_file', not_pem], '--worker_tls_ca_file: %s holds no PEM block' % not_pem),
            (['--worker_tls_ca_file', missing], '--worker_tls_ca_file: cannot read'),
        ]
        for args, message in coordinator_cases:
            r = self.start(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(message, r.stderr, args)

    def test_an_occupied_port_is_refused(self):
        """gRPC binds with SO_REUSEPORT unless told not to: a second worker or
        coordinator on a busy port must fail, not take a share of its connections."""
        port = harness.free_port()
        first = harness.Process('occupied-first', [
            harness.bin_path('chunkattn-worker'), '--listen', '127.0.0.1:%d' % port, '--device', 'cpu',
            '--threads', '1']).start()
        try:
            harness.wait_for(lambda: 'listening' in open(first.log_path).read() or None, timeout=30,
                             interval=0.1, what='the first worker to listen')
            second = subprocess.run([harness.bin_path('chunkattn-worker'), '--listen', '127.0.0.1:%d' % port,
                                     '--device', 'cpu', '--threads', '1'],
                                    capture_output=True, text=True, timeout=60)
            self.assertNotEqual(second.returncode, 0, second.stderr)
            self.assertIn('cannot listen', second.stdout + second.stderr)
            coordinator = self.start('--listen', '127.0.0.1:%d' % port)
            self.assertNotEqual(coordinator.returncode, 0, coordinator.stderr)
            self.assertIn('cannot listen', coordinator.stderr)
            self.assertTrue(first.alive())
        finally:
            first.stop()


if __name__ == '__main__':
    harness.main()
