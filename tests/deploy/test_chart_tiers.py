"""The chart's KV tiers (cache.tiers): off by default; on, every worker gets
its host and disk tiers (the disk one in an emptyDir sized to it) and the
coordinator its write policy; a policy the binaries do not know is refused.
The chart's own Redis (redis.enabled, subchart charts/redis): its objects,
its Secret's password, config and URL, and that config run by a real
redis-server behind a real coordinator reading the rendered URL file."""
import base64
import os
import random
import re
import stat
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_chart import (NAMESPACE, RELEASE, by_kind, container, helm, labels_match, one,  # noqa: E402
                        parse_args, render)
import harness  # noqa: E402  (test_chart put tests/services on the path)


class ChartTiersTest(unittest.TestCase):

    def test_off_by_default(self):
        docs = render([])
        worker = parse_args(container(one(docs, 'StatefulSet'))['args'])
        self.assertNotIn('host_kv_cache_mib', worker)
        self.assertNotIn('disk_kv_cache_dir', worker)
        self.assertEqual(parse_args(container(one(docs, 'Deployment'))['args'])['kv_tier_write_policy'], 'write_back')

    def test_host_and_disk_tiers(self):
        docs = render([], '--set', 'cache.tiers.hostMiB=4096', '--set', 'cache.tiers.diskMiB=20000',
                      '--set', 'cache.tiers.writePolicy=write_through')
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
        secret = [d for d in by_kind(docs, 'Secret') if d['metadata']['name'] == RELEASE + '-kv-redis']
        self.assertEqual(len(secret), 1)
        data = {k: base64.b64decode(v).decode() for k, v in secret[0]['data'].items()}
        return docs, data

    def test_no_redis_by_default(self):
        docs = render([])
        self.assertFalse([d for d in docs if 'redis' in d['metadata']['name']])

    def test_chart_redis_objects(self):
        docs, data = self.chart_redis('--set', 'redis.maxMemoryMiB=512')
        password = data['password']
        self.assertRegex(password, r'^[A-Za-z0-9]{40}$')
        self.assertEqual(data['url'], 'redis://:%s@%s-redis.%s.svc.cluster.local:6379/0' % (password, RELEASE, NAMESPACE))
        conf = data['redis.conf'].splitlines()
        for line in ('requirepass ' + password, 'maxmemory 512mb', 'maxmemory-policy allkeys-lru', 'save ""',
                     'appendonly no', 'port 6379'):
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
        for d in docs:
            if d['kind'] != 'Secret':
                self.assertNotIn(password, str(d))
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

    def test_chart_redis_config_serves_a_coordinator(self):
        """The rendered redis.conf run by Debian's redis-server (on 127.0.0.1),
        and the rendered URL, its host pointed there, as a coordinator's
        --kv_store_url_file: a request's blocks reach Redis (write_through),
        and a client without the password is refused."""
        _, data = self.chart_redis()
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

    def test_unknown_policy_is_refused(self):
        self.assertNotEqual(helm('template', RELEASE, '.', '--set', 'cache.tiers.writePolicy=write_around').returncode,
                            0)


if __name__ == '__main__':
    harness.main()
