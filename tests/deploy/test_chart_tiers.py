"""The chart's KV tiers (cache.tiers): off by default; on, every worker gets
its host and disk tiers (the disk one in an emptyDir sized to it) and the
coordinator its write policy; a policy the binaries do not know is refused.
The chart's own Redis (redis.enabled, subchart charts/redis): its objects,
its Secret's password, config and URL, its TLS certificates (redis.tls), and
that config and those certificates run by a real redis-server behind a real
coordinator reading the rendered URL and TLS files."""
import base64
import os
import random
import re
import socket
import ssl
import stat
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_chart import (NAMESPACE, RELEASE, by_kind, container, helm, labels_match, one,  # noqa: E402
                        parse_args, render)
import harness  # noqa: E402  (test_chart put tests/services on the path)

REDIS_SERVICE = RELEASE + '-redis'
REDIS_HOST = '%s.%s.svc.cluster.local' % (REDIS_SERVICE, NAMESPACE)  # the URL's, and the certificate's
REDIS_NAMES = {REDIS_SERVICE, '%s.%s' % (REDIS_SERVICE, NAMESPACE), '%s.%s.svc' % (REDIS_SERVICE, NAMESPACE),
               REDIS_HOST}


def resp(*args):
    """One Redis command in RESP."""
    out = b'*%d\r\n' % len(args)
    for a in args:
        a = a.encode()
        out += b'$%d\r\n%s\r\n' % (len(a), a)
    return out


def ask(sock, *commands):
    """Sends the commands and returns the first line of each reply ('' when the
    server closed the connection instead)."""
    replies = []
    reader = sock.makefile('rb')
    for command in commands:
        sock.sendall(resp(*command))
        replies.append(reader.readline().decode(errors='replace').strip())
    return replies


def write_file(folder, name, text, mode=stat.S_IRUSR):
    path = os.path.join(folder, name)
    with open(path, 'w') as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def openssl(*args):
    return subprocess.run(['openssl'] + list(args), capture_output=True, text=True, timeout=30)


def resolving_prefix(hosts_file):
    """A command prefix that runs its program in a private mount namespace
    where hosts_file is /etc/hosts (unshare; --map-root-user unless root)."""
    user = [] if os.geteuid() == 0 else ['--map-root-user']
    return (['unshare', '--mount'] + user + ['--', 'sh', '-c', 'mount --bind "$0" /etc/hosts && exec "$@"',
                                            hosts_file])


class ResolvingCluster(harness.Cluster):
    """A cluster whose coordinator and workers run under a prefix (the
    workers reach Redis too: the coordinator hands them the URL at Join)."""

    def __init__(self, name, prefix, **kwargs):
        super().__init__(name, coordinator_prefix=prefix, **kwargs)
        self.prefix = list(prefix)

    def worker_argv(self, i):
        return self.prefix + super().worker_argv(i)


class ChartTiersTest(unittest.TestCase):

    def test_off_by_default(self):
        docs = render([])
        worker = parse_args(container(one(docs, 'StatefulSet'))['args'])
        self.assertNotIn('host_kv_cache_mib', worker)
        self.assertNotIn('disk_kv_cache_dir', worker)
        coordinator = parse_args(container(one(docs, 'Deployment'))['args'])
        self.assertEqual(coordinator['kv_tier_write_policy'], 'write_back')
        self.assertEqual(coordinator['kv_tier_max_loads_per_step'], '0')

    def test_host_and_disk_tiers(self):
        docs = render([], '--set', 'cache.tiers.hostMiB=4096', '--set', 'cache.tiers.diskMiB=20000',
                      '--set', 'cache.tiers.writePolicy=write_through', '--set', 'cache.tiers.maxLoadsPerStep=8')
        sts = one(docs, 'StatefulSet')
        c = container(sts)
        worker = parse_args(c['args'])
        self.assertEqual(worker['host_kv_cache_mib'], '4096')
        self.assertEqual(worker['disk_kv_cache_mib'], '20000')
        mount = [m for m in c['volumeMounts'] if m['name'] == 'kv-tier'][0]
        self.assertEqual(worker['disk_kv_cache_dir'], mount['mountPath'])
        volume = [v for v in sts['spec']['template']['spec']['volumes'] if v['name'] == 'kv-tier'][0]
        self.assertEqual(volume['emptyDir']['sizeLimit'], '20064Mi')
        coordinator = parse_args(container(one(docs, 'Deployment'))['args'])
        self.assertEqual(coordinator['kv_tier_write_policy'], 'write_through')
        self.assertEqual(coordinator['kv_tier_max_loads_per_step'], '8')

    def test_shared_tier_url_from_a_secret_file(self):
        docs = render([])
        self.assertNotIn('kv_store_url', parse_args(container(one(docs, 'Deployment'))['args']))
        self.assertNotIn('kv_store_url_file', parse_args(container(one(docs, 'Deployment'))['args']))
        docs = render([], '--set', 'cache.tiers.shared.urlSecretName=kv-redis')
        deployment = one(docs, 'Deployment')
        c = container(deployment)
        args = parse_args(c['args'])
        # The URL (its password) is a file the coordinator reads: in no argv,
        # no environment variable (/proc/PID/cmdline, /environ).
        self.assertNotIn('kv_store_url', args)
        self.assertEqual(args['kv_store_url_file'], '/etc/chunkattn/kv-store/url')
        self.assertFalse([e for e in c.get('env', []) if 'KV_STORE' in e['name']])
        mount = [m for m in c['volumeMounts'] if m['name'] == 'kv-store-url'][0]
        self.assertEqual(mount['mountPath'] + '/url', args['kv_store_url_file'])
        self.assertTrue(mount['readOnly'])
        volume = [v for v in deployment['spec']['template']['spec']['volumes'] if v['name'] == 'kv-store-url'][0]
        self.assertEqual(volume['secret']['secretName'], 'kv-redis')
        self.assertEqual(volume['secret']['items'], [{'key': 'url', 'path': 'url'}])
        # 0440: the coordinator refuses a secret's file others may read.
        self.assertEqual(volume['secret']['defaultMode'], 0o440)
        # The workers get the URL at Join, never the Secret.
        sts = one(docs, 'StatefulSet')
        self.assertNotIn('kv-store-url', str(sts))
        for d in docs:  # the URL itself is in no rendered object
            self.assertNotIn('redis://', str(d))
        docs = render([], '--set', 'cache.tiers.shared.urlSecretName=kv-redis',
                      '--set', 'cache.tiers.shared.urlSecretKey=redis-url')
        volume = [v for v in one(docs, 'Deployment')['spec']['template']['spec']['volumes']
                  if v['name'] == 'kv-store-url'][0]
        self.assertEqual(volume['secret']['items'], [{'key': 'redis-url', 'path': 'url'}])

    def test_shared_tier_tls_files_from_a_secret(self):
        docs = render([], '--set', 'cache.tiers.shared.urlSecretName=kv-redis',
                      '--set', 'cache.tiers.shared.tlsSecretName=kv-redis-tls')
        deployment = one(docs, 'Deployment')
        c = container(deployment)
        args = parse_args(c['args'])
        self.assertEqual(args['kv_store_tls_ca_file'], '/etc/chunkattn/kv-store-tls/ca.crt')
        self.assertEqual(args['kv_store_tls_cert_file'], '/etc/chunkattn/kv-store-tls/tls.crt')
        self.assertEqual(args['kv_store_tls_key_file'], '/etc/chunkattn/kv-store-tls/tls.key')
        mount = [m for m in c['volumeMounts'] if m['name'] == 'kv-store-tls'][0]
        self.assertTrue(mount['readOnly'])
        self.assertEqual(mount['mountPath'] + '/ca.crt', args['kv_store_tls_ca_file'])
        volume = [v for v in deployment['spec']['template']['spec']['volumes'] if v['name'] == 'kv-store-tls'][0]
        self.assertEqual(volume['secret']['secretName'], 'kv-redis-tls')
        self.assertEqual(volume['secret']['defaultMode'], 0o440)  # the key is read as a secret's file
        self.assertEqual([i['key'] for i in volume['secret']['items']], ['ca.crt', 'tls.crt', 'tls.key'])
        self.assertNotIn('kv-store-tls', str(one(docs, 'StatefulSet')))  # workers get the PEM at Join
        docs = render([], '--set', 'cache.tiers.shared.urlSecretName=kv-redis',
                      '--set', 'cache.tiers.shared.tlsSecretName=kv-redis-tls',
                      '--set', 'cache.tiers.shared.tlsClientCertificate=false')
        args = parse_args(container(one(docs, 'Deployment'))['args'])
        self.assertIn('kv_store_tls_ca_file', args)
        self.assertNotIn('kv_store_tls_cert_file', args)
        self.assertNotIn('kv_store_tls_key_file', args)
        self.assertNotIn('kv_store_tls_ca_file', parse_args(container(one(render([]), 'Deployment'))['args']))

    def chart_redis(self, *sets):
        docs = render([], '--set', 'redis.enabled=true', *sets)
        return docs, self.secret_data(docs, RELEASE + '-kv-redis')

    def secret_data(self, docs, name):
        secret = [d for d in by_kind(docs, 'Secret') if d['metadata']['name'] == name]
        self.assertEqual(len(secret), 1, name)
        return {k: base64.b64decode(v).decode() for k, v in secret[0]['data'].items()}

    def test_no_redis_by_default(self):
        docs = render([])
        self.assertFalse([d for d in docs if 'redis' in d['metadata']['name']])

    def test_chart_redis_objects(self):
        docs, data = self.chart_redis('--set', 'redis.maxMemoryMiB=512')
        password = data['password']
        self.assertRegex(password, r'^[A-Za-z0-9]{40}$')
        # TLS by default (redis.tls.enabled): TLS only, client certificates required.
        self.assertEqual(data['url'], 'rediss://:%s@%s:6379/0' % (password, REDIS_HOST))
        conf = data['redis.conf'].splitlines()
        for line in ('requirepass ' + password, 'maxmemory 512mb', 'maxmemory-policy allkeys-lru', 'save ""',
                     'appendonly no', 'port 0', 'tls-port 6379', 'tls-cert-file /etc/redis-tls/tls.crt',
                     'tls-key-file /etc/redis-tls/tls.key', 'tls-ca-cert-file /etc/redis-tls/ca.crt',
                     'tls-auth-clients yes'):
            self.assertIn(line, conf)
        # A fresh render draws a new password (an upgrade keeps the installed one: lookup).
        self.assertNotEqual(self.chart_redis()[1]['password'], password)
        # The coordinator reads the URL from the Secret as a file.
        deployment = [d for d in by_kind(docs, 'Deployment')
                      if d['metadata']['labels'].get('app.kubernetes.io/component') == 'coordinator'][0]
        args = parse_args(container(deployment)['args'])
        self.assertEqual(args['kv_store_url_file'], '/etc/chunkattn/kv-store/url')
        volume = [v for v in deployment['spec']['template']['spec']['volumes'] if v['name'] == 'kv-store-url'][0]
        self.assertEqual(volume['secret'], {'secretName': RELEASE + '-kv-redis', 'defaultMode': 0o440,
                                            'items': [{'key': 'url', 'path': 'url'}]})
        # Redis: its config from the Secret, the password in no argv, no environment, no other object.
        redis = [d for d in by_kind(docs, 'Deployment') if d['metadata']['name'] == RELEASE + '-redis'][0]
        c = container(redis)
        self.assertEqual(c['command'], ['redis-server', '/etc/redis/redis.conf'])
        self.assertNotIn('env', c)
        self.assertEqual(c['resources']['limits']['memory'], '896Mi')  # 1.25 x 512 + 256
        self.assertTrue(c['securityContext']['readOnlyRootFilesystem'])
        self.assertTrue(redis['spec']['template']['spec']['securityContext']['runAsNonRoot'])
        config = [v for v in redis['spec']['template']['spec']['volumes'] if v['name'] == 'config'][0]
        self.assertEqual(config['secret']['secretName'], RELEASE + '-kv-redis')
        self.assertEqual(config['secret']['defaultMode'], 0o440)
        server = self.secret_data(docs, RELEASE + '-kv-redis-tls')
        client = self.secret_data(docs, RELEASE + '-kv-redis-client')
        self.assertEqual(server['ca.crt'], client['ca.crt'])
        for d in docs:
            if d['kind'] != 'Secret':
                self.assertNotIn(password, str(d))
                for key in (server['tls.key'], client['tls.key']):  # neither as PEM nor as base64
                    self.assertNotIn(key.splitlines()[1], str(d))
                    self.assertNotIn(base64.b64encode(key.encode()).decode()[:64], str(d))
        # Redis's key: mounted by the Redis pod alone, at redis.conf's paths; the client's by the
        # coordinator alone, as its --kv_store_tls_* files (no key in any argv or environment).
        tls = [v for v in redis['spec']['template']['spec']['volumes'] if v['name'] == 'tls'][0]
        self.assertEqual(tls['secret']['secretName'], RELEASE + '-kv-redis-tls')
        self.assertEqual(tls['secret']['defaultMode'], 0o440)
        mount = [m for m in c['volumeMounts'] if m['name'] == 'tls'][0]
        self.assertEqual(mount['mountPath'], '/etc/redis-tls')
        self.assertTrue(mount['readOnly'])
        self.assertEqual(args['kv_store_tls_ca_file'], '/etc/chunkattn/kv-store-tls/ca.crt')
        self.assertEqual(args['kv_store_tls_cert_file'], '/etc/chunkattn/kv-store-tls/tls.crt')
        self.assertEqual(args['kv_store_tls_key_file'], '/etc/chunkattn/kv-store-tls/tls.key')
        volume = [v for v in deployment['spec']['template']['spec']['volumes'] if v['name'] == 'kv-store-tls'][0]
        self.assertEqual(volume['secret']['secretName'], RELEASE + '-kv-redis-client')
        self.assertEqual(volume['secret']['defaultMode'], 0o440)
        self.assertEqual([i['key'] for i in volume['secret']['items']], ['ca.crt', 'tls.crt', 'tls.key'])
        for d in by_kind(docs, 'Deployment') + by_kind(docs, 'StatefulSet'):
            self.assertEqual(RELEASE + '-kv-redis-tls' in str(d), d is redis)
            self.assertEqual(RELEASE + '-kv-redis-client' in str(d), d is deployment)
        # redis.tls.enabled=false: plaintext inside the cluster, the password alone.
        plain_docs, plain = self.chart_redis('--set', 'redis.tls.enabled=false')
        self.assertTrue(plain['url'].startswith('redis://'))
        self.assertIn('port 6379', plain['redis.conf'].splitlines())
        self.assertNotIn('tls', plain['redis.conf'])
        self.assertNotIn('kv-redis-tls', str(plain_docs))
        self.assertNotIn('kv-redis-client', str(plain_docs))
        # The Service reaches the Redis pod; the NetworkPolicy admits this release's
        # coordinator and workers and nothing else.
        pod_labels = redis['spec']['template']['metadata']['labels']
        service = [d for d in by_kind(docs, 'Service') if d['metadata']['name'] == RELEASE + '-redis'][0]
        self.assertTrue(labels_match(service['spec']['selector'], pod_labels))
        policy = [d for d in by_kind(docs, 'NetworkPolicy') if d['metadata']['name'] == RELEASE + '-redis'][0]
        self.assertTrue(labels_match(policy['spec']['podSelector']['matchLabels'], pod_labels))
        (rule,) = policy['spec']['ingress']
        (peer,) = rule['from']
        sts = one(docs, 'StatefulSet')
        admitted = lambda labels: (labels_match(peer['podSelector']['matchLabels'], labels) and all(
            labels.get(e['key']) in e['values'] for e in peer['podSelector']['matchExpressions']))
        self.assertTrue(admitted(deployment['spec']['template']['metadata']['labels']))
        self.assertTrue(admitted(sts['spec']['template']['metadata']['labels']))
        self.assertFalse(admitted(pod_labels))
        self.assertFalse(admitted(dict(deployment['spec']['template']['metadata']['labels'],
                                       **{'app.kubernetes.io/instance': 'other'})))

    def test_chart_redis_and_a_url_of_ones_own_are_refused_together(self):
        r = helm('template', RELEASE, '.', '--set', 'redis.enabled=true', '--set',
                 'cache.tiers.shared.urlSecretName=mine')
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('not both', r.stderr)
        # Another Redis's TLS files mean nothing to the chart's, nor without that Redis's URL.
        r = helm('template', RELEASE, '.', '--set', 'redis.enabled=true', '--set',
                 'cache.tiers.shared.tlsSecretName=mine')
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('leave tlsSecretName empty', r.stderr)
        r = helm('template', RELEASE, '.', '--set', 'cache.tiers.shared.tlsSecretName=mine')
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('needs the rediss:// URL', r.stderr)

    def test_chart_redis_certificates(self):
        """Each render's CA signs Redis's certificate for the Service's DNS names
        alone (server auth) and the coordinator's (client auth); another render's
        CA signs neither. (helm template cannot look up the installed Secrets, so
        every render makes new ones: an upgrade keeps them.)"""
        folders = []
        for _ in range(2):
            docs = self.chart_redis()[0]
            folder = harness.temp_dir('chunkattn-chart-redis-certs-', self.addCleanup)
            for which, name in (('server', '-kv-redis-tls'), ('client', '-kv-redis-client')):
                for key, text in self.secret_data(docs, RELEASE + name).items():
                    write_file(folder, '%s-%s' % (which, key), text)
            folders.append(folder)
        for folder in folders:
            ca, server, client = (os.path.join(folder, f) for f in ('server-ca.crt', 'server-tls.crt',
                                                                    'client-tls.crt'))
            with open(ca) as f, open(os.path.join(folder, 'client-ca.crt')) as g:
                self.assertEqual(f.read(), g.read())
            sans = openssl('x509', '-in', server, '-noout', '-ext', 'subjectAltName').stdout
            self.assertEqual(set(re.findall(r'DNS:([^,\s]+)', sans)), REDIS_NAMES)
            self.assertNotIn('IP Address', sans)
            for name in sorted(REDIS_NAMES):
                r = openssl('verify', '-CAfile', ca, '-purpose', 'sslserver', '-verify_hostname', name, server)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for name in ('localhost', 'other-redis.%s.svc.cluster.local' % NAMESPACE):
                self.assertNotEqual(openssl('verify', '-CAfile', ca, '-verify_hostname', name, server).returncode, 0)
            self.assertNotEqual(openssl('verify', '-CAfile', ca, '-verify_ip', '127.0.0.1', server).returncode, 0)
            r = openssl('verify', '-CAfile', ca, '-purpose', 'sslclient', client)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            for which in ('server', 'client'):  # each key is its certificate's
                cert_key = openssl('x509', '-in', os.path.join(folder, which + '-tls.crt'), '-noout', '-pubkey').stdout
                key = openssl('pkey', '-in', os.path.join(folder, which + '-tls.key'), '-pubout').stdout
                self.assertTrue(key.startswith('-----BEGIN PUBLIC KEY'))
                self.assertEqual(cert_key, key)
        other_ca = os.path.join(folders[1], 'server-ca.crt')
        for cert in ('server-tls.crt', 'client-tls.crt'):
            self.assertNotEqual(openssl('verify', '-CAfile', other_ca, os.path.join(folders[0], cert)).returncode, 0)

    def test_chart_redis_plaintext_config_serves_a_coordinator(self):
        """redis.tls.enabled=false: the rendered redis.conf run by Debian's
        redis-server (on 127.0.0.1), and the rendered URL, its host pointed
        there, as a coordinator's --kv_store_url_file: a request's blocks reach
        Redis (write_through), and a client without the password is refused."""
        _, data = self.chart_redis('--set', 'redis.tls.enabled=false')
        tmp = harness.temp_dir('chunkattn-chart-redis-', self.addCleanup)
        conf = os.path.join(tmp, 'redis.conf')
        with open(conf, 'w') as f:
            f.write(data['redis.conf'])
        port = harness.free_port()
        redis = harness.Process('chart-redis', ['redis-server', conf, '--port', str(port), '--bind', '127.0.0.1',
                                                '--dir', tmp]).start()
        self.addCleanup(redis.stop)

        def cli(*args, password=data['password']):
            auth = ['-a', password, '--no-auth-warning'] if password else []
            return subprocess.run(['redis-cli', '-p', str(port)] + auth + list(args), capture_output=True,
                                  text=True, timeout=5).stdout.strip()
        harness.wait_for(lambda: cli('PING') == 'PONG', 10, what='the chart redis.conf serving')
        self.assertIn('NOAUTH', cli('PING', password=None))
        self.assertEqual(cli('CONFIG', 'GET', 'maxmemory-policy').splitlines()[-1], 'allkeys-lru')
        url = re.sub(r'@[^/]+/', '@127.0.0.1:%d/' % port, data['url'])
        url_file = os.path.join(tmp, 'url')
        with open(url_file, 'w') as f:
            f.write(url)
        os.chmod(url_file, stat.S_IRUSR)
        cluster = harness.Cluster('chart-redis', tp=1, coordinator_args=[
            '--kv_store_url_file', url_file, '--kv_tier_write_policy', 'write_through']).start()
        self.addCleanup(cluster.stop)
        rng = random.Random(3)
        cluster.generate(harness.make_request(prompt_ids=harness.random_ids(rng, 200), max_new_tokens=2,
                                              ignore_eos=True))
        harness.wait_for(lambda: int(cli('DBSIZE') or 0) > 0, 30, what='blocks written to the chart Redis')

    def test_chart_redis_tls_config_serves_a_coordinator(self):
        """The default, TLS: the rendered redis.conf and server certificate run by
        Debian's redis-server on 127.0.0.1 (only the files' folder and the port
        changed) refuse a plaintext client, a client that does not trust the
        rendered CA, one without the client certificate and one without the
        password; a real coordinator with the rendered URL (only its port
        changed), flags and client files stores blocks there over rediss://."""
        docs, data = self.chart_redis()
        tmp = harness.temp_dir('chunkattn-chart-redis-tls-', self.addCleanup)
        server_dir, client_dir = os.path.join(tmp, 'server'), os.path.join(tmp, 'client')
        os.mkdir(server_dir)
        os.mkdir(client_dir)
        for key, text in self.secret_data(docs, RELEASE + '-kv-redis-tls').items():
            write_file(server_dir, key, text)
        for key, text in self.secret_data(docs, RELEASE + '-kv-redis-client').items():
            write_file(client_dir, key, text)
        conf = write_file(tmp, 'redis.conf', data['redis.conf'].replace('/etc/redis-tls/', server_dir + '/'))
        port = harness.free_port()
        redis = harness.Process('chart-redis-tls', ['redis-server', conf, '--tls-port', str(port),
                                                    '--bind', '127.0.0.1', '--dir', tmp]).start()
        self.addCleanup(redis.stop)
        ca = os.path.join(client_dir, 'ca.crt')
        client = (os.path.join(client_dir, 'tls.crt'), os.path.join(client_dir, 'tls.key'))

        def tls(*commands, cafile=ca, cert=client, password=data['password']):
            """Over TLS, checking Redis's certificate names REDIS_HOST (the URL's)."""
            context = ssl.create_default_context(cafile=cafile)
            if cert:
                context.load_cert_chain(*cert)
            with socket.create_connection(('127.0.0.1', port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname=REDIS_HOST) as s:
                    auth = [('AUTH', password)] if password else []
                    return ask(s, *(auth + list(commands)))[len(auth):]

        def serving():
            try:
                return tls(('PING',)) == ['+PONG']
            except OSError:
                return False
        harness.wait_for(serving, 10, what='the chart redis.conf serving TLS')
        # (1) Plaintext: no reply but the connection's end (or a TLS alert), with or without AUTH.
        with socket.create_connection(('127.0.0.1', port), timeout=5) as s:
            try:
                replies = ask(s, ('AUTH', data['password']), ('PING',))
            except OSError:
                replies = []
            self.assertFalse([r for r in replies if r.startswith(('+', '-', ':', '$'))], replies)
        # (2) A client that trusts another CA (another render's) refuses Redis's certificate.
        other = harness.temp_dir('chunkattn-chart-redis-other-', self.addCleanup)
        other_ca = write_file(other, 'ca.crt', self.secret_data(self.chart_redis()[0],
                                                                RELEASE + '-kv-redis-client')['ca.crt'])
        with self.assertRaises(ssl.SSLCertVerificationError):
            tls(('PING',), cafile=other_ca)
        # Redis refuses a client without the certificate, and one without the password.
        try:
            refused = tls(('PING',), cert=None) != ['+PONG']
        except OSError:
            refused = True
        self.assertTrue(refused)
        self.assertTrue(tls(('PING',), password=None)[0].startswith('-NOAUTH'))
        # (3) A real coordinator and worker over rediss://: the URL's host is the Service's DNS
        # name, which the certificate names; it resolves to 127.0.0.1 in a private mount
        # namespace whose /etc/hosts says so (no name fit for a production certificate
        # resolves to 127.0.0.1 here, and the chart's certificate names no IP or localhost).
        with open('/etc/hosts') as f:
            hosts = write_file(tmp, 'hosts', f.read() + '\n127.0.0.1 %s\n' % REDIS_HOST,
                               stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        prefix = resolving_prefix(hosts)
        probe = subprocess.run(prefix + ['getent', 'hosts', REDIS_HOST], capture_output=True, text=True, timeout=30)
        if probe.returncode != 0 or not probe.stdout.startswith('127.0.0.1'):
            self.skipTest('no private mount namespace (unshare) to resolve %s: %s' % (REDIS_HOST, probe.stderr))
        self.assertEqual(data['url'].count(':6379/'), 1)
        url_file = write_file(tmp, 'url', data['url'].replace(':6379/', ':%d/' % port))
        coordinator = [d for d in by_kind(docs, 'Deployment')
                       if d['metadata']['labels'].get('app.kubernetes.io/component') == 'coordinator'][0]
        rendered = parse_args(container(coordinator)['args'])
        tls_args = []
        for flag in ('kv_store_tls_ca_file', 'kv_store_tls_cert_file', 'kv_store_tls_key_file'):
            self.assertTrue(rendered[flag].startswith('/etc/chunkattn/kv-store-tls/'))
            tls_args += ['--' + flag, rendered[flag].replace('/etc/chunkattn/kv-store-tls/', client_dir + '/')]
        cluster = ResolvingCluster('chart-redis-tls', prefix, tp=1, coordinator_args=[
            '--kv_store_url_file', url_file, '--kv_tier_write_policy', 'write_through'] + tls_args).start()
        self.addCleanup(cluster.stop)
        rng = random.Random(3)
        cluster.generate(harness.make_request(prompt_ids=harness.random_ids(rng, 200), max_new_tokens=2,
                                              ignore_eos=True))
        harness.wait_for(lambda: int(tls(('DBSIZE',))[0].lstrip(':') or 0) > 0, 30,
                         what='blocks written to the chart Redis over TLS')

    def test_unknown_policy_is_refused(self):
        self.assertNotEqual(helm('template', RELEASE, '.', '--set', 'cache.tiers.writePolicy=write_around').returncode,
                            0)
        self.assertNotEqual(helm('template', RELEASE, '.', '--set', 'cache.tiers.maxLoadsPerStep=-1').returncode, 0)


if __name__ == '__main__':
    harness.main()
