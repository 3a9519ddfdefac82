"""The chart's KV tiers (cache.tiers): off by default; on, every worker gets
its host and disk tiers (the disk one in an emptyDir sized to it) and the
coordinator its write policy; a policy the binaries do not know is refused."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_chart import RELEASE, container, helm, one, parse_args, render  # noqa: E402
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

    def test_unknown_policy_is_refused(self):
        self.assertNotEqual(helm('template', RELEASE, '.', '--set', 'cache.tiers.writePolicy=write_around').returncode,
                            0)


if __name__ == '__main__':
    harness.main()
