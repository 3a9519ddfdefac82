"""The Helm chart (deploy/helm/chunkattn): helm lint and helm template with the
default, CPU demo and GPU TP=4 values, the latter two also under the OpenAI
gateway example; the rendered manifests checked for probes, resources, security
contexts, ports and flags that the binaries really have, the worker count, the
network policy, the HTTP API and the InferencePool (against the v1 CRD's
fields); the schema rejecting wrong values; and the CPU demo's rendered command
lines run for real on 127.0.0.1. ManyReplicasTest: the LeaderWorkerSet layout,
KV events and the endpoint picker's precise prefix configuration, with the
LeaderWorkerSet and InferencePool checked against their CRDs' schemas
(tests/deploy/crd/, crd_schema.py).

Run: /usr/bin/python3 tests/deploy/test_chart.py --build build [TestClass]
"""
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'services'))
import harness  # noqa: E402
from test_security import make_pki  # noqa: E402
import crd_schema  # noqa: E402  (beside this file)

RELEASE, NAMESPACE = 'rel', 'serving'
GATEWAY_EXAMPLE = 'examples/openai-gateway.yaml'
VALUES_FILES = {  # chart-relative, later files override earlier ones as with helm -f
    'default': [],
    'cpu-demo': ['ci/cpu-demo-values.yaml'],
    'gpu-tp4': ['ci/gpu-tp4-values.yaml'],
    'cpu-demo+openai-gateway': ['ci/cpu-demo-values.yaml', GATEWAY_EXAMPLE],  # deploy/README.md's
    'gpu-tp4+openai-gateway': ['ci/gpu-tp4-values.yaml', GATEWAY_EXAMPLE],
}
VALUES_SETS = {name: [a for f in files for a in ('-f', f)] for name, files in VALUES_FILES.items()}
_helm = None


def chart_dir():
    return os.path.join(harness.SOURCE, 'deploy', 'helm', 'chunkattn')


def helm(*args):
    """Runs helm in the chart folder; returns the CompletedProcess."""
    global _helm
    if _helm is None:
        r = subprocess.run([os.path.join(harness.SOURCE, 'scripts', 'install-helm.sh')],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError('scripts/install-helm.sh failed:\n' + r.stderr)
        _helm = r.stdout.strip().splitlines()[-1]
    return subprocess.run([_helm] + list(args), cwd=chart_dir(), capture_output=True, text=True,
                          timeout=120)


def render(values_args, *extra):
    r = helm('template', RELEASE, '.', '--namespace', NAMESPACE, *values_args, *extra)
    if r.returncode != 0:
        raise AssertionError('helm template failed:\n' + r.stderr)
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def by_kind(docs, kind):
    return [d for d in docs if d['kind'] == kind]


def secret_names(docs):
    return sorted(d['metadata']['name'] for d in by_kind(docs, 'Secret'))


def one(docs, kind, component=None):
    found = [d for d in by_kind(docs, kind)
             if component is None or
             d['metadata']['labels'].get('app.kubernetes.io/component') == component]
    assert len(found) == 1, '%d %s(s) for %s' % (len(found), kind, component)
    return found[0]


def binary_flags(name):
    """The flags a binary defines in its own main file (or, for the coordinator,
    the config file its main reads them through), from --helpfull."""
    r = subprocess.run([harness.bin_path(name), '--helpfull'], capture_output=True, text=True,
                       timeout=30)
    flags, in_main = set(), False
    for line in (r.stdout + r.stderr).splitlines():
        if line.strip().startswith('Flags from '):
            in_main = line.rstrip().endswith(('_main.cc:', 'coordinator_config.cc:'))
        elif in_main:
            m = re.match(r'^\s+--(\w+) \(', line)
            if m:
                flags.add(m.group(1))
    assert flags, 'no flags parsed from %s --helpfull' % name
    return flags


def parse_args(args):
    """['--a=1', '--b=x'] -> {'a': '1', 'b': 'x'}; every arg must be --name=value."""
    out = {}
    for a in args:
        m = re.match(r'^--([a-z_]+)=(.*)$', a)
        assert m, 'argument %r is not --name=value' % a
        assert m.group(1) not in out, 'flag --%s given twice' % m.group(1)
        out[m.group(1)] = m.group(2)
    return out


def container(workload):
    containers = workload['spec']['template']['spec']['containers']
    assert len(containers) == 1
    return containers[0]


def port_of(c, name):
    ports = {p['name']: p['containerPort'] for p in c.get('ports', [])}
    assert name in ports, '%s has no port named %s (has %s)' % (c['name'], name, sorted(ports))
    return ports[name]


def http_get(port, path, timeout=5.0):
    """(status, body) of GET http://127.0.0.1:<port><path>; (None, '') if nothing answers."""
    try:
        with urllib.request.urlopen('http://127.0.0.1:%d%s' % (port, path), timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return None, ''


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def merge_values(base, override):
    """Helm's merge of values files: maps merge key by key, anything else replaces."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge_values(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def values_of(name):
    """The values a VALUES_FILES set renders with: values.yaml under its files."""
    with open(os.path.join(chart_dir(), 'values.yaml')) as f:
        values = yaml.safe_load(f)
    for path in VALUES_FILES[name]:
        with open(os.path.join(chart_dir(), path)) as f:
            values = merge_values(values, yaml.safe_load(f) or {})
    return values


def probe_port(c, probe):
    """The port number a grpc or httpGet probe connects to (httpGet may name the port)."""
    handler = c[probe].get('grpc') or c[probe].get('httpGet')
    assert handler, '%s %s is neither a gRPC nor an HTTP probe' % (c['name'], probe)
    port = handler['port']
    return port_of(c, port) if isinstance(port, str) else port


# The InferencePool of the Gateway API Inference Extension, v1 (CRD bundle v1.0.0,
# config/crd/bases/inference.networking.k8s.io_inferencepools.yaml): the spec's fields and
# what the API server checks. v1.0 requires endpointPickerRef and allows one target port
# (later bundles allow 8 and make the picker optional), so a v1.0 pool is valid in all.
INFERENCE_POOL_API = 'inference.networking.k8s.io/v1'
INFERENCE_POOL_SPEC = {'selector', 'targetPorts', 'endpointPickerRef'}
ENDPOINT_PICKER_REF = {'group', 'kind', 'name', 'port', 'failureMode'}
LABEL_VALUE = re.compile(r'^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')


class LintAndTemplateTest(unittest.TestCase):

    def test_lint_every_values_set(self):
        for name, values in VALUES_SETS.items():
            r = helm('lint', '.', '--strict', *values)
            self.assertEqual(r.returncode, 0, '%s:\n%s%s' % (name, r.stdout, r.stderr))
            self.assertIn('0 chart(s) failed', r.stdout, name)

    def test_rendered_manifests(self):
        coordinator_flags = binary_flags('chunkattn-coordinator')
        worker_flags = binary_flags('chunkattn-worker')
        for name, values in VALUES_SETS.items():
            with self.subTest(values=name):
                self.check_manifests(render(values), name, coordinator_flags, worker_flags)

    def check_manifests(self, docs, name, coordinator_flags, worker_flags):
        values = values_of(name)
        tp, device, http = values['tensorParallelSize'], values['device'], values['http']

        deploy = one(docs, 'Deployment', 'coordinator')
        sts = one(docs, 'StatefulSet', 'worker')
        self.assertEqual(deploy['spec']['replicas'], 1)
        self.assertEqual(deploy['spec']['strategy']['type'], 'Recreate')
        self.assertEqual(sts['spec']['replicas'], tp)
        self.assertEqual(sts['spec']['podManagementPolicy'], 'Parallel')

        # Every container: probes on a declared port, resources, a locked-down context.
        for w in (deploy, sts):
            pod = w['spec']['template']['spec']
            self.assertFalse(pod.get('automountServiceAccountToken', True))
            self.assertTrue(pod['securityContext']['runAsNonRoot'])
            self.assertNotEqual(pod['securityContext'].get('runAsUser'), 0)
            for c in pod['containers'] + pod.get('initContainers', []):
                declared = {p['containerPort'] for p in c['ports']}
                for probe in ('livenessProbe', 'readinessProbe'):
                    self.assertIn(probe, c, c['name'])
                    self.assertIn(probe_port(c, probe), declared)
                # Liveness is always the cheap native gRPC probe (readiness: see below).
                self.assertIn('grpc', c['livenessProbe'], '%s liveness is not a native gRPC probe' % c['name'])
                for kind in ('requests', 'limits'):
                    for resource in ('cpu', 'memory'):
                        self.assertIn(resource, c['resources'][kind], (c['name'], kind))
                sc = c['securityContext']
                self.assertFalse(sc['allowPrivilegeEscalation'])
                self.assertTrue(sc['readOnlyRootFilesystem'])
                self.assertFalse(sc.get('privileged', False))
                self.assertEqual(sc['capabilities']['drop'], ['ALL'])
                mounts = {m['mountPath'] for m in c['volumeMounts']}
                self.assertIn('/tmp', mounts, 'a read-only root needs a writable /tmp')

        # The coordinator: its flags exist, its ports are the ones it listens on.
        c = container(deploy)
        args = parse_args(c['args'])
        self.assertLessEqual(set(args), coordinator_flags, 'flags the coordinator lacks')
        self.assertTrue(c['command'][0].endswith('/chunkattn-coordinator'))
        self.assertEqual(args['listen'], '0.0.0.0:%d' % port_of(c, 'grpc'))
        self.assertEqual(int(args['metrics_port']), port_of(c, 'metrics'))
        self.assertEqual(int(args['health_port']), port_of(c, 'health'))
        self.assertEqual(c['livenessProbe']['grpc']['port'], port_of(c, 'health'))
        self.assertEqual(c['livenessProbe']['grpc']['service'], 'liveness')
        # The HTTP API: on its own port, readiness on its /health (HTTPS under the chart's TLS)
        # unless that port requires a client certificate, which the kubelet lacks.
        tls = values['tls']
        mutual_tls = tls['enabled'] and bool(tls.get('clientCASecretName'))
        if http['enabled']:
            self.assertEqual(args['http_host'], '0.0.0.0')
            self.assertEqual(int(args['http_port']), port_of(c, 'http'))
            self.assertEqual(port_of(c, 'http'), http['port'])
            self.assertEqual(args['served_model_name'],
                             http['servedModelName'] or os.path.basename(args['model']))
        else:
            self.assertEqual(args['http_port'], '0', 'the coordinator serves HTTP unless told not to')
            self.assertNotIn('served_model_name', args)
            self.assertNotIn('http', {p['name'] for p in c['ports']})
        if http['enabled'] and not mutual_tls:
            probe = c['readinessProbe']['httpGet']
            self.assertEqual(probe['path'], '/health')
            self.assertEqual(probe_port(c, 'readinessProbe'), port_of(c, 'http'))
            self.assertEqual(probe['scheme'], 'HTTPS' if tls['enabled'] else 'HTTP')
            self.assertNotIn('grpc', c['readinessProbe'])
        else:
            self.assertEqual(c['readinessProbe']['grpc']['port'], port_of(c, 'health'))
            self.assertEqual(c['readinessProbe']['grpc'].get('service', ''), '')
        # SIGTERM drains for --drain_timeout_s: the pod's grace period covers it.
        grace = deploy['spec']['template']['spec']['terminationGracePeriodSeconds']
        self.assertGreaterEqual(grace, float(args['drain_timeout_s']) + 10)
        self.assertTrue(float(args['step_timeout_s']) == -1 or float(args['step_timeout_s']) > 0, args['step_timeout_s'])

        # The workers: flags, port, and the coordinator's --workers naming each rank.
        w = container(sts)
        wargs = parse_args(w['args'])
        self.assertLessEqual(set(wargs), worker_flags, 'flags the worker lacks')
        self.assertTrue(w['command'][0].endswith('/chunkattn-worker'))
        worker_port = port_of(w, 'grpc')
        self.assertEqual(wargs['listen'], '0.0.0.0:%d' % worker_port)
        # The probes use the plaintext health port (the gRPC port speaks only TLS).
        self.assertEqual(int(wargs['health_port']), port_of(w, 'health'))
        for probe in ('livenessProbe', 'readinessProbe'):
            self.assertEqual(w[probe]['grpc']['port'], port_of(w, 'health'), probe)
        # A draining worker is not ready but alive: liveness must not restart it.
        self.assertEqual(w['livenessProbe']['grpc']['service'], 'liveness')
        self.assertEqual(w['readinessProbe']['grpc'].get('service', ''), '')
        self.assertEqual(wargs['device'], device)
        # A worker's SIGTERM drain (running requests finish) fits its grace period.
        wgrace = sts['spec']['template']['spec']['terminationGracePeriodSeconds']
        self.assertGreaterEqual(wgrace, float(wargs['drain_timeout_s']) + 10)
        self.assertEqual(wargs['collective_host'], '$(POD_IP)')
        self.assertIn('POD_IP', {e['name'] for e in w['env']})
        headless = [s for s in by_kind(docs, 'Service') if s['spec'].get('clusterIP') == 'None']
        self.assertEqual(len(headless), 1)
        headless = headless[0]
        self.assertEqual(sts['spec']['serviceName'], headless['metadata']['name'])
        self.assertTrue(headless['spec']['publishNotReadyAddresses'])
        self.assertEqual(headless['spec']['ports'][0]['port'], worker_port)
        self.assertTrue(labels_match(headless['spec']['selector'],
                                     sts['spec']['template']['metadata']['labels']))
        expected = ['%s-%d.%s.%s.svc.cluster.local:%d' % (sts['metadata']['name'], i,
                                                          headless['metadata']['name'], NAMESPACE,
                                                          worker_port) for i in range(tp)]
        self.assertEqual(args['workers'].split(','), expected)
        # Both load the same model folder, and it is mounted where the flag says.
        if args['model'].startswith('/models'):
            for x in (c, w):
                self.assertIn('/models', {m['mountPath'] for m in x['volumeMounts']})
        else:
            self.assertEqual(args['model'], '/opt/chunkattn/models/demo')
        gpus = w['resources']['limits'].get('nvidia.com/gpu')
        self.assertEqual(gpus, 1 if device == 'cuda' else None)
        if device == 'cuda':
            self.assertEqual(args['kv_dtype'], 'bfloat16')
            self.assertEqual(wargs['gpu_memory_fraction'], '0.9')
            self.assertEqual(wargs['cuda_graphs'], 'true')
        else:
            self.assertNotIn('gpu_memory_fraction', wargs)

        # TLS / tokens: the files the flags name are mounted from the secrets.
        mounts = {m['mountPath']: m['name'] for m in c['volumeMounts']}
        volumes = {v['name']: v for v in deploy['spec']['template']['spec']['volumes']}
        for flag in ('tls_cert_file', 'tls_key_file', 'auth_token_file'):
            if flag in args:
                folder = os.path.dirname(args[flag])
                self.assertIn(folder, mounts, flag)
                self.assertIn('secret', volumes[mounts[folder]], flag)

        # The worker token: both send/require the same file, from the same Secret;
        # workers load models only from the model's volume.
        self.assertEqual(args['worker_token_file'], wargs['worker_token_file'])
        worker_volumes = {v['name']: v for v in sts['spec']['template']['spec']['volumes']}
        secrets = set()
        for x, vols, xargs in ((c, volumes, args), (w, worker_volumes, wargs)):
            xmounts = {m['mountPath']: m['name'] for m in x['volumeMounts']}
            folder = os.path.dirname(xargs['worker_token_file'])
            self.assertIn(folder, xmounts)
            secrets.add(vols[xmounts[folder]]['secret']['secretName'])
        self.assertEqual(len(secrets), 1)
        token_secret = [d for d in by_kind(docs, 'Secret') if d['metadata']['name'] in secrets]
        self.assertEqual(len(token_secret), 1, 'the chart makes the worker token')
        self.assertGreaterEqual(len(next(iter(token_secret[0]['data'].values()))), 48)
        # Mutual TLS on the worker port: the workers serve with the certificate and require
        # client certificates of the CA; the coordinator shows the same certificate and checks
        # the workers' against the CA, for the same name. One Secret, three keys.
        self.assertEqual(args['worker_tls_server_name'], wargs['worker_tls_server_name'])
        tls_secrets = set()
        for x, vols, xargs, files in (
                (c, volumes, args, {'worker_tls_ca_file': 'ca.crt', 'worker_tls_cert_file': 'tls.crt',
                                    'worker_tls_key_file': 'tls.key'}),
                (w, worker_volumes, wargs, {'tls_client_ca_file': 'ca.crt', 'tls_cert_file': 'tls.crt',
                                            'tls_key_file': 'tls.key'})):
            xmounts = {m['mountPath']: m['name'] for m in x['volumeMounts']}
            for flag, key in files.items():
                folder, file_name = os.path.split(xargs[flag])
                self.assertEqual(file_name, key, flag)
                self.assertIn(folder, xmounts, flag)
                secret = vols[xmounts[folder]]['secret']
                self.assertIn({'key': key, 'path': key}, secret['items'], flag)
                tls_secrets.add(secret['secretName'])
        self.assertEqual(len(tls_secrets), 1)
        tls_secret = [d for d in by_kind(docs, 'Secret') if d['metadata']['name'] in tls_secrets]
        self.assertEqual(len(tls_secret), 1, 'the chart makes the worker certificate')
        self.assertEqual(set(tls_secret[0]['data']), {'ca.crt', 'tls.crt', 'tls.key'})
        self.assertTrue(args['model'] == wargs['model_root'] or
                        args['model'].startswith(wargs['model_root'].rstrip('/') + '/'),
                        (args['model'], wargs['model_root']))

        # The public Service routes to the coordinator's named ports.
        svc = [s for s in by_kind(docs, 'Service') if s['spec'].get('clusterIP') != 'None'][0]
        self.assertTrue(labels_match(svc['spec']['selector'], deploy['spec']['template']['metadata']['labels']))
        self.assertEqual({p['targetPort'] for p in svc['spec']['ports']},
                         {'grpc', 'metrics'} | ({'http'} if http['enabled'] else set()))
        if http['enabled']:
            port = [p for p in svc['spec']['ports'] if p['name'] == 'http'][0]
            self.assertEqual((port['port'], port['targetPort']), (http['port'], 'http'))
            self.assertEqual(port['appProtocol'], 'https' if tls['enabled'] else 'http')

        # Only the coordinator and the other workers reach the workers.
        worker_labels = sts['spec']['template']['metadata']['labels']
        coord_labels = deploy['spec']['template']['metadata']['labels']
        policies = [p for p in by_kind(docs, 'NetworkPolicy')
                    if labels_match(p['spec']['podSelector']['matchLabels'], worker_labels)]
        self.assertEqual(len(policies), 1)
        rules = policies[0]['spec']['ingress']
        self.assertIn('Ingress', policies[0]['spec']['policyTypes'])
        for rule in rules:
            self.assertIn('from', rule, 'a worker ingress rule open to every pod')
            for peer in rule['from']:
                self.assertEqual(set(peer), {'podSelector'})
                sel = peer['podSelector']['matchLabels']
                self.assertTrue(labels_match(sel, coord_labels) or labels_match(sel, worker_labels), sel)
        self.assertTrue(any(labels_match(p['podSelector']['matchLabels'], coord_labels)
                            for r in rules for p in r['from']))
        self.assertTrue(any(labels_match(p['podSelector']['matchLabels'], worker_labels)
                            for r in rules for p in r['from']), 'workers must reach each other (collectives)')
        # The coordinator: the HTTP port is an API port, open to the same peers as gRPC.
        coord_policy = [p for p in by_kind(docs, 'NetworkPolicy')
                        if labels_match(p['spec']['podSelector']['matchLabels'], coord_labels)]
        self.assertEqual(len(coord_policy), 1)
        api_rules = [r for r in coord_policy[0]['spec']['ingress']
                     if 'grpc' in {p['port'] for p in r['ports']}]
        self.assertEqual(len(api_rules), 1)
        self.assertEqual({p['port'] for p in api_rules[0]['ports']},
                         {'grpc'} | ({'http'} if http['enabled'] else set()))
        self.assertEqual(api_rules[0].get('from', []), values['networkPolicy']['apiFrom'])

        # The InferencePool: only when asked for, on the coordinator's HTTP port.
        pools = by_kind(docs, 'InferencePool')
        if values['inferencePool']['enabled']:
            self.assertEqual(len(pools), 1)
            self.check_inference_pool(pools[0], deploy, sts, values)
        else:
            self.assertEqual(pools, [])

        # One budget per component; not-ready pods never block a drain.
        pdbs = by_kind(docs, 'PodDisruptionBudget')
        self.assertEqual(len(pdbs), 2)
        for labels in (coord_labels, worker_labels):
            matching = [p for p in pdbs if labels_match(p['spec']['selector']['matchLabels'], labels)]
            self.assertEqual(len(matching), 1)
            self.assertEqual(matching[0]['spec']['unhealthyPodEvictionPolicy'], 'AlwaysAllow')
        env = {e['name']: e.get('value') for e in w['env']}
        self.assertEqual(env.get('NVIDIA_VISIBLE_DEVICES'), 'void' if device == 'cpu' else None)

        # The dashboard ConfigMap is deploy/grafana/chunkattn.json, byte for byte.
        cm = [d for d in by_kind(docs, 'ConfigMap') if 'chunkattn.json' in d.get('data', {})]
        self.assertEqual(len(cm), 1)
        self.assertEqual(cm[0]['metadata']['labels'].get('grafana_dashboard'), '1')
        with open(os.path.join(harness.SOURCE, 'deploy', 'grafana', 'chunkattn.json')) as f:
            self.assertEqual(json.loads(cm[0]['data']['chunkattn.json']), json.load(f))
        if values['metrics']['prometheusRule']['enabled']:
            rule = one(docs, 'PrometheusRule')
            with open(os.path.join(harness.SOURCE, 'deploy', 'prometheus', 'alerts.yml')) as f:
                self.assertEqual(rule['spec'], yaml.safe_load(f))
        else:
            self.assertEqual(by_kind(docs, 'PrometheusRule'), [])
        if values['metrics']['serviceMonitor']['enabled']:
            monitor = one(docs, 'ServiceMonitor')
            self.assertEqual(monitor['spec']['endpoints'][0]['port'], 'metrics')
            self.assertTrue(labels_match(monitor['spec']['selector']['matchLabels'], svc['metadata']['labels']))
        else:
            self.assertEqual(by_kind(docs, 'ServiceMonitor'), [])
        self.assertEqual(name.startswith('gpu-tp4'), bool(by_kind(docs, 'PrometheusRule')))

    def check_inference_pool(self, pool, deploy, sts, values):
        """One rendered InferencePool: valid against the v1 CRD's fields, selecting the
        coordinator pod and not the workers, targeting its HTTP port."""
        self.assertEqual(pool['apiVersion'], INFERENCE_POOL_API)
        self.assertEqual(pool['kind'], 'InferencePool')
        self.assertEqual(pool['metadata']['name'] + '-coordinator', deploy['metadata']['name'])
        self.assertNotIn('namespace', pool['metadata'])  # the release's, as every other object
        spec = pool['spec']
        self.assertEqual(set(spec), INFERENCE_POOL_SPEC)  # all three required in v1.0, no others
        self.assertEqual(set(spec['selector']), {'matchLabels'})
        match = spec['selector']['matchLabels']
        self.assertGreaterEqual(len(match), 1)
        for k, v in match.items():
            self.assertIsInstance(v, str, k)
            self.assertRegex(v, LABEL_VALUE)
            self.assertLessEqual(len(v), 63)
        coordinator = container(deploy)
        self.assertTrue(labels_match(match, deploy['spec']['template']['metadata']['labels']), match)
        self.assertFalse(labels_match(match, sts['spec']['template']['metadata']['labels']),
                         'the pool must not take in the workers (they serve no HTTP)')
        self.assertEqual(spec['targetPorts'], [{'number': port_of(coordinator, 'http')}])
        ref = spec['endpointPickerRef']
        self.assertLessEqual(set(ref), ENDPOINT_PICKER_REF)
        self.assertEqual(ref.get('kind', 'Service'), 'Service')
        self.assertEqual(set(ref['port']), {'number'})  # required when the kind is Service
        picker = values['inferencePool']['endpointPicker']
        self.assertEqual((ref['name'], ref['port']['number']), (picker['serviceName'], picker['port']))
        self.assertTrue(1 <= ref['port']['number'] <= 65535)
        self.assertIn(ref['failureMode'], ('FailOpen', 'FailClose'))
        self.assertEqual(ref['failureMode'], picker['failureMode'])
        # The picker scrapes /metrics on the target port without a token.
        self.assertNotIn('metrics_token_file', parse_args(coordinator['args']))

    def test_http_off(self):
        docs = render([], '--set', 'http.enabled=false')
        deploy = one(docs, 'Deployment')
        c = container(deploy)
        args = parse_args(c['args'])
        self.assertEqual(args['http_port'], '0')
        self.assertNotIn('served_model_name', args)
        self.assertNotIn('http', {p['name'] for p in c['ports']})
        self.assertEqual(c['readinessProbe']['grpc']['port'], port_of(c, 'health'))
        svc = [s for s in by_kind(docs, 'Service') if s['spec'].get('clusterIP') != 'None'][0]
        self.assertEqual({p['name'] for p in svc['spec']['ports']}, {'grpc', 'metrics'})
        for policy in by_kind(docs, 'NetworkPolicy'):
            for rule in policy['spec']['ingress']:
                self.assertNotIn('http', {p['port'] for p in rule.get('ports', [])})
        self.assertEqual(by_kind(docs, 'InferencePool'), [])

    def test_http_port_and_model_name(self):
        docs = render([], '--set', 'http.port=8080', '--set', 'http.servedModelName=meta-llama/Llama-3.1-8B')
        c = container(one(docs, 'Deployment'))
        args = parse_args(c['args'])
        self.assertEqual((args['http_port'], port_of(c, 'http')), ('8080', 8080))
        self.assertEqual(args['served_model_name'], 'meta-llama/Llama-3.1-8B')
        self.assertEqual(c['readinessProbe']['httpGet']['port'], 'http')
        svc = [s for s in by_kind(docs, 'Service') if s['spec'].get('clusterIP') != 'None'][0]
        self.assertIn({'name': 'http', 'port': 8080, 'targetPort': 'http', 'protocol': 'TCP', 'appProtocol': 'http'},
                      svc['spec']['ports'])
        # The default id is the model folder's name, not its path in the pod.
        for extra, expected in ((['--set', 'model.source=pvc', '--set', 'model.pvc.claimName=w',
                                  '--set', 'model.subPath=llama/Meta-Llama-3-8B-Instruct'], 'Meta-Llama-3-8B-Instruct'),
                                ([], 'demo')):
            args = parse_args(container(one(render([], *extra), 'Deployment'))['args'])
            self.assertEqual(args['served_model_name'], expected)

    def test_http_probe_under_tls(self):
        docs = render([], '--set', 'tls.enabled=true', '--set', 'tls.secretName=t')
        c = container(one(docs, 'Deployment'))
        self.assertEqual(c['readinessProbe']['httpGet'], {'path': '/health', 'port': 'http', 'scheme': 'HTTPS'})
        svc = [s for s in by_kind(docs, 'Service') if s['spec'].get('clusterIP') != 'None'][0]
        self.assertEqual([p['appProtocol'] for p in svc['spec']['ports'] if p['name'] == 'http'], ['https'])
        # Mutual TLS: the kubelet has no client certificate, so readiness stays on the
        # plaintext gRPC health port, which answers the same question.
        docs = render([], '--set', 'tls.enabled=true', '--set', 'tls.secretName=t', '--set', 'tls.clientCASecretName=ca')
        c = container(one(docs, 'Deployment'))
        self.assertEqual(c['readinessProbe']['grpc'], {'port': port_of(c, 'health')})
        self.assertEqual(port_of(c, 'http'), 8000)

    def test_inference_pool(self):
        self.assertEqual(by_kind(render([]), 'InferencePool'), [])  # off by default
        picker = ['--set', 'inferencePool.enabled=true', '--set', 'inferencePool.endpointPicker.serviceName=epp']
        docs = render([], *picker)
        pool = one(docs, 'InferencePool')
        values = values_of('default')
        values['inferencePool'] = dict(values['inferencePool'], enabled=True,
                                       endpointPicker=dict(values['inferencePool']['endpointPicker'], serviceName='epp'))
        deploy, sts = one(docs, 'Deployment'), one(docs, 'StatefulSet')
        self.check_inference_pool(pool, deploy, sts, values)
        self.assertEqual(pool['spec']['endpointPickerRef'],
                         {'name': 'epp', 'port': {'number': 9002}, 'failureMode': 'FailClose'})
        self.assertEqual(pool['spec']['selector']['matchLabels'],
                         deploy['spec']['selector']['matchLabels'])
        # A pool shared by several releases: their coordinators carry a common label, which the
        # workers may carry too; the component label still keeps the workers out.
        docs = render([], *picker, '--set', 'http.port=8443', '--set', 'inferencePool.matchLabels.pool=llama3',
                      '--set', 'coordinator.podLabels.pool=llama3', '--set', 'worker.podLabels.pool=llama3',
                      '--set', 'inferencePool.endpointPicker.failureMode=FailOpen',
                      '--set', 'inferencePool.endpointPicker.port=9100')
        pool = one(docs, 'InferencePool')
        self.assertEqual(pool['spec']['selector']['matchLabels'],
                         {'pool': 'llama3', 'app.kubernetes.io/component': 'coordinator'})
        self.assertEqual(pool['spec']['targetPorts'], [{'number': 8443}])
        self.assertEqual(pool['spec']['endpointPickerRef'],
                         {'name': 'epp', 'port': {'number': 9100}, 'failureMode': 'FailOpen'})
        self.assertTrue(labels_match(pool['spec']['selector']['matchLabels'],
                                     one(docs, 'Deployment')['spec']['template']['metadata']['labels']))
        self.assertFalse(labels_match(pool['spec']['selector']['matchLabels'],
                                      one(docs, 'StatefulSet')['spec']['template']['metadata']['labels']))
        # What cannot work is refused before anything renders.
        for extra, message in (
                ([], 'serviceName'),  # no picker named
                (picker[2:] + ['--set', 'http.enabled=false'], 'http.enabled'),
                (picker[2:] + ['--set', 'metrics.auth.existingSecret=mt'], 'metrics.auth.existingSecret')):
            r = helm('template', RELEASE, '.', '--set', 'inferencePool.enabled=true', *extra)
            self.assertNotEqual(r.returncode, 0, extra)
            self.assertIn(message, r.stderr, extra)

    def test_tensor_parallel_size_sets_workers(self):
        for tp in (1, 3, 8):
            docs = render([], '--set', 'tensorParallelSize=%d' % tp)
            self.assertEqual(one(docs, 'StatefulSet')['spec']['replicas'], tp)
            args = parse_args(container(one(docs, 'Deployment'))['args'])
            self.assertEqual(len(args['workers'].split(',')), tp)

    def test_worker_token_from_an_existing_secret_or_off(self):
        docs = render([], '--set', 'workerAuth.existingSecret=mine', '--set', 'workerAuth.secretKey=k')
        self.assertEqual(secret_names(docs), ['rel-chunkattn-worker-tls'])  # no token Secret
        for workload in (one(docs, 'Deployment'), one(docs, 'StatefulSet')):
            volume = [v for v in workload['spec']['template']['spec']['volumes'] if v['name'] == 'worker-token'][0]
            self.assertEqual(volume['secret']['secretName'], 'mine')
            self.assertEqual(volume['secret']['items'], [{'key': 'k', 'path': 'token'}])
        docs = render([], '--set', 'workerAuth.enabled=false')
        self.assertEqual(secret_names(docs), ['rel-chunkattn-worker-tls'])
        for workload in (one(docs, 'Deployment'), one(docs, 'StatefulSet')):
            self.assertNotIn('worker_token_file', parse_args(container(workload)['args']))

    def openssl(self, folder, *args):
        r = subprocess.run(['openssl'] + list(args), cwd=folder, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, (args, r.stderr))
        return r.stdout

    def test_worker_certificate(self):
        """The chart's CA signs one certificate for workerTls.serverName, good as a server and a
        client certificate; both components check that name."""
        for name in ('chunkattn-worker', 'workers.internal'):
            with self.subTest(serverName=name):
                docs = render([], '--set', 'workerTls.serverName=' + name)
                secret = [s for s in by_kind(docs, 'Secret') if s['metadata']['name'] == 'rel-chunkattn-worker-tls']
                self.assertEqual(len(secret), 1)
                self.assertEqual(secret[0]['type'], 'kubernetes.io/tls')
                tmp = harness.temp_dir('chunkattn-worker-tls-', self.addCleanup)
                for key, value in secret[0]['data'].items():
                    with open(os.path.join(tmp, key), 'wb') as f:
                        f.write(base64.b64decode(value))
                for purpose in ('sslserver', 'sslclient'):
                    self.assertIn('tls.crt: OK',
                                  self.openssl(tmp, 'verify', '-CAfile', 'ca.crt', '-purpose', purpose, 'tls.crt'))
                self.assertIn('DNS:' + name,
                              self.openssl(tmp, 'x509', '-in', 'tls.crt', '-noout', '-ext', 'subjectAltName'))
                self.assertEqual(self.openssl(tmp, 'x509', '-in', 'tls.crt', '-noout', '-pubkey'),
                                 self.openssl(tmp, 'pkey', '-in', 'tls.key', '-pubout'))
                self.assertEqual(parse_args(container(one(docs, 'Deployment'))['args'])['worker_tls_server_name'], name)
                self.assertEqual(parse_args(container(one(docs, 'StatefulSet'))['args'])['worker_tls_server_name'], name)

    def test_worker_tls_from_an_existing_secret_or_off(self):
        docs = render([], '--set', 'workerTls.existingSecret=mine')
        self.assertEqual(secret_names(docs), ['rel-chunkattn-worker-token'])  # no certificate Secret
        for workload in (one(docs, 'Deployment'), one(docs, 'StatefulSet')):
            volume = [v for v in workload['spec']['template']['spec']['volumes'] if v['name'] == 'worker-tls'][0]
            self.assertEqual(volume['secret']['secretName'], 'mine')
            self.assertEqual({i['key'] for i in volume['secret']['items']}, {'ca.crt', 'tls.crt', 'tls.key'})
        self.assertIn('worker_tls_ca_file', parse_args(container(one(docs, 'Deployment'))['args']))
        self.assertIn('tls_client_ca_file', parse_args(container(one(docs, 'StatefulSet'))['args']))
        docs = render([], '--set', 'workerTls.enabled=false')
        self.assertEqual(secret_names(docs), ['rel-chunkattn-worker-token'])
        deploy, sts = one(docs, 'Deployment'), one(docs, 'StatefulSet')
        args, wargs = parse_args(container(deploy)['args']), parse_args(container(sts)['args'])
        self.assertEqual([a for a in args if a.startswith('worker_tls_')], [])
        self.assertEqual([a for a in wargs if 'tls' in a], [])
        self.assertIn('health_port', wargs)  # the probes' port either way
        for workload in (deploy, sts):
            self.assertNotIn('worker-tls', {v['name'] for v in workload['spec']['template']['spec']['volumes']})
            self.assertNotIn('worker-tls', {m['name'] for m in container(workload)['volumeMounts']})

    def test_metrics_token_from_a_secret(self):
        docs = render([], '--set', 'metrics.auth.existingSecret=mt', '--set', 'metrics.serviceMonitor.enabled=true')
        deploy = one(docs, 'Deployment')
        c = container(deploy)
        args = parse_args(c['args'])
        self.assertIn('metrics_token_file', binary_flags('chunkattn-coordinator'))
        folder = os.path.dirname(args['metrics_token_file'])
        mount = [m for m in c['volumeMounts'] if m['mountPath'] == folder][0]
        volume = [v for v in deploy['spec']['template']['spec']['volumes'] if v['name'] == mount['name']][0]
        self.assertEqual(volume['secret']['secretName'], 'mt')
        self.assertEqual(volume['secret']['items'][0]['path'], os.path.basename(args['metrics_token_file']))
        endpoint = one(docs, 'ServiceMonitor')['spec']['endpoints'][0]
        self.assertEqual(endpoint['authorization'], {'type': 'Bearer', 'credentials': {'name': 'mt', 'key': 'token'}})
        docs = render([], '--set', 'metrics.serviceMonitor.enabled=true')
        self.assertNotIn('metrics_token_file', parse_args(container(one(docs, 'Deployment'))['args']))
        self.assertNotIn('authorization', one(docs, 'ServiceMonitor')['spec']['endpoints'][0])

    def test_schema_rejects_wrong_values(self):
        cases = [
            ('--set-string', 'tensorParallelSize=four', 'tensorParallelSize'),
            ('--set', 'tensorParallelSize=0', 'tensorParallelSize'),
            ('--set', 'device=tpu', 'device'),
            ('--set', 'cache.chunkSize=48', 'chunkSize'),
            ('--set-string', 'cache.prefixSharing=yes', 'prefixSharing'),
            ('--set', 'cache.kvDtype=int8', 'kvDtype'),
            ('--set', 'worker.kvCacheMiB=-1', 'kvCacheMiB'),
            ('--set', 'worker.gpuMemoryFraction=1.5', 'gpuMemoryFraction'),
            ('--set', 'worker.kvCacheMib=512', 'kvCacheMib'),  # a typo is not ignored
            ('--set', 'coordinator.grpcPort=70000', 'grpcPort'),
            ('--set', 'model.source=s3', 'source'),
            ('--set', 'model.source=pvc', 'claimName'),
            ('--set', 'model.subPath=../etc', 'subPath'),
            ('--set', 'tls.enabled=true', 'secretName'),
            ('--set', 'auth.enabled=true', 'existingSecret'),
            ('--set', 'coordinator.extraArgs[0]=rm -rf', 'extraArgs'),
            ('--set', 'scheduler.maxBatchSize=4096', 'maxTokensPerStep'),
            ('--set', 'worker.podLabels.app\\.kubernetes\\.io/component=x', 'podLabels'),
            ('--set', 'fullnameOverride=' + 'a' * 46, 'fullnameOverride'),
            ('--set', 'nameOverride=Bad_Name', 'nameOverride'),
            ('--set', 'auth.secretKey=../x', 'secretKey'),
            ('--set', 'workerAuth.secretKey=a/b', 'secretKey'),
            ('--set', 'coordinator.drainTimeoutSeconds=-1', 'drainTimeoutSeconds'),
            ('--set', 'worker.drainTimeoutSeconds=90000', 'drainTimeoutSeconds'),
            ('--set-string', 'workerAuth.enabled=yes', 'enabled'),
            ('--set', 'podDisruptionBudget.maxUnavailable=abc', 'maxUnavailable'),
            ('--set', 'worker.updateStrategy=Recreate', 'updateStrategy'),
            ('--set', 'worker.healthPort=0', 'healthPort'),
            ('--set-string', 'workerTls.enabled=yes', 'enabled'),
            ('--set', 'workerTls.serverName=Bad_Name', 'serverName'),
            ('--set', 'workerTls.serverName=', 'serverName'),
            ('--set', 'workerTls.certificate=x', 'certificate'),  # a typo is not ignored
            ('--set', 'http.port=0', 'http.port'),
            ('--set', 'http.port=50051', 'http.port'),  # the gRPC port's
            ('--set', 'http.servedModel=x', 'servedModel'),  # a typo is not ignored
            ('--set', 'http.servedModelName=my model', 'servedModelName'),
            ('--set-string', 'http.enabled=yes', 'enabled'),
            ('--set', 'inferencePool.endpointPicker.failureMode=Sometimes', 'failureMode'),
            ('--set', 'inferencePool.matchLabels.app\\.kubernetes\\.io/component=worker', 'matchLabels'),
            ('--set', 'inferencePool.targetPort=8000', 'targetPort'),  # a typo is not ignored
        ]
        for flag, value, field in cases:
            r = helm('template', RELEASE, '.', flag, value)
            self.assertNotEqual(r.returncode, 0, value)
            self.assertIn(field, r.stderr, value)

    def test_long_release_names_keep_pod_names_valid(self):
        # A StatefulSet's pods carry controller-revision-hash=<name>-<10 chars>, a label
        # value (at most 63), so its name may have at most 52 characters.
        r = helm('template', 'r' * 53, '.')
        self.assertEqual(r.returncode, 0, r.stderr)
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        self.assertLessEqual(len(one(docs, 'StatefulSet')['metadata']['name']), 52)
        for d in docs:
            self.assertLessEqual(len(d['metadata']['name']), 63, d['metadata']['name'])

    def test_model_sources(self):
        docs = render([], '--set', 'model.source=hostPath', '--set', 'model.hostPath.path=/data/llama')
        volumes = one(docs, 'StatefulSet')['spec']['template']['spec']['volumes']
        self.assertIn({'name': 'model', 'hostPath': {'path': '/data/llama', 'type': 'Directory'}}, volumes)
        docs = render([], '--set', 'model.source=pvc', '--set', 'model.pvc.claimName=weights',
                      '--set', 'model.subPath=Qwen2-7B')
        args = parse_args(container(one(docs, 'Deployment'))['args'])
        self.assertEqual(args['model'], '/models/Qwen2-7B')

    def render_notes(self, *values):
        """NOTES.txt as `helm install` prints it. That needs a cluster, so a copy
        of the chart renders it into a ConfigMap through `tpl` instead."""
        copy = os.path.join(harness.temp_dir('chunkattn-notes-', self.addCleanup), 'chart')
        shutil.copytree(chart_dir(), copy, symlinks=False)
        shutil.copy(os.path.join(copy, 'templates', 'NOTES.txt'), os.path.join(copy, 'files', 'NOTES.txt'))
        with open(os.path.join(copy, 'templates', 'zz-notes.yaml'), 'w') as f:
            f.write('apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n'
                    '  notes: {{ tpl (.Files.Get "files/NOTES.txt") . | quote }}\n')
        r = subprocess.run([_helm, 'template', RELEASE, copy, '--namespace', NAMESPACE,
                            '--show-only', 'templates/zz-notes.yaml'] + list(values),
                           cwd=copy, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return yaml.safe_load(r.stdout)['data']['notes']

    def test_notes_tell_how_to_call_generate(self):
        helm('version')  # installs helm when needed
        notes = self.render_notes()
        self.assertIn('port-forward svc/rel-chunkattn 50051:50051', notes)
        self.assertIn('chunkattn generate --server 127.0.0.1:50051 --max_new_tokens', notes)
        self.assertIn("grpcurl -plaintext -d '{\"text\"", notes)
        self.assertIn('chunkattn.v1.Generation/Generate', notes)
        self.assertIn('ConfigMap rel-chunkattn-dashboard', notes)
        self.assertIn('uid chunkattn', notes)
        self.assertIn('port-forward svc/rel-chunkattn 50051:50051 8000:8000', notes)
        self.assertIn('curl http://127.0.0.1:8000/v1/chat/completions', notes)
        self.assertIn('"model": "demo"', notes)
        self.assertNotIn('InferencePool', notes)
        self.assertNotIn('8000', self.render_notes('--set', 'http.enabled=false'))
        secure = self.render_notes('-f', 'ci/gpu-tp4-values.yaml')
        self.assertIn('--tls_ca_file ca.crt', secure)
        self.assertIn('--auth_token_file token.txt', secure)
        self.assertIn('authorization: Bearer $TOKEN', secure)
        self.assertIn('A ServiceMonitor scrapes', secure)
        self.assertIn('PrometheusRule rel-chunkattn', secure)
        gateway = self.render_notes(*VALUES_SETS['gpu-tp4+openai-gateway'])
        self.assertIn('curl --cacert ca.crt', gateway)
        self.assertIn('authorization: Bearer $TOKEN" https://', gateway)
        self.assertIn('"model": "Meta-Llama-3-8B-Instruct"', gateway)
        self.assertIn('InferencePool rel-chunkattn', gateway)
        self.assertIn('--pool-name=rel-chunkattn --pool-namespace=serving', gateway)



# Many replicas: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1), checked against LWS v0.10.0's
# CRD (tests/deploy/crd/), whose names follow LWS's rules: the leader of group g is the pod
# <lws>-g, its workers <lws>-g-1 ... <lws>-g-N, all in the headless Service <lws> (subdomain
# policy Shared), and every container gets LWS_LEADER_ADDRESS=<lws>-g.<lws>.<namespace>
# (kubernetes-sigs/lws v0.10.0, pkg/utils/pod/pod_utils.go, pkg/controllers/pod_controller.go).
LWS_API = 'leaderworkerset.x-k8s.io/v1'
LWS_GROUP_INDEX = 'leaderworkerset.sigs.k8s.io/group-index'
LWS_SCHEMA = 'leaderworkerset-v0.10.0'
POOL_SCHEMAS = ('inferencepool-v1.0.0', 'inferencepool-v1.6.0')
# The InferencePool CRDs' CEL rules, which crd_schema cannot evaluate: check_pool_cel does.
POOL_CEL_RULES = {"self.kind != 'Service' || has(self.port)",
                  'self.all(p1, self.exists_one(p2, p1.number==p2.number))'}
MANY_REPLICAS_EXAMPLE = 'examples/many-replicas.yaml'
LWS_VALUES_FILES = {
    'cpu-demo+openai-gateway+many-replicas': VALUES_FILES['cpu-demo+openai-gateway'] + [MANY_REPLICAS_EXAMPLE],
    'gpu-tp4+openai-gateway+many-replicas': VALUES_FILES['gpu-tp4+openai-gateway'] + [MANY_REPLICAS_EXAMPLE],
}
KV_EVENTS_FLAGS = {'kv_events_endpoint', 'kv_events_replay_endpoint', 'kv_events_topic', 'kv_events_format',
                   'kv_events_buffer_steps', 'kv_events_hash_seed', 'kv_events_allow_plaintext_remote'}
KV_CURVE_FLAGS = {'kv_events_curve_secret_key_file', 'kv_events_curve_client_keys_file'}
# CurveZMQ's published example keys (Z85): a server's pair and a client's public key.
CURVE_SERVER_PUBLIC = 'rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7'
CURVE_SERVER_SECRET = 'JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6'
CURVE_CLIENT_PUBLIC = 'Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID'
CURVE_CLIENT_SECRET = 'D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs'
RANDOM_SECRET_LINE = re.compile(r'^(  (ca\.crt|tls\.crt|tls\.key|token)): .*$', re.M)


def render_text(*args):
    """helm template's output, the chart's random secret material masked."""
    r = helm('template', RELEASE, '.', '--namespace', NAMESPACE, *args)
    if r.returncode != 0:
        raise AssertionError('helm template failed:\n' + r.stderr)
    return RANDOM_SECRET_LINE.sub(r'\1: <random>', r.stdout)


def values_with(files, *sets):
    """values.yaml under the files, then `key=value` overrides (dotted keys, YAML values)."""
    with open(os.path.join(chart_dir(), 'values.yaml')) as f:
        values = yaml.safe_load(f)
    for path in files:
        with open(os.path.join(chart_dir(), path)) as f:
            values = merge_values(values, yaml.safe_load(f) or {})
    for item in sets:
        key, value = item.split('=', 1)
        node = values
        parts = key.split('.')
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(value)
    return values


def set_args(sets):
    return [a for item in sets for a in ('--set', item)]


def pod_spec(template):
    return template['spec']


def env_of(c):
    return {e['name']: e for e in c.get('env', [])}


def mounted_file(docs, template, c, path):
    """The text a container finds at `path`: through its volumeMount, the pod's volume, to the
    key of the rendered Secret or ConfigMap it names. None when the chart renders no such
    object (an existing Secret); AssertionError when the chain is broken."""
    mount = [m for m in c['volumeMounts'] if path.startswith(m['mountPath'].rstrip('/') + '/')]
    assert len(mount) == 1, 'no single mount holds %s' % path
    name, rest = mount[0]['name'], path[len(mount[0]['mountPath'].rstrip('/')) + 1:]
    volume = [v for v in template['spec']['volumes'] if v['name'] == name]
    assert len(volume) == 1, 'no volume %s' % name
    volume = volume[0]
    source = volume.get('secret') or volume.get('configMap')
    key = [i['key'] for i in source.get('items', []) if i['path'] == rest] or [rest]
    kind, object_name = ('Secret', source['secretName']) if 'secret' in volume else ('ConfigMap', source['name'])
    found = [d for d in by_kind(docs, kind) if d['metadata']['name'] == object_name]
    if not found:
        return None
    data = found[0]['data']
    assert key[0] in data, '%s %s has no key %s' % (kind, object_name, key[0])
    return base64.b64decode(data[key[0]]).decode() if kind == 'Secret' else data[key[0]]


def expand(arg, env):
    """The kubelet's $(VAR) expansion of a container argument, for the variables given."""
    return re.sub(r'\$\(([A-Za-z_][A-Za-z0-9_]*)\)', lambda m: env.get(m.group(1), m.group(0)), arg)


def lws_pod_labels(lws, template, group, worker):
    """A pod's labels as LWS makes them: the template's plus LWS's own."""
    labels = dict(template['metadata']['labels'])
    labels.update({'leaderworkerset.sigs.k8s.io/name': lws['metadata']['name'],
                   LWS_GROUP_INDEX: str(group), 'leaderworkerset.sigs.k8s.io/worker-index': str(worker)})
    return labels


def admitted(policies, target, peer, port):
    """Whether NetworkPolicies admit `peer` (pod labels, same namespace) to the named `port`
    of `target` (pod labels): open unless some policy selects the target, then any rule of
    those policies may admit. Peers: podSelector.matchLabels only (what the chart renders for
    pods of its own), or an empty `from` (anyone)."""
    selecting = [p for p in policies if labels_match(p['spec']['podSelector'].get('matchLabels', {}), target)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy['spec'].get('ingress', []):
            if 'ports' in rule and port not in {x['port'] for x in rule['ports']}:
                continue
            peers = rule.get('from')
            if not peers or any(set(x) == {'podSelector'} and
                                labels_match(x['podSelector'].get('matchLabels', {}), peer) for x in peers):
                return True
    return False


class ManyReplicasTest(unittest.TestCase):
    """replicas > 1 or lws.enabled: a LeaderWorkerSet instead of the coordinator Deployment and
    worker StatefulSet, valid against LWS's CRD, the coordinators' --workers naming their own
    group's pods by LWS's rules; KV-cache events on the coordinators; the InferencePool and the
    endpoint picker's precise prefix configuration. One replica keeps today's layout."""

    @classmethod
    def setUpClass(cls):
        cls.coordinator_flags = binary_flags('chunkattn-coordinator')

    def test_lint(self):
        for name, files in LWS_VALUES_FILES.items():
            values = [a for f in files for a in ('-f', f)]
            r = helm('lint', '.', '--strict', *values)
            self.assertEqual(r.returncode, 0, '%s:\n%s%s' % (name, r.stdout, r.stderr))
        for extra in (['--set', 'lws.enabled=true'], ['--set', 'replicas=3'],
                      ['-f', 'ci/gpu-tp4-values.yaml', '--set', 'replicas=2',
                       '--set', 'lws.exclusiveTopology=kubernetes.io/hostname']):
            r = helm('lint', '.', '--strict', *extra)
            self.assertEqual(r.returncode, 0, '%s:\n%s%s' % (extra, r.stdout, r.stderr))

    def test_one_replica_keeps_todays_layout(self):
        """replicas 1 without lws.enabled renders exactly what the chart rendered before
        (the same bytes as the defaults), kinds and all; KV events off add nothing."""
        for files in (VALUES_FILES['default'], VALUES_FILES['gpu-tp4+openai-gateway']):
            values = [a for f in files for a in ('-f', f)]
            base = render_text(*values)
            for extra in (['--set', 'replicas=1'], ['--set', 'replicas=1', '--set', 'lws.enabled=false'],
                          ['--set', 'kvEvents.enabled=false']):
                self.assertEqual(render_text(*values, *extra), base, (files, extra))
        docs = render([])
        self.assertEqual(sorted(d['kind'] for d in docs),
                         ['ConfigMap', 'Deployment', 'NetworkPolicy', 'NetworkPolicy', 'PodDisruptionBudget',
                          'PodDisruptionBudget', 'Secret', 'Secret', 'Service', 'Service', 'ServiceAccount',
                          'StatefulSet'])
        c = container(one(docs, 'Deployment'))
        self.assertNotIn('env', c, 'no environment without LWS or KV events')
        self.assertEqual({p['name'] for p in c['ports']}, {'grpc', 'metrics', 'health', 'http'})
        self.assertEqual(set(parse_args(c['args'])) & KV_EVENTS_FLAGS, set())

    def lws_docs(self, files, sets):
        docs = render([a for f in files for a in ('-f', f)], *set_args(sets))
        return docs, values_with(files, *sets)

    def test_leader_worker_set(self):
        cases = [(VALUES_FILES['default'], ['lws.enabled=true']),
                 (VALUES_FILES['default'], ['replicas=3']),
                 (VALUES_FILES['cpu-demo'], ['replicas=2', 'tensorParallelSize=3']),
                 (VALUES_FILES['gpu-tp4+openai-gateway'], ['replicas=4', 'lws.exclusiveTopology=kubernetes.io/hostname',
                                                           'lws.rollingUpdate.maxSurge=1']),
                 (LWS_VALUES_FILES['cpu-demo+openai-gateway+many-replicas'], [])]
        for files, sets in cases:
            with self.subTest(files=files, sets=sets):
                docs, values = self.lws_docs(files, sets)
                # The same pods as the one-replica layout renders for the same values.
                single = render([a for f in files for a in ('-f', f)],
                                *set_args([x for x in sets if not x.startswith(('replicas=', 'lws.'))] +
                                          ['replicas=1', 'lws.enabled=false']))
                self.check_lws(docs, values, single)

    def check_lws(self, docs, values, single):
        replicas, tp = values['replicas'], values['tensorParallelSize']
        kinds = {d['kind'] for d in docs}
        self.assertNotIn('Deployment', kinds)
        self.assertNotIn('StatefulSet', kinds)
        lws = one(docs, 'LeaderWorkerSet')
        self.assertEqual(lws['apiVersion'], LWS_API)
        errors, cel = crd_schema.validate(lws, crd_schema.load(LWS_SCHEMA))
        self.assertEqual(errors, [])
        self.assertEqual(cel, [])
        name = lws['metadata']['name']
        self.assertEqual(name, 'rel-chunkattn-replica')
        spec = lws['spec']
        self.assertEqual(spec['replicas'], replicas)
        self.assertEqual(spec['startupPolicy'], 'LeaderCreated')  # LeaderReady never comes: see the template
        self.assertEqual(spec['networkConfig'], {'subdomainPolicy': 'Shared'})
        self.assertEqual(spec['rolloutStrategy']['type'], 'RollingUpdate')
        self.assertEqual(spec['rolloutStrategy']['rollingUpdateConfiguration'], values['lws']['rollingUpdate'])
        topology = values['lws']['exclusiveTopology']
        self.assertEqual(lws['metadata'].get('annotations', {}).get('leaderworkerset.sigs.k8s.io/exclusive-topology'),
                         topology or None)
        group = spec['leaderWorkerTemplate']
        self.assertEqual(group['size'], 1 + tp)
        self.assertEqual(group['restartPolicy'], 'RecreateGroupOnPodRestart')
        leader, worker = group['leaderTemplate'], group['workerTemplate']
        self.assertEqual(leader['metadata']['labels']['app.kubernetes.io/component'], 'coordinator')
        self.assertEqual(worker['metadata']['labels']['app.kubernetes.io/component'], 'worker')

        # The pods are the one-replica layout's: the workers' exactly, the coordinator's but for
        # --workers and the group index it is built from.
        deploy, sts = one(single, 'Deployment'), one(single, 'StatefulSet')
        self.assertEqual(worker, sts['spec']['template'])
        c, single_c = container({'spec': {'template': leader}}), container(deploy)
        args, single_args = parse_args(c['args']), parse_args(single_c['args'])
        self.assertEqual({k: v for k, v in args.items() if k != 'workers'},
                         {k: v for k, v in single_args.items() if k != 'workers'})
        self.assertLessEqual(set(args), self.coordinator_flags, 'flags the coordinator lacks')
        stripped = json.loads(json.dumps(leader))
        stripped_c = stripped['spec']['containers'][0]
        stripped_c['args'] = single_c['args']
        stripped_c['env'] = [e for e in stripped_c['env'] if e['name'] != 'CHUNKATTN_GROUP_INDEX']
        if not stripped_c['env']:
            del stripped_c['env']
        self.assertEqual(stripped, deploy['spec']['template'])

        # --workers: group g's ranks in order, by the names LWS gives them, on their port.
        env = env_of(c)
        self.assertEqual(env['CHUNKATTN_GROUP_INDEX']['valueFrom'],
                         {'fieldRef': {'fieldPath': "metadata.labels['%s']" % LWS_GROUP_INDEX}})
        worker_port = port_of(container({'spec': {'template': worker}}), 'grpc')
        for g in range(replicas):
            expanded = expand(args['workers'], {'CHUNKATTN_GROUP_INDEX': str(g)})
            self.assertNotIn('$(', expanded)
            pods = ['%s-%d-%d' % (name, g, i) for i in range(1, tp + 1)]  # LWS: <lws>-<group>-<index>
            expected = ['%s.%s.%s.svc.cluster.local:%d' % (pod, name, NAMESPACE, worker_port) for pod in pods]
            self.assertEqual(expanded.split(','), expected)
            # The same names from LWS's LWS_LEADER_ADDRESS (<lws>-g.<subdomain>.<namespace>).
            leader_address = '%s-%d.%s.%s' % (name, g, name, NAMESPACE)
            host, domain = leader_address.split('.', 1)
            self.assertEqual(expanded.split(','), ['%s-%d.%s.svc.cluster.local:%d' % (host, i, domain, worker_port)
                                                   for i in range(1, tp + 1)])
        # The names stay within Kubernetes' limits at the largest group index: the worker
        # StatefulSet <lws>-<g> (52, its pods' controller-revision-hash label), the pods (63).
        self.assertLessEqual(len('%s-%d' % (name, replicas - 1)), 52)

        # The Service and the budgets: coordinators (leaders) and workers apart.
        services = by_kind(docs, 'Service')
        self.assertEqual(len(services), 1, 'LWS makes the workers\' headless Service')
        self.assertNotEqual(services[0]['metadata']['name'], name, 'LWS would not make its headless Service')
        for g in range(replicas):
            leader_labels = lws_pod_labels(lws, leader, g, 0)
            worker_labels = lws_pod_labels(lws, worker, g, 1)
            self.assertTrue(labels_match(services[0]['spec']['selector'], leader_labels))
            self.assertFalse(labels_match(services[0]['spec']['selector'], worker_labels))
        pdbs = by_kind(docs, 'PodDisruptionBudget')
        self.assertEqual(len(pdbs), 2)
        for labels in (lws_pod_labels(lws, leader, 0, 0), lws_pod_labels(lws, worker, 0, 1)):
            self.assertEqual(len([p for p in pdbs if labels_match(p['spec']['selector']['matchLabels'], labels)]), 1)

        # NetworkPolicy: a group's workers admit their own coordinator (gRPC) and ranks (any
        # port), no other group's, and a group past `replicas` admits no one.
        policies = by_kind(docs, 'NetworkPolicy')
        for g in range(replicas + 1):
            target = lws_pod_labels(lws, worker, g, 1)
            for h in range(replicas):
                same = g == h
                self.assertEqual(admitted(policies, target, lws_pod_labels(lws, leader, h, 0), 'grpc'), same, (g, h))
                self.assertEqual(admitted(policies, target, lws_pod_labels(lws, worker, h, 2), 'grpc'), same, (g, h))
                self.assertFalse(admitted(policies, target, lws_pod_labels(lws, leader, h, 0), 'health'))
            self.assertFalse(admitted(policies, target, {'app': 'other'}, 'grpc'))
        coordinator = lws_pod_labels(lws, leader, 0, 0)
        self.assertEqual(admitted(policies, coordinator, {'app': 'other'}, 'grpc'),
                         not values['networkPolicy']['apiFrom'])

    def test_long_release_name_and_many_groups(self):
        r = helm('template', 'r' * 53, '.', '--set', 'replicas=1000')
        self.assertEqual(r.returncode, 0, r.stderr)
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        lws = one(docs, 'LeaderWorkerSet')
        name = lws['metadata']['name']
        self.assertLessEqual(len(name + '-999'), 52)
        self.assertLessEqual(len(name + '-999-%d' % lws['spec']['leaderWorkerTemplate']['size']), 63)
        for d in docs:
            self.assertLessEqual(len(d['metadata']['name']), 63, d['metadata']['name'])
        self.assertNotEqual(helm('template', RELEASE, '.', '--set', 'replicas=1001').returncode, 0)

    def test_pod_templates_match_the_core_schema(self):
        """Today's Deployment and StatefulSet pod templates, checked against the PodTemplateSpec
        schema that LWS's CRD embeds (the core API's, as of LWS v0.10.0)."""
        schema = crd_schema.load(LWS_SCHEMA)
        template_schema = dict(schema['definitions']['leaderTemplate'], definitions=schema['definitions'])
        for name, values in VALUES_SETS.items():
            docs = render(values)
            for workload in (one(docs, 'Deployment'), one(docs, 'StatefulSet')):
                errors, _ = crd_schema.validate(workload['spec']['template'], template_schema)
                self.assertEqual(errors, [], (name, workload['kind']))

    def test_kv_events(self):
        for sets in ([], ['replicas=2']):
            with self.subTest(sets=sets):
                docs, values = self.lws_docs([], sets + ['kvEvents.enabled=true'])
                workload = one(docs, 'LeaderWorkerSet' if sets else 'Deployment')
                template = (workload['spec']['leaderWorkerTemplate']['leaderTemplate'] if sets
                            else workload['spec']['template'])
                c = container({'spec': {'template': template}})
                args = parse_args(c['args'])
                self.assertLessEqual(KV_EVENTS_FLAGS, set(args))
                self.assertLessEqual(set(args), self.coordinator_flags, 'flags the coordinator lacks')
                self.assertEqual(args['kv_events_endpoint'], 'tcp://*:%d' % port_of(c, 'kv-events'))
                self.assertEqual(args['kv_events_replay_endpoint'], 'tcp://*:%d' % port_of(c, 'kv-replay'))
                self.assertEqual((port_of(c, 'kv-events'), port_of(c, 'kv-replay')), (5556, 5557))
                # llm-d's topic: kv@<pod IP>@<the model id clients send>.
                self.assertEqual(args['kv_events_topic'], 'kv@$(POD_IP)@%s' % args['served_model_name'])
                self.assertEqual(env_of(c)['POD_IP']['valueFrom'], {'fieldRef': {'fieldPath': 'status.podIP'}})
                self.assertEqual(expand(args['kv_events_topic'], {'POD_IP': '10.1.2.3'}), 'kv@10.1.2.3@demo')
                self.assertEqual(
                    (args['kv_events_format'], args['kv_events_buffer_steps'], args['kv_events_hash_seed']),
                    ('map', '10000', '0'))
                # Plaintext on every address: the coordinator's explicit consent, no CURVE.
                self.assertEqual(args['kv_events_allow_plaintext_remote'], 'true')
                self.assertEqual(set(args) & KV_CURVE_FLAGS, set())
                # The events are for routers: the Service does not carry them; the NetworkPolicy
                # opens them to apiFrom's peers (anyone by default).
                self.assertEqual({p['name'] for p in one(docs, 'Service', 'coordinator')['spec']['ports']},
                                 {'grpc', 'metrics', 'http'})
                policy = [p for p in by_kind(docs, 'NetworkPolicy')
                          if labels_match(p['spec']['podSelector']['matchLabels'], template['metadata']['labels'])]
                self.assertEqual(len(policy), 1)
                rules = [r for r in policy[0]['spec']['ingress'] if 'kv-events' in {p['port'] for p in r['ports']}]
                self.assertEqual(len(rules), 1)
                self.assertEqual({p['port'] for p in rules[0]['ports']}, {'kv-events', 'kv-replay'})
                self.assertNotIn('from', rules[0])
        # Other values; numbers never in float notation; the peers.
        gateway = {'namespaceSelector': {'matchLabels': {'kubernetes.io/metadata.name': 'gateway'}}}
        epp = {'podSelector': {'matchLabels': {'app': 'epp'}}}
        for seed_set, seed in ((['--set', 'kvEvents.hashSeed=4294967295'], '4294967295'),
                               (['--set-string', 'kvEvents.hashSeed=0'], '0'),
                               (['--set', 'kvEvents.hashSeed=abc-1'], 'abc-1')):
            docs = render(['-f', 'ci/gpu-tp4-values.yaml'], '--set', 'kvEvents.enabled=true',
                          '--set', 'kvEvents.port=6000', '--set', 'kvEvents.replayPort=6001',
                          '--set', 'kvEvents.format=array', '--set', 'kvEvents.bufferSteps=1000000',
                          '--set', 'http.servedModelName=meta-llama/Llama-3.1-8B', *seed_set)
            c = container(one(docs, 'Deployment'))
            args = parse_args(c['args'])
            self.assertEqual((args['kv_events_endpoint'], args['kv_events_replay_endpoint']),
                             ('tcp://*:6000', 'tcp://*:6001'))
            self.assertEqual((port_of(c, 'kv-events'), port_of(c, 'kv-replay')), (6000, 6001))
            self.assertEqual((args['kv_events_format'], args['kv_events_buffer_steps'], args['kv_events_hash_seed']),
                             ('array', '1000000', seed))
            self.assertEqual(args['kv_events_topic'], 'kv@$(POD_IP)@meta-llama/Llama-3.1-8B')
            rule = [r for r in one(docs, 'NetworkPolicy', 'coordinator')['spec']['ingress']
                    if 'kv-events' in {p['port'] for p in r['ports']}][0]
            self.assertEqual(rule['from'], [gateway])  # apiFrom's
        docs = render(['-f', 'ci/gpu-tp4-values.yaml'], '--set', 'kvEvents.enabled=true',
                      '--set-json', 'networkPolicy.kvEventsFrom=[%s]' % json.dumps(epp))
        rule = [r for r in one(docs, 'NetworkPolicy', 'coordinator')['spec']['ingress']
                if 'kv-events' in {p['port'] for p in r['ports']}][0]
        self.assertEqual(rule['from'], [epp])
        # Ports the coordinator already listens on are refused.
        for clash in (['kvEvents.port=8000'], ['kvEvents.replayPort=50051'], ['kvEvents.port=9400'],
                      ['kvEvents.replayPort=5556']):
            r = helm('template', RELEASE, '.', '--set', 'kvEvents.enabled=true', *set_args(clash))
            self.assertNotEqual(r.returncode, 0, clash)
            self.assertIn('kvEvents.port and kvEvents.replayPort must differ', r.stderr, clash)
        r = helm('template', RELEASE, '.', '--set', 'kvEvents.enabled=true', '--set', 'http.enabled=false',
                 '--set', 'kvEvents.port=8000')
        self.assertEqual(r.returncode, 0, r.stderr)  # 8000 is free with the HTTP API off

    def test_kv_events_curve(self):
        """kvEvents.curve: the secret key from a Secret (the chart's, or an existing one), the
        admitted routers' keys from a ConfigMap, both mounted where the flags point; no
        plaintext consent. Refused without a key, with a malformed one, and beside the
        endpoint picker's configuration (which has no CURVE keys)."""
        curve = {'enabled': True, 'secretKey': CURVE_SERVER_SECRET, 'allowedClientKeys': [CURVE_CLIENT_PUBLIC]}
        for sets, json_sets in (([], curve), (['replicas=2'], curve),
                                ([], {'enabled': True, 'existingSecret': 'my-curve'})):
            with self.subTest(sets=sets, curve=json_sets):
                values = values_with([], *(sets + ['kvEvents.enabled=true']))
                values['kvEvents']['curve'] = dict(values['kvEvents']['curve'], **json_sets)
                docs = render([], *set_args(sets + ['kvEvents.enabled=true']),
                              '--set-json', 'kvEvents.curve=%s' % json.dumps(values['kvEvents']['curve']))
                workload = one(docs, 'LeaderWorkerSet' if sets else 'Deployment')
                template = (workload['spec']['leaderWorkerTemplate']['leaderTemplate'] if sets
                            else workload['spec']['template'])
                c = container({'spec': {'template': template}})
                args = parse_args(c['args'])
                self.assertLessEqual(set(args), self.coordinator_flags, 'flags the coordinator lacks')
                self.assertNotIn('kv_events_allow_plaintext_remote', args)
                self.assertEqual(args['kv_events_endpoint'], 'tcp://*:%d' % port_of(c, 'kv-events'))
                secret = mounted_file(docs, template, c, args['kv_events_curve_secret_key_file'])
                if 'existingSecret' in json_sets:
                    self.assertIsNone(secret)  # the user's Secret, not rendered
                    volume = [v for v in template['spec']['volumes'] if v['name'] == 'kv-events-curve'][0]
                    self.assertEqual(volume['secret']['secretName'], 'my-curve')
                    self.assertNotIn('kv_events_curve_client_keys_file', args)
                    continue
                self.assertEqual(secret, CURVE_SERVER_SECRET)
                clients = mounted_file(docs, template, c, args['kv_events_curve_client_keys_file'])
                self.assertEqual(clients.split(), [CURVE_CLIENT_PUBLIC])
        # Without client keys: any client with the public key; no ConfigMap, no flag.
        docs = render([], '--set', 'kvEvents.enabled=true', '--set-json',
                      'kvEvents.curve=%s' % json.dumps({'enabled': True, 'secretKey': CURVE_SERVER_SECRET}))
        args = parse_args(container(one(docs, 'Deployment'))['args'])
        self.assertIn('kv_events_curve_secret_key_file', args)
        self.assertNotIn('kv_events_curve_client_keys_file', args)
        self.assertEqual([d for d in by_kind(docs, 'ConfigMap') if d['metadata']['name'].endswith('-kv-events-clients')],
                         [])
        for extra, message in (
                ({'enabled': True}, 'kvEvents.curve.secretKey (or kvEvents.curve.existingSecret) is required'),
                ({'enabled': True, 'secretKey': 'short'}, 'kvEvents.curve.secretKey'),
                ({'enabled': True, 'secretKey': CURVE_SERVER_SECRET, 'allowedClientKeys': ['x']},
                 'kvEvents.curve.allowedClientKeys'),
        ):
            r = helm('template', RELEASE, '.', '--set', 'kvEvents.enabled=true',
                     '--set-json', 'kvEvents.curve=%s' % json.dumps(extra))
            self.assertNotEqual(r.returncode, 0, extra)
            self.assertIn(message, r.stderr, extra)
        r = helm('template', RELEASE, '.', *VALUES_SETS['cpu-demo+openai-gateway'], '--set', 'kvEvents.enabled=true',
                 '--set', 'inferencePool.endpointPicker.precisePrefix.enabled=true',
                 '--set-json', 'kvEvents.curve=%s' % json.dumps(curve))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('the endpoint picker configuration this chart renders', r.stderr)

    def check_pool_cel(self, pool):
        """The CRDs' CEL rules: a Service reference has a port; target ports are unique."""
        ref = pool['spec']['endpointPickerRef']
        self.assertTrue(ref.get('kind', 'Service') != 'Service' or 'port' in ref)
        numbers = [p['number'] for p in pool['spec']['targetPorts']]
        self.assertEqual(len(numbers), len(set(numbers)))

    def test_inference_pool_selects_the_coordinators(self):
        for files, sets in ((VALUES_FILES['gpu-tp4+openai-gateway'], ['replicas=3']),
                            (VALUES_FILES['cpu-demo+openai-gateway'],
                             ['lws.enabled=true', 'inferencePool.matchLabels.pool=llama',
                              'coordinator.podLabels.pool=llama', 'worker.podLabels.pool=llama']),
                            (LWS_VALUES_FILES['gpu-tp4+openai-gateway+many-replicas'], [])):
            with self.subTest(files=files, sets=sets):
                docs, values = self.lws_docs(files, sets)
                pool, lws = one(docs, 'InferencePool'), one(docs, 'LeaderWorkerSet')
                for name in POOL_SCHEMAS:  # valid in v1.0 and in the newest
                    errors, cel = crd_schema.validate(pool, crd_schema.load(name))
                    self.assertEqual(errors, [], name)
                    self.assertLessEqual({rule for _, rule in cel}, POOL_CEL_RULES, name)
                self.check_pool_cel(pool)
                self.assertEqual(pool['metadata']['name'], 'rel-chunkattn')
                match = pool['spec']['selector']['matchLabels']
                group = lws['spec']['leaderWorkerTemplate']
                for g in range(values['replicas']):
                    self.assertTrue(labels_match(match, lws_pod_labels(lws, group['leaderTemplate'], g, 0)))
                    for i in range(1, values['tensorParallelSize'] + 1):
                        self.assertFalse(labels_match(match, lws_pod_labels(lws, group['workerTemplate'], g, i)))
                leader = container({'spec': {'template': group['leaderTemplate']}})
                self.assertEqual(pool['spec']['targetPorts'], [{'number': port_of(leader, 'http')}])

    def epp_config(self, docs):
        cm = [d for d in by_kind(docs, 'ConfigMap') if d['metadata']['name'] == 'rel-chunkattn-epp-config']
        self.assertEqual(len(cm), 1)
        self.assertEqual(set(cm[0]['data']), {'epp-config.yaml'})
        return yaml.safe_load(cm[0]['data']['epp-config.yaml'])

    def test_endpoint_picker_config(self):
        """llm-d's EndpointPickerConfig (llm-d-router v0.10, deploy/config/
        epp-precise-prefix-cache-config.yaml's shape): blocks of the coordinator's chunk size,
        the KV-events ports the coordinators listen on, every referenced plugin declared."""
        precise = ['inferencePool.endpointPicker.precisePrefix.enabled=true', 'kvEvents.enabled=true']
        self.assertEqual([d for d in render(VALUES_SETS['cpu-demo+openai-gateway'], *set_args(precise[1:]))
                          if d['metadata']['name'].endswith('-epp-config')], [])
        for files, sets, chunk, scheme in (
                (VALUES_FILES['cpu-demo+openai-gateway'], precise, 64, 'http'),
                (VALUES_FILES['gpu-tp4+openai-gateway'], precise + ['replicas=2', 'cache.chunkSize=128',
                                                                   'kvEvents.port=7000', 'kvEvents.replayPort=7001'],
                 128, 'https'),
                (LWS_VALUES_FILES['cpu-demo+openai-gateway+many-replicas'], [], 64, 'http')):
            with self.subTest(files=files, sets=sets):
                docs, values = self.lws_docs(files, sets)
                config = self.epp_config(docs)
                self.assertEqual((config['apiVersion'], config['kind']), ('llm-d.ai/v1alpha1', 'EndpointPickerConfig'))
                plugins = {p.get('name', p['type']): p for p in config['plugins']}
                self.assertEqual(len(plugins), len(config['plugins']), 'plugin names are unique')
                refs = [r['pluginRef'] for profile in config['schedulingProfiles'] for r in profile['plugins']]
                refs += [x for source in config['dataLayer']['sources']
                         for x in [source['pluginRef']] + [e['pluginRef'] for e in source.get('extractors', [])]]
                self.assertLessEqual(set(refs), set(plugins))
                weighted = {r['pluginRef']: r.get('weight') for r in config['schedulingProfiles'][0]['plugins']}
                self.assertEqual(set(weighted), {'prefix-cache-scorer', 'kv-cache-utilization-scorer', 'queue-scorer',
                                                 'max-score-picker'})
                self.assertGreater(weighted['prefix-cache-scorer'], weighted['queue-scorer'])
                self.assertEqual(plugins['prefix-cache-scorer']['parameters'],
                                 {'prefixMatchInfoProducerName': 'precise-prefix-cache-producer'})
                workload = one(docs, 'LeaderWorkerSet' if 'LeaderWorkerSet' in {d['kind'] for d in docs}
                               else 'Deployment')
                template = (workload['spec']['leaderWorkerTemplate']['leaderTemplate']
                            if workload['kind'] == 'LeaderWorkerSet' else workload['spec']['template'])
                c = container({'spec': {'template': template}})
                args = parse_args(c['args'])
                producer = plugins['precise-prefix-cache-producer']['parameters']
                self.assertEqual(producer['tokenProcessorConfig']['blockSizeTokens'], int(args['chunk_size']))
                self.assertEqual(int(args['chunk_size']), chunk)
                self.assertEqual(producer['tokenProcessorConfig']['hashSeed'], args['kv_events_hash_seed'])
                events = producer['kvEventsConfig']
                self.assertEqual((events['engineType'], events['topicFilter'], events['discoverPods']),
                                 ('vllm', 'kv@', True))
                self.assertTrue(args['kv_events_topic'].startswith(events['topicFilter']))
                self.assertEqual(events['podDiscoveryConfig'], {'socketPort': port_of(c, 'kv-events'),
                                                                'replaySocketPort': port_of(c, 'kv-replay')})
                self.assertEqual(args['kv_events_endpoint'], 'tcp://*:%d' % events['podDiscoveryConfig']['socketPort'])
                token = plugins['token-producer']['parameters']
                self.assertEqual(token, {'modelName': args['served_model_name'],
                                         'vllm': {'url': 'http://localhost:8000'}})
                self.assertEqual(plugins['metrics-data-source']['parameters'], {'scheme': scheme, 'path': '/metrics'})
                self.assertEqual(scheme == 'https', values['tls']['enabled'])
        docs = render(VALUES_SETS['cpu-demo+openai-gateway'], *set_args(precise + [
            'inferencePool.endpointPicker.precisePrefix.renderUrl=http://render.models.svc:8000',
            'inferencePool.endpointPicker.precisePrefix.renderModelName=meta-llama/Meta-Llama-3-8B-Instruct']))
        self.assertEqual(self.epp_config(docs)['plugins'][0]['parameters'],
                         {'modelName': 'meta-llama/Meta-Llama-3-8B-Instruct',
                          'vllm': {'url': 'http://render.models.svc:8000'}})
        # What cannot work is refused, saying why.
        for sets, message in ((precise[:1], 'needs kvEvents.enabled'),
                              (precise + ['http.enabled=false'], 'needs http.enabled'),
                              (precise + ['metrics.auth.existingSecret=mt'], 'metrics.auth.existingSecret')):
            r = helm('template', RELEASE, '.', *set_args(sets))
            self.assertNotEqual(r.returncode, 0, sets)
            self.assertIn(message, r.stderr, sets)

    def test_schema_rejects_wrong_values(self):
        cases = [
            ('--set', 'replicas=0', 'replicas'),
            ('--set', 'replicas=1001', 'replicas'),
            ('--set-string', 'replicas=two', 'replicas'),
            ('--set-string', 'lws.enabled=yes', 'enabled'),
            ('--set', 'lws.size=3', 'size'),  # a typo (or LWS's own field) is not taken
            ('--set', 'lws.exclusiveTopology=not a key', 'exclusiveTopology'),
            ('--set', 'lws.rollingUpdate.maxUnavailable=-1', 'maxUnavailable'),
            ('--set', 'lws.rollingUpdate.maxSurge=150%', 'maxSurge'),
            ('--set', 'replicas=2,lws.rollingUpdate.maxUnavailable=0', 'both be 0'),
            ('--set-string', 'kvEvents.enabled=yes', 'enabled'),
            ('--set', 'kvEvents.format=json', 'format'),
            ('--set', 'kvEvents.port=0', 'port'),
            ('--set', 'kvEvents.replayPort=65536', 'replayPort'),
            ('--set', 'kvEvents.bufferSteps=0', 'bufferSteps'),
            ('--set', 'kvEvents.bufferSteps=1000001', 'bufferSteps'),
            ('--set', 'kvEvents.hashSeed=a b', 'hashSeed'),
            ('--set', 'kvEvents.hashSeed=-1', 'hashSeed'),
            ('--set', 'kvEvents.hashSeed=true', 'hashSeed'),
            ('--set', 'kvEvents.topic=x', 'topic'),  # the chart makes the topic
            ('--set-string', 'inferencePool.endpointPicker.precisePrefix.enabled=yes', 'enabled'),
            ('--set', 'inferencePool.endpointPicker.precisePrefix.renderUrl=https://render:8000', 'renderUrl'),
            ('--set', 'inferencePool.endpointPicker.precisePrefix.renderUrl=http://render:8000/', 'renderUrl'),
            ('--set', 'inferencePool.endpointPicker.precisePrefix.renderModelName=a b', 'renderModelName'),
            ('--set', 'inferencePool.endpointPicker.precisePrefix.blockSize=16', 'blockSize'),
            ('--set', 'networkPolicy.kvEventsFrom=all', 'kvEventsFrom'),
        ]
        for flag, value, field in cases:
            r = helm('template', RELEASE, '.', flag, value)
            self.assertNotEqual(r.returncode, 0, value)
            self.assertIn(field, r.stderr, value)

    def test_notes(self):
        helm('version')  # installs helm when needed
        # LintAndTemplateTest's NOTES rendering (it needs only a TestCase).
        notes = LintAndTemplateTest.render_notes(self, '--set', 'replicas=3', '--set', 'kvEvents.enabled=true')
        self.assertIn('leaderworkerset/rel-chunkattn-replica, 3 group(s)', notes)
        self.assertIn('wait --for=condition=Available leaderworkerset/rel-chunkattn-replica', notes)
        self.assertIn('KV events :5556/:5557', notes)
        self.assertNotIn('statefulset/', notes)
        notes = LintAndTemplateTest.render_notes(self, *VALUES_SETS['cpu-demo+openai-gateway'],
                                                 '-f', MANY_REPLICAS_EXAMPLE)
        self.assertIn('ConfigMap rel-chunkattn-epp-config (key epp-config.yaml)', notes)

class RenderedCommandLinesRunTest(harness.ServiceTestCase):
    """The CPU demo values' rendered command lines, started for real: only what
    a cluster provides differs (ports, the pod IP, DNS names, the model path)."""

    def test_rendered_kv_events_flags_publish(self):
        """kvEvents.enabled's rendered flags on a real coordinator: the kubelet's
        $(POD_IP) substituted and the bind-all TCP ports swapped for ipc://
        sockets in a temporary folder (loopback only), everything else as
        rendered; a consumer written from vLLM's format hears the topic the
        chart made and a request's blocks."""
        docs = render(VALUES_SETS['cpu-demo'], '--set', 'kvEvents.enabled=true', '--set', 'kvEvents.hashSeed=7')
        cluster, folder, consumer = self.start_rendered_kv(docs, 'rendered-kv')
        self.assertEqual(consumer.curve, None)
        self.check_rendered_kv(cluster, consumer)

    def test_rendered_kv_events_curve(self):
        """kvEvents.curve's rendered flags, the mounted files holding what the rendered Secret
        and ConfigMap hold: a consumer with the admitted key hears the events, a plaintext one
        nothing."""
        import kv_events_consumer as kv  # noqa: E402 (tests/services, on the path)
        docs = render(VALUES_SETS['cpu-demo'], '--set', 'kvEvents.enabled=true', '--set', 'kvEvents.hashSeed=7',
                      '--set-json', 'kvEvents.curve=%s' % json.dumps(
                          {'enabled': True, 'secretKey': CURVE_SERVER_SECRET,
                           'allowedClientKeys': [CURVE_CLIENT_PUBLIC]}))
        cluster, folder, consumer = self.start_rendered_kv(
            docs, 'rendered-kv-curve', curve=(CURVE_SERVER_PUBLIC, CURVE_CLIENT_PUBLIC, CURVE_CLIENT_SECRET))
        plaintext = kv.KvEventConsumer('ipc://%s/pub' % folder, 'ipc://%s/replay' % folder,
                                       hash_seed='7', block_size=64).start()
        self.addCleanup(plaintext.stop)
        self.check_rendered_kv(cluster, consumer)
        self.assertEqual((plaintext.last_seq, plaintext.last_topic), (-1, None))

    def start_rendered_kv(self, docs, name, curve=None):
        """A cluster whose coordinator runs the rendered KV-event flags, and a consumer."""
        import kv_events_consumer as kv  # noqa: E402 (tests/services, on the path)
        workload = one(docs, 'Deployment')
        coordinator = container(workload)
        flags = {k: v for k, v in parse_args(coordinator['args']).items() if k.startswith('kv_events')}
        self.assertEqual(flags['kv_events_endpoint'], 'tcp://*:5556')
        self.assertEqual(flags['kv_events_replay_endpoint'], 'tcp://*:5557')
        self.assertEqual(flags['kv_events_topic'], 'kv@$(POD_IP)@demo')
        env = {e['name']: e for e in coordinator['env']}
        self.assertEqual(env['POD_IP']['valueFrom']['fieldRef']['fieldPath'], 'status.podIP')
        folder = harness.temp_dir('chunkattn-rendered-kv-', self.addCleanup)
        flags['kv_events_endpoint'] = 'ipc://%s/pub' % folder
        flags['kv_events_replay_endpoint'] = 'ipc://%s/replay' % folder
        flags['kv_events_topic'] = flags['kv_events_topic'].replace('$(POD_IP)', '10.1.2.3')
        for flag in sorted(KV_CURVE_FLAGS & set(flags)):  # the mounted files, with what they hold
            text = mounted_file(docs, workload['spec']['template'], coordinator, flags[flag])
            flags[flag] = os.path.join(folder, flag)
            with open(flags[flag], 'w') as f:
                f.write(text)
        cluster = harness.Cluster(name, tp=1,
                                  coordinator_args=['--%s=%s' % kv_flag for kv_flag in sorted(flags.items())])
        type(self).clusters = type(self).clusters + [cluster]
        cluster.start()
        consumer = kv.KvEventConsumer('ipc://%s/pub' % folder, 'ipc://%s/replay' % folder,
                                      hash_seed='7', block_size=64, curve=curve).start()
        self.addCleanup(consumer.stop)
        return cluster, folder, consumer

    def check_rendered_kv(self, cluster, consumer):
        # A batch published before the subscription took hold comes by replay, which
        # does not set last_topic: a few requests make sure one arrives live.
        rng = __import__('random').Random(5)
        for i in range(5):
            prompt = harness.random_ids(rng, 2 * 64 + 3)
            cluster.generate(harness.make_request(prompt_ids=prompt, temperature=0.0, max_new_tokens=2,
                                                  ignore_eos=True))
            nxt = cluster.stub.GetKvBlocks(harness.pb.GetKvBlocksRequest(), timeout=30).next_sequence_number
            self.assertTrue(consumer.wait_for_seq(nxt - 1, 30), consumer.stats())
            self.assertEqual(consumer.errors, [])
            self.assertEqual(sum(consumer.blocks().get('', {}).values()), 2 * (i + 1))
            if consumer.last_topic is not None:
                break
        self.assertEqual(consumer.last_topic, 'kv@10.1.2.3@demo')

    def test_rendered_args_serve(self):
        docs = render(VALUES_SETS['cpu-demo'])
        coordinator = container(one(docs, 'Deployment'))
        worker = container(one(docs, 'StatefulSet'))
        tp = one(docs, 'StatefulSet')['spec']['replicas']
        cluster = harness.Cluster('rendered', tp=tp)
        type(self).clusters = type(self).clusters + [cluster]
        cluster.worker_ports = [harness.free_port() for _ in range(tp)]
        cluster.port, cluster.metrics_port = harness.free_port(), harness.free_port()
        health_port, http_port = harness.free_port(), harness.free_port()

        def local(args, replace):
            out = []
            for a in args:
                name = parse_args([a]).popitem()[0]
                out.append(replace.get(name, a))
            return out

        tmp = tempfile.TemporaryDirectory(prefix='chunkattn-rendered-')
        self.addCleanup(tmp.cleanup)
        token_file = os.path.join(tmp.name, 'token')
        with open(token_file, 'w') as f:
            f.write('rendered-secret\n')
        # A PKI of the test's own stands in for the chart's certificate Secret: a certificate
        # for the same name (the rendered --worker_tls_server_name is kept).
        _, pki = make_pki(self.addCleanup)
        worker_health_ports = [harness.free_port() for _ in range(tp)]
        self.assertIn('tls_client_ca_file', parse_args(worker['args']))
        for i in range(tp):
            argv = [harness.bin_path('chunkattn-worker')] + local(worker['args'], {
                'listen': '--listen=127.0.0.1:%d' % cluster.worker_ports[i],
                'health_port': '--health_port=%d' % worker_health_ports[i],
                'collective_host': '--collective_host=127.0.0.1',
                'model_root': '--model_root=' + harness.model_dir(),
                'worker_token_file': '--worker_token_file=' + token_file,
                'tls_cert_file': '--tls_cert_file=' + pki['worker.pem'],
                'tls_key_file': '--tls_key_file=' + pki['worker.key'],
                'tls_client_ca_file': '--tls_client_ca_file=' + pki['ca.pem'],
            })
            cluster.workers[i] = harness.Process('rendered-worker%d' % i, argv).start()
        argv = [harness.bin_path('chunkattn-coordinator')] + local(coordinator['args'], {
            'listen': '--listen=127.0.0.1:%d' % cluster.port,
            'health_port': '--health_port=%d' % health_port,
            'metrics_host': '--metrics_host=127.0.0.1',
            'metrics_port': '--metrics_port=%d' % cluster.metrics_port,
            'workers': '--workers=' + ','.join('127.0.0.1:%d' % p for p in cluster.worker_ports),
            'model': '--model=' + harness.model_dir(),
            'worker_token_file': '--worker_token_file=' + token_file,
            'worker_tls_ca_file': '--worker_tls_ca_file=' + pki['ca.pem'],
            'worker_tls_cert_file': '--worker_tls_cert_file=' + pki['worker.pem'],
            'worker_tls_key_file': '--worker_tls_key_file=' + pki['worker.key'],
            'http_host': '--http_host=127.0.0.1',
            'http_port': '--http_port=%d' % http_port,
        })
        cluster.coordinator = harness.Process('rendered-coordinator', argv).start()
        cluster.channel = cluster.open_channel()
        cluster.stub = harness.pb_grpc.GenerationStub(cluster.channel)
        probe = harness.grpc.insecure_channel('127.0.0.1:%d' % health_port)
        try:
            harness.wait_for(lambda: harness.health(probe) == harness.SERVING,
                             harness.STARTUP_TIMEOUT_S, what='readiness on the rendered health port')
            self.assertEqual(harness.health(probe, service='liveness'), harness.SERVING)
        finally:
            probe.close()
        for port in worker_health_ports:  # the workers' probes, in plaintext
            worker_probe = harness.grpc.insecure_channel('127.0.0.1:%d' % port)
            try:
                self.assertEqual(harness.health(worker_probe), harness.SERVING)
                self.assertEqual(harness.health(worker_probe, service='liveness'), harness.SERVING)
            finally:
                worker_probe.close()
        # The HTTP API on the rendered flags: the readiness probe's request turns 200, the
        # served model id is listed, and /metrics there carries the gauges an InferencePool's
        # endpoint picker reads.
        probe = coordinator['readinessProbe']['httpGet']
        self.assertEqual(probe['scheme'], 'HTTP')
        harness.wait_for(lambda: http_get(http_port, probe['path'])[0] == 200, harness.STARTUP_TIMEOUT_S,
                         what='GET %s on the rendered HTTP port' % probe['path'])
        status, body = http_get(http_port, '/v1/models')
        self.assertEqual(status, 200, body)
        self.assertIn(parse_args(coordinator['args'])['served_model_name'],
                      [m['id'] for m in json.loads(body)['data']])
        status, body = http_get(http_port, '/metrics')
        self.assertEqual(status, 200, body[:200])
        exported = {line.split('{')[0].split(' ')[0] for line in body.splitlines() if not line.startswith('#')}
        for gauge in ('vllm:num_requests_waiting', 'vllm:num_requests_running', 'vllm:kv_cache_usage_perc',
                      'vllm:cache_config_info'):
            self.assertIn(gauge, exported)
        info = cluster.model_info()
        self.assertEqual(info.tensor_parallel_size, tp)
        self.assertEqual(info.chunk_size, 64)
        samples = cluster.generate(harness.make_request(text='Hello', max_new_tokens=4, ignore_eos=True))
        self.assertEqual(samples[0].completion_tokens, 4)
        self.assertIn('chunkattn_workers_ready 1', harness.scrape_text(cluster.metrics_port))


if __name__ == '__main__':
    harness.main()
