"""Serving by chat: GenerateRequest.chat and TokenizeRequest.chat render the
conversation with the model's chat template exactly as transformers does
(checked against tests/text/chat_reference.py, i.e. Python's jinja2 configured
as transformers configures it), tokenize it without adding special tokens, and
share the KV of what conversations have in common: a system prompt across
conversations, and a conversation's own history from turn to turn."""
import json
import os
import random
import re
import subprocess
import sys

import grpc

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'text'))
import chat_reference  # noqa: E402 (the path above)

# A template in the style of the published ones: an optional system message,
# roles that must alternate (raise_exception otherwise), trimmed content, and
# the assistant header as the generation prompt. Plain-text markers: the demo
# model's SentencePiece vocabulary has no chat tokens.
TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set system = 'You are a helpful assistant.' %}"
    "{%- set rest = messages %}{%- endif %}"
    "[SYSTEM] {{ system | trim }}\n"
    "{%- for m in rest %}\n"
    "  {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\n"
    "{{ '\\n' + m['role'] | upper + ': ' + m['content'] | trim }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{ '\\nASSISTANT:' }}{% endif %}\n")


def chat(messages, add_generation_prompt=None, tools_json='', kwargs_json=''):
    prompt = harness.pb.ChatPrompt(tools_json=tools_json, template_kwargs_json=kwargs_json)
    for role, content in messages:
        prompt.messages.add(role=role, content=content)
    if add_generation_prompt is not None:
        prompt.add_generation_prompt = add_generation_prompt
    return prompt


def chat_request(prompt, namespace, max_new_tokens=8):
    req = harness.make_request(namespace=namespace, temperature=0.0, max_new_tokens=max_new_tokens)
    req.chat.CopyFrom(prompt)
    return req


class ChatTest(harness.ServiceTestCase):

    @harness.setup_class_or_dump
    def setUpClass(cls):
        # The demo model with a tokenizer_config.json beside its files.
        cls.model = harness.temp_dir('chunkattn-chat-model-', cls.addClassCleanup)
        demo = harness.model_dir()
        for name in os.listdir(demo):
            os.symlink(os.path.join(demo, name), os.path.join(cls.model, name))
        cls.config = {'chat_template': TEMPLATE, 'bos_token': '<s>', 'eos_token': '</s>'}
        with open(os.path.join(cls.model, 'tokenizer_config.json'), 'w') as f:
            json.dump(cls.config, f)
        cls.cluster = cls.start_cluster('chat', tp=1, model=cls.model)
        cls.plain = cls.start_cluster('chat-none', shared=True, tp=1)
        cls.reference = chat_reference.Renderer(cls.config)
        with open(os.path.join(harness.SOURCE, 'data', 'demo', 'shakespeare.txt'), encoding='utf-8') as f:
            cls.prose = f.read()

    def render(self, messages, add_generation_prompt=True):
        out = self.reference.render({'messages': [{'role': r, 'content': c} for r, c in messages],
                                     'add_generation_prompt': add_generation_prompt})
        self.assertIn('text', out, out)
        return out['text']

    def tokenize_chat(self, prompt):
        return self.cluster.stub.Tokenize(harness.pb.TokenizeRequest(chat=prompt), timeout=30)

    def test_model_info_says_whether_chat_works(self):
        self.assertTrue(self.cluster.stub.GetModelInfo(harness.pb.GetModelInfoRequest(), timeout=10).chat_template)
        self.assertFalse(self.plain.stub.GetModelInfo(harness.pb.GetModelInfoRequest(), timeout=10).chat_template)
        with self.assertRaises(grpc.RpcError) as e:
            self.plain.generate(chat_request(chat([('user', 'hi')]), ''))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn('no usable chat template', e.exception.details())

    def test_the_prompt_is_what_transformers_renders(self):
        rng = random.Random(7)
        words = self.prose.split()
        for case in range(40):
            turns = [('system', ' '.join(rng.sample(words, rng.randint(1, 30))))] if rng.random() < 0.5 else []
            for t in range(rng.randint(1, 4) * 2 - 1):
                content = ' '.join(rng.sample(words, rng.randint(0, 20)))
                if rng.random() < 0.2:
                    content = '  ' + content + ' é漢字😀\n\t'
                turns.append(('user' if t % 2 == 0 else 'assistant', content))
            generation = rng.random() < 0.8
            with self.subTest(case=case):
                got = self.tokenize_chat(chat(turns, add_generation_prompt=generation))
                self.assertEqual(got.text, self.render(turns, generation))
                plain = self.cluster.stub.Tokenize(harness.pb.TokenizeRequest(text=got.text, add_bos=False),
                                                   timeout=30)
                self.assertEqual(list(got.token_ids), list(plain.token_ids))
        # add_generation_prompt defaults to true.
        self.assertTrue(self.tokenize_chat(chat([('user', 'hi')])).text.endswith('\nASSISTANT:'))

    def test_generate_by_chat_equals_generate_by_its_ids(self):
        prompt = chat([('system', 'Answer in verse.'), ('user', 'What is the hour?')])
        ids = list(self.tokenize_chat(prompt).token_ids)
        by_chat = self.cluster.generate(chat_request(prompt, harness.fresh_namespace('a')))[0]
        by_ids = self.cluster.generate(harness.make_request(prompt_ids=ids, namespace=harness.fresh_namespace('b'),
                                                            temperature=0.0, max_new_tokens=8))[0]
        self.assertEqual(by_chat.prompt_tokens, len(ids))
        self.assertEqual(by_chat.tokens, by_ids.tokens)
        self.assertEqual(by_chat.text, by_ids.text)

    def test_conversations_share_their_system_prompt_and_history(self):
        ns = harness.fresh_namespace('chat-share')
        system = ' '.join(self.prose.split()[:400])
        first = [('system', system), ('user', 'Who speaks first?')]
        second = [('system', system), ('user', 'Where are we?')]
        ids = [list(self.tokenize_chat(chat(c)).token_ids) for c in (first, second)]
        common = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
        self.assertGreater(common, 300)
        a = self.cluster.generate(chat_request(chat(first), ns))[0]
        b = self.cluster.generate(chat_request(chat(second), ns))[0]
        self.assertEqual(a.cached_prompt_tokens, 0)
        self.assertGreaterEqual(b.cached_prompt_tokens, common - 1)
        self.assertLessEqual(b.cached_prompt_tokens, common)
        # The next turn of the first conversation: its own history is cached.
        third = first + [('assistant', a.text), ('user', 'And then?')]
        c = self.cluster.generate(chat_request(chat(third), ns))[0]
        self.assertGreaterEqual(c.cached_prompt_tokens, len(ids[0]) - 2)
        self.assertEqual(self.cluster.cache_stats().used_chunks, 0)

    def test_chat_cli_keeps_the_conversation_and_shows_its_reuse(self):
        cli = harness.bin_path('chunkattn')
        run = subprocess.run([cli, 'chat', '--server', '127.0.0.1:%d' % self.cluster.port, '--system',
                              'You are terse.', '--temperature', '0', '--max_new_tokens', '6', '--namespace',
                              harness.fresh_namespace('cli')],
                             input='Who are you?\n\nAnd then?\n/reset\nWho are you?\n/exit\nnever sent\n',
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        turns = re.findall(r'\[turn (\d+): finish=\w+ prompt_tokens=(\d+) cached_prompt_tokens=(\d+) '
                           r'\((\d+)% of the prompt reused from the cache([^)]*)\)', run.stderr)
        self.assertEqual([t[0] for t in turns], ['1', '2', '1'], run.stderr)
        first, second, again = [(int(p), int(c)) for _, p, c, _, _ in turns]
        self.assertEqual(first[1], 0)
        # Turn 2 sends turn 1's prompt and reply again: the cache holds them.
        self.assertGreaterEqual(second[1], first[0] - 2)
        self.assertIn('the conversation so far', turns[1][4])
        # After /reset the same first message is a fresh conversation, fully cached.
        self.assertEqual(again[0], first[0])
        self.assertGreaterEqual(again[1], first[0] - 1)
        self.assertIn('[conversation reset]', run.stderr)
        # Three replies on stdout, each ended by a newline.
        self.assertGreaterEqual(run.stdout.count('\n'), 3, run.stdout)

    def test_bad_chats_are_invalid_argument_naming_the_field(self):
        long_text = 'x' * (4096 * 32 + 1)
        cases = [
            (chat([('user', 'a'), ('user', 'b')]), 'Conversation roles must alternate'),
            (chat([]), 'prompt.chat.messages is empty'),
            (chat([('', 'a')]), 'prompt.chat.messages[0].role is empty'),
            (chat([('user', 'a')], tools_json='['), 'prompt.chat.tools_json is not valid JSON'),
            (chat([('user', 'a')], tools_json='{}'), 'prompt.chat.tools_json must be a JSON array'),
            (chat([('user', 'a')], kwargs_json='[]'), 'prompt.chat.template_kwargs_json must be a JSON object'),
            (chat([('user', long_text)]), 'bytes; at most'),
        ]
        bad_calls = chat([('user', 'a')])
        bad_calls.messages[0].tool_calls_json = '{"not": "a list"}'
        cases.append((bad_calls, 'prompt.chat.messages[0].tool_calls_json must be a JSON array'))
        for prompt, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(grpc.RpcError) as e:
                    self.cluster.generate(chat_request(prompt, ''))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn(message, e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.cluster.stub.Tokenize(harness.pb.TokenizeRequest(text='a', chat=chat([('user', 'a')])), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(self.cluster.cache_stats().used_chunks, 0)


if __name__ == '__main__':
    harness.main()
