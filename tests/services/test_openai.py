"""The OpenAI-compatible HTTP front, driven by the official OpenAI SDK for
Node.js (npm `openai`, installed by scripts/install-openai-sdk.sh: a client
no one here wrote) and by raw HTTP for the Server-Sent Events framing and
malformed input. Outputs are checked against the gRPC API on the same engine
(same tokens for the same prompt and seed), usage against the cache, and
tenancy against bound bearer tokens."""
import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time

import harness

SDK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'openai_sdk', 'sdk_call.mjs')
SERVED = 'demo-model'
TEMPLATE = ("{%- for m in messages %}{{ '[' + m['role'] | upper + '] ' + m['content'] + '\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{ '[ASSISTANT]' }}{% endif %}")


def install_sdk():
    """The SDK's folder; a failed install fails the test (never a skip)."""
    out = subprocess.run(['bash', os.path.join(harness.SOURCE, 'scripts', 'install-openai-sdk.sh')],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError('install-openai-sdk.sh failed:\n' + out.stderr)
    return out.stdout.strip().splitlines()[-1]


def chat_model(addCleanup):
    """The demo model with a chat template beside it."""
    folder = harness.temp_dir('chunkattn-openai-model-', addCleanup)
    demo = harness.model_dir()
    for name in os.listdir(demo):
        os.symlink(os.path.join(demo, name), os.path.join(folder, name))
    with open(os.path.join(folder, 'tokenizer_config.json'), 'w') as f:
        json.dump({'chat_template': TEMPLATE, 'bos_token': '<s>', 'eos_token': '</s>'}, f)
    return folder


class Http:
    """Raw HTTP/1.1 on 127.0.0.1 (http.client), with a bound on every call."""

    def __init__(self, port, token=None):
        self.port = port
        self.token = token

    def request(self, method, path, body=None, headers=None, raw=None):
        conn = http.client.HTTPConnection('127.0.0.1', self.port, timeout=60)
        h = {'Content-Type': 'application/json'}
        if self.token:
            h['Authorization'] = 'Bearer ' + self.token
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        return resp.status, resp.getheader('Content-Type') or '', payload

    def json(self, method, path, body=None, **kw):
        status, _, payload = self.request(method, path, body, **kw)
        return status, json.loads(payload) if payload else None


def sse_events(payload):
    """The data lines of an SSE body; asserts OpenAI's framing."""
    text = payload.decode('utf-8')
    assert text.endswith('data: [DONE]\n\n'), text[-200:]
    events = []
    for block in text.split('\n\n'):
        if not block:
            continue
        assert block.startswith('data: '), block
        events.append(block[len('data: '):])
    assert events[-1] == '[DONE]'
    return [json.loads(e) for e in events[:-1]]


class OpenAiTestBase(harness.ServiceTestCase):
    sdk = None

    @classmethod
    def sdk_dir(cls):
        if OpenAiTestBase.sdk is None:
            OpenAiTestBase.sdk = install_sdk()
        return OpenAiTestBase.sdk

    def sdk_call(self, api, params, cluster=None, token=None):
        cluster = cluster or self.cluster
        spec = {'baseURL': 'http://127.0.0.1:%d/v1' % cluster.http_port, 'apiKey': token or 'none',
                'api': api, 'params': dict(params, model=params.get('model', SERVED))}
        out = subprocess.run(['node', SDK_SCRIPT, self.sdk_dir()], input=json.dumps(spec), capture_output=True,
                             text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)


class OpenAiTest(OpenAiTestBase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.sdk_dir()
        cls.model = chat_model(cls.addClassCleanup)
        cls.cluster = cls.start_cluster('openai', tp=1, model=cls.model,
                                        coordinator_args=['--served_model_name', SERVED,
                                                          '--http_max_body_bytes', str(1 << 20),
                                                          # Qwen3's formats, whatever the demo template says.
                                                          '--tool_call_parser', 'hermes',
                                                          '--reasoning_parser', 'qwen3'])
        cls.http = Http(cls.cluster.http_port)
        with open(os.path.join(harness.SOURCE, 'data', 'demo', 'shakespeare.txt'), encoding='utf-8') as f:
            cls.words = f.read().split()

    def prose(self, start, n):
        return ' '.join(self.words[start:start + n])

    def test_models_health_version(self):
        status, body = self.http.json('GET', '/v1/models')
        self.assertEqual(status, 200)
        self.assertEqual(body['object'], 'list')
        self.assertEqual([m['id'] for m in body['data']], [SERVED])
        self.assertEqual(body['data'][0]['max_model_len'], self.cluster.model_info().max_context)
        self.assertEqual(self.http.json('GET', '/v1/models/' + SERVED)[0], 200)
        self.assertEqual(self.http.json('GET', '/v1/models/other')[0], 404)
        self.assertEqual(self.http.request('GET', '/health')[0], 200)
        status, body = self.http.json('GET', '/version')
        self.assertEqual(status, 200)
        self.assertRegex(body['version'], r'^\d+\.\d+\.\d+')

    def test_sdk_completion_equals_grpc_and_reports_cached_tokens(self):
        ns = harness.fresh_namespace('http-cmpl')
        prompt = self.prose(0, 120)
        params = {'prompt': prompt, 'max_tokens': 8, 'temperature': 0, 'cache_salt': ns}
        first = self.sdk_call('completions', params)['result']
        self.assertEqual(first['object'], 'text_completion')
        self.assertEqual(first['choices'][0]['finish_reason'], 'length')
        usage = first['usage']
        self.assertEqual(usage['completion_tokens'], 8)
        self.assertEqual(usage['total_tokens'], usage['prompt_tokens'] + 8)
        self.assertEqual(usage['prompt_tokens_details']['cached_tokens'], 0)
        # The same prompt through gRPC, in another namespace: the same tokens.
        grpc_out = self.cluster.generate(harness.make_request(text=prompt, namespace=harness.fresh_namespace('g'),
                                                              temperature=0.0, max_new_tokens=8))[0]
        self.assertEqual(first['choices'][0]['text'], grpc_out.text)
        self.assertEqual(usage['prompt_tokens'], grpc_out.prompt_tokens)
        # Again: the prompt's KV comes from the cache (all but its last token).
        again = self.sdk_call('completions', params)['result']
        self.assertEqual(again['choices'][0]['text'], first['choices'][0]['text'])
        self.assertGreaterEqual(again['usage']['prompt_tokens_details']['cached_tokens'], usage['prompt_tokens'] - 64)
        self.assertGreater(again['usage']['prompt_tokens_details']['cached_tokens'], 0)
        # vLLM's return_token_ids, streamed: the prompt's ids as /tokenize gives
        # them, once, and gRPC's completion ids chunk by chunk.
        chunks = self.sdk_call('completions', dict(params, stream=True, return_token_ids=True,
                                                   cache_salt=harness.fresh_namespace('ids')))['chunks']
        self.assertEqual([c['choices'][0]['prompt_token_ids'] for c in chunks
                          if 'prompt_token_ids' in c['choices'][0]],
                         [self.http.json('POST', '/tokenize', {'prompt': prompt})[1]['tokens']])
        self.assertEqual(sum((c['choices'][0]['token_ids'] for c in chunks), []), grpc_out.tokens)
        self.assertTrue(all(len(c['choices'][0]['token_ids']) == 1 for c in chunks))
        whole = self.sdk_call('chat', {'messages': [{'role': 'user', 'content': prompt}], 'max_tokens': 4,
                                       'temperature': 0, 'return_token_ids': True})['result']
        self.assertEqual(len(whole['choices'][0]['token_ids']), whole['usage']['completion_tokens'])
        self.assertEqual(len(whole['prompt_token_ids']), whole['usage']['prompt_tokens'])

    def test_sdk_prompt_lists_n_stop_and_echo(self):
        out = self.sdk_call('completions', {'prompt': [self.prose(10, 20), self.prose(40, 20)], 'n': 2,
                                            'max_tokens': 6, 'temperature': 1.0, 'seed': 5})['result']
        self.assertEqual([c['index'] for c in out['choices']], [0, 1, 2, 3])
        self.assertEqual(out['usage']['completion_tokens'], 24)
        tokens = self.sdk_call('completions', {'prompt': [[5, 6, 7, 8], [9, 10]], 'max_tokens': 3,
                                               'temperature': 0})['result']
        self.assertEqual(tokens['usage']['prompt_tokens'], 6)
        echo = self.sdk_call('completions', {'prompt': 'To be', 'max_tokens': 4, 'echo': True,
                                             'temperature': 0})['result']
        self.assertTrue(echo['choices'][0]['text'].startswith('To be'))
        # A stop string: the text ends before it, finish_reason "stop".
        free = self.sdk_call('completions', {'prompt': self.prose(100, 30), 'max_tokens': 24,
                                             'temperature': 0})['result']['choices'][0]['text']
        stop = free.strip()[1:3] if len(free.strip()) > 3 else None
        if stop:
            stopped = self.sdk_call('completions', {'prompt': self.prose(100, 30), 'max_tokens': 24,
                                                    'temperature': 0, 'stop': [stop]})['result']
            self.assertEqual(stopped['choices'][0]['finish_reason'], 'stop')
            self.assertNotIn(stop, stopped['choices'][0]['text'])
            self.assertTrue(free.startswith(stopped['choices'][0]['text']))

    def test_sdk_chat_streamed_and_not(self):
        messages = [{'role': 'system', 'content': self.prose(200, 80)}, {'role': 'user', 'content': 'Speak.'}]
        whole = self.sdk_call('chat', {'messages': messages, 'max_tokens': 10, 'temperature': 0})['result']
        self.assertEqual(whole['object'], 'chat.completion')
        self.assertEqual(whole['choices'][0]['message']['role'], 'assistant')
        streamed = self.sdk_call('chat', {'messages': messages, 'max_tokens': 10, 'temperature': 0, 'stream': True,
                                          'stream_options': {'include_usage': True}})['chunks']
        self.assertEqual(streamed[0]['choices'][0]['delta']['role'], 'assistant')
        text = ''.join(c['choices'][0]['delta'].get('content') or '' for c in streamed if c['choices'])
        self.assertEqual(text, whole['choices'][0]['message']['content'])
        finishes = [c['choices'][0]['finish_reason'] for c in streamed if c['choices']]
        self.assertEqual(finishes[-1], 'length')
        self.assertEqual(streamed[-1]['choices'], [])
        self.assertEqual(streamed[-1]['usage']['completion_tokens'], 10)
        # The second conversation shares the first one's system prompt.
        self.assertGreater(streamed[-1]['usage']['prompt_tokens_details']['cached_tokens'], 0)
        # The rendered prompt is what /tokenize renders.
        status, tok = self.http.json('POST', '/tokenize', {'messages': messages})
        self.assertEqual(status, 200)
        self.assertEqual(tok['count'], whole['usage']['prompt_tokens'])
        status, detok = self.http.json('POST', '/detokenize', {'tokens': tok['tokens']})
        self.assertEqual(status, 200)
        self.assertIn('[ASSISTANT]', detok['prompt'])

    def test_sdk_logprobs(self):
        out = self.sdk_call('chat', {'messages': [{'role': 'user', 'content': 'Hello there'}], 'max_tokens': 5,
                                     'temperature': 0, 'logprobs': True, 'top_logprobs': 3})['result']
        content = out['choices'][0]['logprobs']['content']
        self.assertEqual(len(content), 5)
        for entry in content:
            tops = [t['logprob'] for t in entry['top_logprobs']]
            self.assertEqual(len(tops), 3)
            self.assertEqual(tops, sorted(tops, reverse=True))
            self.assertAlmostEqual(entry['logprob'], tops[0], places=5)  # greedy: the most likely
            self.assertLessEqual(entry['logprob'], 0.0)
        out = self.sdk_call('completions', {'prompt': 'Hello there', 'max_tokens': 4, 'temperature': 0,
                                            'logprobs': 2})['result']
        lp = out['choices'][0]['logprobs']
        self.assertEqual(len(lp['tokens']), 4)
        self.assertEqual(len(lp['token_logprobs']), 4)
        self.assertEqual(len(lp['text_offset']), 4)
        self.assertTrue(all(1 <= len(t) <= 3 for t in lp['top_logprobs']))

    def test_sdk_min_tokens(self):
        """vLLM's min_tokens: stop tokens (and EOS) are masked and stop strings
        not matched until then; after that a stop ends the request as usual."""
        prompt = self.prose(300, 40)
        base = {'prompt': prompt, 'max_tokens': 8, 'temperature': 0, 'return_token_ids': True}
        free = self.sdk_call('completions', base)['result']['choices'][0]
        g = free['token_ids']
        self.assertEqual(len(g), 8)
        stopped = self.sdk_call('completions', dict(base, stop_token_ids=[g[0]]))['result']
        self.assertEqual(stopped['choices'][0]['token_ids'], [g[0]])
        self.assertEqual(stopped['choices'][0]['finish_reason'], 'stop')
        held = self.sdk_call('completions', dict(base, stop_token_ids=g, min_tokens=8))['result']
        ids = held['choices'][0]['token_ids']
        self.assertEqual(len(ids), 8)
        self.assertFalse(set(ids) & set(g), (ids, g))
        self.assertEqual(held['choices'][0]['finish_reason'], 'length')
        # The same through gRPC: the same tokens.
        grpc_out = self.cluster.generate(harness.make_request(
            text=prompt, temperature=0.0, max_new_tokens=8, stop_token_ids=g, min_tokens=8))[0]
        self.assertEqual(grpc_out.tokens, ids)
        # A stop string is not matched before min_tokens.
        text = free['text']
        stop = text.strip()[:2]
        if len(stop) == 2 and stop in text:
            early = self.sdk_call('completions', dict(base, stop=[stop]))['result']
            self.assertLess(early['usage']['completion_tokens'], 8)
            late = self.sdk_call('completions', dict(base, stop=[stop], min_tokens=8))['result']
            self.assertEqual(late['usage']['completion_tokens'], 8)
        # Masking every token would leave nothing to sample: a 400, not a failed step.
        vocab = self.cluster.model_info().vocab_size
        err = self.sdk_call('completions', dict(base, stop_token_ids=list(range(vocab)), min_tokens=1))['error']
        self.assertEqual((err['status'], err['param']), (400, 'min_tokens'), err)
        err = self.sdk_call('completions', dict(base, min_tokens=9))['error']
        self.assertEqual((err['status'], err['param']), (400, 'min_tokens'), err)

    def test_sdk_errors_are_typed(self):
        cases = [
            ('completions', {'prompt': 'x', 'model': 'gpt-4'}, 'NotFoundError', 404, 'model'),
            ('completions', {'prompt': 'x', 'max_tokens': -1}, 'BadRequestError', 400, 'max_tokens'),
            ('completions', {'prompt': 'x', 'max_tokens': 10 ** 9}, 'BadRequestError', 400, 'max_tokens'),
            ('completions', {'prompt': [999999999]}, 'BadRequestError', 400, 'prompt'),
            # More KV than the whole pool (64 samples of 4,000 tokens): the client's to change, not a 429.
            ('completions', {'prompt': 'x', 'max_tokens': 4000, 'n': 64}, 'BadRequestError', 400, None),
            ('chat', {'messages': []}, 'BadRequestError', 400, 'messages'),
            # A keyword the engine cannot enforce is refused by name, never ignored.
            ('chat', {'messages': [{'role': 'user', 'content': 'x'}], 'response_format': {
                'type': 'json_schema', 'json_schema': {'name': 'x', 'schema': {'type': 'object', 'frobnicate': 1}}}},
             'BadRequestError', 400, 'response_format'),
            ('completions', {'prompt': 'x', 'guided_regex': '(unclosed'}, 'BadRequestError', 400,
             'guided_regex'),
            ('chat', {'messages': [{'role': 'user', 'content': 'x'}], 'tool_choice': 'required'},
             'BadRequestError', 400, 'tool_choice'),
        ]
        for api, params, cls, status, param in cases:
            with self.subTest(params=params):
                err = self.sdk_call(api, params)['error']
                self.assertEqual(err['class'], cls, err)
                self.assertEqual(err['status'], status, err)
                self.assertEqual(err['param'], param, err)

    def test_structured_outputs_match_their_constraint(self):
        """The demo model writes noise; constrained, every sample parses and
        matches, on chat and completions, streamed and not, through the SDK."""
        schema = {'type': 'object', 'additionalProperties': False, 'required': ['name', 'age', 'tags'],
                  'properties': {'name': {'type': 'string', 'minLength': 1, 'maxLength': 12},
                                 'age': {'type': 'integer', 'minimum': 0, 'maximum': 120},
                                 'tags': {'type': 'array', 'maxItems': 3, 'items': {'enum': ['red', 'blue']}}}}

        def check_person(text):
            v = json.loads(text)
            self.assertEqual(sorted(v), ['age', 'name', 'tags'], text)
            self.assertIsInstance(v['name'], str)
            self.assertTrue(1 <= len(v['name']) <= 12, text)
            self.assertIsInstance(v['age'], int)
            self.assertTrue(0 <= v['age'] <= 120, text)
            self.assertTrue(len(v['tags']) <= 3 and all(t in ('red', 'blue') for t in v['tags']), text)

        fmt = {'type': 'json_schema', 'json_schema': {'name': 'person', 'strict': True, 'schema': schema}}
        messages = [{'role': 'user', 'content': 'Describe a person.'}]
        out = self.sdk_call('chat', {'messages': messages, 'max_tokens': 400, 'temperature': 1.0, 'seed': 3,
                                     'n': 4, 'response_format': fmt})['result']
        for choice in out['choices']:
            self.assertEqual(choice['finish_reason'], 'stop', choice)
            check_person(choice['message']['content'])
        chunks = self.sdk_call('chat', {'messages': messages, 'max_tokens': 400, 'temperature': 1.0, 'seed': 4,
                                        'stream': True, 'response_format': fmt})['chunks']
        check_person(''.join(c['choices'][0]['delta'].get('content') or '' for c in chunks if c['choices']))
        # Completions, with vLLM's fields.
        cases = [({'guided_regex': '[a-z]{3}-[0-9]{2}'}, lambda t: re.fullmatch('[a-z]{3}-[0-9]{2}', t)),
                 ({'structured_outputs': {'choice': ['yes', 'no', 'maybe so']}},
                  lambda t: t in ('yes', 'no', 'maybe so')),
                 ({'response_format': {'type': 'json_object'}}, lambda t: isinstance(json.loads(t), dict)),
                 ({'structured_outputs': {'grammar': 'root ::= "(" [0-9]+ ("+" [0-9]+)* ")"'}},
                  lambda t: re.fullmatch(r'\([0-9]+(\+[0-9]+)*\)', t))]
        for extra, ok in cases:
            with self.subTest(constraint=extra):
                # Unbounded outputs (any JSON object, any sum) end complete within the budget.
                out = self.sdk_call('completions', dict(extra, prompt='Good morrow', max_tokens=60, temperature=1.0,
                                                        seed=9, n=3, complete_within_max_tokens=True))['result']
                for choice in out['choices']:
                    self.assertTrue(ok(choice['text']), choice['text'])
                    self.assertEqual(choice['finish_reason'], 'stop', choice)
        # Compiled once each (the same schema again is a hit), and cached.
        m = harness.scrape_metrics(self.cluster.metrics_port)
        self.assertGreaterEqual(m.get('chunkattn_grammar_compiles_total', result='miss'), 5)
        self.assertGreaterEqual(m.get('chunkattn_grammar_compiles_total', result='hit'), 1)
        self.assertGreaterEqual(m.get('chunkattn_grammar_cache_entries'), 5)

    def test_tool_calls(self):
        """tool_choice named and required are constrained calls; auto parses
        the model's format (Hermes <tool_call> blocks here, forced with a
        regex as the demo model never writes them) into tool_calls."""
        tools = [{'type': 'function', 'function': {'name': 'get_weather', 'description': 'Weather in a city',
                  'parameters': {'type': 'object', 'properties': {'city': {'type': 'string', 'maxLength': 20},
                                                                  'days': {'type': 'integer', 'minimum': 1,
                                                                           'maximum': 7}},
                                 'required': ['city', 'days']}}},
                 {'type': 'function', 'function': {'name': 'now', 'parameters': {'type': 'object', 'properties': {}}}}]
        messages = [{'role': 'user', 'content': 'Weather in Oslo?'}]
        base = {'messages': messages, 'tools': tools, 'max_tokens': 300, 'temperature': 1.0, 'seed': 2}

        def check_weather(args):
            v = json.loads(args)
            self.assertEqual(sorted(v), ['city', 'days'], args)
            self.assertTrue(isinstance(v['days'], int) and 1 <= v['days'] <= 7, args)

        named = self.sdk_call('chat', dict(base, tool_choice={'type': 'function',
                                                              'function': {'name': 'get_weather'}}))['result']
        choice = named['choices'][0]
        self.assertEqual(choice['finish_reason'], 'stop')  # OpenAI's for a named function
        self.assertIsNone(choice['message']['content'])
        [call] = choice['message']['tool_calls']
        self.assertEqual((call['type'], call['function']['name']), ('function', 'get_weather'))
        self.assertTrue(call['id'].startswith('call_'))
        check_weather(call['function']['arguments'])

        required = self.sdk_call('chat', dict(base, tool_choice='required', n=3,
                                              complete_within_max_tokens=True))['result']
        for choice in required['choices']:
            self.assertEqual(choice['finish_reason'], 'tool_calls')
            self.assertGreaterEqual(len(choice['message']['tool_calls']), 1)
            for call in choice['message']['tool_calls']:
                self.assertIn(call['function']['name'], ('get_weather', 'now'))
                if call['function']['name'] == 'get_weather':
                    check_weather(call['function']['arguments'])
                else:
                    self.assertEqual(json.loads(call['function']['arguments']), {})
        # Streamed: the SDK's chunks carry the call's id and name first, then its arguments.
        chunks = self.sdk_call('chat', dict(base, stream=True, tool_choice={'type': 'function',
                                                                            'function': {'name': 'get_weather'}}))
        deltas = [d for c in chunks['chunks'] if c['choices'] for d in c['choices'][0]['delta'].get('tool_calls') or []]
        self.assertEqual(deltas[0]['function']['name'], 'get_weather')
        check_weather(''.join(d['function'].get('arguments') or '' for d in deltas))

        forced = ('Checking\\.\n<tool_call>\n\\{"name": "now", "arguments": \\{\\}\\}\n</tool_call>')
        for stream in (False, True):
            with self.subTest(stream=stream):
                reply = self.sdk_call('chat', dict(base, guided_regex=forced, stream=stream))
                if stream:
                    chunks = [c['choices'][0] for c in reply['chunks'] if c['choices']]
                    calls = [d for c in chunks for d in c['delta'].get('tool_calls') or []]
                    content = ''.join(c['delta'].get('content') or '' for c in chunks)
                    finish = chunks[-1]['finish_reason']
                else:
                    message = reply['result']['choices'][0]['message']
                    calls, content = message['tool_calls'], message['content']
                    finish = reply['result']['choices'][0]['finish_reason']
                self.assertEqual([c['function']['name'] for c in calls], ['now'])
                self.assertEqual(json.loads(calls[0]['function']['arguments']), {})
                self.assertEqual(content, 'Checking.\n')  # the text before the block, as it is
                self.assertEqual(finish, 'tool_calls')

    def test_sse_framing_and_malformed_input(self):
        status, ctype, payload = self.http.request('POST', '/v1/completions', {
            'prompt': 'Good morrow', 'max_tokens': 5, 'stream': True, 'temperature': 0,
            'stream_options': {'include_usage': True}})
        self.assertEqual(status, 200)
        self.assertTrue(ctype.startswith('text/event-stream'), ctype)
        events = sse_events(payload)
        self.assertEqual(''.join(e['choices'][0]['text'] for e in events if e['choices']),
                         self.sdk_call('completions', {'prompt': 'Good morrow', 'max_tokens': 5,
                                                       'temperature': 0})['result']['choices'][0]['text'])
        self.assertEqual(events[-1]['usage']['completion_tokens'], 5)
        bad = [
            (b'{"prompt": ', 400), (b'[1, 2]', 400), (b'{"prompt": "x", "max_tokens": 1e999}', 400),
            (b'{"prompt": ' + b'[' * 100 + b']' * 100 + b'}', 400), (b'\xff\xfe', 400),
            (b'{"prompt": "x", "n": "two"}', 400), (b'{"prompt": "x", "max_tokens": 99999999999999999999999}', 400),
        ]
        for body, want in bad:
            with self.subTest(body=body[:40]):
                status, ctype, payload = self.http.request('POST', '/v1/completions', raw=body)
                self.assertEqual(status, want, payload)
                error = json.loads(payload)['error']
                self.assertTrue(error['message'])
        self.assertEqual(self.http.request('POST', '/v1/completions', raw=b'x' * (2 << 20))[0], 413)
        self.assertEqual(self.http.request('GET', '/v1/completions')[0], 405)
        status, _, payload = self.http.request('POST', '/v1/nothing', {})
        self.assertEqual(status, 404)
        self.assertIn('error', json.loads(payload))
        # The server took all that and still serves.
        self.assertEqual(self.http.request('GET', '/health')[0], 200)

    def test_disconnect_cancels_and_frees_chunks(self):
        # Long enough that it cannot end by itself before the server sees the
        # disconnect: the demo model decodes 400 tokens alone in well under a
        # second, so a run that lost the race ended "length", not "cancelled".
        body = json.dumps({'prompt': self.prose(300, 50), 'max_tokens': 3000, 'ignore_eos': True, 'stream': True,
                           'cache_salt': harness.fresh_namespace('gone')}).encode()
        with socket.create_connection(('127.0.0.1', self.cluster.http_port), timeout=30) as s:
            s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
                      b'Content-Length: %d\r\n\r\n' % len(body) + body)
            got = b''
            while b'data: ' not in got:
                chunk = s.recv(4096)
                self.assertTrue(chunk, 'the stream ended early')
                got += chunk
        # The request stops long before its 400 tokens, and its chunks are freed.
        m = self.cluster.metrics_when(
            lambda m: m.value('chunkattn_requests', state='running') == 0
            and m.value('chunkattn_kv_chunks', state='used') == 0, timeout=20, what='the stream cancelled')
        self.assertGreaterEqual(m.value('chunkattn_requests_finished_total', reason='cancelled'), 1)
        self.assertLess(m.value('chunkattn_generation_tokens_total'), 10 ** 6)

    def test_vllm_metrics_for_routers(self):
        self.sdk_call('completions', {'prompt': self.prose(500, 60), 'max_tokens': 2})
        self.sdk_call('completions', {'prompt': self.prose(500, 60), 'max_tokens': 2})
        status, ctype, payload = self.http.request('GET', '/metrics')
        self.assertEqual(status, 200)
        m = harness.Metrics(payload.decode())
        self.assertEqual(m.value('vllm:num_requests_running', model_name=SERVED), 0)
        self.assertEqual(m.value('vllm:num_requests_waiting', model_name=SERVED), 0)
        usage = m.value('vllm:kv_cache_usage_perc', model_name=SERVED)
        self.assertTrue(0 <= usage <= 1, usage)
        self.assertEqual(m.get('vllm:cache_config_info', block_size=64, enable_prefix_caching='True'), 1)
        self.assertGreater(m.value('vllm:prefix_cache_hits_total', model_name=SERVED), 0)
        self.assertGreaterEqual(m.value('vllm:prefix_cache_queries_total', model_name=SERVED),
                                m.value('vllm:prefix_cache_hits_total', model_name=SERVED))

    def test_many_concurrent_streams(self):
        results = [None] * 64

        def run(i):
            status, _, payload = self.http.request('POST', '/v1/completions', {
                'prompt': self.prose(i, 16), 'max_tokens': 4, 'stream': True, 'ignore_eos': True})
            results[i] = (status, len([e for e in sse_events(payload) if e['choices']]))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(results))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertTrue(all(r is not None and r[0] == 200 and r[1] >= 1 for r in results), results)


class OpenAiTenancyTest(OpenAiTestBase):
    """Bearer tokens on the HTTP port, bound to tenants: a tenant's requests
    share cache only with each other, whatever cache_salt they send."""

    @harness.setup_class_or_dump
    def setUpClass(cls):
        cls.sdk_dir()
        tokens = harness.token_file('# token tenant\nalpha-1 acme\nalpha-2 acme\nbeta-1 globex\nloner\n',
                                    'chunkattn-openai-tokens-', cls.addClassCleanup)
        cls.cluster = cls.start_cluster('openai-auth', tp=1, coordinator_args=[
            '--auth_token_file', tokens, '--served_model_name', SERVED, '--max_batch_size', '1',
            '--max_waiting_requests', '1'])
        with open(os.path.join(harness.SOURCE, 'data', 'demo', 'shakespeare.txt'), encoding='utf-8') as f:
            cls.words = f.read().split()

    def cached(self, token, prompt, salt=None):
        params = {'prompt': prompt, 'max_tokens': 1}
        if salt:
            params['cache_salt'] = salt
        out = self.sdk_call('completions', params, token=token)
        self.assertIn('result', out, out)
        return out['result']['usage']['prompt_tokens_details']['cached_tokens']

    def test_tokens_and_tenants(self):
        err = self.sdk_call('completions', {'prompt': 'x'}, token='wrong')['error']
        self.assertEqual((err['class'], err['status']), ('AuthenticationError', 401))
        self.assertEqual(Http(self.cluster.http_port).request('GET', '/v1/models')[0], 401)
        self.assertEqual(Http(self.cluster.http_port).request('GET', '/health')[0], 200)  # probes need no token
        prompt = ' '.join(self.words[1000:1150])
        self.assertEqual(self.cached('alpha-1', prompt, salt='shared'), 0)
        self.assertGreater(self.cached('alpha-2', prompt, salt='shared'), 0)  # same tenant, same salt
        self.assertEqual(self.cached('beta-1', prompt, salt='shared'), 0)     # another tenant: never
        self.assertEqual(self.cached('loner', prompt, salt='shared'), 0)      # an unbound token is its own
        self.assertEqual(self.cached('alpha-1', prompt, salt='other'), 0)     # a salt splits within a tenant

    def test_full_queue_is_429(self):
        statuses = []
        lock = threading.Lock()

        def run(i):
            status, _, _ = Http(self.cluster.http_port, 'alpha-1').request('POST', '/v1/completions', {
                'prompt': ' '.join(self.words[i * 10:i * 10 + 30]), 'max_tokens': 300, 'ignore_eos': True})
            with lock:
                statuses.append(status)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(300)
        self.assertEqual(len(statuses), 8)
        self.assertIn(429, statuses)
        self.assertIn(200, statuses)
        self.assertTrue(set(statuses) <= {200, 429}, statuses)


if __name__ == '__main__':
    harness.main()
