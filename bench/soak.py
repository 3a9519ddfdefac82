#!/usr/bin/python3
"""Fault soak: a real TP=2 cluster on 127.0.0.1 under seeded Poisson load with
worker faults, and a ledger of every request checked against the
coordinator's own accounting.

Setup: two workers and a coordinator from tests/services/harness.py
(--step_timeout_s 3, so a hung worker is noticed fast; --max_kv_chunks 2048,
so a request can be too big for the pool).

Load: Poisson arrivals at --rate per second for --duration seconds, run by a
pool of client threads. The mix: shared system prompts with distinct
questions (as text and as token ids, in a few namespaces), n > 1, stop
strings and stop token ids, logprobs, priorities, client cancels after a few
responses, gRPC deadlines short enough that some expire, and hostile requests
(bad sampling values, prompts over the context, token ids outside the
vocabulary, empty prompts, n too large, text over the byte bound, long
namespaces, a body that is not a message, a request the KV pool can never
hold...) that must get exactly their code and harm nothing else.

Faults, on a schedule scaled to --duration, after a warm-up (the first 20%):
at 30% one worker is SIGKILLed and started again a few seconds later on the
same port with the same argv (as Kubernetes restarts a pod); at 60% one
worker is SIGSTOPped for a few seconds, then SIGCONTed. Recovery is the first
probe request that succeeds afterwards.

Checks (exit status 1 with one line per failed check, 0 when all pass):
  outcomes     every request ends with exactly one terminal outcome: OK with
               each of its n samples finished exactly once (nothing after
               it, usage matching what was streamed), or one gRPC status
  bounded      no request outlives its deadline by more than --slack_s;
               nothing without a short deadline gets DEADLINE_EXCEEDED
  fault_free   a request whose lifetime misses every fault window (fault to
               recovery plus --grace_s) gets what its kind must get: OK,
               CANCELLED for a client cancel, OK or DEADLINE_EXCEEDED for a
               short deadline; in a window UNAVAILABLE is allowed as well
  hostile      hostile requests get exactly their code (UNAVAILABLE allowed
               only in a fault window)
  faults       both faults were injected and each was followed by a served
               probe within --recovery_timeout_s (else every process's
               thread stacks are printed, with gdb)
  recovered    afterwards every process is alive, health is SERVING, a probe
               is served, and GetCacheStats has 0 used chunks, 0 running and
               0 waiting requests
  rss          the coordinator's RSS after the load (idle) is at most 10%
               (--rss_tolerance) and --rss_slack_mib (default 0) over its
               level at the end of the warm-up (medians of samples taken
               every second through the run)
  metrics      chunkattn_requests_finished_total by reason (delta over the
               run) equals the ledger: each request is counted once, under
               the reason its stream ended with, cancelled for a client
               cancel or an expired deadline, error when a worker failure
               ended it, not at all when refused before it was admitted; the
               few outcomes the client cannot tell apart (a deadline racing
               the last token, a cancel racing a fault) may count under any
               reason they allow: the check is that one assignment makes
               every count equal. Also request_duration_seconds_count equals
               the finished total, and generation_tokens_total lies between
               the tokens streamed and the most that could have been made.

It prints a table; --json PATH writes the machine, the commit, the command,
every count, the fault times, the RSS samples and each check's result.

  /usr/bin/python3 bench/soak.py --duration 60 [--build DIR] [--json PATH]

The ctest services_soak runs the 60 s version (bench/README.md, "fault soak").
"""
import argparse
import collections
import concurrent.futures
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

import grpc

from run_info import machine_info, write_result  # bench/, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))

harness = None  # tests/services/harness.py, imported in main() from --source

FINISH_LABELS = {1: 'length', 2: 'stop_token', 3: 'stop_string', 4: 'cancelled'}
REASONS = ('length', 'stop_token', 'stop_string', 'cancelled', 'error')
FINISHED = frozenset(('length', 'stop_token', 'stop_string'))
NONE = 'none'  # refused before admission: not counted
EOS_IDS = set()  # the model's, from GetModelInfo

WORDS = ('the of and to in is was for on that with as by at from his her be it an are had not this which '
         'or have one all were they but their been has more when will would who so no out if up what about '
         'time there can into only other new some could these two may first then do any like my now over '
         'such our man me even most made after also did many before must through back years where much your '
         'way well down should because each just those people how too little state good very make world still '
         'own see men work long get here between both life being under never day same another know while last '
         'might us great old year off come since against go came right used take three states himself few house '
         'use during without again place american around however home small found thought went say part once '
         'general high upon school every does got united left number course war until always away something fact '
         'though water less public put think almost hand enough far took head yet government system better set '
         'told nothing night end why called didn find going look asked later knew point next program city business '
         'give group toward young days let room president side social given present several order national second '
         'possible rather per face among form important often things looked early white case john become large '
         'big need four within felt along children saw best church ever least power development light thing seemed '
         'family interest want members mind country area others done turned although open god service certain kind '
         'problem began different door thus help sense means whole matter perhaps itself york times law human line '
         'above name example action company hands local show whether five history gave today either act feet across '
         'taken past quite anything seen having death week experience body word half really field am car words').split()


def words(rng, n):
    return ' '.join(rng.choice(WORDS) for _ in range(n))


# --- the workload ------------------------------------------------------------

class Spec:
    """One request to send: what, when, and what it may end with."""

    def __init__(self, idx, kind, at, timeout, fields=None, raw=None, cancel_after=None, expect=None,
                 variant=None, n=1, max_new_tokens=16, stops=(), short_deadline=False, seed=None):
        self.idx = idx
        self.kind = kind              # shared / samples / stop / plain / cancel / deadline / hostile / probe
        self.at = at                  # seconds after the load started
        self.timeout = timeout        # the gRPC deadline, seconds
        self.fields = fields or {}    # harness.make_request's arguments
        self.raw = raw                # bytes sent as the body instead (not a message)
        self.cancel_after = cancel_after
        self.expect = expect          # a hostile request's code ('OK' for a valid one)
        self.variant = variant        # which hostile request
        self.n = max(1, n)
        self.max_new_tokens = max_new_tokens
        self.stops = list(stops)
        self.short_deadline = short_deadline
        self.seed = seed


class Workload:
    """Seeded: the same --seed gives the same arrivals and requests."""

    def __init__(self, args, info, system_prompts, system_ids):
        self.args = args
        self.rng = random.Random(args.seed)
        self.vocab = info.vocab_size
        self.context = info.max_context
        self.system_prompts = system_prompts
        self.system_ids = system_ids
        self.namespaces = ['', 'tenant-a', 'tenant-b']
        limit = self.context * 32  # the coordinator's byte bound on text (32 bytes per token of context)
        prose = ('It was the best of times, it was the worst of times; ' * (limit // 50 + 1))[:limit]
        self.hostile_variants = self._hostile(limit, prose)
        self.hostile_made = 0
        self.kinds = [('shared', 34), ('samples', 10), ('stop', 10), ('plain', 12), ('cancel', 8),
                      ('deadline', 10), ('hostile', 16)]

    def _hostile(self, limit, prose):
        """(name, expected code, make_request fields or raw bytes)."""
        ok = [5, 6, 7, 8]
        mnt = dict(max_new_tokens=4)
        return [
            ('text_1mib', 'INVALID_ARGUMENT', dict(text='y' * (1 << 20), max_new_tokens=1)),
            ('text_over_byte_bound', 'INVALID_ARGUMENT', dict(text=prose + 'x', max_new_tokens=1)),
            ('text_over_context', 'INVALID_ARGUMENT', dict(text=prose, max_new_tokens=1)),
            ('never_fits_the_pool', 'RESOURCE_EXHAUSTED', dict(prompt_ids=[7] * 50, n=64, max_new_tokens=3000,
                                                               ignore_eos=True)),
            ('not_a_message', 'INVALID_ARGUMENT', b'\xff\xff\xff\xff\x0f not a protobuf'),
            ('repetition_penalty_1e-38', 'OK', dict(text='hello world hello hello world hello',
                                                    repetition_penalty=1e-38, max_new_tokens=8, ignore_eos=True)),
            ('repetition_penalty_0', 'INVALID_ARGUMENT', dict(prompt_ids=ok, repetition_penalty=0.0, **mnt)),
            ('repetition_penalty_inf', 'INVALID_ARGUMENT', dict(prompt_ids=ok, repetition_penalty=float('inf'),
                                                                **mnt)),
            ('temperature_nan', 'INVALID_ARGUMENT', dict(prompt_ids=ok, temperature=float('nan'), **mnt)),
            ('temperature_negative', 'INVALID_ARGUMENT', dict(prompt_ids=ok, temperature=-1.0, **mnt)),
            ('top_p_0', 'INVALID_ARGUMENT', dict(prompt_ids=ok, top_p=0.0, **mnt)),
            ('min_p_2', 'INVALID_ARGUMENT', dict(prompt_ids=ok, min_p=2.0, **mnt)),
            ('top_k_negative', 'INVALID_ARGUMENT', dict(prompt_ids=ok, top_k=-5, **mnt)),
            ('max_new_tokens_over_context', 'INVALID_ARGUMENT', dict(prompt_ids=[5] * 100,
                                                                     max_new_tokens=self.context)),
            ('prompt_over_context', 'INVALID_ARGUMENT', dict(prompt_ids=[5] * (self.context + 1), max_new_tokens=1)),
            ('max_new_tokens_0', 'INVALID_ARGUMENT', dict(prompt_ids=ok, max_new_tokens=0)),
            ('token_id_over_vocab', 'INVALID_ARGUMENT', dict(prompt_ids=[5, 999999, 6], **mnt)),
            ('token_id_negative', 'INVALID_ARGUMENT', dict(prompt_ids=[5, -1], **mnt)),
            ('stop_token_id_over_vocab', 'INVALID_ARGUMENT', dict(prompt_ids=ok, stop_token_ids=[self.vocab], **mnt)),
            ('empty_token_ids', 'INVALID_ARGUMENT', dict(prompt_ids=[], **mnt)),
            ('empty_text', 'INVALID_ARGUMENT', dict(text='', **mnt)),
            ('no_prompt', 'INVALID_ARGUMENT', dict(**mnt)),
            ('n_65', 'INVALID_ARGUMENT', dict(prompt_ids=ok, n=65, **mnt)),
            ('n_1000', 'INVALID_ARGUMENT', dict(prompt_ids=ok, n=1000, **mnt)),
            ('priority_over_bound', 'INVALID_ARGUMENT', dict(prompt_ids=ok, priority=1000001, **mnt)),
            ('priority_int_max', 'INVALID_ARGUMENT', dict(prompt_ids=ok, priority=2**31 - 1, **mnt)),
            ('namespace_257_bytes', 'INVALID_ARGUMENT', dict(prompt_ids=ok, namespace='n' * 257, **mnt)),
            ('request_id_300_bytes', 'INVALID_ARGUMENT', dict(prompt_ids=ok, request_id='r' * 300, **mnt)),
            ('odd_namespace', 'OK', dict(prompt_ids=ok, namespace='\x00\u2603\uffff' * 20, temperature=0.0,
                                         max_new_tokens=3, ignore_eos=True)),
            ('stop_17_strings', 'INVALID_ARGUMENT', dict(prompt_ids=ok, stop=['s%d' % i for i in range(17)], **mnt)),
            ('stop_empty_string', 'INVALID_ARGUMENT', dict(prompt_ids=ok, stop=[''], **mnt)),
            ('stop_257_bytes', 'INVALID_ARGUMENT', dict(prompt_ids=ok, stop=['x' * 257], **mnt)),
        ]

    def question(self):
        return words(self.rng, self.rng.randint(5, 20)) + '?'

    def make(self, idx, kind, at):
        rng, a = self.rng, self.args
        timeout = a.request_timeout_s
        priority = rng.choice([0, 0, 0, -10, 5, 100])
        if kind == 'hostile':
            # Each variant once first (the warm-up sees them all), then at random.
            h = self.hostile_made
            self.hostile_made += 1
            name, expect, body = self.hostile_variants[h] if h < len(self.hostile_variants) else \
                rng.choice(self.hostile_variants)
            if isinstance(body, bytes):
                return Spec(idx, kind, at, timeout, raw=body, expect=expect, variant=name)
            return Spec(idx, kind, at, timeout, fields=dict(body), expect=expect, variant=name,
                        n=body.get('n', 1) or 1, max_new_tokens=body.get('max_new_tokens', 16),
                        stops=body.get('stop', ()))
        if kind == 'plain':
            n_prompt = rng.randint(8, 200)
            fields = dict(prompt_ids=[rng.randrange(3, self.vocab) for _ in range(n_prompt)],
                          namespace='plain-%d' % idx, temperature=rng.choice([0.0, 0.7, 1.0]),
                          max_new_tokens=rng.randint(4, 48), seed=rng.randrange(1 << 32), priority=priority,
                          logprobs=rng.random() < 0.5, top_k=rng.choice([None, 0, 20]),
                          top_p=rng.choice([None, 0.9]), min_p=rng.choice([None, 0.05]))
            if rng.random() < 0.4:  # 30 of 2,048 ids: some samples end on one
                fields['stop_token_ids'] = [rng.randrange(3, self.vocab) for _ in range(30)]
            return Spec(idx, kind, at, timeout, fields=fields, max_new_tokens=fields['max_new_tokens'])
        # The shared-prefix kinds: a system prompt and a question, as text or as ids.
        s = rng.randrange(len(self.system_prompts))
        namespace = rng.choice(self.namespaces)
        q = self.question()
        as_text = rng.random() < 0.5 or kind == 'stop'
        fields = dict(namespace=namespace, priority=priority, seed=rng.randrange(1 << 32),
                      temperature=rng.choice([0.0, 0.8, 1.0]))
        if as_text:
            fields['text'] = self.system_prompts[s] + q
        else:
            q_ids = [rng.randrange(3, self.vocab) for _ in range(rng.randint(4, 40))]
            fields['prompt_ids'] = self.system_ids[s] + q_ids
        n, stops, cancel_after, short = 1, [], None, False
        if kind == 'shared':
            fields['max_new_tokens'] = rng.randint(4, 48)
            fields['logprobs'] = rng.random() < 0.3
        elif kind == 'samples':
            n = rng.randint(2, 4)
            fields.update(n=n, max_new_tokens=rng.randint(4, 24), temperature=1.0)
        elif kind == 'stop':
            stops = rng.sample([' the', 'e ', '.', 'ing', '\n', 'a', 'zq', 'of '], rng.randint(1, 3))
            if rng.random() < 0.1:
                stops = ['%c%c' % (rng.choice('abcdefghij'), rng.choice('abcdefghij')) for _ in range(16)]
            fields.update(stop=stops, max_new_tokens=rng.randint(8, 64), temperature=rng.choice([0.7, 1.0]))
        elif kind == 'cancel':
            # Long enough that the cancel always comes before the end.
            fields.update(max_new_tokens=rng.randint(400, 1500), ignore_eos=True)
            cancel_after = rng.randint(1, 5)
        elif kind == 'deadline':
            fields.update(max_new_tokens=rng.randint(60, 300), ignore_eos=True)
            timeout = round(rng.uniform(a.deadline_min_s, a.deadline_max_s), 2)
            short = True
        return Spec(idx, kind, at, timeout, fields=fields, cancel_after=cancel_after, n=n,
                    max_new_tokens=fields['max_new_tokens'], stops=stops, short_deadline=short)

    def arrivals(self):
        """Poisson arrivals over the duration; the first ones cover every kind
        and every hostile variant once, one in two hostile (so the warm-up
        has seen them all: the largest bodies come first)."""
        t, idx, specs = 0.0, 0, []
        names, weights = zip(*self.kinds)
        normal = [k for k in names if k != 'hostile']
        first = []
        for i in range(len(self.hostile_variants)):
            first += ['hostile', normal[i % len(normal)]]
        while True:
            t += self.rng.expovariate(self.args.rate)
            if t >= self.args.duration:
                return specs
            kind = first[idx] if idx < len(first) else self.rng.choices(names, weights)[0]
            specs.append(self.make(idx, kind, t))
            idx += 1


# --- the ledger --------------------------------------------------------------

class Record:
    """What the client saw of one request."""

    def __init__(self, spec):
        self.spec = spec
        self.sent = None
        self.ended = None
        self.code = None            # 'OK' or a grpc.StatusCode name
        self.details = ''
        self.responses = 0
        self.samples = {}           # index -> dict(tokens, text, finish, finishes, logprobs, usage, after)
        self.last_reason = None     # the last finish reason streamed (the coordinator's label for OK)
        self.cancel_result = None   # what call.cancel() returned
        self.problems = []          # malformed stream
        self.in_window = True       # overlaps a fault window (set by check())

    def on_response(self, r):
        self.responses += 1
        s = self.samples.setdefault(r.index, dict(tokens=0, text='', finish=0, finishes=0, logprobs=0,
                                                  completion=None, after=0, last=None))
        if r.index >= self.spec.n:
            self.problems.append('sample index %d >= n = %d' % (r.index, self.spec.n))
        if s['finishes']:
            s['after'] += 1
        s['tokens'] += len(r.token_ids)
        if r.token_ids:
            s['last'] = r.token_ids[-1]
        s['text'] += r.text
        s['logprobs'] += len(r.logprobs)
        if r.finish_reason != 0:
            s['finishes'] += 1
            s['finish'] = r.finish_reason
            s['completion'] = r.usage.completion_tokens
            self.last_reason = r.finish_reason

    def all_finished(self):
        return len(self.samples) == self.spec.n and all(s['finishes'] >= 1 for s in self.samples.values())

    def well_formed(self):
        """Problems with the stream itself (any outcome)."""
        out = list(self.problems)
        want_logprobs = self.spec.fields.get('logprobs', False)
        for i, s in sorted(self.samples.items()):
            if s['finishes'] > 1:
                out.append('sample %d got %d finish reasons' % (i, s['finishes']))
            if s['after']:
                out.append('sample %d got %d responses after its finish' % (i, s['after']))
            if s['finishes'] and s['completion'] != s['tokens']:
                out.append('sample %d: usage.completion_tokens %s, %d tokens streamed' % (i, s['completion'],
                                                                                             s['tokens']))
            if s['finish'] == 1 and s['tokens'] != self.spec.max_new_tokens:
                out.append('sample %d finished LENGTH after %d of max_new_tokens %d' % (i, s['tokens'],
                                                                                         self.spec.max_new_tokens))
            stoppers = set(self.spec.fields.get('stop_token_ids', ())) | (
                set() if self.spec.fields.get('ignore_eos') else EOS_IDS)
            if s['finish'] == 2 and s['last'] not in stoppers:
                out.append('sample %d finished STOP_TOKEN on token %s, not a stop token' % (i, s['last']))
            if s['finishes'] and s['tokens'] > self.spec.max_new_tokens:
                out.append('sample %d: %d tokens > max_new_tokens %d' % (i, s['tokens'], self.spec.max_new_tokens))
            if want_logprobs and s['logprobs'] != s['tokens']:
                out.append('sample %d: %d logprobs for %d tokens' % (i, s['logprobs'], s['tokens']))
            if s['finish'] == 3:
                found = [x for x in self.spec.stops if x in s['text']]
                if found:
                    out.append('sample %d stopped on a stop string but its text contains %r' % (i, found))
        if self.code == 'OK' and not self.all_finished():
            out.append('OK with samples %s finished of n = %d' % (
                sorted(i for i, s in self.samples.items() if s['finishes']), self.spec.n))
        if self.code not in ('OK', 'CANCELLED', 'DEADLINE_EXCEEDED') and self.samples and self.all_finished():
            out.append('every sample finished, then the call ended %s' % self.code)
        return out

    def allowed_labels(self):
        """The reasons under which the coordinator may have counted this request
        in chunkattn_requests_finished_total ('none': not counted). 'error'
        (a step failed) only where the request overlapped a fault window."""
        code = self.code
        failure = {'error'} if self.in_window else set()
        if code == 'OK':
            return {FINISH_LABELS.get(self.last_reason, '?')}
        if code in ('INVALID_ARGUMENT', 'RESOURCE_EXHAUSTED'):
            return {NONE}  # refused before admission (validation, the queue, the pool)
        if code == 'UNAVAILABLE':
            if self.responses or re.match(r'(worker |a worker failed)', self.details):
                return {'error'}  # admitted, then ended by a worker failure (the pool's message)
            if 'not ready' in self.details or 'shutting down' in self.details:
                return {NONE}  # refused before admission
            return {NONE, 'error'}
        if code == 'CANCELLED' and self.spec.cancel_after is not None:
            # Admitted (it streamed); the cancel ends it, unless a failure did first.
            return {'cancelled'} | failure if self.responses else {'cancelled', NONE} | failure
        if code == 'DEADLINE_EXCEEDED':
            if self.samples and self.all_finished():
                return {FINISH_LABELS.get(self.last_reason, '?')}  # finished; the status came late
            # Expired while admitted (cancelled), or racing its last token, or
            # before admission (not counted) if nothing was streamed.
            labels = {'cancelled'} | FINISHED | failure
            return labels if self.responses else labels | {NONE}
        return set(REASONS) | {NONE}

    def to_json(self):
        s = self.spec
        return dict(idx=s.idx, kind=s.kind, variant=s.variant, at=round(s.at, 3),
                    sent=None if self.sent is None else round(self.sent, 3),
                    ended=None if self.ended is None else round(self.ended, 3), timeout=s.timeout,
                    code=self.code, details=self.details[:200], responses=self.responses,
                    finishes={str(i): v['finish'] for i, v in self.samples.items()})


# --- running it --------------------------------------------------------------

class Soak:

    def __init__(self, args):
        self.args = args
        self.cluster = None
        self.t0 = None
        self.records = []
        self.records_lock = threading.Lock()
        self.faults = []  # dicts: kind, rank, at, end_at (restart/SIGCONT), recovered
        self.rss = []     # (t, kB)
        self.health = []  # (t, status) on changes
        self.stop_sampling = threading.Event()
        self.channels = []
        self.stubs = []
        self.raw_generate = []

    def now(self):
        return time.monotonic() - self.t0

    # Cluster.
    def start_cluster(self):
        a = self.args
        self.cluster = harness.Cluster('soak', tp=2, coordinator_args=[
            '--step_timeout_s', str(a.step_timeout_s), '--max_kv_chunks', str(a.max_kv_chunks)])
        self.cluster.start()
        for _ in range(4):
            ch = self.cluster.open_channel()
            self.channels.append(ch)
            self.stubs.append(harness.pb_grpc.GenerationStub(ch))
            self.raw_generate.append(ch.unary_stream('/chunkattn.v1.Generation/Generate',
                                                     request_serializer=lambda x: x,
                                                     response_deserializer=harness.pb.GenerateResponse.FromString))

    def coordinator_rss_kb(self):
        try:
            with open('/proc/%d/status' % self.cluster.coordinator.proc.pid) as f:
                return int(re.search(r'VmRSS:\s+(\d+) kB', f.read()).group(1))
        except (OSError, AttributeError):
            return None

    def sampler(self):
        """RSS every second, health every half second (changes only)."""
        channel = self.cluster.open_channel()
        last, tick = None, 0
        try:
            while not self.stop_sampling.is_set():
                if tick % 2 == 0:
                    kb = self.coordinator_rss_kb()
                    if kb is not None:
                        self.rss.append((round(self.now(), 2), kb))
                h = harness.health(channel, timeout=0.4)
                if h != last:
                    self.health.append((round(self.now(), 2), h))
                    last = h
                tick += 1
                self.stop_sampling.wait(0.5)
        finally:
            channel.close()

    # Requests.
    def run_one(self, spec):
        rec = Record(spec)
        k = spec.idx % len(self.stubs)
        rec.sent = self.now()
        call = None
        try:
            if spec.raw is not None:
                call = self.raw_generate[k](spec.raw, timeout=spec.timeout)
            else:
                call = self.stubs[k].Generate(harness.make_request(**spec.fields), timeout=spec.timeout)
            for r in call:
                rec.on_response(r)
                if spec.cancel_after is not None and rec.cancel_result is None and rec.responses >= spec.cancel_after:
                    rec.cancel_result = call.cancel()
            rec.code = 'OK'
        except grpc.RpcError as e:
            rec.code = e.code().name if e.code() is not None else 'UNKNOWN'
            rec.details = e.details() or ''
        except Exception as e:  # noqa: BLE001 (a client bug is a failed request, not a dead thread)
            rec.code = 'CLIENT_ERROR'
            rec.details = repr(e)
        rec.ended = self.now()
        with self.records_lock:
            self.records.append(rec)
        return rec

    def probe(self, timeout=10.0):
        """A short greedy request, in the ledger as kind 'probe'; True if served."""
        spec = Spec(-1, 'probe', self.now(), timeout,
                    fields=dict(prompt_ids=[5, 6, 7, 8, 9], temperature=0.0, max_new_tokens=4, ignore_eos=True),
                    max_new_tokens=4)
        with self.records_lock:
            spec.idx = -1 - sum(1 for r in self.records if r.spec.kind == 'probe')
        return self.run_one(spec).code == 'OK'

    def dispatcher(self, specs, pool, futures, done):
        for spec in specs:
            delay = spec.at - self.now()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(self.run_one, spec))
        done.set()

    # Faults (from the main thread: the harness starts processes there only).
    def wait_until(self, t):
        while self.now() < t:
            time.sleep(min(0.1, t - self.now()))

    def recover(self, fault):
        deadline = time.monotonic() + self.args.recovery_timeout_s
        while time.monotonic() < deadline:
            if harness.health(self.cluster.channel, timeout=1.0) == harness.SERVING and self.probe():
                fault['recovered'] = round(self.now(), 3)
                return True
            time.sleep(0.3)
        fault['recovered'] = None
        self.dump_stacks('no recovery %.0f s after the %s' % (self.args.recovery_timeout_s, fault['kind']))
        return False

    def dump_stacks(self, why):
        """Every thread's stack of every process (gdb, if installed), to stderr:
        what a hang looks like from inside."""
        gdb = shutil.which('gdb')
        sys.stderr.write('\n===== %s: thread stacks =====\n' % why)
        if gdb is None:
            sys.stderr.write('(gdb is not installed)\n')
            return
        for p in self.cluster.processes():
            if not p.alive():
                continue
            try:
                r = subprocess.run([gdb, '-p', str(p.proc.pid), '-batch', '-ex', 'thread apply all bt'],
                                   capture_output=True, text=True, timeout=60)
                text = '\n'.join(line for line in r.stdout.splitlines() if line.startswith(('#', 'Thread')))
            except (OSError, subprocess.SubprocessError) as e:
                text = repr(e)
            sys.stderr.write('----- %s (pid %d) -----\n%s\n' % (p.name, p.proc.pid, text))
        sys.stderr.flush()

    def inject_faults(self):
        a, c = self.args, self.cluster
        d = a.duration
        self.wait_until(0.3 * d)
        fault = dict(kind='SIGKILL', rank=a.kill_rank, at=round(self.now(), 3))
        self.faults.append(fault)
        c.kill_worker(a.kill_rank)
        self.wait_until(fault['at'] + a.restart_after_s)
        c.start_worker(a.kill_rank)  # the same port and argv
        fault['end_at'] = round(self.now(), 3)
        self.recover(fault)

        self.wait_until(0.6 * d)
        fault = dict(kind='SIGSTOP', rank=a.stop_rank, at=round(self.now(), 3))
        self.faults.append(fault)
        proc = c.workers[a.stop_rank].proc
        proc.send_signal(signal.SIGSTOP)
        try:
            self.wait_until(fault['at'] + a.stop_for_s)
        finally:
            proc.send_signal(signal.SIGCONT)
        fault['end_at'] = round(self.now(), 3)
        self.recover(fault)

    def windows(self):
        end = self.now() + 1e9
        return [(f['at'], (f['recovered'] if f.get('recovered') is not None else end) + self.args.grace_s)
                for f in self.faults]

    def run(self):
        a = self.args
        info = self.cluster.model_info()
        EOS_IDS.update(info.eos_token_ids)
        rng = random.Random(a.seed ^ 0x5EED)
        system_prompts = ['You are assistant %d. %s.\n' % (i, words(rng, rng.randint(250, 400)))
                          for i in range(a.system_prompts)]
        system_ids = [list(self.stubs[0].Tokenize(harness.pb.TokenizeRequest(text=p), timeout=60).token_ids)
                      for p in system_prompts]
        workload = Workload(a, info, system_prompts, system_ids)
        specs = workload.arrivals()
        self.before = self.cluster.metrics()
        self.t0 = time.monotonic()
        sampler = threading.Thread(target=self.sampler, daemon=True)
        sampler.start()
        futures, dispatched = [], threading.Event()
        pool = concurrent.futures.ThreadPoolExecutor(a.clients, thread_name_prefix='client')
        dispatcher = threading.Thread(target=self.dispatcher, args=(specs, pool, futures, dispatched), daemon=True)
        dispatcher.start()
        try:
            self.inject_faults()
        finally:
            # Whatever happened, the workers run again before the load ends.
            for w in self.cluster.workers:
                if w is not None and w.alive():
                    w.proc.send_signal(signal.SIGCONT)
        dispatched.wait(a.duration + 60)
        self.load_end = round(self.now(), 3)
        # Every call has a gRPC deadline: waiting for the longest is bounded.
        bound = max([s.timeout for s in specs] + [10.0]) + a.slack_s + 30
        done, not_done = concurrent.futures.wait(futures, timeout=bound)
        # Still queued: every client thread was busy with earlier requests
        # (only when requests hang): never sent. Running: a call that
        # outlived its own deadline.
        self.not_sent = sum(1 for f in not_done if f.cancel())
        self.unfinished = len(not_done) - self.not_sent
        pool.shutdown(wait=not self.unfinished, cancel_futures=True)
        self.drained_at = round(self.now(), 3)
        self.specs = specs
        self.after_load()
        self.stop_sampling.set()
        sampler.join(5)

    def after_load(self):
        """The cluster healthy again: health, a probe, an idle cache, the final
        RSS and the metrics' scrape (once the counters have settled)."""
        c, a = self.cluster, self.args
        self.alive = {p.name: p.alive() for p in c.processes()}
        self.final_health = None
        try:
            c.wait_health(harness.SERVING, timeout=a.recovery_timeout_s, check_alive=False)
            self.final_health = harness.SERVING
        except AssertionError:
            self.final_health = harness.health(c.channel)
        self.final_probe = self.probe(timeout=15)
        self.stats = None

        def quiet():
            try:
                s = c.cache_stats()
            except grpc.RpcError:
                return None
            self.stats = s
            return s.used_chunks == 0 and s.running_requests == 0 and s.waiting_requests == 0

        try:
            harness.wait_for(quiet, 30, interval=0.25, what='an idle cache')
        except AssertionError:
            pass
        # The counters move when a request ends on the coordinator, a moment
        # after a cancelled client has given up: wait until they hold still.
        last, self.after = None, None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.metrics()
            total = tuple(m.value('chunkattn_requests_finished_total', reason=r) for r in REASONS)
            if total == last:
                self.after = m
                break
            last = total
            time.sleep(1.0)
        if self.after is None:
            self.after = c.metrics()
        # Final RSS: idle, after everything ended.
        samples = []
        for _ in range(a.rss_final_samples):
            time.sleep(1.0)
            kb = self.coordinator_rss_kb()
            if kb is not None:
                samples.append(kb)
                self.rss.append((round(self.now(), 2), kb))
        self.rss_final_samples = samples


# --- checks ------------------------------------------------------------------

def max_flow(capacity, source, sink):
    """Edmonds-Karp on a dict-of-dicts capacity graph (tiny graphs only)."""
    flow = 0
    residual = {u: dict(vs) for u, vs in capacity.items()}
    for u, vs in capacity.items():
        for v in vs:
            residual.setdefault(v, {}).setdefault(u, 0)
    while True:
        parent = {source: None}
        queue = collections.deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v, cap in residual[u].items():
                if cap > 0 and v not in parent:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            return flow
        v, push = sink, float('inf')
        while parent[v] is not None:
            push = min(push, residual[parent[v]][v])
            v = parent[v]
        v = sink
        while parent[v] is not None:
            residual[parent[v]][v] -= push
            residual[v][parent[v]] += push
            v = parent[v]
        flow += push


def metrics_feasible(records, deltas):
    """Can each request be given one of its allowed reasons so that the
    counts per reason are exactly the coordinator's deltas? Returns
    (ok, certain counts, ambiguous groups, message)."""
    certain = collections.Counter()
    groups = collections.Counter()
    for r in records:
        labels = frozenset(r.allowed_labels())
        if len(labels) == 1:
            certain[next(iter(labels))] += 1
        else:
            groups[labels] += 1
    excess = {label: deltas[label] - certain[label] for label in REASONS}
    if any(v < 0 for v in excess.values()):
        return False, certain, groups, 'the coordinator counted fewer than the ledger: %s' % {
            k: v for k, v in excess.items() if v < 0}
    total = sum(groups.values())
    spare = total - sum(excess.values())
    if spare < 0:
        return False, certain, groups, ('the coordinator counted %d more than the ledger can explain '
                                        '(ambiguous requests: %d)' % (-spare, total))
    graph = {'s': {}, NONE: {'t': spare}}
    for label in REASONS:
        graph[label] = {'t': excess[label]}
    for i, (labels, count) in enumerate(groups.items()):
        node = 'g%d' % i
        graph['s'][node] = count
        graph[node] = {label: count for label in labels}
    graph['t'] = {}
    ok = max_flow(graph, 's', 't') == total
    return ok, certain, groups, '' if ok else 'no assignment of the ambiguous requests matches the counts'


def overlaps(rec, windows):
    return any(rec.sent <= end and rec.ended >= start for start, end in windows)


def allowed_codes(rec, in_window):
    s = rec.spec
    if s.kind == 'hostile':
        codes = {s.expect}
    elif s.kind == 'cancel':
        codes = {'CANCELLED'}
    elif s.short_deadline:
        codes = {'OK', 'DEADLINE_EXCEEDED'}
    else:
        codes = {'OK'}
    if in_window:
        codes.add('UNAVAILABLE')
    return codes


def check(soak):
    a = soak.args
    records = soak.records
    load = [r for r in records if r.spec.kind != 'probe']
    results = []  # (name, ok, message)

    def add(name, ok, message):
        results.append(dict(name=name, ok=bool(ok), message=message))

    windows = soak.windows()
    for r in records:
        r.in_window = overlaps(r, windows)

    # Every request sent ended once, each with one outcome.
    problems = []
    sent_ids = [r.spec.idx for r in load]
    if soak.unfinished:
        problems.append('%d requests never ended' % soak.unfinished)
    if soak.not_sent:
        problems.append('%d requests never sent: all %d client threads were waiting on earlier ones' % (
            soak.not_sent, a.clients))
    if len(load) + soak.not_sent != len(soak.specs) or len(set(sent_ids)) != len(sent_ids):
        problems.append('%d requests scheduled, %d ledger entries (%d distinct), %d not sent' % (
            len(soak.specs), len(load), len(set(sent_ids)), soak.not_sent))
    for r in records:
        for p in r.well_formed():
            problems.append('request %d (%s%s): %s' % (r.spec.idx, r.spec.kind,
                                                        '/' + r.spec.variant if r.spec.variant else '', p))
        if r.code == 'CLIENT_ERROR':
            problems.append('request %d: the client failed: %s' % (r.spec.idx, r.details))
    add('outcomes', not problems, '; '.join(problems[:10]) or '%d requests, one terminal outcome each' % len(records))

    # Bounded: deadlines are kept; nothing else hits one.
    late, hung = [], []
    for r in records:
        if r.ended - r.sent > r.spec.timeout + a.slack_s:
            late.append('request %d (%s) took %.1f s with a %.1f s deadline' % (r.spec.idx, r.spec.kind,
                                                                                r.ended - r.sent, r.spec.timeout))
        if r.code == 'DEADLINE_EXCEEDED' and not r.spec.short_deadline:
            hung.append('request %d (%s) hit its %.0f s deadline (hung)' % (r.spec.idx, r.spec.kind, r.spec.timeout))
    add('bounded', not late and not hung, '; '.join((late + hung)[:10]) or
        'every request ended within its deadline + %.1f s' % a.slack_s)

    # Outcomes by kind, outside and inside the fault windows.
    bad, hostile_bad = [], []
    outside = collections.Counter()
    for r in records:
        in_window = r.in_window
        if not in_window:
            outside[r.code] += 1
        if r.code not in allowed_codes(r, in_window):
            line = 'request %d (%s%s) %s %s at %.1f-%.1f s: %s' % (
                r.spec.idx, r.spec.kind, '/' + r.spec.variant if r.spec.variant else '',
                'in a fault window' if in_window else 'outside the fault windows', r.code, r.sent, r.ended,
                r.details[:120])
            (hostile_bad if r.spec.kind == 'hostile' else bad).append(line)
    n_out = sum(outside.values())
    add('fault_free', not bad, '; '.join(bad[:10]) or
        '%d requests outside the fault windows got what their kind must get' % n_out)
    n_hostile = sum(1 for r in records if r.spec.kind == 'hostile')
    add('hostile', not hostile_bad, '; '.join(hostile_bad[:10]) or
        '%d hostile requests got exactly their code' % n_hostile)
    missing = [f['kind'] for f in soak.faults if f.get('recovered') is None]
    add('faults', len(soak.faults) == 2 and not missing,
        'no recovery after %s' % missing if missing else '%d faults injected, each recovered' % len(soak.faults))

    # The cluster afterwards.
    s = soak.stats
    dead = [name for name, alive in soak.alive.items() if not alive]
    recovered_ok = (not dead and soak.final_health == harness.SERVING and soak.final_probe and s is not None
                    and s.used_chunks == 0 and s.running_requests == 0 and s.waiting_requests == 0)
    add('recovered', recovered_ok,
        'processes not alive: %s; health %s; probe %s; used chunks %s, running %s, waiting %s' % (
            dead or 'none', soak.final_health, 'served' if soak.final_probe else 'failed',
            None if s is None else s.used_chunks, None if s is None else s.running_requests,
            None if s is None else s.waiting_requests))

    # RSS: warm level (end of the warm-up) vs the final, idle level.
    warm_end = a.warmup_fraction * a.duration
    warm = [kb for t, kb in soak.rss if warm_end - a.rss_window_s <= t <= warm_end]
    soak.rss_warm = statistics.median(warm) if warm else None
    soak.rss_final = statistics.median(soak.rss_final_samples) if soak.rss_final_samples else None
    soak.rss_peak = max(kb for _, kb in soak.rss) if soak.rss else None
    if soak.rss_warm and soak.rss_final:
        growth = soak.rss_final / soak.rss_warm - 1
        bound_kb = soak.rss_warm * (1 + a.rss_tolerance) + a.rss_slack_mib * 1024
        add('rss', soak.rss_final <= bound_kb,
            'coordinator RSS %.1f MiB warm, %.1f MiB final (%+.1f%%, bound +%.0f%%%s = %.1f MiB), peak %.1f MiB' % (
                soak.rss_warm / 1024, soak.rss_final / 1024, 100 * growth, 100 * a.rss_tolerance,
                ' + %g MiB' % a.rss_slack_mib if a.rss_slack_mib else '', bound_kb / 1024, soak.rss_peak / 1024))
    else:
        add('rss', False, 'too few RSS samples (warm %d, final %d)' % (len(warm), len(soak.rss_final_samples)))

    # The coordinator's counts against the ledger.
    before, after = soak.before, soak.after
    delta = lambda name, **labels: after.value(name, **labels) - before.value(name, **labels)
    deltas = {label: int(round(delta('chunkattn_requests_finished_total', reason=label))) for label in REASONS}
    soak.metric_deltas = deltas
    ok, certain, groups, message = metrics_feasible(records, deltas)
    soak.metric_certain = dict(certain)
    soak.metric_ambiguous = {'|'.join(sorted(k)): v for k, v in groups.items()}
    finished_total = sum(deltas.values())
    durations = int(round(delta('chunkattn_request_duration_seconds_count')))
    streamed = sum(s_['tokens'] for r in records for s_ in r.samples.values())
    most = sum(s_['tokens'] for r in records if r.code == 'OK' for s_ in r.samples.values()) + sum(
        r.spec.n * r.spec.max_new_tokens for r in records if r.code != 'OK' and r.responses)
    generated = int(round(delta('chunkattn_generation_tokens_total')))
    soak.generation_tokens = dict(counted=generated, streamed=streamed, at_most=most)
    extra = []
    if durations != finished_total:
        extra.append('request_duration_seconds_count rose %d, requests_finished_total %d' % (durations,
                                                                                             finished_total))
    if not streamed <= generated <= most:
        extra.append('generation_tokens_total rose %d: not within [%d streamed, %d at most]' % (generated, streamed,
                                                                                             most))
    if ok and not extra:
        message = ('finished by reason %s match the ledger (%d certain, %d ambiguous); durations %d; '
                   'generated tokens %d in [%d, %d]' % (deltas, sum(certain.values()), sum(groups.values()),
                                                       durations, generated, streamed, most))
    else:
        message = '; '.join(([message] if message else []) + extra) + \
            ' (coordinator %s; ledger certain %s, ambiguous %s)' % (deltas, dict(certain), soak.metric_ambiguous)
    add('metrics', ok and not extra, message)
    return results


# --- the report --------------------------------------------------------------

def summarize(soak, results):
    records = [r for r in soak.records if r.spec.kind != 'probe']
    probes = [r for r in soak.records if r.spec.kind == 'probe']
    by_code = collections.Counter(r.code for r in records)
    by_kind = collections.defaultdict(collections.Counter)
    for r in records:
        by_kind[r.spec.kind][r.code] += 1
    hostile = collections.defaultdict(collections.Counter)
    for r in records:
        if r.spec.kind == 'hostile':
            hostile[r.spec.variant][r.code] += 1
    latency = sorted(r.ended - r.sent for r in records if r.code == 'OK' and r.spec.kind != 'hostile')
    return dict(
        scheduled=len(soak.specs), sent=len(records), not_sent=soak.not_sent, completed=by_code.get('OK', 0),
        max_send_lag_s=round(max((r.sent - r.spec.at for r in records), default=0), 3),
        failed_by_code={k: v for k, v in sorted(by_code.items()) if k != 'OK'},
        by_kind={k: dict(v) for k, v in sorted(by_kind.items())},
        hostile=sum(by_kind['hostile'].values()), hostile_by_variant={k: dict(v) for k, v in sorted(hostile.items())},
        cancelled=sum(by_kind['cancel'].values()), deadline=sum(by_kind['deadline'].values()),
        deadline_expired=by_kind['deadline'].get('DEADLINE_EXCEEDED', 0),
        probes=dict(collections.Counter(r.code for r in probes)),
        ok_latency_s=dict(p50=round(latency[len(latency) // 2], 3), max=round(latency[-1], 3)) if latency else {},
        faults=soak.faults, windows=[(round(s, 3), round(e, 3)) for s, e in soak.windows()],
        health_changes=soak.health, load_end=soak.load_end, drained_at=soak.drained_at,
        rss_warm_kb=soak.rss_warm, rss_peak_kb=soak.rss_peak, rss_final_kb=soak.rss_final,
        rss_samples=soak.rss, metric_deltas=soak.metric_deltas, metric_certain=soak.metric_certain,
        metric_ambiguous=soak.metric_ambiguous, generation_tokens=soak.generation_tokens,
        checks=results)


def print_report(soak, summary):
    a = soak.args
    out = []
    w = out.append
    w('')
    w('Fault soak: %.0f s at %.1f requests/s, seed %d, TP=2, --step_timeout_s %g' % (
        a.duration, a.rate, a.seed, a.step_timeout_s))
    w('')
    w('%-26s %8s' % ('requests', 'count'))
    w('%-26s %8d' % ('sent', summary['sent']))
    if summary['not_sent']:
        w('%-26s %8d' % ('NOT sent (clients busy)', summary['not_sent']))
    w('%-26s %8d' % ('completed (OK)', summary['completed']))
    for code, n in summary['failed_by_code'].items():
        w('%-26s %8d' % ('failed: ' + code, n))
    w('%-26s %8d' % ('hostile', summary['hostile']))
    w('%-26s %8d' % ('client cancels', summary['cancelled']))
    w('%-26s %8d  (%d expired)' % ('short deadlines', summary['deadline'], summary['deadline_expired']))
    w('%-26s %8s' % ('probes', ', '.join('%s %d' % kv for kv in sorted(summary['probes'].items()))))
    if summary['ok_latency_s']:
        w('%-26s %8s' % ('OK latency p50 / max', '%.2f / %.2f s' % (summary['ok_latency_s']['p50'],
                                                                  summary['ok_latency_s']['max'])))
    w('')
    w('by kind: ' + '; '.join('%s %s' % (k, ', '.join('%s %d' % kv for kv in sorted(v.items())))
                              for k, v in summary['by_kind'].items()))
    w('')
    w('faults (seconds after the load started):')
    for f in soak.faults:
        w('  %-8s rank %d at %7.2f, %s at %7.2f, served again at %s' % (
            f['kind'], f['rank'], f['at'], 'restarted' if f['kind'] == 'SIGKILL' else 'SIGCONT',
            f.get('end_at', float('nan')), '%.2f' % f['recovered'] if f.get('recovered') is not None else 'never'))
    w('  health changes: ' + ', '.join('%.1f %s' % (t, h) for t, h in soak.health))
    w('')
    pts = soak.rss
    step = max(1, len(pts) // 8)
    w('coordinator RSS (MiB): warm %s, peak %s, final %s; samples: %s' % (
        '%.1f' % (soak.rss_warm / 1024) if soak.rss_warm else '-',
        '%.1f' % (soak.rss_peak / 1024) if soak.rss_peak else '-',
        '%.1f' % (soak.rss_final / 1024) if soak.rss_final else '-',
        ' '.join('%.0fs:%.1f' % (t, kb / 1024) for t, kb in pts[::step])))
    w('finished_total deltas: %s' % ', '.join('%s %d' % kv for kv in soak.metric_deltas.items()))
    w('')
    for c in summary['checks']:
        w('%-4s %-11s %s' % ('ok' if c['ok'] else 'FAIL', c['name'], c['message']))
    failed = [c for c in summary['checks'] if not c['ok']]
    w('')
    w('soak: %s' % ('all %d checks passed' % len(summary['checks']) if not failed else
                    '%d of %d checks FAILED: %s' % (len(failed), len(summary['checks']),
                                                   ', '.join(c['name'] for c in failed))))
    print('\n'.join(out), flush=True)


def parse_args():
    source = os.path.dirname(HERE)
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--source', default=source, help='the checkout (tests/services/harness.py, proto/)')
    p.add_argument('--build', default=None, help='the build folder (bin/, demo-model/); default SOURCE/build')
    p.add_argument('--duration', type=float, default=60, help='seconds of load')
    p.add_argument('--rate', type=float, default=3.0, help='Poisson arrivals per second')
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--clients', type=int, default=64, help='client threads')
    p.add_argument('--json', default=None, help='write the results here')
    p.add_argument('--system_prompts', type=int, default=3)
    p.add_argument('--step_timeout_s', type=float, default=3.0)
    p.add_argument('--max_kv_chunks', type=int, default=2048)
    p.add_argument('--kill_rank', type=int, default=1, choices=(0, 1))
    p.add_argument('--stop_rank', type=int, default=0, choices=(0, 1))
    p.add_argument('--restart_after_s', type=float, default=3.0, help='SIGKILL to restart')
    p.add_argument('--stop_for_s', type=float, default=5.0, help='SIGSTOP to SIGCONT')
    p.add_argument('--request_timeout_s', type=float, default=60.0,
                   help='the deadline of every request without a short one (a request that reaches it hung)')
    p.add_argument('--deadline_min_s', type=float, default=0.5)
    p.add_argument('--deadline_max_s', type=float, default=4.0)
    p.add_argument('--slack_s', type=float, default=2.0, help='how far past its deadline a request may end')
    p.add_argument('--grace_s', type=float, default=1.0, help='added to a fault window after the recovery')
    p.add_argument('--recovery_timeout_s', type=float, default=30.0,
                   help='bound on each recovery (the first probe served) and on the final checks\' waits')
    p.add_argument('--warmup_fraction', type=float, default=0.2)
    p.add_argument('--rss_window_s', type=float, default=5.0, help='the warm level: median over the warm-up\'s end')
    p.add_argument('--rss_final_samples', type=int, default=5)
    p.add_argument('--rss_tolerance', type=float, default=0.10)
    p.add_argument('--rss_slack_mib', type=float, default=0.0,
                   help='MiB allowed over the tolerance: a one-off step a short run cannot tell from a leak')
    args = p.parse_args()
    args.source = os.path.abspath(args.source)
    args.build = os.path.abspath(args.build or os.path.join(args.source, 'build'))
    if args.duration < 20:
        p.error('--duration must be at least 20 s (warm-up, two faults and their recoveries)')
    if args.stop_for_s <= args.step_timeout_s:
        sys.stderr.write('note: --stop_for_s %g <= --step_timeout_s %g: the hang may go unnoticed\n' % (
            args.stop_for_s, args.step_timeout_s))
    return args


def main():
    global harness
    args = parse_args()
    sys.path.insert(0, os.path.join(args.source, 'tests', 'services'))
    import harness as h  # noqa: E402 (from --source)
    harness = h
    harness.setup(args.source, args.build)
    soak = Soak(args)
    try:
        soak.start_cluster()
        soak.run()
        results = check(soak)
        summary = summarize(soak, results)
        print_report(soak, summary)
        if args.json:
            doc = dict(machine_info(args.source, ' '.join([sys.executable] + sys.argv)), benchmark='fault_soak', duration_s=args.duration, rate=args.rate,
                       seed=args.seed, tensor_parallel=2, step_timeout_s=args.step_timeout_s, **summary)
            doc['requests'] = [r.to_json() for r in sorted(soak.records, key=lambda r: r.sent)]
            write_result(args.json, doc)
        ok = all(c['ok'] for c in results)
        if not ok:
            soak.cluster.dump_logs(40)
        return 0 if ok else 1
    finally:
        for ch in soak.channels:
            ch.close()
        if soak.cluster is not None:
            soak.cluster.stop()


if __name__ == '__main__':
    sys.exit(main())
