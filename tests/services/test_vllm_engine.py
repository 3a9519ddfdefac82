"""The vLLM gRPC engine API (vllm.grpc.engine.VllmEngine, what SMG and the
llm-d router speak to `vllm serve --grpc`) on the coordinator's port, through
Python stubs generated from proto/vllm/grpc/engine/vllm_engine.proto and
proto/smg/grpc/common/common.proto. Outputs are checked against our own API
(chunkattn.v1.Generation) on the same engine: the same tokens for the same
prompt, sampling and seed. The reply semantics checked (deltas in chunks, the
complete repeating the last delta, "abort" completes, proto3 zero defaults,
max_tokens capped at the context, the tokenizer zip, the KV-event stream)
are docs/design/vllm-engine-api.md's, with its sources."""
import concurrent.futures
import dataclasses
import datetime
import glob
import hashlib
import importlib
import io
import json
import os
import random
import re
import sys
import threading
import time
import uuid
import zipfile

import grpc

import harness

vpb = None       # vllm.grpc.engine.vllm_engine_pb2
vpb_grpc = None  # vllm.grpc.engine.vllm_engine_pb2_grpc
cpb = None       # smg.grpc.common.common_pb2

SERVICE = 'vllm.grpc.engine.VllmEngine'
RPC_S = 120     # bound on every Generate / stream read
SHORT_S = 30    # bound on unary calls
CHUNK = 64      # the coordinator's default --chunk_size

# SMG's tokenizer bundle (grpc_servicer/smg_grpc_servicer/tokenizer_bundle.py):
# these names, then these globs, each file once, flat.
TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json', 'config.json', 'generation_config.json',
                   'special_tokens_map.json', 'vocab.json', 'merges.txt', 'tokenizer.model',
                   'tiktoken.model', 'chat_template.json', 'preprocessor_config.json']
TOKENIZER_GLOBS = ['*.tiktoken', '*.jinja', '*.model']


# --- stubs -----------------------------------------------------------------

def generate_vllm_stubs(source):
    """Compiles the two protos into a temporary folder put first on sys.path.
    The generated packages get __init__.py files, so that an installed `vllm`
    (a regular package) cannot shadow them."""
    global vpb, vpb_grpc, cpb
    if vpb is not None:
        return
    for name in ('vllm', 'smg'):
        if name in sys.modules:
            raise RuntimeError('a module %r is already imported; the stubs would be shadowed' % name)
    harness.compile_protos(source, ['smg/grpc/common/common.proto', 'vllm/grpc/engine/vllm_engine.proto'],
                           'chunkattn-vllm-stubs-',
                           packages=('vllm', 'vllm/grpc', 'vllm/grpc/engine', 'smg', 'smg/grpc', 'smg/grpc/common'))
    importlib.invalidate_caches()
    from smg.grpc.common import common_pb2  # noqa: E402
    from vllm.grpc.engine import vllm_engine_pb2, vllm_engine_pb2_grpc  # noqa: E402
    vpb, vpb_grpc, cpb = vllm_engine_pb2, vllm_engine_pb2_grpc, common_pb2


# --- requests and replies --------------------------------------------------

def vreq(prompt_ids=None, text=None, stream=False, request_id=None, **sampling):
    """A VllmEngine GenerateRequest. sampling: SamplingParams fields by name
    (lists for stop / stop_token_ids, a dict for logit_bias, a list for choice)."""
    req = vpb.GenerateRequest(request_id=request_id or 'v-' + uuid.uuid4().hex, stream=stream)
    if prompt_ids is not None:
        req.tokenized.SetInParent()  # sets the oneof even for an empty list
        req.tokenized.input_ids.extend(prompt_ids)
    if text is not None:
        req.text = text
    p = req.sampling_params
    p.SetInParent()
    for field, value in sampling.items():
        if field in ('stop', 'stop_token_ids'):
            getattr(p, field).extend(value)
        elif field == 'logit_bias':
            p.logit_bias.update(value)
        elif field == 'choice':
            p.choice.choices.extend(value)
        else:
            setattr(p, field, value)
    return req


@dataclasses.dataclass
class VSample:
    """One index of a VllmEngine Generate stream."""
    chunks: list = dataclasses.field(default_factory=list)
    complete: object = None
    chunk_tokens: list = dataclasses.field(default_factory=list)
    chunk_logprobs: list = dataclasses.field(default_factory=list)  # (id, logprob, [(ids), (values)])

    def tokens(self):
        """The sample's tokens: from the chunks when streamed, from the
        complete otherwise."""
        return list(self.chunk_tokens) if self.chunks else list(self.complete.output_ids)

    def logprobs(self):
        if self.chunks:
            return self.chunk_logprobs
        return logprob_rows(self.complete.output_logprobs)


def logprob_rows(lp):
    rows = []
    for k, (token, value) in enumerate(zip(lp.token_ids, lp.token_logprobs)):
        top = lp.top_logprobs[k] if k < len(lp.top_logprobs) else None
        rows.append((token, value, (list(top.token_ids), list(top.values)) if top is not None else ([], [])))
    return rows


def read_generate(responses):
    """Reads a VllmEngine Generate stream to its end: {index: VSample}.
    Raises AssertionError on a chunk after its index's complete, two
    completes for one index, or an empty response."""
    samples = {}
    for r in responses:
        kind = r.WhichOneof('response')
        if kind == 'chunk':
            c = r.chunk
            s = samples.setdefault(c.index, VSample())
            if s.complete is not None:
                raise AssertionError('a chunk of index %d after its complete' % c.index)
            s.chunks.append(c)
            s.chunk_tokens.extend(c.token_ids)
            s.chunk_logprobs.extend(logprob_rows(c.output_logprobs))
        elif kind == 'complete':
            c = r.complete
            s = samples.setdefault(c.index, VSample())
            if s.complete is not None:
                raise AssertionError('two completes for index %d' % c.index)
            s.complete = c
        else:
            raise AssertionError('a GenerateResponse with neither chunk nor complete')
    return samples


FINISH = {1: 'length', 2: 'stop', 3: 'stop'}  # chunkattn.v1.FinishReason -> vLLM's string


@dataclasses.dataclass
class Ours:
    tokens: list
    logprobs: list
    top: list
    finish: str
    usage: object


def ours_request(prompt_ids=None, text=None, namespace=None, max_tokens=None, logprobs=None, **kw):
    """Our API's request for the same sampling (vLLM names in, ours out)."""
    req = harness.make_request(prompt_ids=prompt_ids, text=text,
                               namespace=harness.fresh_namespace('ref') if namespace is None else namespace,
                               max_new_tokens=max_tokens, logprobs=logprobs is not None, **kw)
    if logprobs:
        req.top_logprobs = logprobs
    return req


def read_ours(responses):
    out = {}
    for r in responses:
        s = out.setdefault(r.index, Ours([], [], [], None, None))
        s.tokens.extend(r.token_ids)
        s.logprobs.extend(r.logprobs)
        for t in r.top_logprobs:
            s.top.append((list(t.token_ids), list(t.logprobs)))
        if r.finish_reason:
            s.finish = FINISH.get(r.finish_reason, str(r.finish_reason))
            s.usage = r.usage
    return out


class Subscription:
    """A SubscribeKvEvents stream read on a thread into `batches`."""

    def __init__(self, stub, start, timeout=RPC_S * 4):
        self.call = stub.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(start_sequence_number=start),
                                           timeout=timeout)
        self.batches = []
        self.error = None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for b in self.call:
                with self.lock:
                    self.batches.append(b)
        except grpc.RpcError as e:
            self.error = e

    def wait_headers(self, timeout=20.0):
        """The server's initial metadata: sent once the subscription is
        registered (docs/design/vllm-engine-api.md (h)), so every batch
        published after this returns reaches the stream."""
        done = threading.Event()

        def get():
            try:
                self.call.initial_metadata()
            finally:
                done.set()
        threading.Thread(target=get, daemon=True).start()
        if not done.wait(timeout):
            raise AssertionError('SubscribeKvEvents sent no initial metadata within %.0f s: the servicer must '
                                 'send it once the subscription is registered, before any event' % timeout)
        if self.error is not None:
            raise AssertionError('SubscribeKvEvents failed: %s' % self.error)

    def snapshot(self):
        with self.lock:
            return list(self.batches)

    def close(self):
        self.call.cancel()
        self.thread.join(timeout=10)


def stored_runs(batches):
    """[(sequence_number, KvBlocksStored)] in stream order."""
    return [(b.sequence_number, e.stored) for b in batches for e in b.events if e.WhichOneof('data') == 'stored']


def event_key(e):
    kind = e.WhichOneof('data')
    return kind, getattr(e, kind).SerializeToString(deterministic=True)


def runs_of_prompt(batches, chunks):
    """The stored runs whose blocks are all chunks of this prompt, in order."""
    wanted = {tuple(c) for c in chunks}
    return [(seq, run) for seq, run in stored_runs(batches)
            if run.blocks and all(tuple(b.token_ids) in wanted for b in run.blocks)]


def blocks_of(runs):
    return [b for _, run in runs for b in run.blocks]


# --- tests -----------------------------------------------------------------

class VllmTestCase(harness.ServiceTestCase):
    """Starts the class's cluster with `cluster_args`; self.v is the VllmEngine stub."""
    name = 'vllm'
    cluster_args = ()

    @harness.setup_class_or_dump
    def setUpClass(cls):
        generate_vllm_stubs(harness.SOURCE)
        cls.cluster = cls.start_cluster(cls.name, shared=not cls.cluster_args, tp=1,
                                        coordinator_args=list(cls.cluster_args))
        cls.v = vpb_grpc.VllmEngineStub(cls.cluster.channel)
        cls.info = cls.cluster.model_info()

    # VllmEngine calls.
    def vgen(self, request, timeout=RPC_S):
        return read_generate(self.v.Generate(request, timeout=timeout))

    def ours(self, **kw):
        return read_ours(self.cluster.stub.Generate(ours_request(**kw), timeout=RPC_S))

    def loads(self):
        return self.v.GetLoads(vpb.GetLoadsRequest(include=['core']), timeout=SHORT_S)

    def assert_invalid(self, request, what):
        with self.assertRaises(grpc.RpcError, msg=what) as e:
            self.vgen(request, timeout=SHORT_S)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         '%s: %s' % (what, e.exception.details()))

    # Reply shapes (docs/design/vllm-engine-api.md (a), (c)).
    def check_streamed(self, samples, n, prompt_len, what=''):
        self.assertEqual(sorted(samples), list(range(n)), what)
        for i, s in samples.items():
            w = '%s index %d' % (what, i)
            self.assertIsNotNone(s.complete, w + ': no complete')
            self.assertTrue(s.chunks, w + ': a streamed sample without chunks')
            for c in s.chunks:
                self.assertEqual(c.index, i, w)
                self.assertEqual(c.completion_tokens, len(c.token_ids), w + ': completion_tokens is the delta')
                self.assertEqual(c.prompt_tokens, prompt_len, w + ': prompt_tokens on every chunk')
                self.assertEqual(c.cached_tokens, s.chunks[0].cached_tokens, w + ': cached_tokens on every chunk')
                self.assertFalse(c.HasField('input_logprobs'), w)
                self.assertEqual(len(c.output_logprobs.token_ids), len(c.output_logprobs.token_logprobs), w)
            last = list(s.chunks[-1].token_ids)
            self.assertEqual(list(s.complete.output_ids), last, w + ': the complete repeats the last delta')
            self.assertEqual(s.complete.completion_tokens, len(last), w)
            self.assertEqual(s.complete.prompt_tokens, prompt_len, w)
            self.assertEqual(s.complete.cached_tokens, s.chunks[0].cached_tokens, w)
            self.assertEqual(s.complete.index, i, w)

    def check_unary(self, samples, n, prompt_len, what=''):
        self.assertEqual(sorted(samples), list(range(n)), what)
        for i, s in samples.items():
            w = '%s index %d' % (what, i)
            self.assertEqual(s.chunks, [], w + ': chunks in a non-streaming reply')
            self.assertIsNotNone(s.complete, w)
            self.assertEqual(s.complete.completion_tokens, len(s.complete.output_ids), w)
            self.assertEqual(s.complete.prompt_tokens, prompt_len, w)
            self.assertEqual(s.complete.index, i, w)

    def check_same(self, samples, ours, what=''):
        """Same tokens and finish reason as our API, index by index."""
        self.assertEqual(sorted(samples), sorted(ours), what)
        for i in ours:
            self.assertEqual(samples[i].tokens(), ours[i].tokens, '%s index %d' % (what, i))
            self.assertEqual(samples[i].complete.finish_reason, ours[i].finish, '%s index %d' % (what, i))

    def both_modes(self, prompt_ids=None, text=None, n=1, **sampling):
        """The request streamed and not, each checked for shape and against our API."""
        n_field = {'n': n} if n != 1 else {}
        ours = self.ours(prompt_ids=prompt_ids, text=text, n=n if n != 1 else 0, **sampling)
        prompt_len = ours[0].usage.prompt_tokens
        for stream in (True, False):
            what = '%s stream=%s' % (sorted(sampling.items()), stream)
            got = self.vgen(vreq(prompt_ids=prompt_ids, text=text, stream=stream, **n_field, **sampling))
            (self.check_streamed if stream else self.check_unary)(got, n, prompt_len, what)
            self.check_same(got, ours, what)
        return ours


class VllmGenerateTest(VllmTestCase):
    """Generate: the same tokens as our API, with vLLM's reply shapes."""
    name = 'vllm-gen'

    def test_greedy_matches_our_api(self):
        prompt = harness.random_ids(random.Random(101), 100)
        ours = self.both_modes(prompt_ids=prompt, temperature=0.0, max_tokens=24, ignore_eos=True)
        self.assertEqual(len(ours[0].tokens), 24)
        self.assertEqual(ours[0].finish, 'length')

    def test_seeded_sampling_matches_our_api(self):
        cases = [
            dict(temperature=0.8, top_k=40, seed=7),
            dict(temperature=1.0, top_p=0.9, min_p=0.05, seed=11),
            dict(temperature=0.7, repetition_penalty=1.3, seed=3),
            dict(temperature=1.2, top_k=100, top_p=0.95, min_p=0.01, repetition_penalty=1.1, seed=2**31 - 1),
            dict(temperature=0.9, seed=0, min_tokens=8),
        ]
        rng = random.Random(102)
        for k, case in enumerate(cases):
            with self.subTest(**case):
                prompt = harness.random_ids(rng, 40 + 17 * k)
                self.both_modes(prompt_ids=prompt, max_tokens=20, ignore_eos=True, **case)

    def test_parallel_samples_match_our_api(self):
        prompt = harness.random_ids(random.Random(103), 90)
        ours = self.both_modes(prompt_ids=prompt, n=3, temperature=1.0, seed=42, max_tokens=12, ignore_eos=True)
        self.assertFalse(ours[0].tokens == ours[1].tokens == ours[2].tokens, 'three identical samples')
        with self.subTest('n = 64, the limit'):
            got = self.vgen(vreq(prompt_ids=prompt[:10], n=64, temperature=1.0, seed=5, max_tokens=2,
                                 ignore_eos=True))
            self.check_unary(got, 64, 10)

    def test_logprobs_match_our_api(self):
        prompt = harness.random_ids(random.Random(104), 70)
        for top in (0, 3, 20):
            with self.subTest(logprobs=top):
                # Ours: return_logprobs, and top_logprobs = N (0: none).
                ours = self.ours(prompt_ids=prompt, temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=top)
                for stream in (True, False):
                    got = self.vgen(vreq(prompt_ids=prompt, stream=stream, temperature=0.0, max_tokens=10,
                                         ignore_eos=True, logprobs=top))
                    s = got[0]
                    rows = s.logprobs()
                    self.assertEqual([r[0] for r in rows], s.tokens(), 'logprobs follow the tokens')
                    self.assertEqual(s.tokens(), ours[0].tokens)
                    for k, (token, value, (ids, values)) in enumerate(rows):
                        self.assertAlmostEqual(value, ours[0].logprobs[k], places=5)
                        if top == 0:
                            self.assertEqual(ids, [], 'logprobs=0: no top_logprobs')
                            continue
                        self.assertEqual(ids, ours[0].top[k][0], 'position %d' % k)
                        for a, b in zip(values, ours[0].top[k][1]):
                            self.assertAlmostEqual(a, b, places=5)
                    if stream:
                        for c in s.chunks:
                            self.assertEqual(list(c.output_logprobs.token_ids), list(c.token_ids),
                                             'a chunk carries the logprobs of its own tokens')
        with self.subTest('no logprobs asked: none sent'):
            got = self.vgen(vreq(prompt_ids=prompt, stream=True, temperature=0.0, max_tokens=4))
            self.assertFalse(any(c.output_logprobs.token_ids for c in got[0].chunks))
            got = self.vgen(vreq(prompt_ids=prompt, temperature=0.0, max_tokens=4))
            self.assertFalse(got[0].complete.output_logprobs.token_ids)

    def test_stop_token_ids_and_min_tokens(self):
        prompt = harness.random_ids(random.Random(105), 60)
        full = self.ours(prompt_ids=prompt, temperature=0.0, max_tokens=40, ignore_eos=True)[0].tokens
        # A token that first appears at position k >= 3.
        k = next(i for i in range(3, len(full)) if full[i] not in full[:i])
        stop = full[k]
        for stream in (True, False):
            with self.subTest(stream=stream):
                got = self.vgen(vreq(prompt_ids=prompt, stream=stream, temperature=0.0, max_tokens=40,
                                     ignore_eos=True, stop_token_ids=[stop]))[0]
                self.assertEqual(got.tokens(), full[:k + 1], 'the stop token is the last output token')
                self.assertEqual(got.complete.finish_reason, 'stop')
                self.assertEqual(got.complete.WhichOneof('matched_stop'), 'matched_token_id')
                self.assertEqual(got.complete.matched_token_id, stop)
                ours = self.ours(prompt_ids=prompt, temperature=0.0, max_tokens=40, ignore_eos=True,
                                 stop_token_ids=[stop])
                self.check_same({0: got}, ours)
                # min_tokens past the stop: it cannot stop there.
                got = self.vgen(vreq(prompt_ids=prompt, stream=stream, temperature=0.0, max_tokens=40,
                                     ignore_eos=True, stop_token_ids=[stop], min_tokens=k + 2))
                ours = self.ours(prompt_ids=prompt, temperature=0.0, max_tokens=40, ignore_eos=True,
                                 stop_token_ids=[stop], min_tokens=k + 2)
                self.check_same(got, ours)
                self.assertGreaterEqual(len(got[0].tokens()), k + 2)
        with self.subTest('length: no matched stop'):
            got = self.vgen(vreq(prompt_ids=prompt, temperature=0.0, max_tokens=5, ignore_eos=True))[0]
            self.assertEqual(got.complete.finish_reason, 'length')
            self.assertIsNone(got.complete.WhichOneof('matched_stop'))

    def test_stop_strings(self):
        # SMG passes the client's stop strings through (crates/grpc_client/src/vllm_engine.rs).
        prompt = 'To be, or not to be, that is the question:'
        full = self.cluster.generate(harness.make_request(text=prompt, temperature=0.0, max_new_tokens=40,
                                                          ignore_eos=True))[0]
        text = full.text
        self.assertGreater(len(text.strip()), 8, repr(text))
        stop = text[len(text) // 2:len(text) // 2 + 4]
        ours = self.ours(text=prompt, temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop])
        self.assertEqual(ours[0].finish, 'stop')
        for stream in (True, False):
            with self.subTest(stream=stream):
                got = self.vgen(vreq(text=prompt, stream=stream, temperature=0.0, max_tokens=40, ignore_eos=True,
                                     stop=[stop], skip_special_tokens=True, spaces_between_special_tokens=True))
                self.check_same(got, ours)
                self.assertEqual(got[0].complete.WhichOneof('matched_stop'), 'matched_stop_str')
                self.assertEqual(got[0].complete.matched_stop_str, stop)

    def test_text_prompt_matches_our_api(self):
        text = 'Now is the winter of our discontent'
        tok = self.cluster.stub.Tokenize(harness.pb.TokenizeRequest(text=text), timeout=SHORT_S)
        ours = self.both_modes(text=text, temperature=0.0, max_tokens=10, ignore_eos=True)
        self.assertEqual(ours[0].usage.prompt_tokens, len(tok.token_ids))
        # The same as the tokenized prompt, original_text being informational.
        req = vreq(prompt_ids=list(tok.token_ids), temperature=0.0, max_tokens=10, ignore_eos=True)
        req.tokenized.original_text = 'something else entirely'
        self.assertEqual(self.vgen(req)[0].tokens(), ours[0].tokens)

    def test_cached_tokens(self):
        # 3 full chunks and a tail, new to the shared namespace (VllmEngine has none).
        prompt = harness.random_ids(random.Random(106), 3 * CHUNK + 10)
        first = self.vgen(vreq(prompt_ids=prompt, stream=True, temperature=0.0, max_tokens=6, ignore_eos=True))
        self.check_streamed(first, 1, len(prompt))
        self.assertEqual(first[0].complete.cached_tokens, 0)
        second = self.vgen(vreq(prompt_ids=prompt, stream=True, temperature=0.0, max_tokens=6, ignore_eos=True))
        self.check_streamed(second, 1, len(prompt))
        cached = second[0].complete.cached_tokens
        self.assertGreater(cached, 0, 'an identical prompt of 3 chunks reports cached tokens')
        self.assertLess(cached, len(prompt))
        self.assertGreaterEqual(cached, 2 * CHUNK)
        self.assertEqual(second[0].tokens(), first[0].tokens())
        third = self.vgen(vreq(prompt_ids=prompt, temperature=0.0, max_tokens=6, ignore_eos=True))
        self.assertEqual(third[0].complete.cached_tokens, cached, 'non-streaming reports it too')
        # The figure is our API's for the same prompt in the same (shared) namespace.
        ours = self.ours(prompt_ids=prompt, namespace='', temperature=0.0, max_tokens=6, ignore_eos=True)
        self.assertEqual(ours[0].usage.cached_prompt_tokens, cached)

    def test_max_tokens_defaults_to_and_is_capped_at_the_context(self):
        ctx = self.info.max_context
        prompt = harness.random_ids(random.Random(107), ctx - 7)
        for stream in (True, False):
            for max_tokens in (None, 1000, 2**32 - 1):
                with self.subTest(stream=stream, max_tokens=max_tokens):
                    extra = {} if max_tokens is None else {'max_tokens': max_tokens}
                    got = self.vgen(vreq(prompt_ids=prompt, stream=stream, temperature=0.0, ignore_eos=True,
                                         **extra))[0]
                    self.assertEqual(len(got.tokens()), 7, 'the rest of the context')
                    self.assertEqual(got.complete.finish_reason, 'length')

    def test_proto3_zeros_are_the_defaults(self):
        prompt = harness.random_ids(random.Random(108), 50)
        ours = self.ours(prompt_ids=prompt, temperature=0.0, max_tokens=12, ignore_eos=True)
        zeros = vreq(prompt_ids=prompt, temperature=0.0, max_tokens=12, ignore_eos=True,
                     top_p=0.0, top_k=0, min_p=0.0, repetition_penalty=0.0, n=0, min_tokens=0,
                     frequency_penalty=0.0, presence_penalty=0.0)
        for stream in (True, False):
            zeros.stream = stream
            self.check_same(self.vgen(zeros), ours, 'zeros stream=%s' % stream)
        # temperature unset is 1, as our API's default.
        ours = self.ours(prompt_ids=prompt, seed=9, max_tokens=12, ignore_eos=True)
        got = self.vgen(vreq(prompt_ids=prompt, seed=9, max_tokens=12, ignore_eos=True))
        self.check_same(got, ours, 'temperature unset')
        # No sampling_params at all: temperature 1, the rest of the context.
        req = vpb.GenerateRequest(request_id='v-none', stream=False)
        req.tokenized.input_ids.extend(prompt)
        got = self.vgen(req)
        self.assertGreaterEqual(len(got[0].tokens()), 1)
        self.assertIn(got[0].complete.finish_reason, ('stop', 'length'))


class VllmControlTest(VllmTestCase):
    """Bad input, Abort, HealthCheck, GetModelInfo, GetServerInfo, GetLoads,
    GetTokenizer, and SubscribeKvEvents with events off."""
    name = 'vllm-ctl'
    cluster_args = ('--served_model_name', 'demo-model')

    def test_bad_input_is_invalid_argument(self):
        ok = [5, 6, 7, 8]
        vocab, ctx = self.info.vocab_size, self.info.max_context
        cases = [
            ('no input', vpb.GenerateRequest(request_id='bad-0')),
            ('empty input_ids', vreq(prompt_ids=[])),
            ('empty text', vreq(text='')),
            ('token id = vocab size', vreq(prompt_ids=[5, vocab, 6])),
            ('token id 2^32-1', vreq(prompt_ids=[5, 2**32 - 1])),
            ('prompt longer than the context', vreq(prompt_ids=[5] * (ctx + 1), max_tokens=1)),
            ('max_tokens 0', vreq(prompt_ids=ok, max_tokens=0)),
            # Constraints the engine cannot honour are refused, never ignored.
            ('json_schema keyword', vreq(prompt_ids=ok, json_schema='{"type": "object", "frobnicate": 1}')),
            ('json_schema not JSON', vreq(prompt_ids=ok, json_schema='{"type": ')),
            ('regex', vreq(prompt_ids=ok, regex='(a+')),
            ('grammar', vreq(prompt_ids=ok, grammar='root ::= undefined_rule')),
            ('structural_tag', vreq(prompt_ids=ok, structural_tag='{}')),
            ('choice', vreq(prompt_ids=ok, choice=[])),
            ('logit_bias', vreq(prompt_ids=ok, logit_bias={5: 2.0})),
            ('prompt_logprobs', vreq(prompt_ids=ok, prompt_logprobs=1)),
            ('prompt_logprobs 0', vreq(prompt_ids=ok, prompt_logprobs=0)),
            ('frequency_penalty', vreq(prompt_ids=ok, frequency_penalty=0.5)),
            ('presence_penalty', vreq(prompt_ids=ok, presence_penalty=-0.5)),
            ('truncate_prompt_tokens', vreq(prompt_ids=ok, truncate_prompt_tokens=2)),
            ('n = 65', vreq(prompt_ids=ok, n=65)),
            ('logprobs = 21', vreq(prompt_ids=ok, logprobs=21)),
            ('logprobs = -1', vreq(prompt_ids=ok, logprobs=-1)),
            ('temperature -1', vreq(prompt_ids=ok, temperature=-1.0)),
            ('top_p 1.5', vreq(prompt_ids=ok, top_p=1.5)),
            ('kv_transfer_params_json', vreq(prompt_ids=ok)),
            ('data_parallel_rank 1', vreq(prompt_ids=ok)),
            ('mm_inputs', vreq(prompt_ids=ok)),
        ]
        cases[-3][1].kv_transfer_params_json = '{"do_remote_prefill": true}'
        cases[-2][1].data_parallel_rank = 1
        cases[-1][1].mm_inputs.pixel_values.inline = b'\0' * 16
        cases[-1][1].mm_inputs.pixel_values.shape.extend([4])
        cases[-1][1].mm_inputs.pixel_values.dtype = 'float32'
        for what, req in cases:
            for stream in (False, True):
                with self.subTest(what, stream=stream):
                    req.stream = stream
                    self.assert_invalid(req, what)
        with self.subTest('serves after them'):
            self.assertTrue(self.cluster.coordinator.alive())
            self.assertTrue(self.v.HealthCheck(vpb.HealthCheckRequest(), timeout=SHORT_S).healthy)
            self.assertEqual(harness.health(self.cluster.channel), harness.SERVING)
            got = self.vgen(vreq(prompt_ids=ok, stream=True, temperature=0.0, max_tokens=4, ignore_eos=True))
            self.assertEqual(len(got[0].tokens()), 4)
            self.assertEqual(self.loads().loads[0].num_running_reqs, 0)

    def test_structured_outputs_on_both_grpc_apis(self):
        """vLLM's constraint fields and chunkattn.v1's: the same seed gives the
        same constrained tokens on both, and the text matches."""
        ok = [5, 6, 7, 8]
        schema = '{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, ' \
                 '"required": ["n"], "additionalProperties": false}'
        cases = [('regex', '[a-z]{2}-[0-9]{3}', lambda t: re.fullmatch('[a-z]{2}-[0-9]{3}', t)),
                 ('choice', ['alpha', 'beta gamma'], lambda t: t in ('alpha', 'beta gamma')),
                 ('json_schema', schema, lambda t: sorted(json.loads(t)) == ['n'] and 0 <= json.loads(t)['n'] <= 99),
                 ('grammar', 'root ::= "<" [a-c]{1,3} ">"', lambda t: re.fullmatch('<[a-c]{1,3}>', t))]
        for field, value, check in cases:
            for seed in (11, 12):
                with self.subTest(field, seed=seed):
                    v = self.vgen(vreq(prompt_ids=ok, temperature=1.0, seed=seed, max_tokens=48, **{field: value}))
                    req = ours_request(prompt_ids=ok, max_tokens=48, temperature=1.0, seed=seed)
                    if field == 'choice':
                        req.constraint.choice.choices.extend(value)
                    else:
                        setattr(req.constraint, field, value)
                    responses = list(self.cluster.stub.Generate(req, timeout=RPC_S))
                    text = ''.join(r.text for r in responses)
                    self.assertTrue(check(text), text)
                    self.assertEqual(v[0].tokens(), [t for r in responses for t in r.token_ids])
                    self.assertEqual(responses[-1].finish_reason, harness.pb.FINISH_REASON_STOP_TOKEN)

    def test_valid_edges(self):
        ok = [5, 6, 7, 8]
        with self.subTest('data_parallel_rank 0'):
            req = vreq(prompt_ids=ok, temperature=0.0, max_tokens=2)
            req.data_parallel_rank = 0
            self.assertEqual(len(self.vgen(req)[0].tokens()), 2)
        with self.subTest('text-only flags are accepted'):
            got = self.vgen(vreq(prompt_ids=ok, temperature=0.0, max_tokens=2, skip_special_tokens=True,
                                 spaces_between_special_tokens=True, include_stop_str_in_output=True))
            self.assertEqual(len(got[0].tokens()), 2)
        with self.subTest('an empty request_id gets one'):
            req = vreq(prompt_ids=ok, temperature=0.0, max_tokens=2)
            req.request_id = ''
            self.assertEqual(len(self.vgen(req)[0].tokens()), 2)

    def stream_until_running(self, request_id, n=1, max_tokens=3000):
        """A long streaming request, read until it has produced tokens."""
        call = self.v.Generate(vreq(prompt_ids=harness.random_ids(random.Random(request_id), 150),
                                    request_id=request_id, stream=True, n=n, temperature=0.0,
                                    max_tokens=max_tokens, ignore_eos=True), timeout=RPC_S)
        got = 0
        first = []
        for r in call:
            first.append(r)
            if r.WhichOneof('response') == 'chunk':
                got += len(r.chunk.token_ids)
            if got >= 3:
                break
        self.assertGreaterEqual(got, 3)
        return call, first

    def wait_idle(self):
        def idle():
            load = self.loads().loads[0]
            stats = self.cluster.cache_stats()
            return (load.num_running_reqs == 0 and load.num_waiting_reqs == 0 and stats.used_chunks == 0 and
                    stats.running_requests == 0)
        harness.wait_for(idle, timeout=30, interval=0.1, what='no running request, no used chunk')

    def test_abort_ends_the_stream_with_an_abort_complete(self):
        for n in (1, 2):
            with self.subTest(n=n):
                rid = 'abort-%d-%s' % (n, uuid.uuid4().hex[:6])
                call, first = self.stream_until_running(rid, n=n)
                reply = self.v.Abort(vpb.AbortRequest(request_ids=[rid, 'never-sent']), timeout=SHORT_S)
                self.assertEqual(reply, vpb.AbortResponse())
                rest = list(call)  # ends OK: no RpcError
                samples = read_generate(first + rest)
                self.assertEqual(sorted(samples), list(range(n)))
                for i, s in samples.items():
                    self.assertIsNotNone(s.complete, 'index %d has no complete' % i)
                    self.assertEqual(s.complete.finish_reason, 'abort', 'index %d' % i)
                    self.assertIsNone(s.complete.WhichOneof('matched_stop'))
                    self.assertEqual(s.complete.completion_tokens, len(s.complete.output_ids))
                    self.assertLess(len(s.chunk_tokens), 3000)
                self.assertEqual(call.code(), grpc.StatusCode.OK)
                self.wait_idle()
                # Aborting it again, or an unknown id, is no error.
                self.v.Abort(vpb.AbortRequest(request_ids=[rid]), timeout=SHORT_S)
        with self.subTest('non-streaming'):
            rid = 'abort-unary-' + uuid.uuid4().hex[:6]
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                future = pool.submit(self.vgen, vreq(prompt_ids=harness.random_ids(random.Random(7), 150),
                                                     request_id=rid, temperature=0.0, max_tokens=3000,
                                                     ignore_eos=True))
                harness.wait_for(lambda: self.loads().loads[0].num_running_reqs >= 1, timeout=30, interval=0.05,
                                 what='the request running')
                time.sleep(0.2)
                self.v.Abort(vpb.AbortRequest(request_ids=[rid]), timeout=SHORT_S)
                samples = future.result(timeout=RPC_S)
            self.check_unary(samples, 1, 150)
            self.assertEqual(samples[0].complete.finish_reason, 'abort')
            self.assertLess(len(samples[0].complete.output_ids), 3000)
            self.wait_idle()
        with self.subTest('a following request runs'):
            got = self.vgen(vreq(prompt_ids=[5, 6, 7], temperature=0.0, max_tokens=5, ignore_eos=True))
            self.assertEqual(len(got[0].tokens()), 5)
            self.assertEqual(got[0].complete.finish_reason, 'length')

    def test_cancelling_the_call_frees_the_request(self):
        call, _ = self.stream_until_running('cancel-' + uuid.uuid4().hex[:6])
        call.cancel()
        with self.assertRaises(grpc.RpcError) as e:
            for _ in call:
                pass
        self.assertEqual(e.exception.code(), grpc.StatusCode.CANCELLED)
        self.wait_idle()

    def test_health_model_and_server_info(self):
        health = self.v.HealthCheck(vpb.HealthCheckRequest(), timeout=SHORT_S)
        self.assertTrue(health.healthy, health.message)
        # SMG detects the runtime by whose HealthCheck answers, sglang's first.
        sglang = self.cluster.channel.unary_unary('/sglang.grpc.scheduler.SglangScheduler/HealthCheck',
                                                  request_serializer=lambda x: x,
                                                  response_deserializer=lambda x: x)
        with self.assertRaises(grpc.RpcError) as e:
            sglang(b'', timeout=SHORT_S)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        self.assertEqual(harness.health(self.cluster.channel, service=SERVICE), harness.SERVING)
        self.assertIn(SERVICE.encode(), harness.reflection_list_services(self.cluster.channel))

        info = self.v.GetModelInfo(vpb.GetModelInfoRequest(), timeout=SHORT_S)
        ours = self.info
        self.assertEqual(info.vocab_size, ours.vocab_size)
        self.assertEqual(info.max_context_length, ours.max_context)
        self.assertEqual(info.max_req_input_len, ours.max_context)
        self.assertEqual(list(info.eos_token_ids), list(ours.eos_token_ids))
        self.assertEqual(info.served_model_name, 'demo-model')
        self.assertEqual(info.model_path, ours.model)
        self.assertTrue(info.is_generation)
        self.assertFalse(info.supports_vision)
        self.assertEqual(list(info.architectures), [ours.architecture])

        first = self.v.GetServerInfo(vpb.GetServerInfoRequest(), timeout=SHORT_S)
        self.assertEqual(first.server_type, 'vllm-grpc')
        self.assertEqual(first.data_parallel_size, 1)
        self.assertGreater(first.uptime_seconds, 0)
        time.sleep(0.3)
        call, _ = self.stream_until_running('info-' + uuid.uuid4().hex[:6])
        try:
            busy = self.v.GetServerInfo(vpb.GetServerInfoRequest(), timeout=SHORT_S)
            self.assertGreaterEqual(busy.active_requests, 1)
            self.assertGreater(busy.uptime_seconds, first.uptime_seconds)
        finally:
            call.cancel()
        self.wait_idle()
        idle = self.v.GetServerInfo(vpb.GetServerInfoRequest(), timeout=SHORT_S)
        self.assertEqual(idle.active_requests, 0)

    def test_get_loads(self):
        idle = self.loads()
        self.assertEqual(len(idle.loads), 1)
        self.assertEqual(idle.dp_rank_count, 1)
        self.assertEqual(idle.loads[0].dp_rank, 0)
        self.assertTrue(idle.timestamp)
        datetime.datetime.fromisoformat(idle.timestamp.replace('Z', '+00:00'))  # ISO 8601
        rid = 'loads-' + uuid.uuid4().hex[:6]
        call, _ = self.stream_until_running(rid)
        try:
            busy = self.loads()
            self.assertEqual(len(busy.loads), 1)
            load = busy.loads[0]
            self.assertGreaterEqual(load.num_running_reqs, 1)
            self.assertEqual(load.num_total_reqs, load.num_running_reqs + load.num_waiting_reqs)
            self.assertGreater(load.token_usage, 0.0)
            self.assertLessEqual(load.token_usage, 1.0)
            self.assertEqual(load.max_total_num_tokens, self.info.kv_capacity_tokens)
            self.assertGreater(load.num_used_tokens, 0)
            self.assertLessEqual(load.num_used_tokens, load.max_total_num_tokens)
            # One request of the filter SMG sends is no different.
            filtered = self.v.GetLoads(vpb.GetLoadsRequest(include=['core', 'disagg', 'queues', 'memory'],
                                                           dp_rank=0), timeout=SHORT_S)
            self.assertEqual(len(filtered.loads), 1)
        finally:
            self.v.Abort(vpb.AbortRequest(request_ids=[rid]), timeout=SHORT_S)
            list(call)
        self.wait_idle()
        after = self.loads().loads[0]
        self.assertEqual(after.num_running_reqs, 0)
        self.assertGreaterEqual(after.token_usage, 0.0)
        self.assertLessEqual(after.token_usage, 1.0)

    def test_get_tokenizer(self):
        chunks = list(self.v.GetTokenizer(cpb.GetTokenizerRequest(), timeout=RPC_S))
        self.assertTrue(chunks)
        for c in chunks[:-1]:
            self.assertEqual(c.sha256, '', 'sha256 on the last chunk only')
        for c in chunks:
            self.assertGreater(len(c.data), 0)
            # The reference sends 64 KiB chunks; what binds is the receiver's
            # default 4 MiB message limit (grpc, tonic).
            self.assertLess(len(c.data), 4 * 1024 * 1024 - 1024)
        data = b''.join(c.data for c in chunks)
        self.assertEqual(chunks[-1].sha256, hashlib.sha256(data).hexdigest())  # lowercase hex of the zip
        model = harness.model_dir()
        expected = {name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(model, name))}
        for pattern in TOKENIZER_GLOBS:
            expected |= {os.path.basename(p) for p in glob.glob(os.path.join(model, pattern)) if os.path.isfile(p)}
        self.assertIn('tokenizer.model', expected, sorted(os.listdir(model)))
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            self.assertIsNone(z.testzip())
            names = z.namelist()
            self.assertEqual(len(names), len(set(names)), names)
            self.assertEqual(set(names), expected, 'model folder: %s' % sorted(os.listdir(model)))
            for name in names:
                with open(os.path.join(model, name), 'rb') as f:
                    self.assertEqual(z.read(name), f.read(), name)
        self.assertNotIn('model.safetensors', names)
        # The same bytes twice.
        again = b''.join(c.data for c in self.v.GetTokenizer(cpb.GetTokenizerRequest(), timeout=RPC_S))
        with zipfile.ZipFile(io.BytesIO(again)) as z:
            self.assertEqual(sorted(z.namelist()), sorted(names))

    def test_kv_events_off_is_unimplemented(self):
        # UNIMPLEMENTED, as vLLM without --kv-events-config: SMG then stops
        # subscribing, where any other code has it retry forever
        # (docs/design/vllm-engine-api.md (h)).
        call = self.v.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(), timeout=SHORT_S)
        with self.assertRaises(grpc.RpcError) as e:
            next(call)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED, e.exception.details())
        self.assertTrue(self.v.HealthCheck(vpb.HealthCheckRequest(), timeout=SHORT_S).healthy)


class VllmKvEventsTest(VllmTestCase):
    """SubscribeKvEvents with --kv_events=true: stored blocks of a prompt's full
    chunks, chained by parent hash, consecutive sequence numbers, replay from N."""
    name = 'vllm-kv'
    cluster_args = ('--kv_events=true',)

    def subscribe(self, start):
        sub = Subscription(self.v, start)
        self.addCleanup(sub.close)
        return sub

    def run_prompt(self, seed, full_chunks=3, tail=10):
        """A prompt of `full_chunks` full chunks and a tail, in a fresh
        namespace through our API; its chunks."""
        prompt = harness.random_ids(random.Random(seed), full_chunks * CHUNK + tail)
        s = self.cluster.generate(harness.make_request(prompt_ids=prompt, namespace=harness.fresh_namespace('kv'),
                                                       temperature=0.0, max_new_tokens=4, ignore_eos=True))[0]
        self.assertEqual(len(s.tokens), 4)  # prompt + 4 < 4 chunks: no generated chunk fills
        return [prompt[i * CHUNK:(i + 1) * CHUNK] for i in range(full_chunks)]

    def wait_blocks(self, sub, chunks, what):
        def have():
            return len(blocks_of(runs_of_prompt(sub.snapshot(), chunks))) >= len(chunks)
        harness.wait_for(have, timeout=30, interval=0.05, what='%s: the stored blocks of %d chunks' %
                         (what, len(chunks)))
        if sub.error is not None:
            raise AssertionError('%s: the subscription failed: %s' % (what, sub.error))

    def check_chain(self, batches, chunks):
        runs = runs_of_prompt(batches, chunks)
        blocks = blocks_of(runs)
        self.assertEqual([list(b.token_ids) for b in blocks], [list(c) for c in chunks],
                         'the stored blocks concatenate to the prompt\'s full chunks')
        for b in blocks:
            self.assertEqual(b.block_size, CHUNK)
            self.assertNotEqual(b.block_hash, 0)
            self.assertFalse(b.HasField('lora_id'))
        self.assertEqual(len({b.block_hash for b in blocks}), len(blocks), 'distinct hashes')
        self.assertFalse(runs[0][1].HasField('parent_block_hash'), 'the run at block 0 has no parent')
        for (_, prev), (_, run) in zip(runs, runs[1:]):
            self.assertTrue(run.HasField('parent_block_hash'))
            self.assertEqual(run.parent_block_hash, prev.blocks[-1].block_hash, 'parent hash chaining')
        return runs

    def check_consecutive(self, batches, what):
        seqs = [b.sequence_number for b in batches]
        self.assertEqual(seqs, list(range(seqs[0], seqs[0] + len(seqs))), '%s: sequence numbers +1' % what)
        now = time.time()
        for b in batches:
            self.assertLess(abs(b.timestamp - now), 600, 'timestamp in seconds since the epoch')
            self.assertTrue(b.events, 'an empty batch')

    def test_stored_blocks_of_a_prompt(self):
        sub = self.subscribe(0)
        sub.wait_headers()
        chunks = self.run_prompt(201)
        self.wait_blocks(sub, chunks, 'live')
        batches = sub.snapshot()
        self.check_chain(batches, chunks)
        self.check_consecutive(batches, 'live')
        # VllmEngine's own requests publish too (into the shared namespace).
        prompt = harness.random_ids(random.Random(202), 2 * CHUNK + 5)
        got = self.vgen(vreq(prompt_ids=prompt, temperature=0.0, max_tokens=3, ignore_eos=True))
        self.assertEqual(len(got[0].tokens()), 3)
        mine = [prompt[:CHUNK], prompt[CHUNK:2 * CHUNK]]
        self.wait_blocks(sub, mine, 'VllmEngine request')
        self.check_chain(sub.snapshot(), mine)
        self.check_consecutive(sub.snapshot(), 'live')

    def test_replay_from_a_sequence_number(self):
        live = self.subscribe(0)
        live.wait_headers()
        chunks_a = self.run_prompt(301)
        self.wait_blocks(live, chunks_a, 'live')
        runs_a = self.check_chain(live.snapshot(), chunks_a)
        n = runs_a[0][0]
        self.assertGreater(n, 0, 'batch 0 was published before this subscription')
        # Replay from N: the same batches from N on, then live, without a gap.
        replay = self.subscribe(n)
        kept = [b for b in live.snapshot() if b.sequence_number >= n]
        harness.wait_for(lambda: len(replay.snapshot()) >= len(kept), timeout=30, interval=0.05,
                         what='%d replayed batches from %d' % (len(kept), n))
        got = replay.snapshot()
        self.assertEqual(got[0].sequence_number, n, 'the replay starts at N')
        for a, b in zip(kept, got):
            self.assertEqual(b.sequence_number, a.sequence_number)
            self.assertEqual(b.timestamp, a.timestamp)
            self.assertEqual([event_key(e) for e in b.events], [event_key(e) for e in a.events])
        # A subscription from now (0) sees none of A's batches.
        later = self.subscribe(0)
        later.wait_headers()
        chunks_b = self.run_prompt(302)
        for sub, what in ((live, 'live'), (replay, 'replay'), (later, 'from now')):
            self.wait_blocks(sub, chunks_b, what)
            self.check_consecutive(sub.snapshot(), what)
            self.check_chain(sub.snapshot(), chunks_b)
        self.assertEqual(runs_of_prompt(later.snapshot(), chunks_a), [], 'a live subscription replayed history')
        self.assertGreater(later.snapshot()[0].sequence_number, runs_a[-1][0])
        by_seq = {b.sequence_number: b for b in live.snapshot()}
        for b in replay.snapshot() + later.snapshot():
            self.assertIn(b.sequence_number, by_seq)
            self.assertEqual([event_key(e) for e in b.events], [event_key(e) for e in by_seq[b.sequence_number].events])

    def test_a_sequence_number_the_stream_cannot_continue_is_out_of_range(self):
        live = self.subscribe(0)
        live.wait_headers()
        self.run_prompt(401)
        nxt = self.cluster.stub.GetKvBlocks(harness.pb.GetKvBlocksRequest(), timeout=SHORT_S).next_sequence_number
        self.assertGreater(nxt, 1)
        # Ahead of the stream (a coordinator that restarted since): refused,
        # not left waiting for a batch that may never come.
        ahead = self.v.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(start_sequence_number=nxt + 1000),
                                         timeout=SHORT_S)
        with self.assertRaises(grpc.RpcError) as e:
            next(iter(ahead))
        self.assertEqual(e.exception.code(), grpc.StatusCode.OUT_OF_RANGE, e.exception.details())
        self.assertIn('subscribe from 0', e.exception.details())
        # The next one to come is fine: the stream continues from there.
        sub = self.subscribe(nxt)
        chunks = self.run_prompt(402)
        self.wait_blocks(sub, chunks, 'from the next sequence number')
        self.assertEqual(sub.snapshot()[0].sequence_number, nxt)
        self.check_consecutive(sub.snapshot(), 'from the next sequence number')


class VllmKvEventsRingTest(VllmTestCase):
    """A ring of 4 batches: a subscription from before it is OUT_OF_RANGE."""
    name = 'vllm-kv-ring'
    cluster_args = ('--kv_events=true', '--kv_events_buffer_steps', '4')

    def test_older_than_the_ring_is_out_of_range(self):
        for i in range(8):  # a batch or more each
            prompt = harness.random_ids(random.Random(500 + i), 3 * CHUNK)
            self.cluster.generate(harness.make_request(prompt_ids=prompt, temperature=0.0, max_new_tokens=2,
                                                       ignore_eos=True))
        nxt = self.cluster.stub.GetKvBlocks(harness.pb.GetKvBlocksRequest(), timeout=SHORT_S).next_sequence_number
        self.assertGreater(nxt, 5, 'fewer batches than the test needs')
        call = self.v.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(start_sequence_number=1), timeout=SHORT_S)
        with self.assertRaises(grpc.RpcError) as e:
            next(iter(call))
        self.assertEqual(e.exception.code(), grpc.StatusCode.OUT_OF_RANGE, e.exception.details())
        self.assertIn('no longer kept (the oldest is %d' % (nxt - 4), e.exception.details())
        # The oldest kept one replays the last four.
        call = self.v.SubscribeKvEvents(cpb.SubscribeKvEventsRequest(start_sequence_number=nxt - 4), timeout=SHORT_S)
        got = []
        for batch in call:
            got.append(batch.sequence_number)
            if len(got) == 4:
                call.cancel()
                break
        self.assertEqual(got, list(range(nxt - 4, nxt)))


if __name__ == '__main__':
    harness.main()
