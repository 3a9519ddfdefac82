"""TLS, mutual TLS and bearer tokens on the public API, and the plaintext
health port that Kubernetes' gRPC probes use (they cannot speak TLS)."""
import os
import subprocess
import tempfile
import unittest

import grpc

import harness

SERVING, NOT_SERVING = harness.SERVING, harness.NOT_SERVING
TOKEN = 'tok-3f9a1c0e7b'


def openssl(*args, cwd):
    subprocess.run(['openssl'] + list(args), cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki():
    """A CA, a server certificate for localhost / 127.0.0.1 and a client
    certificate, all signed by the CA, in a new folder (removed at exit).
    Returns (folder, {name: path})."""
    folder = tempfile.mkdtemp(prefix='chunkattn-pki-')
    harness._temp_dirs.append(folder)
    openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=test-ca',
            '-keyout', 'ca.key', '-out', 'ca.pem', cwd=folder)
    with open(os.path.join(folder, 'san.ext'), 'w') as f:
        f.write('subjectAltName=DNS:localhost,IP:127.0.0.1\n')
    for name in ('server', 'client'):
        openssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=%s' % name,
                '-keyout', '%s.key' % name, '-out', '%s.csr' % name, cwd=folder)
        openssl('x509', '-req', '-in', '%s.csr' % name, '-CA', 'ca.pem', '-CAkey', 'ca.key',
                '-CAcreateserial', '-days', '2', '-extfile', 'san.ext', '-out', '%s.pem' % name,
                cwd=folder)
    return folder, {n: os.path.join(folder, n) for n in
                    ('ca.pem', 'server.pem', 'server.key', 'client.pem', 'client.key')}


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
        cls.tmp, cls.pki = make_pki()
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
        cls.tmp, cls.pki = make_pki()
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


class BadSecurityFlagsTest(unittest.TestCase):
    """Wrong TLS / token flags stop the coordinator at start with a message."""

    def start(self, *args):
        argv = [harness.bin_path('chunkattn-coordinator'), '--listen', '127.0.0.1:0',
                '--metrics_port', '0', '--workers', '127.0.0.1:1', '--model', harness.model_dir()]
        return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=60)

    def test_rejected(self):
        tmp = tempfile.mkdtemp(prefix='chunkattn-badsec-')
        harness._temp_dirs.append(tmp)
        empty = os.path.join(tmp, 'empty')
        with open(empty, 'w') as f:
            f.write('# no token here\n\n')
        not_pem = os.path.join(tmp, 'not.pem')
        with open(not_pem, 'w') as f:
            f.write('hello\n')
        spaced = os.path.join(tmp, 'spaced')
        with open(spaced, 'w') as f:
            f.write('two words\n')
        cases = [
            (['--tls_cert_file', not_pem], 'go together'),
            (['--tls_client_ca_file', not_pem], 'needs --tls_cert_file'),
            (['--tls_cert_file', not_pem, '--tls_key_file', not_pem], 'no PEM block'),
            (['--tls_cert_file', os.path.join(tmp, 'missing'), '--tls_key_file', not_pem], 'cannot read'),
            (['--auth_token_file', empty], 'has no token'),
            (['--auth_token_file', spaced], 'whitespace'),
            (['--auth_token_file', os.path.join(tmp, 'missing')], 'cannot read'),
            (['--health_port', '70000'], '--health_port'),
            (['--priority_aging_s', '-1'], '--priority_aging_s'),
            (['--priority_aging_s', 'nan'], '--priority_aging_s'),
            (['--priority_aging_s', '90000'], '--priority_aging_s'),
        ]
        for args, message in cases:
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
