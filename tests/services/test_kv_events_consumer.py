"""Unit tests of kv_events_consumer against a small publisher written here
from vLLM's documented format (docs/design/issue-24-research.md, section 1.3),
and of the committed wire fixtures in tests/fixtures/kv_events.

Run: /usr/bin/python3 tests/services/test_kv_events_consumer.py
(needs python3-zmq, python3-msgpack, python3-cbor2; binds 127.0.0.1 only).
"""

import collections
import glob
import json
import os
import struct
import sys
import threading
import time
import unittest

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_events_consumer as kv  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'fixtures', 'kv_events')
WAIT_S = 10
BS = 4  # block size of these tests
TOPIC = b'kv@127.0.0.1@test-model'


class FakePublisher:
    """vLLM's ZmqEventPublisher in miniature: PUB frames [topic, seq, batch],
    a ring of (seq, payload) served by a ROUTER. The PUB is an XPUB so a test
    can wait until the consumer's subscription has arrived."""

    def __init__(self, form='map', legacy_replay=False):
        self.form = form
        self.legacy_replay = legacy_replay  # reply layout before vLLM #45177
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind('tcp://127.0.0.1:*')
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind('tcp://127.0.0.1:*')
        self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.lock = threading.Lock()
        self.ring = collections.deque(maxlen=1000)
        self.seq = 0
        self.replay_requests = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    def publish(self, events, drop_live=False):
        """Publishes one batch; drop_live keeps it out of the live stream
        (as if the subscriber missed it) but in the replay ring."""
        payload = kv.encode_batch(time.time(), events, self.form)
        with self.lock:
            seq, self.seq = self.seq, self.seq + 1
            self.ring.append((seq, payload))
        if not drop_live:
            self.pub.send_multipart([TOPIC, seq.to_bytes(8, 'big'), payload])
        return seq

    def restart(self):
        """Like a restarted process on the same ports: seq from 0, empty ring."""
        with self.lock:
            self.seq = 0
            self.ring.clear()

    def wait_subscribed(self, timeout=WAIT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pub.poll(100) and self.pub.recv().startswith(b'\x01'):
                return True
        return False

    def _serve_replay(self):
        while not self.stopping.is_set():
            if not self.router.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            start = int.from_bytes(start, 'big')
            with self.lock:
                self.replay_requests += 1
                batches = [(s, p) for s, p in self.ring if s >= start]
            prefix = [client, b''] if self.legacy_replay else [client, b'', TOPIC]
            for s, p in batches:
                self.router.send_multipart(prefix + [s.to_bytes(8, 'big'), p])
            self.router.send_multipart(prefix[:2] + ([] if self.legacy_replay else [b''])
                                       + [kv.END_SEQ, b''])

    def close(self):
        self.stopping.set()
        self.thread.join(5)
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


def tokens(start, blocks=1):
    return list(range(start, start + blocks * BS))


def blocks_of(toks):
    return [toks[i:i + BS] for i in range(0, len(toks), BS)]


class Chain:
    """Correct hashes for a chain of blocks, for building events."""

    def __init__(self, toks, salt='', parent=None, seed='0'):
        self.tokens = toks
        self.salt = salt
        self.parent = parent
        parent_digest = parent.digests[-1] if parent else None
        self.digests, self.hashes = kv.chain_hashes(seed, blocks_of(toks), salt, parent_digest)

    def stored(self):
        parent = self.parent.hashes[-1] if self.parent else None
        return kv.stored_event(self.hashes, parent, self.tokens, BS, self.salt)


class ConsumerTestCase(unittest.TestCase):
    form = 'map'
    legacy_replay = False

    def setUp(self):
        self.pub = FakePublisher(self.form, self.legacy_replay)
        self.addCleanup(self.pub.close)

    def consumer(self, subscribe=True, **kwargs):
        c = kv.KvEventConsumer(self.pub.endpoint, self.pub.replay_endpoint,
                               block_size=kwargs.pop('block_size', BS), **kwargs)
        c.start()
        self.addCleanup(c.stop)
        if subscribe:
            self.assertTrue(self.pub.wait_subscribed())
        return c

    def publish_and_wait(self, c, events, **kwargs):
        seq = self.pub.publish(events, **kwargs)
        self.assertTrue(c.wait_for_seq(seq, WAIT_S), 'seq %d not applied: %s' % (seq, c.stats()))
        return seq

    def assertClean(self, c):
        self.assertEqual(c.errors, [])


class StoreRemoveTest(ConsumerTestCase):

    def test_store_child_remove(self):
        c = self.consumer()
        root = Chain(tokens(0, 2))
        child = Chain(tokens(100), parent=root)
        self.publish_and_wait(c, [root.stored()])
        self.publish_and_wait(c, [child.stored(), kv.removed_event(root.hashes[:1])])
        self.assertEqual(c.blocks(),
                         {'': collections.Counter({root.hashes[1]: 1, child.hashes[0]: 1})})
        st = c.stats()
        self.assertEqual((st['batches'], st['events'], st['stored'], st['removed']), (2, 3, 3, 1))
        self.assertEqual(st[self.form + '_events'], 3)
        self.assertEqual(c.last_seq, 1)
        self.assertClean(c)

    def test_salted_namespaces(self):
        c = self.consumer()
        toks = tokens(0, 2)
        plain, a, b = Chain(toks), Chain(toks, 'tenant-a'), Chain(toks, 'tenant-b')
        a_child = Chain(tokens(50), parent=a)  # no salt of its own: inherits
        self.assertEqual(len(set(plain.hashes + a.hashes + b.hashes)), 6)
        self.publish_and_wait(c, [plain.stored(), a.stored(), b.stored(), a_child.stored()])
        got = c.blocks()
        self.assertEqual(set(got), {'', 'tenant-a', 'tenant-b'})
        self.assertEqual(set(got['tenant-a']), set(a.hashes + a_child.hashes))
        self.assertEqual(set(got['']), set(plain.hashes))
        self.assertClean(c)

    def test_all_blocks_cleared(self):
        c = self.consumer()
        root = Chain(tokens(0, 3))
        self.publish_and_wait(c, [root.stored()])
        self.publish_and_wait(c, [kv.cleared_event()])
        self.assertEqual(c.blocks(), {})
        # After a clear the old blocks are gone: a child of one is an error.
        self.publish_and_wait(c, [Chain(tokens(9), parent=root).stored()])
        self.assertEqual(len(c.errors), 1)
        self.assertIn('unknown', c.errors[0])
        self.assertEqual(c.stats()['cleared'], 1)

    def test_duplicate_stores_are_counted(self):
        c = self.consumer()
        root = Chain(tokens(0))
        self.publish_and_wait(c, [root.stored(), root.stored()])
        self.assertEqual(c.blocks(), {'': collections.Counter({root.hashes[0]: 2})})
        self.publish_and_wait(c, [kv.removed_event(root.hashes)])
        self.assertEqual(c.blocks(), {'': collections.Counter({root.hashes[0]: 1})})
        self.publish_and_wait(c, [kv.removed_event(root.hashes)])
        self.assertEqual(c.blocks(), {})
        self.assertClean(c)
        self.publish_and_wait(c, [kv.removed_event(root.hashes)])  # one too many
        self.assertEqual(len(c.errors), 1)
        self.assertIn('not stored', c.errors[0])


class ArrayFormTest(StoreRemoveTest):
    """The same with legacy array-encoded events and the older replay layout."""
    form = 'array'
    legacy_replay = True


class ChecksTest(ConsumerTestCase):

    def test_wrong_hash_flagged(self):
        c = self.consumer()
        root = Chain(tokens(0, 2))
        bad = list(root.hashes)
        bad[1] ^= 1
        self.publish_and_wait(c, [kv.stored_event(bad, None, root.tokens, BS)])
        self.assertEqual(len(c.errors), 1, c.errors)
        self.assertIn('block 1 hash', c.errors[0])
        # The index keeps what was published; children chain from the
        # recomputed digest, so the next block checks out.
        child = Chain(tokens(40), parent=root)
        self.publish_and_wait(c, [kv.stored_event(child.hashes, bad[1], child.tokens, BS)])
        self.assertEqual(len(c.errors), 1, c.errors)

    def test_wrong_salt_or_seed_flagged(self):
        c = self.consumer()
        self.publish_and_wait(c, [Chain(tokens(0), 'x').stored()])
        self.assertClean(c)
        wrong = Chain(tokens(0), 'x')
        self.publish_and_wait(c, [kv.stored_event(wrong.hashes, None, wrong.tokens, BS, 'y')])
        self.publish_and_wait(c, [Chain(tokens(0), seed='1').stored()])
        mismatches = [e for e in c.errors if 'sha256_cbor gives' in e]
        self.assertEqual(len(mismatches), 2, c.errors)

    def test_shape_checks(self):
        c = self.consumer(block_size=8)
        root = Chain(tokens(0, 2))
        self.publish_and_wait(c, [root.stored()])  # block size 4, expected 8
        self.publish_and_wait(c, [kv.stored_event(root.hashes, None, root.tokens[:-1], BS)])
        self.publish_and_wait(c, [kv.stored_event([5], 12345, tokens(0), BS)])
        joined = '\n'.join(c.errors)
        self.assertIn('expected 8', joined)
        self.assertIn('7 token_ids for 2 blocks', joined)
        self.assertIn('parent 12345 is unknown', joined)

    def test_hash_encodings(self):
        """int64 (negative), uint64 and 32-byte bin hashes all name one block."""
        c = self.consumer()
        root = Chain(tokens(0, 2))
        signed = [h - (1 << 64) if h >= 1 << 63 else h for h in root.hashes]
        self.publish_and_wait(c, [kv.stored_event(signed, None, root.tokens, BS)])
        child = Chain(tokens(70), parent=root)
        self.publish_and_wait(
            c, [kv.stored_event(child.digests, root.digests[-1], child.tokens, BS)])
        self.publish_and_wait(c, [kv.removed_event([root.digests[0], child.hashes[0]])])
        self.assertEqual(c.blocks(), {'': collections.Counter({root.hashes[1]: 1})})
        self.assertClean(c)

    def test_malformed_batches_flagged(self):
        c = self.consumer()
        for payload in (b'\xc1', kv.msgpack.packb([1.0, [['NoSuchEvent']], 0]),
                        kv.msgpack.packb([1.0, [{'type': 'BlockRemoved', 'block_hashes': [1]}], 0]),
                        kv.msgpack.packb([1, [], 0])):
            with self.pub.lock:
                seq, self.pub.seq = self.pub.seq, self.pub.seq + 1
                self.pub.ring.append((seq, payload))
            self.pub.pub.send_multipart([TOPIC, seq.to_bytes(8, 'big'), payload])
            self.assertTrue(c.wait_for_seq(seq, WAIT_S))
        joined = '\n'.join(c.errors)
        for text in ('undecodable', 'unknown event tag', 'lacks required field medium', 'float64'):
            self.assertIn(text, joined)


class ReplayTest(ConsumerTestCase):

    def test_slow_joiner_replays_from_zero(self):
        root = Chain(tokens(0, 2))
        self.pub.publish([root.stored()])
        self.pub.publish([kv.removed_event(root.hashes[1:])])
        c = self.consumer(subscribe=False)
        self.assertTrue(c.wait_for_seq(1, WAIT_S))
        self.assertEqual(c.blocks(), {'': collections.Counter({root.hashes[0]: 1})})
        self.assertEqual(c.stats()['gaps_healed'], 1)
        self.assertClean(c)

    def test_dropped_batches_healed_by_replay(self):
        c = self.consumer()
        root = Chain(tokens(0))
        mid = Chain(tokens(10), parent=root)
        leaf = Chain(tokens(20), parent=mid)
        self.publish_and_wait(c, [root.stored()])
        self.pub.publish([mid.stored()], drop_live=True)        # seq 1, missed
        self.pub.publish([kv.removed_event(root.hashes)], drop_live=True)
        self.publish_and_wait(c, [leaf.stored()])               # seq 3 shows the gap
        self.assertEqual(c.blocks(),
                         {'': collections.Counter({mid.hashes[0]: 1, leaf.hashes[0]: 1})})
        st = c.stats()
        self.assertEqual(st['batches'], 4)
        self.assertGreaterEqual(st['gaps_healed'], 1)
        self.assertGreaterEqual(self.pub.replay_requests, 2)  # on connect, on the gap
        self.assertClean(c)

    def test_disconnect_healed_by_replay(self):
        c = self.consumer()
        root = Chain(tokens(0))
        self.publish_and_wait(c, [root.stored()])
        self.assertTrue(c.disconnect(0.5))
        children = [Chain(tokens(100 * i), parent=root) for i in range(1, 4)]
        for child in children:
            self.pub.publish([child.stored()])   # nobody is subscribed
        self.assertTrue(c.wait_for_seq(3, WAIT_S), c.stats())
        self.assertEqual(sum(c.blocks()[''].values()), 4)
        self.assertGreaterEqual(c.stats()['gaps_healed'], 1)
        self.assertTrue(self.pub.wait_subscribed())  # the new SUB; live again
        self.publish_and_wait(c, [kv.cleared_event()])
        self.assertEqual(c.blocks(), {})
        self.assertClean(c)

    def test_publisher_restart_resets(self):
        c = self.consumer()
        old = Chain(tokens(0, 2))
        self.publish_and_wait(c, [old.stored()])
        self.publish_and_wait(c, [kv.removed_event(old.hashes[1:])])
        self.pub.restart()
        new = Chain(tokens(500))
        self.pub.publish([new.stored()], drop_live=True)  # seq 0 of the new run, missed
        seq = self.pub.publish([kv.removed_event(new.hashes), new.stored()])  # seq 1 < 1: reset
        self.assertEqual(seq, 1)
        deadline = time.monotonic() + WAIT_S
        while c.stats()['resets'] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertTrue(c.wait_for_seq(1, WAIT_S))
        self.assertEqual(c.stats()['resets'], 1)
        self.assertEqual(c.blocks(), {'': collections.Counter({new.hashes[0]: 1})})
        self.assertClean(c)


class EncodingTest(unittest.TestCase):
    """Bytes derived by hand from the msgpack spec, independent of the
    encoder: fixarray 0x93, float64 0xcb, fixmap 0x8N, fixstr 0xaN / str8
    0xd9, uint64 0xcf, nil 0xc0."""

    TS = b'\xcb' + struct.pack('>d', 1767225600.0)

    def test_cleared_map(self):
        want = (b'\x93' + self.TS + b'\x91\x81\xa4type\xb0AllBlocksCleared\x00')
        self.assertEqual(kv.encode_batch(1767225600.0, [kv.cleared_event()], 'map'), want)

    def test_cleared_array(self):
        want = b'\x93' + self.TS + b'\x91\x91\xb0AllBlocksCleared\x00'
        self.assertEqual(kv.encode_batch(1767225600.0, [kv.cleared_event()], 'array'), want)

    def test_removed_uint64(self):
        ev = kv.removed_event([2 ** 64 - 1, 1])
        want = (b'\x93' + self.TS + b'\x91\x83\xa4type\xacBlockRemoved'
                b'\xacblock_hashes\x92\xcf' + b'\xff' * 8 + b'\x01\xa6medium\xa3GPU\x00')
        self.assertEqual(kv.encode_batch(1767225600.0, [ev], 'map'), want)

    def test_stored_array_salted(self):
        ev = kv.stored_event([300], None, [0, 65536], 2, 'ns')
        want = (b'\x93' + self.TS + b'\x91\x99\xabBlockStored\x91\xcd\x01\x2c\xc0'
                b'\x92\x00\xce\x00\x01\x00\x00\x02\xc0\xa3GPU\xc0\x91\x91\xa2ns\x00')
        self.assertEqual(kv.encode_batch(1767225600.0, [ev], 'array'), want)

    def test_hash_chain_by_hand(self):
        """Block 0 of seed '0', tokens [1, 2], no salt: the CBOR is
        [bstr(32) NONE, [1, 2], null]; NONE = sha256(CBOR text '0')."""
        import hashlib
        none = hashlib.sha256(b'\x610').digest()
        self.assertEqual(kv.none_hash('0'), none)
        cbor = b'\x83\x58\x20' + none + b'\x82\x01\x02\xf6'
        self.assertEqual(kv.block_cbor(none, [1, 2], None), cbor)
        want = int.from_bytes(hashlib.sha256(cbor).digest()[-8:], 'big')
        self.assertEqual(kv.chain_hashes('0', [[1, 2]])[1], [want])
        salted = b'\x83\x58\x20' + none + b'\x82\x01\x02\x81\x62ns'
        self.assertEqual(kv.block_cbor(none, [1, 2], ('ns',)), salted)


def to_event(e):
    if e['type'] == kv.STORED:
        return kv.stored_event(e['block_hashes'], e['parent_block_hash'], e['token_ids'],
                               e['block_size'], e['cache_salt'], e.get('medium', 'GPU'))
    if e['type'] == kv.REMOVED:
        return kv.removed_event(e['block_hashes'], e.get('medium', 'GPU'))
    return kv.cleared_event()


class FixturesTest(unittest.TestCase):
    """The committed fixtures decode to their JSON and match the generator."""

    def test_batches(self):
        sys.path.insert(0, FIXTURES)
        import make_fixtures
        names = sorted(glob.glob(os.path.join(FIXTURES, '*.msgpack')))
        self.assertGreaterEqual(len(names), 10)
        for path in names:
            with self.subTest(os.path.basename(path)):
                with open(path[:-len('.msgpack')] + '.json') as f:
                    spec = json.load(f)
                with open(path, 'rb') as f:
                    payload = f.read()
                self.assertEqual(make_fixtures.encode(spec), payload, 'regenerate the fixtures')
                # The consumer module's encoder, written separately, agrees.
                self.assertEqual(kv.encode_batch(spec['ts'], [to_event(e) for e in spec['events']],
                                                 spec['format']), payload)
                ts, events, rank, batch_form, problems = kv.decode_batch(payload)
                self.assertEqual(problems, [])
                self.assertEqual((ts, rank, batch_form), (spec['ts'], 0, 'array'))
                self.assertEqual(len(events), len(spec['events']))
                for (tag, fields, form), want in zip(events, spec['events']):
                    self.assertEqual((tag, form), (want['type'], spec['format']))
                    for key in ('block_hashes', 'parent_block_hash', 'token_ids', 'block_size'):
                        if key in want:
                            self.assertEqual(fields[key], want[key], key)
                    if tag != kv.CLEARED:
                        self.assertEqual(fields['medium'], want.get('medium', spec['medium']))
                    salt = want.get('cache_salt', '')
                    if tag == kv.STORED and salt and want['parent_block_hash'] is None:
                        self.assertEqual(fields['extra_keys'][0], [salt])
                    else:
                        self.assertNotIn('extra_keys', fields)

    def test_hashes(self):
        with open(os.path.join(FIXTURES, 'hashes.json')) as f:
            cases = json.load(f)['cases']
        self.assertGreaterEqual(len(cases), 4)
        for case in cases:
            digests, hashes = kv.chain_hashes(case['seed'], case['blocks'], case['salt'])
            self.assertEqual(hashes, case['hashes'])
            for blk in case['blocks']:
                self.assertEqual(len(blk), case['block_size'])
        self.assertTrue(any(h >= 1 << 63 for c in cases for h in c['hashes']))


if __name__ == '__main__':
    unittest.main()
