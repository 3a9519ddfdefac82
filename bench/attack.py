"""The fronts under attack: a bounded attack harness on 127.0.0.1.

Starts one coordinator (under `prlimit --nofile=1024:1024`, so descriptor
exhaustion is what a default container gets) and one CPU worker on the demo
model, with bearer tokens (t-a acme, t-b globex, r-1 role:router, o-1
role:operator) and the KV-event ports (ZMQ PUB and replay on loopback). Then,
one after the other, each attack below runs for a bounded time while a
legitimate tenant (t-a) streams one request on each front (gRPC Generate and
HTTP /v1/completions with stream), and after each: did the victims complete,
their time to first token against the same pair of streams with no attack,
the coordinator's RSS (VmRSS before, peak sampled every 50 ms, after), whether
every port (gRPC health on the API port, HTTP GET /health, the metrics port)
serves within 2 s, the HTTP guard's and the engine's counters, and the
coordinator's log lines written meanwhile.

  1 idle-http-flood     idle TCP connections to the HTTP port (1,100), held, then closed
  2 body-trickle        unauthenticated POST heads announcing 16 MiB, then 1 byte/s
  3 big-bodies          authenticated POSTs announcing 16 MiB, bodies sent slowly
  4 tenant-reads-events tenant t-b on SubscribeKvEvents and GetKvBlocks while t-a sends a prompt;
                        the router r-1's live stream is the control (it must carry t-a's ids)
  5 pool-stats          tenants on GetCacheStats and VllmEngine/GetLoads; the operator's are the control
  6 replay-flood        ZMQ DEALERs, each sending replay requests from sequence 0, read for a bounded time
  7 many-sequences      one /v1/completions with 256 prompts x n = 64 (closed after a bound if accepted)
  8 plain-disconnect    a non-streamed /v1/completions of 4,000 tokens whose client leaves after 0.5 s

It is a benchmark: it exits 0 when it ran to the end, whatever the outcomes;
with --check it exits 1 when an attack's expectation failed. --short runs a
few seconds per attack with fewer connections (the CI version, under 90 s on
2 cores).

  /usr/bin/python3 bench/attack.py --json bench/results/attack-cpu-2core.json
  /usr/bin/python3 bench/attack.py --short --check
"""
import argparse
import collections
import http.client
import json
import os
import random
import select
import socket
import sys
import threading
import time

from run_info import machine_info, write_result

TOKENS = 't-a acme\nt-b globex\nr-1 role:router\no-1 role:operator\n'
MODEL = 'demo'
CHUNK = 64  # the coordinator's default --chunk_size
MIB = 1 << 20
BIG = 16 * MIB  # the Content-Length the body attacks announce

# Per mode: connections, durations (s).
FULL = dict(idle_conns=1100, idle_hold_s=3.0, tricklers=60, trickle_s=10.0, big_bodies=60, big_body_s=10.0,
            events_s=5.0, dealers=200, dealer_requests=50, replay_read_s=10.0, many_cancel_s=10.0, flood_tokens=200, flood_ttft_bound=3.0,
            victim_timeout_s=60.0, baseline_repeats=3)
SHORT = dict(idle_conns=300, idle_hold_s=2.0, tricklers=10, trickle_s=3.0, big_bodies=10, big_body_s=3.0,
             events_s=2.0, dealers=20, dealer_requests=5, replay_read_s=3.0, many_cancel_s=3.0, flood_tokens=100, flood_ttft_bound=None,
             victim_timeout_s=30.0, baseline_repeats=2)

RATIO_ATTACKS = ('tenant-flood',)  # expectations on the victims' TTFT against alone
PORTS_WITHIN_S = 2.0     # every port must serve within this after an attack
PORTS_LIMIT_S = 10.0     # and is polled this long, to record when it came back
FLAT_MIB = 8.0           # "memory flat": peak - before for the HTTP body attacks
REPLAY_MIB = 32.0        # the replay flood's bound on peak - before ("a few MB", not a ring per request)
DRAIN_LIMIT_S = 60.0     # the engine idle again before the next attack

harness = None  # tests/services/harness.py, imported in main() from --source
vllm = None     # tests/services/test_vllm_engine.py (the vLLM engine API's stubs)


def md(token):
    return [('authorization', 'Bearer ' + token)]


def rss_mib(pid):
    try:
        with open('/proc/%d/status' % pid) as f:
            for line in f:
                if line.startswith('VmRSS:'):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


class RssSampler:
    """The peak of VmRSS, sampled every 50 ms on a thread."""

    def __init__(self, pid):
        self.pid = pid
        self.peak = rss_mib(pid) or 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            v = rss_mib(self.pid)
            if v is not None:
                self.peak = max(self.peak, v)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        v = rss_mib(self.pid)
        if v is not None:
            self.peak = max(self.peak, v)
        return self.peak


def code_name(e):
    return e.code().name if hasattr(e, 'code') and e.code() is not None else type(e).__name__


def error_text(e):
    """The status code and, for the record, the server's message (a flake's cause)."""
    details = e.details() if hasattr(e, 'details') else str(e)
    return '%s: %s' % (code_name(e), details) if details else code_name(e)


# --- the victims ---------------------------------------------------------------

def grpc_victim(cluster, prompt, max_tokens, timeout):
    """t-a's streamed Generate on a fresh channel: ok, ttft_ms, tokens, error."""
    t0 = time.monotonic()
    channel = cluster.open_channel()
    ttft, tokens, finished, error = None, 0, False, None
    try:
        stub = harness.pb_grpc.GenerationStub(channel)
        req = harness.make_request(prompt_ids=prompt, temperature=0.0, max_new_tokens=max_tokens, ignore_eos=True)
        for r in stub.Generate(req, metadata=md('t-a'), timeout=timeout):
            if r.token_ids and ttft is None:
                ttft = time.monotonic() - t0
            tokens += len(r.token_ids)
            if r.finish_reason != harness.pb.FINISH_REASON_UNSPECIFIED:
                finished = True
    except Exception as e:  # noqa: BLE001 (an outcome to record)
        error = error_text(e)
    finally:
        channel.close()
    return dict(front='grpc', ok=finished and tokens == max_tokens and error is None, tokens=tokens,
                ttft_ms=None if ttft is None else 1000 * ttft, seconds=time.monotonic() - t0, error=error)


def http_victim(port, prompt, max_tokens, timeout):
    """t-a's streamed /v1/completions on a new connection: ok, ttft_ms, tokens, error."""
    body = json.dumps({'model': MODEL, 'prompt': prompt, 'max_tokens': max_tokens, 'stream': True,
                       'ignore_eos': True, 'temperature': 0, 'stream_options': {'include_usage': True}}).encode()
    t0 = time.monotonic()
    deadline = t0 + timeout
    ttft, tokens, done, status, error = None, 0, False, None, None
    s = None
    try:
        s = socket.create_connection(('127.0.0.1', port), timeout=timeout)
        s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: victim\r\nAuthorization: Bearer t-a\r\n'
                  b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
        buf = b''
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                error = 'timeout'
                break
            s.settimeout(left)
            chunk = s.recv(65536)
            if not chunk:
                error = error or 'closed by the server'
                break
            buf += chunk
            if status is None:
                if b'\r\n\r\n' not in buf:
                    continue
                head, buf = buf.split(b'\r\n\r\n', 1)
                status = int(head.split(b' ', 2)[1])
                if status != 200:
                    error = 'HTTP %d' % status
                    break
            while b'\n\n' in buf:  # SSE events (inside chunked framing: skip to "data: ")
                event, buf = buf.split(b'\n\n', 1)
                at = event.find(b'data: ')
                if at < 0:
                    continue
                data = event[at + len(b'data: '):]
                if data == b'[DONE]':
                    done = True
                    break
                msg = json.loads(data)
                if 'error' in msg:
                    error = msg['error'].get('message', 'error')
                    done = True
                    break
                if msg.get('usage'):
                    tokens = msg['usage']['completion_tokens']
                if msg.get('choices') and ttft is None:
                    ttft = time.monotonic() - t0
    except (OSError, ValueError) as e:
        error = '%s: %s' % (type(e).__name__, e)
    finally:
        if s is not None:
            s.close()
    return dict(front='http', ok=done and error is None and tokens == max_tokens, tokens=tokens, status=status,
                ttft_ms=None if ttft is None else 1000 * ttft, seconds=time.monotonic() - t0, error=error)


class Victims:
    """One streamed request per front, at once, each with a prompt of its own
    (32 token ids nothing else sends: no cache hits)."""

    MAX_TOKENS = 16

    def __init__(self, ctx):
        self.ctx = ctx
        self.rng = random.Random(7)

    def run_rounds(self, rounds):
        """run() `rounds` times in turn; per front the round of median TTFT
        (any failed round is the result), with every round's TTFT."""
        runs = [self.run() for _ in range(rounds)]
        out = {}
        for front in runs[0]:
            got = [r[front] for r in runs]
            failed = [v for v in got if not v['ok']]
            pick = failed[0] if failed else sorted(got, key=lambda v: v['ttft_ms'])[len(got) // 2]
            out[front] = dict(pick, ttft_ms_rounds=[v['ttft_ms'] for v in got])
        return out

    def run(self):
        ctx = self.ctx
        out = {}
        prompts = [harness.random_ids(self.rng, 32), harness.random_ids(self.rng, 32)]
        threads = [threading.Thread(target=lambda: out.__setitem__('grpc', grpc_victim(
                       ctx.cluster, prompts[0], self.MAX_TOKENS, ctx.p['victim_timeout_s']))),
                   threading.Thread(target=lambda: out.__setitem__('http', http_victim(
                       ctx.cluster.http_port, prompts[1], self.MAX_TOKENS, ctx.p['victim_timeout_s'])))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(ctx.p['victim_timeout_s'] + 30)
        return out


# --- the ports ---------------------------------------------------------------

def serves_grpc(cluster):
    channel = cluster.open_channel()
    try:
        return harness.health(channel, timeout=1.0) == harness.SERVING
    finally:
        channel.close()


def serves_http(port, path):
    try:
        conn = http.client.HTTPConnection('127.0.0.1', port, timeout=1.0)
        conn.request('GET', path)
        status = conn.getresponse().status
        conn.close()
        return status == 200
    except (OSError, http.client.HTTPException):
        return False


def ports_check(cluster):
    """Seconds until each port served (polled at once, in parallel), None if
    not within PORTS_LIMIT_S."""
    checks = {'grpc': lambda: serves_grpc(cluster),
              'http': lambda: serves_http(cluster.http_port, '/health'),
              'metrics': lambda: serves_http(cluster.metrics_port, '/metrics')}
    out = {}
    t0 = time.monotonic()

    def poll(name, fn):
        while time.monotonic() - t0 < PORTS_LIMIT_S:
            if fn():
                out[name] = time.monotonic() - t0
                return
            time.sleep(0.05)
        out[name] = None

    threads = [threading.Thread(target=poll, args=item) for item in checks.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PORTS_LIMIT_S + 10)
    return {name: out.get(name) for name in checks}


# --- raw HTTP clients ------------------------------------------------------------

def open_many(port, n, bound_s):
    """Up to n connections to 127.0.0.1:port, opened one after the other within
    bound_s (stops at the first that fails)."""
    socks, error = [], None
    end = time.monotonic() + bound_s
    while len(socks) < n and time.monotonic() < end:
        try:
            socks.append(socket.create_connection(('127.0.0.1', port), timeout=min(5.0, bound_s)))
        except OSError as e:
            error = '%s after %d' % (e, len(socks))
            break
    return socks, error


def closed_by_peer(s):
    """True when the server closed (or reset) the connection; False while open."""
    try:
        s.setblocking(False)
        return s.recv(1, socket.MSG_PEEK) == b''
    except BlockingIOError:
        return False
    except OSError:
        return True


def slow_posts(port, n, head, piece, interval_s, seconds, engaged):
    """n connections each send `head`, then `piece` every interval_s for
    `seconds` while the server keeps them; the server's replies are read as
    they come. Returns the statuses, when they came, and how the connections
    ended."""
    socks, error = open_many(port, n, 10.0)
    t0 = time.monotonic()
    state = []
    for s in socks:
        try:
            s.sendall(head)
            state.append(dict(sock=s, sent=0, reply=b'', status=None, reply_s=None, closed_s=None))
        except OSError:
            state.append(dict(sock=s, sent=0, reply=b'', status=None, reply_s=None, closed_s=0.0))
        s.setblocking(False)
    engaged.set()
    next_send = t0 + interval_s
    # Sends for `seconds`, then only reads for 1.5 s more: a close by the
    # server at the end of the sending is seen as the server's, not ours.
    while time.monotonic() - t0 < seconds + 1.5:
        live = [st for st in state if st['closed_s'] is None]
        if not live:
            break
        wait = max(0.0, min(next_send, t0 + seconds + 1.5) - time.monotonic())
        readable, _, _ = select.select([st['sock'] for st in live], [], [], min(wait, 0.1))
        now = time.monotonic() - t0
        for st in live:
            if st['sock'] not in readable:
                continue
            try:
                data = st['sock'].recv(65536)
            except OSError:
                data = b''
            if not data:
                st['closed_s'] = now
                continue
            st['reply'] += data
            if st['status'] is None and b'\r\n' in st['reply']:
                try:
                    st['status'] = int(st['reply'].split(b' ', 2)[1])
                except (IndexError, ValueError):
                    st['status'] = -1
                st['reply_s'] = now
        if time.monotonic() >= next_send and time.monotonic() - t0 < seconds:
            for st in state:
                if st['closed_s'] is None:
                    try:
                        st['sent'] += st['sock'].send(piece)
                    except BlockingIOError:
                        pass
                    except OSError:
                        st['closed_s'] = time.monotonic() - t0
            next_send += interval_s
    for st in state:
        st['sock'].close()
    statuses = collections.Counter(str(st['status']) if st['status'] is not None else 'none' for st in state)
    reply_s = [st['reply_s'] for st in state if st['reply_s'] is not None]
    sample = next((st['reply'] for st in state if st['reply']), b'')
    return dict(connections=len(socks), open_error=error, statuses=dict(statuses),
                reply_s_max=max(reply_s) if reply_s else None,
                closed_by_server=sum(1 for st in state if st['closed_s'] is not None),
                closed_s_min=min((st['closed_s'] for st in state if st['closed_s'] is not None), default=None),
                closed_s_max=max((st['closed_s'] for st in state if st['closed_s'] is not None), default=None),
                sent_s=seconds, watched_s=seconds + 1.5,
                body_bytes_sent=sum(st['sent'] for st in state),
                reply_sample=sample[:300].decode('latin-1'))


# --- the attacks -------------------------------------------------------------------
# Each runs on a thread beside the victims: it sets `engaged` once the attack
# is in full swing (the victims start then) and returns its details; `checks`
# gets (name, passed, detail) tuples for the expectation.

def slow_posts_outcome(r):
    statuses = ', '.join('%d x %s' % (n, status) for status, n in sorted(r['statuses'].items()))
    closed = 'none closed by the server in %.1f s' % r['watched_s']
    if r['closed_by_server']:
        closed = '%d of %d closed by the server %.1f-%.1f s after the head' % (
            r['closed_by_server'], r['connections'], r['closed_s_min'], r['closed_s_max'])
    return '%s (the last %s s after its head); %s' % (
        statuses or 'no reply', '%.2f' % r['reply_s_max'] if r['reply_s_max'] is not None else '-', closed)


def idle_http_flood(ctx, engaged):
    p = ctx.p
    t0 = time.monotonic()
    socks, error = open_many(ctx.cluster.http_port, p['idle_conns'], 15.0)
    opened_s = time.monotonic() - t0
    engaged.set()
    time.sleep(p['idle_hold_s'])
    closed = sum(1 for s in socks if closed_by_peer(s))
    for s in socks:
        s.close()
    return dict(asked=p['idle_conns'], opened=len(socks), open_error=error, open_seconds=opened_s,
                closed_by_server_while_held=closed, held_open=len(socks) - closed, hold_s=p['idle_hold_s'],
                outcome='%d opened, %d closed by the server at once, %d held %.0f s' % (
                    len(socks), closed, len(socks) - closed, p['idle_hold_s']))


def body_trickle(ctx, engaged):
    p = ctx.p
    head = (b'POST /v1/completions HTTP/1.1\r\nHost: attack\r\nContent-Type: application/json\r\n'
            b'Content-Length: %d\r\n\r\n' % BIG)
    r = slow_posts(ctx.cluster.http_port, p['tricklers'], head, b'x', 1.0, p['trickle_s'], engaged)
    r['outcome'] = slow_posts_outcome(r)
    return r


def big_bodies(ctx, engaged):
    p = ctx.p
    head = (b'POST /v1/completions HTTP/1.1\r\nHost: attack\r\nAuthorization: Bearer t-b\r\n'
            b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n' % BIG)
    # 4 KiB every 0.25 s per connection: "slowly", but far more than a trickle.
    r = slow_posts(ctx.cluster.http_port, p['big_bodies'], head, b'{' + b' ' * 4095, 0.25, p['big_body_s'], engaged)
    r['outcome'] = slow_posts_outcome(r)
    return r


def tenant_reads_events(ctx, engaged):
    p = ctx.p
    cluster = ctx.cluster
    v = vllm.vpb_grpc.VllmEngineStub(cluster.channel)
    # The control: the router's live stream, registered before t-a's prompt.
    control = dict(batches=[], error=None)
    call = v.SubscribeKvEvents(vllm.cpb.SubscribeKvEventsRequest(start_sequence_number=0), metadata=md('r-1'),
                               timeout=p['events_s'] + 15)

    def read_control():
        try:
            for b in call:
                control['batches'].append(b.SerializeToString())
        except Exception as e:  # noqa: BLE001 (cancelled at the end)
            control['error'] = code_name(e)

    reader = threading.Thread(target=read_control, daemon=True)
    reader.start()
    try:
        call.initial_metadata()  # sent once the subscription is registered
    except Exception as e:  # noqa: BLE001
        control['error'] = code_name(e)
    prompt = harness.random_ids(random.Random(4), 3 * CHUNK + 5)
    a_result = {}

    def tenant_a():
        try:
            req = harness.make_request(prompt_ids=prompt, temperature=0.0, max_new_tokens=8, ignore_eos=True)
            a_result['samples'] = len(harness.collect(cluster.stub.Generate(req, metadata=md('t-a'), timeout=60)))
        except Exception as e:  # noqa: BLE001
            a_result['error'] = code_name(e)

    a = threading.Thread(target=tenant_a)
    a.start()
    engaged.set()
    codes = {'SubscribeKvEvents': collections.Counter(), 'GetKvBlocks': collections.Counter()}
    leaked = False
    end = time.monotonic() + p['events_s']
    while time.monotonic() < end:
        try:
            got = list(v.SubscribeKvEvents(vllm.cpb.SubscribeKvEventsRequest(start_sequence_number=1),
                                           metadata=md('t-b'), timeout=1.0))
            codes['SubscribeKvEvents']['OK'] += 1
            leaked = leaked or bool(got)
        except Exception as e:  # noqa: BLE001
            codes['SubscribeKvEvents'][code_name(e)] += 1
        try:
            got = cluster.stub.GetKvBlocks(harness.pb.GetKvBlocksRequest(), metadata=md('t-b'), timeout=5)
            codes['GetKvBlocks']['OK'] += 1
            leaked = leaked or len(got.SerializeToString()) > 0
        except Exception as e:  # noqa: BLE001
            codes['GetKvBlocks'][code_name(e)] += 1
        time.sleep(0.05)
    a.join(60)
    time.sleep(0.5)  # the last batches of t-a's request reach the router
    call.cancel()
    reader.join(10)
    stream = b''.join(control['batches'])
    router_sees = harness.varints(prompt[:CHUNK]) in stream
    return dict(tenant_codes={k: dict(c) for k, c in codes.items()}, tenant_got_data=leaked,
                tenant_a=a_result, router_batches=len(control['batches']), router_sees_prompt=router_sees,
                outcome='t-b: SubscribeKvEvents %s, GetKvBlocks %s; r-1 (control): %d batches, t-a\'s ids %s' % (
                    dict(codes['SubscribeKvEvents']), dict(codes['GetKvBlocks']), len(control['batches']),
                    'found' if router_sees else 'NOT found'))


def pool_stats(ctx, engaged):
    cluster = ctx.cluster
    v = vllm.vpb_grpc.VllmEngineStub(cluster.channel)
    engaged.set()
    codes = {}
    for token in ('t-a', 't-b', 'r-1', 'o-1'):
        for name, fn in (('GetCacheStats', lambda: cluster.stub.GetCacheStats(
                              harness.pb.GetCacheStatsRequest(), metadata=md(token), timeout=10)),
                         ('GetLoads', lambda: v.GetLoads(vllm.vpb.GetLoadsRequest(), metadata=md(token), timeout=10))):
            try:
                fn()
                codes['%s %s' % (token, name)] = 'OK'
            except Exception as e:  # noqa: BLE001
                codes['%s %s' % (token, name)] = code_name(e)
    short = {'OK': 'OK', 'PERMISSION_DENIED': 'DENIED'}
    return dict(codes=codes, outcome='GetCacheStats / GetLoads: ' + '; '.join(
        '%s %s / %s' % (t, short.get(codes[t + ' GetCacheStats'], codes[t + ' GetCacheStats']),
                        short.get(codes[t + ' GetLoads'], codes[t + ' GetLoads'])) for t in ('t-a', 't-b', 'r-1', 'o-1')))


def replay_flood(ctx, engaged):
    import zmq
    p = ctx.p
    # Something to replay: a few requests' worth of stored blocks in the ring.
    rng = random.Random(6)
    for _ in range(8):
        harness.collect(ctx.cluster.stub.Generate(harness.make_request(
            prompt_ids=harness.random_ids(rng, 2 * CHUNK + 3), temperature=0.0, max_new_tokens=2, ignore_eos=True),
            metadata=md('t-a'), timeout=60))
    zctx = zmq.Context()
    socks = []
    counts = collections.Counter()
    per_sock = []
    try:
        for _ in range(p['dealers']):
            s = zctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDTIMEO, 1000)
            s.connect(ctx.replay_endpoint)
            socks.append(s)
            per_sock.append(collections.Counter())
        for _ in range(p['dealer_requests']):
            for s in socks:
                try:
                    s.send_multipart([b'', (0).to_bytes(8, 'big')])
                    counts['requests_sent'] += 1
                except zmq.ZMQError:
                    counts['send_errors'] += 1
        engaged.set()
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        end = time.monotonic() + p['replay_read_s']
        while time.monotonic() < end:
            for s, _ in poller.poll(100):
                i = socks.index(s)
                while True:
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    counts['bytes'] += sum(len(f) for f in frames)
                    if frames and frames[-1] == b'':
                        counts['end_markers'] += 1
                        per_sock[i]['end_markers'] += 1
                    else:
                        counts['batches'] += 1
                        per_sock[i]['batches'] += 1
    finally:
        for s in socks:
            s.close(linger=0)
        zctx.term()
    with_batches = sum(1 for c in per_sock if c['batches'])
    most = max((c['batches'] for c in per_sock), default=0)
    return dict(dealers=p['dealers'], requests_per_dealer=p['dealer_requests'], read_s=p['replay_read_s'],
                counts=dict(counts), dealers_with_batches=with_batches, most_batches_one_dealer=most,
                outcome='%d requests: %d batches (%.1f MiB) to %d of %d dealers, %d end markers' % (
                    counts['requests_sent'], counts['batches'], counts['bytes'] / MIB, with_batches,
                    p['dealers'], counts['end_markers']))


def read_reply(s, deadline):
    """Reads an HTTP reply (head and a Content-Length body) until `deadline`:
    (status, body bytes, error)."""
    buf, status, want = b'', None, None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return status, buf, 'no reply within the bound'
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return status, buf, 'no reply within the bound'
        except OSError as e:
            return status, buf, str(e)
        if not chunk:
            return status, buf, None if status is not None else 'closed by the server'
        buf += chunk
        if status is None and b'\r\n\r\n' in buf:
            head, rest = buf.split(b'\r\n\r\n', 1)
            status = int(head.split(b' ', 2)[1])
            for line in head.split(b'\r\n')[1:]:
                if line.lower().startswith(b'content-length:'):
                    want = int(line.split(b':', 1)[1])
            buf = rest
        if status is not None and want is not None and len(buf) >= want:
            return status, buf, None


def many_sequences(ctx, engaged):
    p = ctx.p
    rng = random.Random(8)
    prompts = [harness.random_ids(rng, 8) for _ in range(256)]
    body = json.dumps({'model': MODEL, 'prompt': prompts, 'n': 64, 'max_tokens': 256, 'ignore_eos': True,
                       'temperature': 1.0}).encode()
    s = socket.create_connection(('127.0.0.1', ctx.cluster.http_port), timeout=10)
    t0 = time.monotonic()
    s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: attack\r\nAuthorization: Bearer t-b\r\n'
              b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
    # The victims start once the request had time to be refused or admitted.
    threading.Timer(0.3, engaged.set).start()
    status, reply, error = read_reply(s, t0 + p['many_cancel_s'])
    seconds = time.monotonic() - t0
    s.close()
    closed_s = time.monotonic()
    running_at_close = ctx.stats().running_requests
    # After a close: how long until the engine dropped the request's 256 prompts.
    drained = None
    while time.monotonic() - closed_s < DRAIN_LIMIT_S:
        st = ctx.stats()
        if st.running_requests == 0 and st.waiting_requests == 0:
            drained = time.monotonic() - closed_s
            break
        time.sleep(0.05)
    message = ''
    try:
        message = json.loads(reply).get('error', {}).get('message', '') if status and status != 200 else ''
    except ValueError:
        message = reply[:200].decode('latin-1')
    if status is None:
        what = 'no reply in %.0f s (%s): closed; idle %s s after' % (
            seconds, error, '%.1f' % drained if drained is not None else '>%d' % DRAIN_LIMIT_S)
    else:
        what = 'HTTP %d after %.2f s%s' % (status, seconds, ': ' + message if message else '')
    return dict(prompts=256, n=64, max_tokens=256, status=status, seconds=seconds, error=error,
                message=message, reply_bytes=len(reply), running_at_close=running_at_close,
                idle_after_close_s=drained, outcome=what)


def plain_disconnect(ctx, engaged):
    body = json.dumps({'model': MODEL, 'prompt': list(range(5, 25)), 'max_tokens': 4000,
                       'ignore_eos': True}).encode()
    before = ctx.stats().generation_tokens_total
    s = socket.create_connection(('127.0.0.1', ctx.cluster.http_port), timeout=10)
    t0 = time.monotonic()
    s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: attack\r\nAuthorization: Bearer t-b\r\n'
              b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
    seen_running = None
    while time.monotonic() - t0 < 0.5:
        if seen_running is None and ctx.stats().running_requests >= 1:
            seen_running = time.monotonic() - t0
            engaged.set()
        time.sleep(0.02)
    engaged.set()
    s.close()
    closed = time.monotonic()
    idle_s = None
    while time.monotonic() - closed < 30:
        if ctx.stats().running_requests == 0:
            idle_s = time.monotonic() - closed
            break
        time.sleep(0.02)
    time.sleep(0.2)
    tokens = ctx.stats().generation_tokens_total - before  # the victims' 32 included
    return dict(closed_after_s=closed - t0, running_seen_s=seen_running, zero_running_after_close_s=idle_s,
                tokens_generated=tokens,
                outcome='closed at %.2f s; 0 running %s after the close; %d tokens generated (victims\' 32 included)' % (
                    closed - t0, '%.2f s' % idle_s if idle_s is not None else 'not within 30 s', tokens))


def tenant_flood(ctx, engaged):
    """t-b fills the engine: two completions of 4 prompts x n = 64 (512 sequences,
    each within the per-request bound), non-streamed; the victims (t-a) come
    once t-b runs its share and queues the rest."""
    body = json.dumps({'model': MODEL, 'prompt': [[7 + i] * 24 for i in range(4)], 'n': 64,
                       'max_tokens': ctx.p['flood_tokens'], 'ignore_eos': True, 'temperature': 1.0}).encode()
    socks = []
    for _ in range(2):
        s = socket.create_connection(('127.0.0.1', ctx.cluster.http_port), timeout=10)
        s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: attack\r\nAuthorization: Bearer t-b\r\n'
                  b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
        socks.append(s)
    t0 = time.monotonic()
    peak_running = peak_waiting = 0
    while time.monotonic() - t0 < 20:
        st = ctx.stats()
        peak_running, peak_waiting = max(peak_running, st.running_requests), max(peak_waiting, st.waiting_requests)
        if st.running_requests > 0 and st.waiting_requests > 0:  # decoding its share, the rest queued
            break
        time.sleep(0.02)
    engaged.set()  # the victims run now, while the flood holds its share
    ctx.victims_done.wait(120)
    st = ctx.stats()
    for s in socks:
        s.close()  # a disconnect cancels the rest of the flood
    return dict(sequences=512, flood_running=peak_running, flood_waiting=peak_waiting, ttft_bound=ctx.p['flood_ttft_bound'],
                running_during=st.running_requests, outcome='t-b: 2 requests x 256 sequences; %d running, %d waiting '
                'when the victims came' % (peak_running, peak_waiting))


# --- expectations ------------------------------------------------------------------

def expect_idle_flood(r):
    return [('refused past the caps', r['details']['closed_by_server_while_held'] > 0 or
             r['guard']['refused_connection'] > 0, 'closed at once %d, guard refused_connection +%d' % (
                 r['details']['closed_by_server_while_held'], r['guard']['refused_connection']))]


def expect_trickle(r):
    d = r['details']
    return [('401 from the head', d['statuses'] == {'401': d['connections']} and (d['reply_s_max'] or 99) < 2.0,
             'statuses %s, last reply at %s s' % (d['statuses'], d['reply_s_max'])),
            ('memory flat', r['rss_growth_mib'] <= FLAT_MIB, 'peak - before %.1f MiB (bound %.0f)' % (
                r['rss_growth_mib'], FLAT_MIB))]


def expect_big_bodies(r):
    d = r['details']
    ok = sum(n for status, n in d['statuses'].items() if status in ('413', '503')) == d['connections']
    return [('413 or 503', ok and d['connections'] > 0, 'statuses %s' % d['statuses']),
            ('memory flat', r['rss_growth_mib'] <= FLAT_MIB, 'peak - before %.1f MiB (bound %.0f)' % (
                r['rss_growth_mib'], FLAT_MIB))]


def expect_events(r):
    d = r['details']
    denied = all(set(c) == {'PERMISSION_DENIED'} for c in d['tenant_codes'].values())
    return [('tenant denied', denied and not d['tenant_got_data'], str(d['tenant_codes'])),
            ('router gets the events (control)', d['router_sees_prompt'],
             '%d batches, t-a\'s ids %s' % (d['router_batches'], 'in them' if d['router_sees_prompt'] else 'absent'))]


def expect_pool_stats(r):
    c = r['details']['codes']
    tenants = all(c['%s %s' % (t, m)] == 'PERMISSION_DENIED' for t in ('t-a', 't-b')
                  for m in ('GetCacheStats', 'GetLoads'))
    operator = all(c['o-1 %s' % m] == 'OK' for m in ('GetCacheStats', 'GetLoads'))
    return [('tenants denied', tenants, str({k: v for k, v in c.items() if k.startswith('t-')})),
            ('operator served', operator, str({k: v for k, v in c.items() if k.startswith('o-')}))]


def expect_replay(r):
    return [('memory bounded', r['rss_growth_mib'] <= REPLAY_MIB, 'peak - before %.1f MiB (bound %.0f)' % (
        r['rss_growth_mib'], REPLAY_MIB))]


def expect_many_sequences(r):
    d = r['details']
    return [('400 naming sequences', d['status'] == 400 and 'sequences' in d['message'],
             'HTTP %s: %s' % (d['status'], d['message'] or d['error']))]


def expect_tenant_flood(r):
    """The flood queues behind its share; the victim's first token within the
    bound of its time alone (the full run only: the short run's few-ms TTFTs on
    2 shared cores are too noisy to hold a ratio to, so it is recorded)."""
    g = r['victims'].get('grpc', {})
    ratio, bound = g.get('ttft_vs_alone'), r['details']['ttft_bound']
    checks = [('the flood queues', r['details']['flood_waiting'] > 0, 'waiting %d' % r['details']['flood_waiting'])]
    if bound is not None:
        checks.append(('victim TTFT within %.0fx alone' % bound, ratio is not None and ratio <= bound,
                       'gRPC TTFT %s ms, %.1fx alone' % (g.get('ttft_ms'), ratio or 0)))
    return checks


def expect_disconnect(r):
    d = r['details']
    s = d['zero_running_after_close_s']
    return [('stops within 5 s', s is not None and s <= 5.0, '0 running %s s after the close' % s),
            ('fewer than 4000 tokens', d['tokens_generated'] < 4000, '%d tokens' % d['tokens_generated'])]


# name, function, expectation, whether the HTTP victim must complete (the idle
# flood comes from the victim's own address: the per-peer cap refuses it too).
ATTACKS = [
    ('idle-http-flood', idle_http_flood, expect_idle_flood, False),
    ('body-trickle', body_trickle, expect_trickle, True),
    ('big-bodies', big_bodies, expect_big_bodies, True),
    ('tenant-reads-events', tenant_reads_events, expect_events, True),
    ('pool-stats', pool_stats, expect_pool_stats, True),
    ('replay-flood', replay_flood, expect_replay, True),
    ('many-sequences', many_sequences, expect_many_sequences, True),
    ('plain-disconnect', plain_disconnect, expect_disconnect, True),
    ('tenant-flood', tenant_flood, expect_tenant_flood, True),
]


# --- the run ------------------------------------------------------------------------

class Context:
    def __init__(self, cluster, params, replay_endpoint):
        self.cluster = cluster
        self.p = params
        self.replay_endpoint = replay_endpoint
        self.victims = Victims(self)
        self.victims_done = threading.Event()  # set when an attack's victims have run
        self.alone = {}

    @property
    def pid(self):
        return self.cluster.coordinator.proc.pid

    def stats(self):
        return self.cluster.stub.GetCacheStats(harness.pb.GetCacheStatsRequest(), metadata=md('o-1'), timeout=10)

    def wait_idle(self):
        t0 = time.monotonic()
        while time.monotonic() - t0 < DRAIN_LIMIT_S:
            try:
                st = self.stats()
                if st.running_requests == 0 and st.waiting_requests == 0:
                    return time.monotonic() - t0
            except Exception:  # noqa: BLE001 (the coordinator may be gone)
                pass
            time.sleep(0.1)
        return None


def guard_counts(cluster):
    try:
        m = harness.scrape_metrics(cluster.metrics_port)
    except Exception:  # noqa: BLE001
        return {}
    out = {e: m.value('chunkattn_http_guard_events_total', event=e)
           for e in ('refused_connection', 'refused_request', 'deadline', 'accept_error')}
    out['finished'] = m.value('chunkattn_requests_finished_total')
    out['finished_cancelled'] = m.value('chunkattn_requests_finished_total', reason='cancelled')
    return out


def log_size(cluster):
    try:
        return os.path.getsize(cluster.coordinator.log_path)
    except OSError:
        return 0


def log_since(cluster, offset, keep=40):
    try:
        with open(cluster.coordinator.log_path, 'rb') as f:
            f.seek(offset)
            lines = f.read().decode('utf-8', 'replace').splitlines()
    except OSError:
        return 0, []
    if len(lines) <= keep:
        return len(lines), lines
    return len(lines), lines[:keep // 2] + ['...'] + lines[-(keep // 2):]


def run_attack(ctx, name, fn, expect, http_victim_must):
    cluster = ctx.cluster
    drained_before = ctx.wait_idle()
    guard0, log0 = guard_counts(cluster), log_size(cluster)
    rss_before = rss_mib(ctx.pid)
    sampler = RssSampler(ctx.pid)
    engaged = threading.Event()
    holder = {}

    def body():
        try:
            holder['details'] = fn(ctx, engaged)
        except Exception as e:  # noqa: BLE001 (the harness's own failure: recorded, the run goes on)
            holder['details'] = dict(harness_error='%s: %s' % (type(e).__name__, e), outcome='harness error: %s' % e)
        finally:
            engaged.set()

    t0 = time.monotonic()
    ctx.victims_done.clear()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    engaged.wait(120)
    # Where the expectation is a TTFT ratio, medians of the same rounds as
    # the baseline: one stream's TTFT on 2 shared cores varies 3x alone.
    victims = ctx.victims.run_rounds(ctx.p['baseline_repeats'] if name in RATIO_ATTACKS else 1)
    ctx.victims_done.set()
    thread.join(300)
    attack_s = time.monotonic() - t0
    alive = cluster.coordinator.alive()
    ports = ports_check(cluster) if alive else {'grpc': None, 'http': None, 'metrics': None}
    time.sleep(1.0)  # settle: the RSS "after"
    rss_after = rss_mib(ctx.pid)
    rss_peak = sampler.stop()
    guard1 = guard_counts(cluster)
    lines, log = log_since(cluster, log0)
    details = holder.get('details', dict(outcome='the attack did not end within 300 s'))
    for v in victims.values():
        base = ctx.alone.get(v['front'])
        v['ttft_vs_alone'] = v['ttft_ms'] / base if v['ttft_ms'] and base else None
    r = dict(attack=name, seconds=attack_s, drained_before_s=drained_before, details=details, victims=victims,
             rss_before_mib=rss_before, rss_peak_mib=rss_peak, rss_after_mib=rss_after,
             rss_growth_mib=(rss_peak or 0) - (rss_before or 0), ports_serve_s=ports, coordinator_alive=alive,
             guard={k: guard1.get(k, 0) - guard0.get(k, 0) for k in guard0}, log_lines=lines, log=log)
    checks = [] if 'harness_error' in details else expect(r)
    if 'harness_error' in details:
        checks.append(('attack ran', False, details['harness_error']))
    checks.append(('coordinator alive', alive, ''))
    checks.append(('ports serve within %.0f s' % PORTS_WITHIN_S,
                   all(s is not None and s <= PORTS_WITHIN_S for s in ports.values()), str(ports)))
    g = victims.get('grpc', {})
    checks.append(('gRPC victim completed', bool(g.get('ok')), g.get('error') or ''))
    if http_victim_must:
        h = victims.get('http', {})
        checks.append(('HTTP victim completed', bool(h.get('ok')), h.get('error') or ''))
    r['http_victim_required'] = http_victim_must
    r['checks'] = [dict(check=c, passed=bool(ok), detail=d) for c, ok, d in checks]
    r['expectation_met'] = all(ok for _, ok, _ in checks)
    return r


def victim_cell(v, required=True):
    if not v:
        return '-'
    if not v['ok']:
        return '%s (%s)' % ('FAILED' if required else 'refused, not required:', v['error'] or 'incomplete')
    ratio = ' (%.1fx)' % v['ttft_vs_alone'] if v.get('ttft_vs_alone') else ''
    return 'ok, %.0f ms%s' % (v['ttft_ms'], ratio)


def ports_cell(ports):
    return ', '.join('%s %s' % (k, '%.2f s' % s if s is not None else 'DOWN') for k, s in ports.items())


def print_table(results, alone):
    print('\nvictims alone (TTFT, median): gRPC %.0f ms, HTTP %.0f ms' % (alone.get('grpc') or 0,
                                                                        alone.get('http') or 0))
    print('\n| attack | outcome | expectation | victim gRPC: TTFT (x alone) | victim HTTP | '
          'coordinator RSS MiB before / peak / after | ports serve again (gRPC, HTTP, metrics) |')
    print('|---|---|---|---|---|---|---|')
    for r in results:
        failed = [c['check'] for c in r['checks'] if not c['passed']]
        print('| %s | %s | %s | %s | %s | %.1f / %.1f / %.1f | %s |' % (
            r['attack'], r['details'].get('outcome', '').replace('|', '/'),
            'met' if not failed else 'FAILED: ' + '; '.join(failed),
            victim_cell(r['victims'].get('grpc')), victim_cell(r['victims'].get('http'), r['http_victim_required']),
            r['rss_before_mib'] or 0, r['rss_peak_mib'] or 0, r['rss_after_mib'] or 0, ports_cell(r['ports_serve_s'])))
    print('\nThe HTTP victim connects from 127.0.0.1 like the idle flood, so the per-address cap '
          '(--http_max_connections_per_peer) refuses it during that flood by design; it is required elsewhere.')
    for r in results:
        for c in r['checks']:
            if not c['passed']:
                print('FAILED %s: %s (%s)' % (r['attack'], c['check'], c['detail']))


def main():
    global harness, vllm
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--source', default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument('--build', default=None)
    p.add_argument('--short', action='store_true', help='a few seconds per attack, fewer connections (CI)')
    p.add_argument('--check', action='store_true', help='exit 1 if an attack\'s expectation failed')
    p.add_argument('--only', default='', help='comma-separated attack names (default: all)')
    p.add_argument('--json', default='')
    args = p.parse_args()
    args.build = os.path.abspath(args.build or os.path.join(args.source, 'build'))
    sys.path.insert(0, os.path.join(args.source, 'tests', 'services'))
    import harness as h  # noqa: E402 (from --source)
    harness = h
    harness.setup(args.source, args.build)
    import test_vllm_engine as tv  # noqa: E402
    vllm = tv
    vllm.generate_vllm_stubs(harness.SOURCE)
    params = SHORT if args.short else FULL
    only = [x for x in args.only.split(',') if x]
    unknown = set(only) - {a[0] for a in ATTACKS}
    if unknown:
        sys.exit('unknown attacks: %s' % ', '.join(sorted(unknown)))
    attacks = [a for a in ATTACKS if not only or a[0] in only]

    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 and hard > soft:  # the flood's client side needs its own descriptors
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))

    tokens = harness.token_file(TOKENS, 'chunkattn-attack-')
    pub = 'tcp://127.0.0.1:%d' % harness.free_port()
    replay = 'tcp://127.0.0.1:%d' % harness.free_port()
    cluster = harness.Cluster('attack', tp=1, coordinator_prefix=['prlimit', '--nofile=1024:1024', '--'],
                              coordinator_args=['--auth_token_file', tokens, '--served_model_name', MODEL,
                                                '--kv_events_endpoint', pub, '--kv_events_replay_endpoint', replay,
                                                # On 2 cores a step's cost grows with its rows: a quarter of the
                                                # batch (64 rows) keeps another tenant's first token within 3x.
                                                '--tenant_max_batch_share', '0.25'])
    sys.stderr.write('logs: %s%s\n' % (harness.log_dir(), '' if harness.keep_logs() else
                                         ' (removed at exit; CHUNKATTN_KEEP_TEST_LOGS=1 keeps them)'))
    t_start = time.monotonic()
    try:
        cluster.start()
        ctx = Context(cluster, params, replay)
        # Alone: the same pair of victim streams with no attack (the first run warms up, unmeasured).
        ctx.victims.run()
        alone = ctx.victims.run_rounds(params['baseline_repeats'])
        for front in ('grpc', 'http'):
            ctx.alone[front] = alone[front]['ttft_ms'] if alone[front]['ok'] else None
        idle_rss = rss_mib(ctx.pid)
        print('coordinator pid %d, RSS %.1f MiB idle; victims alone: gRPC TTFT %s ms, HTTP %s ms' % (
            ctx.pid, idle_rss, ctx.alone['grpc'], ctx.alone['http']), flush=True)
        baseline_failed = [(f, alone[f]['error']) for f in ('grpc', 'http') if not alone[f]['ok']]
        for front, error in baseline_failed:
            print('BASELINE FAILED: the %s victim alone: %s' % (front, error), flush=True)
        results = []
        for name, fn, expect, http_must in attacks:
            r = run_attack(ctx, name, fn, expect, http_must)
            results.append(r)
            print('%-20s %5.1f s  %s  %s' % (name, r['seconds'], 'met   ' if r['expectation_met'] else 'FAILED',
                                            r['details'].get('outcome', '')), flush=True)
            if not r['coordinator_alive']:
                print('the coordinator exited (%s): its log tail:\n%s' % (
                    cluster.coordinator.returncode(), cluster.coordinator.log_tail(30)), flush=True)
                cluster.stop()
                cluster.start()
        print_table(results, ctx.alone)
        total_s = time.monotonic() - t_start
        print('%d attacks in %.0f s; %d met their expectation' % (
            len(results), total_s, sum(r['expectation_met'] for r in results)))
        if args.json:
            doc = dict(machine_info(args.source, ' '.join([sys.executable] + sys.argv)), benchmark='attack',
                       nproc=len(os.sched_getaffinity(0)), mode='short' if args.short else 'full', params=params,
                       coordinator_binary_mtime=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(
                           os.path.getmtime(harness.bin_path('chunkattn-coordinator')))),
                       coordinator_nofile='1024:1024', victims_alone_ttft_ms=ctx.alone, rss_idle_mib=idle_rss,
                       seconds=total_s, attacks=results)
            write_result(args.json, doc)
        failed = [r['attack'] for r in results if not r['expectation_met']]
        if failed or baseline_failed:
            cluster.dump_logs()  # the processes' side of a failure (the logs go at exit)
        return 1 if args.check and (failed or baseline_failed) else 0
    finally:
        cluster.stop()


if __name__ == '__main__':
    sys.exit(main())
