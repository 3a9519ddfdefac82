"""Integration-test harness: real chunkattn workers and coordinators on 127.0.0.1.

A test module imports this, subclasses ServiceTestCase and ends with
`harness.main()`, which takes `--build DIR --source DIR` (defaults: this
checkout and its build/), generates the Python gRPC stubs from
proto/chunkattn/v1/generation.proto into a temporary folder, and runs
unittest with the remaining arguments (e.g. a test class name).

Every process started here is killed when the test process exits, however it
exits: atexit, SIGTERM, and PR_SET_PDEATHSIG for a SIGKILLed test. Every wait
is bounded. A failing test prints the tail of each process's log.

Temporary folders come from temp_dir(): each is removed by the test (class)
that made it, through addCleanup / addClassCleanup, and whatever is left,
with the processes' logs, when the test process exits (atexit and SIGTERM),
also after a failure. CHUNKATTN_KEEP_TEST_LOGS=1 keeps the logs' folder.
"""

import argparse
import atexit
import ctypes
import dataclasses
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import uuid

# Before gRPC is loaded: without this, a fork (subprocess.Popen with the
# harness's preexec_fn) soon after a call can hang for good in gRPC core's
# fork handlers, which join an executor thread that waits for the GIL the
# forking thread holds (seen here: a GetKvBlocks, then starting a process).
# The children exec at once and never use gRPC, so they need no fork support.
# (Effective when the harness is imported before grpc; ctest also sets it.)
os.environ.setdefault('GRPC_ENABLE_FORK_SUPPORT', 'false')

import grpc  # noqa: E402

# Set by main().
BUILD = None
SOURCE = None
pb = None        # chunkattn.v1.generation_pb2
pb_grpc = None   # chunkattn.v1.generation_pb2_grpc
wpb = None       # chunkattn.internal.v1.worker_pb2 (the worker's port, as an attacker sees it)
wpb_grpc = None

_live_processes = []
_temp_dirs = []  # removed at exit, also on SIGTERM
_live_lock = threading.RLock()  # re-entered by the SIGTERM handler
_log_dir = None
_log_dir_done = False  # removed (or reported kept) at exit
_cleanup_pid = os.getpid()  # a forked child must not remove its parent's folders

STARTUP_TIMEOUT_S = 120
RPC_TIMEOUT_S = 120


def log_dir():
    global _log_dir
    if _log_dir is None:
        _log_dir = tempfile.mkdtemp(prefix='chunkattn-services-')
    return _log_dir


def keep_logs():
    return os.environ.get('CHUNKATTN_KEEP_TEST_LOGS', '') not in ('', '0')


def temp_dir(prefix, add_cleanup=None):
    """A new folder under $TMPDIR. add_cleanup (a test's addCleanup, or a
    class's addClassCleanup in setUpClass) removes it when that test or class
    is done, passed or failed; it is removed at exit in any case."""
    folder = tempfile.mkdtemp(prefix=prefix)
    with _live_lock:
        _temp_dirs.append(folder)
    if add_cleanup is not None:
        add_cleanup(remove_temp_dir, folder)
    return folder


def token_file(text, prefix='chunkattn-tokens-', add_cleanup=None):
    """A bearer-token file (--auth_token_file) holding `text`, in a new
    temp_dir(prefix, add_cleanup); its path."""
    path = os.path.join(temp_dir(prefix, add_cleanup), 'tokens')
    with open(path, 'w') as f:
        f.write(text)
    return path


def remove_temp_dir(folder):
    shutil.rmtree(folder, ignore_errors=True)
    with _live_lock:
        if folder in _temp_dirs:
            _temp_dirs.remove(folder)


def bin_path(name):
    return os.path.join(BUILD, 'bin', name)


def model_dir():
    return os.path.join(BUILD, 'demo-model')


def free_port():
    """A port that was free a moment ago (the caller accepts the race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def port_open(port, timeout=0.5):
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=timeout):
            return True
    except OSError:
        return False


def compile_protos(source, protos, prefix, packages=()):
    """Compiles `protos` (paths under SOURCE/proto) into a new temporary
    folder put first on sys.path, and returns it; each of `packages` (folders
    in it) gets an __init__.py, so that an installed package of that name
    cannot shadow the generated one."""
    out = temp_dir(prefix)
    proto_dir = os.path.join(source, 'proto')
    targets = [os.path.join(proto_dir, p) for p in protos]
    # The protos use proto3 `optional`, which needs protoc >= 3.12: Debian
    # 12's python3-grpc-tools bundles protoc 3.5, so its protoc
    # (protobuf-compiler, 3.21, the Python runtime's version) with the gRPC
    # plugin (protobuf-compiler-grpc) comes first when both are installed.
    protoc, plugin = shutil.which('protoc'), shutil.which('grpc_python_plugin')
    if protoc and plugin:
        cmd = [protoc, '--plugin=protoc-gen-grpc_python=' + plugin, '-I', proto_dir,
               '--python_out=' + out, '--grpc_python_out=' + out] + targets
    else:
        cmd = [sys.executable, '-m', 'grpc_tools.protoc', '-I', proto_dir,
               '--python_out=' + out, '--grpc_python_out=' + out] + targets
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError('generating the Python stubs failed: %s\n%s' % (' '.join(cmd), r.stderr))
    for pkg in packages:
        open(os.path.join(out, pkg, '__init__.py'), 'a').close()
    sys.path.insert(0, out)
    return out


def generate_stubs(source):
    """Compiles generation.proto and worker.proto into a temporary folder put
    on sys.path."""
    global pb, pb_grpc, wpb, wpb_grpc
    out = compile_protos(source, ['chunkattn/v1/generation.proto', 'chunkattn/internal/v1/worker.proto'],
                         'chunkattn-stubs-')
    from chunkattn.v1 import generation_pb2, generation_pb2_grpc  # noqa: E402
    from chunkattn.internal.v1 import worker_pb2, worker_pb2_grpc  # noqa: E402
    pb, pb_grpc = generation_pb2, generation_pb2_grpc
    wpb, wpb_grpc = worker_pb2, worker_pb2_grpc
    return out


# --- processes -------------------------------------------------------------

def _die_with_parent():
    # PR_SET_PDEATHSIG = 1: SIGKILL the child when the thread that forked it
    # exits, so a test killed by ctest leaves nothing behind. (Processes are
    # therefore started from the main thread only.)
    try:
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


class Process:
    """One server process with its log file."""

    def __init__(self, name, argv):
        self.name = name
        self.argv = argv
        self.log_path = os.path.join(log_dir(), name + '.log')
        self.proc = None

    def start(self):
        with open(self.log_path, 'ab') as log:
            log.write(('\n=== start: %s\n' % ' '.join(self.argv)).encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        with _live_lock:
            _live_processes.append(self)
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def returncode(self):
        return None if self.proc is None else self.proc.poll()

    def kill(self):
        """SIGKILL, and wait for it to be gone."""
        if self.alive():
            self.proc.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL after `timeout` seconds."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        with _live_lock:
            if self in _live_processes:
                _live_processes.remove(self)

    def log_tail(self, max_lines=60):
        try:
            with open(self.log_path, 'rb') as f:
                lines = f.read().decode('utf-8', 'replace').splitlines()
        except OSError:
            return '(no log)'
        return '\n'.join(lines[-max_lines:])


def _kill_all():
    with _live_lock:
        procs = list(_live_processes)
    for p in procs:
        if p.alive():
            try:
                p.proc.kill()
                p.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 (best effort at exit)
                pass


def _remove_temp_dirs():
    """Removes every folder temp_dir() made that is still there, and the
    logs' folder (unless CHUNKATTN_KEEP_TEST_LOGS is set)."""
    if os.getpid() != _cleanup_pid:
        return
    with _live_lock:
        folders = list(_temp_dirs)
        _temp_dirs.clear()
    for d in folders:
        shutil.rmtree(d, ignore_errors=True)
    global _log_dir_done
    if _log_dir is not None and not _log_dir_done:
        _log_dir_done = True
        if keep_logs():
            sys.stderr.write('logs kept in %s\n' % _log_dir)
        else:
            shutil.rmtree(_log_dir, ignore_errors=True)


def _cleanup():
    # The processes first: they may still write into the folders.
    _kill_all()
    _remove_temp_dirs()


atexit.register(_cleanup)


def _on_sigterm(signum, frame):
    # Not sys.exit(): unittest would record SystemExit as a test error and
    # carry on with the next test.
    _cleanup()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


signal.signal(signal.SIGTERM, _on_sigterm)
signal.signal(signal.SIGHUP, _on_sigterm)


class StartupError(Exception):
    pass


# --- health, reflection ----------------------------------------------------

SERVING = 'SERVING'
NOT_SERVING = 'NOT_SERVING'


def health(channel, timeout=2.0, service=''):
    """SERVING, NOT_SERVING, another status name, or None if the call failed."""
    check = channel.unary_unary('/grpc.health.v1.Health/Check',
                                request_serializer=lambda x: x,
                                response_deserializer=lambda x: x)
    name = service.encode()
    request = b'\x0a' + bytes([len(name)]) + name if name else b''  # HealthCheckRequest.service
    try:
        reply = check(request, timeout=timeout)
    except grpc.RpcError:
        return None
    return {b'\x08\x01': SERVING, b'\x08\x02': NOT_SERVING, b'': 'UNKNOWN',
            b'\x08\x03': 'SERVICE_UNKNOWN'}.get(reply, repr(reply))


def reflection_list_services(channel, timeout=10.0):
    """The raw ServerReflectionResponse to a list_services request."""
    call = channel.stream_stream('/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo',
                                 request_serializer=lambda x: x,
                                 response_deserializer=lambda x: x)
    responses = call(iter([b'\x3a\x00']), timeout=timeout)
    for r in responses:
        return r
    return b''


def wait_for(predicate, timeout, interval=0.1, what='condition'):
    """Polls predicate() until truthy; returns its value or raises AssertionError."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError('timed out after %.0f s waiting for %s (last: %r)' %
                                 (timeout, what, last))
        time.sleep(interval)


# --- the cluster -----------------------------------------------------------

class Cluster:
    """`tp` workers and a coordinator (tensor-parallel over the workers)."""

    def __init__(self, name, tp=1, coordinator_args=(), worker_args=(), model=None,
                 credentials=None, target_name=None, coordinator_prefix=()):
        """credentials: grpc.ChannelCredentials for a TLS API port (target_name
        overrides the name the certificate is checked against).
        coordinator_prefix: a command the coordinator runs under (prlimit ...)."""
        self.coordinator_prefix = list(coordinator_prefix)
        self.name = name
        self.credentials = credentials
        self.target_name = target_name
        self.tp = tp
        self.coordinator_args = list(coordinator_args)
        self.worker_args = list(worker_args)
        self.model = model or model_dir()
        self.workers = [None] * tp
        self.worker_ports = []
        self.coordinator = None
        self.port = None
        self.metrics_port = None
        self.http_port = None
        self.channel = None
        self.stub = None
        self._attempt = 0

    # Processes.
    def worker_argv(self, i):
        return [bin_path('chunkattn-worker'), '--listen', '127.0.0.1:%d' % self.worker_ports[i],
                '--device', 'cpu', '--threads', '1', '--kv_cache_mib', '256'] + self.worker_args

    def start_worker(self, i):
        """(Re)starts worker i on its port."""
        p = Process('%s-worker%d-%d' % (self.name, i, self._attempt), self.worker_argv(i))
        self.workers[i] = p.start()
        return p

    def kill_worker(self, i):
        self.workers[i].kill()

    def coordinator_argv(self):
        return self.coordinator_prefix + [bin_path('chunkattn-coordinator'), '--listen', '127.0.0.1:%d' % self.port,
                '--metrics_port', str(self.metrics_port), '--metrics_host', '127.0.0.1',
                # Tests that set the ports themselves leave http_port None: 0
                # lets the kernel pick, so no two coordinators want 8000.
                '--http_port', str(self.http_port or 0), '--http_host', '127.0.0.1',
                '--workers', ','.join('127.0.0.1:%d' % p for p in self.worker_ports),
                '--model', self.model] + self.coordinator_args

    def processes(self):
        return [p for p in self.workers + [self.coordinator] if p is not None]

    def start(self, timeout=STARTUP_TIMEOUT_S):
        """Starts everything and waits for SERVING; retries once with new ports
        if a process dies on the way (a port taken in the meantime)."""
        for attempt in (0, 1):
            self._attempt = attempt
            self.worker_ports = [free_port() for _ in range(self.tp)]
            self.port, self.metrics_port, self.http_port = free_port(), free_port(), free_port()
            try:
                for i in range(self.tp):
                    self.start_worker(i)
                self.coordinator = Process('%s-coordinator-%d' % (self.name, attempt),
                                           self.coordinator_argv()).start()
                # A channel whose first connection is refused waits out gRPC's
                # reconnect backoff (1 s, 1.6 s, 2.6 s ...): opened before the
                # coordinator listened, it saw SERVING ~4.5 s after the fact.
                self.wait_listening(timeout)
                self.channel = self.open_channel()
                self.stub = pb_grpc.GenerationStub(self.channel)
                self.wait_health(SERVING, timeout)
                return self
            except StartupError as e:
                sys.stderr.write('cluster %s: start attempt %d failed: %s\n' % (self.name, attempt, e))
                self.dump_logs()
                self.stop()
                if attempt == 1:
                    raise

    def open_channel(self, credentials=None):
        """A new channel to the API port: TLS with `credentials` (default: the
        cluster's), plaintext when there are none."""
        credentials = credentials or self.credentials
        target = '127.0.0.1:%d' % self.port
        if credentials is None:
            return grpc.insecure_channel(target)
        options = [('grpc.ssl_target_name_override', self.target_name)] if self.target_name else []
        return grpc.secure_channel(target, credentials, options=options)

    def wait_listening(self, timeout):
        """Waits until the API port accepts connections; StartupError as soon
        as a process has exited, AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while not port_open(self.port, timeout=0.2):
            for p in self.processes():
                if not p.alive():
                    raise StartupError('%s exited with %s' % (p.name, p.returncode()))
            if time.monotonic() >= deadline:
                raise AssertionError('the coordinator did not listen on %d within %.0f s' % (self.port, timeout))
            time.sleep(0.02)

    def wait_health(self, expected, timeout, check_alive=None):
        """Waits until health is `expected`. With check_alive (the default when
        waiting for SERVING), StartupError as soon as a process has exited;
        AssertionError on timeout."""
        if check_alive is None:
            check_alive = expected == SERVING
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if check_alive:
                for p in self.processes():
                    if not p.alive():
                        raise StartupError('%s exited with %s' % (p.name, p.returncode()))
            last = health(self.channel, timeout=1.0)
            if last == expected:
                return
            time.sleep(0.1)
        raise AssertionError('health did not become %s within %.0f s (last: %s)' %
                             (expected, timeout, last))

    def stop(self):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.coordinator is not None:
            self.coordinator.stop()
        for w in self.workers:
            if w is not None:
                w.stop()

    def dump_logs(self, max_lines=60):
        for p in self.processes():
            sys.stderr.write('\n----- %s (%s, exit %s) -----\n%s\n' %
                             (p.name, p.log_path, p.returncode(), p.log_tail(max_lines)))
        sys.stderr.flush()

    # RPC helpers.
    def generate(self, request, timeout=RPC_TIMEOUT_S):
        return collect(self.stub.Generate(request, timeout=timeout))

    def metrics(self):
        return scrape_metrics(self.metrics_port)

    def metrics_when(self, predicate, timeout=10.0, what='metrics'):
        """The first scrape for which predicate(Metrics) holds (counters are
        updated as requests finish, possibly a moment after the last response)."""
        found = []

        def check():
            m = self.metrics()
            if predicate(m):
                found.append(m)
                return True
            return False

        wait_for(check, timeout, interval=0.1, what=what)
        return found[-1]

    def model_info(self):
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)

    def cache_stats(self):
        return self.stub.GetCacheStats(pb.GetCacheStatsRequest(), timeout=30)


# --- requests --------------------------------------------------------------

def make_request(prompt_ids=None, text=None, namespace='', temperature=None, top_k=None,
                 top_p=None, min_p=None, repetition_penalty=None, seed=None,
                 max_new_tokens=None, stop=(), stop_token_ids=(), ignore_eos=False, n=0,
                 logprobs=False, request_id='', priority=0, min_tokens=0):
    sampling = pb.SamplingParams()
    for field, value in (('temperature', temperature), ('top_k', top_k), ('top_p', top_p),
                         ('min_p', min_p), ('repetition_penalty', repetition_penalty),
                         ('seed', seed)):
        if value is not None:
            setattr(sampling, field, value)
    stopping = pb.StoppingCriteria(stop=list(stop), stop_token_ids=list(stop_token_ids),
                                   ignore_eos=ignore_eos, min_tokens=min_tokens)
    if max_new_tokens is not None:
        stopping.max_new_tokens = max_new_tokens
    req = pb.GenerateRequest(request_id=request_id, cache_namespace=namespace, sampling=sampling,
                             stopping=stopping, return_logprobs=logprobs, n=n,
                             priority=priority)
    if prompt_ids is not None:
        req.token_ids.ids.extend(prompt_ids)
    if text is not None:
        req.text = text
    return req


@dataclasses.dataclass
class Sample:
    tokens: list = dataclasses.field(default_factory=list)
    text: str = ''
    logprobs: list = dataclasses.field(default_factory=list)
    finish_reason: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    responses: int = 0
    finished: bool = False


def collect(responses):
    """Reads a Generate stream to its end: {sample index: Sample}."""
    samples = {}
    for r in responses:
        s = samples.setdefault(r.index, Sample())
        s.responses += 1
        s.tokens.extend(r.token_ids)
        s.text += r.text
        s.logprobs.extend(r.logprobs)
        if r.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            if s.finished:
                raise AssertionError('sample %d got two finish reasons' % r.index)
            s.finished = True
            s.finish_reason = r.finish_reason
            s.prompt_tokens = r.usage.prompt_tokens
            s.cached_prompt_tokens = r.usage.cached_prompt_tokens
            s.completion_tokens = r.usage.completion_tokens
    return samples


# --- metrics ---------------------------------------------------------------

def scrape_text(port, timeout=5.0):
    with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port, timeout=timeout) as r:
        return r.read().decode('utf-8')


class Metrics:
    """One scrape: samples by name and labels."""

    def __init__(self, text):
        from prometheus_client.parser import text_string_to_metric_families
        self.text = text
        self.samples = []  # (name, labels, value)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples.append((s.name, dict(s.labels), s.value))

    def names(self):
        return {name for name, _, _ in self.samples}

    def get(self, name, **labels):
        """The sum over the samples of `name` whose labels include `labels`;
        None if there is none."""
        values = [v for n, l, v in self.samples
                  if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
        return sum(values) if values else None

    def value(self, name, **labels):
        """Like get(), but 0 for a series not exported yet (counters with labels
        appear on first use)."""
        v = self.get(name, **labels)
        return 0.0 if v is None else v


def scrape_metrics(port):
    return Metrics(scrape_text(port))


# --- tests -----------------------------------------------------------------

def varints(ids):
    """`ids` as protobuf varints, as a packed repeated field holds them: to find
    token ids in a serialized reply (test_tenancy.py, bench/attack.py)."""
    out = bytearray()
    for v in ids:
        while True:
            b = v & 0x7f
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                break
    return bytes(out)


def random_ids(rng, n, low=3, high=2048):
    return [rng.randrange(low, high) for _ in range(n)]


def fresh_namespace(tag):
    """A cache namespace no other request uses: nothing is cached in it."""
    return '%s-%s' % (tag, uuid.uuid4().hex)


_shared_clusters = {}  # (tp, coordinator_args, worker_args) -> the process's Cluster


def shared_cluster(name, tp=1, coordinator_args=(), worker_args=()):
    """The process's cluster of this configuration: started by the first
    caller, kept until the process exits (stop_shared_clusters), and checked
    to be SERVING for each later one."""
    key = (tp, tuple(coordinator_args), tuple(worker_args))
    c = _shared_clusters.get(key)
    if c is None:
        c = Cluster('shared-' + name, tp=tp, coordinator_args=coordinator_args, worker_args=worker_args).start()
        _shared_clusters[key] = c
    else:
        c.wait_health(SERVING, 10)
    return c


def stop_shared_clusters():
    for c in _shared_clusters.values():
        c.stop()
    _shared_clusters.clear()


class ServiceTestCase(unittest.TestCase):
    """Base: subclasses start their cluster(s) in setUpClass through
    start_cluster(); a failing test prints every process's log tail."""

    clusters = []         # the class's own, stopped when it is done
    shared_clusters = []  # the process's, that the class uses

    @classmethod
    def start_cluster(cls, name, shared=False, **kwargs):
        """A cluster of `tp` workers and a coordinator (Cluster's arguments).
        shared=True (tp, coordinator_args and worker_args only): the process's
        cluster of that configuration, which the classes run in one process
        share (tests/services/CMakeLists.txt runs several classes per
        process) instead of each starting its own. A class that shares one
        kills, stops and reconfigures nothing of it, and its tests use their
        own namespaces and request ids and measure deltas, so that they pass
        in any order and after any other class."""
        if shared:
            c = shared_cluster(name, **kwargs)
            cls.shared_clusters = cls.shared_clusters + [c]
            return c
        c = Cluster(name, **kwargs)
        cls.clusters = cls.clusters + [c]
        c.start()
        return c

    @classmethod
    def tearDownClass(cls):
        for c in cls.clusters:
            c.stop()
        cls.clusters = []
        cls.shared_clusters = []

    def run(self, result=None):
        result = result if result is not None else self.defaultTestResult()
        before = len(result.failures) + len(result.errors)
        out = super().run(result)
        if len(result.failures) + len(result.errors) > before:
            for c in type(self).clusters + type(self).shared_clusters:
                c.dump_logs()
        return out


def setup_class_or_dump(fn):
    """Decorates a setUpClass body: on failure, print the logs before raising."""
    def wrapper(cls):
        try:
            fn(cls)
        except BaseException:
            for c in cls.clusters + cls.shared_clusters:
                c.dump_logs()
            for c in cls.clusters:
                c.stop()
            raise
    return classmethod(wrapper)


def setup(source, build=None):
    """Points the harness at a checkout and its build folder (default
    SOURCE/build), checks that the servers and the demo model are there, and
    generates the stubs: main() for the tests, and bench/soak.py."""
    global BUILD, SOURCE
    SOURCE = os.path.abspath(source)
    BUILD = os.path.abspath(build or os.path.join(SOURCE, 'build'))
    for name in ('chunkattn-worker', 'chunkattn-coordinator'):
        if not os.access(bin_path(name), os.X_OK):
            sys.exit('missing %s (build it first)' % bin_path(name))
    if not os.path.isfile(os.path.join(model_dir(), 'config.json')):
        sys.exit('missing the demo model in %s (ctest fixture demo_model)' % model_dir())
    generate_stubs(SOURCE)


def main():
    """Runs the tests named in the arguments: classes of the calling module
    (CancelTest), or of another test module here (test_prefix_cache.CacheSurvivesTest),
    all in this process, so that they can share clusters (start_cluster's shared)."""
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('--source', default=os.path.dirname(os.path.dirname(here)))
    parser.add_argument('--build', default=None)
    args, rest = parser.parse_known_args()
    setup(args.source, args.build)
    main_module = sys.modules['__main__']
    for name in rest:
        module = name.split('.')[0]
        if not hasattr(main_module, module) and os.path.isfile(os.path.join(here, module + '.py')):
            setattr(main_module, module, importlib.import_module(module))
    sys.stderr.write('logs: %s%s\n' % (log_dir(), '' if keep_logs() else
                                         ' (removed at exit; CHUNKATTN_KEEP_TEST_LOGS=1 keeps them)'))
    program = unittest.main(module='__main__', argv=[sys.argv[0]] + rest, verbosity=2, exit=False)
    ok = program.result.wasSuccessful()
    stop_shared_clusters()
    _cleanup()
    sys.exit(0 if ok else 1)
