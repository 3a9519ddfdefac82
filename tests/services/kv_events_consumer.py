"""A test-side consumer of KV-cache events in vLLM's wire format.

Written from the documented format (docs/design/issue-24-research.md, sections
1, 2 and 6), not from chunkattn's C++ publisher, so that tests check the
publisher against the format rather than against itself.

Transport: a ZMQ SUB socket receives 3-frame messages [topic, seq (8 bytes,
big-endian), msgpack EventBatch]; a DEALER socket asks the publisher's ROUTER
for missed batches ([b'', start seq] -> one [b'', topic, seq, payload] per
batch, then an end marker whose payload frame is empty; the layout before
vLLM #45177 has no topic frame). A publisher may bound a reply (chunkattn
sends at most 1,000 batches per request), so after an end marker that came
with new batches the consumer asks again from last+1, until a reply brings
nothing new. The consumer replays from 0 on connect (a SUB misses what is
published before its subscription arrives), from last+1 after a gap or a
reconnect, and from 0 after a publisher restart. With `curve` (the server's
public key and the consumer's keypair, Z85) both sockets speak ZMQ CURVE.

Index: per namespace (the cache_salt in block 0's extra_keys; children
inherit their parent's), a count per stored block hash, since vLLM does not
dedupe. Every BlockStored is checked against an independent recomputation of
vLLM's sha256_cbor hash chain. Violations are appended to `errors`; the
background thread never raises.

Also here, for the tests and tests/fixtures/kv_events/make_fixtures.py: the
hash chain (chain_hashes) and a reference encoder (encode_batch).
"""

import collections
import hashlib
import threading
import time

import cbor2
import msgpack
import zmq

MASK64 = (1 << 64) - 1
END_SEQ = b'\xff' * 8  # (-1) as 8 signed big-endian bytes

STORED, REMOVED, CLEARED = 'BlockStored', 'BlockRemoved', 'AllBlocksCleared'

# Field names in declaration order, and how many leading ones are required
# (present on the wire even when nil); the rest default to None and are left
# out when None (msgspec omit_defaults). Wire facts from the research doc 1.1.
EVENT_FIELDS = {
    STORED: (('block_hashes', 'parent_block_hash', 'token_ids', 'block_size',
              'lora_id', 'medium', 'lora_name', 'extra_keys', 'group_idx',
              'kv_cache_spec_kind', 'kv_cache_spec_sliding_window'), 7),
    REMOVED: (('block_hashes', 'medium', 'group_idx'), 2),
    CLEARED: ((), 0),
}


# --- vLLM's sha256_cbor block-hash chain -------------------------------------

# The media of chunkattn's KV tiers below the pool (host, disk, the shared
# store); the pool's is GPU.
TIER_MEDIA = ('CPU', 'STORAGE', 'SHARED')


def none_hash(seed):
    """The root's parent digest: SHA-256 of the CBOR text string of the seed
    (vLLM: hash_fn(PYTHONHASHSEED))."""
    return hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()


def block_cbor(parent_digest, tokens, extra_keys):
    """The hashed CBOR: [parent digest (bstr), [tokens], extra keys array or
    null]. Tuples and lists both encode as CBOR arrays."""
    extra = tuple(extra_keys) if extra_keys is not None else None
    return cbor2.dumps((parent_digest, tuple(tokens), extra), canonical=True)


def block_digest(parent_digest, tokens, extra_keys):
    return hashlib.sha256(block_cbor(parent_digest, tokens, extra_keys)).digest()


def published_hash(digest):
    """The 64-bit value on the wire: the digest's last 8 bytes, big-endian.
    chunkattn publishes 0 as 1 (llm-d reads 0 as "no parent")."""
    return int.from_bytes(digest[-8:], 'big') or 1


def chain_hashes(seed, blocks, salt='', parent_digest=None):
    """Digests and published hashes of consecutive blocks (lists of tokens).
    Without parent_digest the first block is block 0 and carries the salt."""
    digests, parent = [], parent_digest
    for k, tokens in enumerate(blocks):
        root = k == 0 and parent_digest is None
        extra = (salt,) if root and salt else None
        parent = block_digest(none_hash(seed) if parent is None else parent, tokens, extra)
        digests.append(parent)
    return digests, [published_hash(d) for d in digests]


def normalize_hash(value):
    """An ExternalBlockHash as an unsigned 64-bit int: ints (int64 or uint64)
    modulo 2^64, bytes by their last 8 bytes big-endian. None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, (bytes, bytearray)):
        return int.from_bytes(bytes(value[-8:]), 'big')
    return None


# --- reference encoder (tests and fixtures) ----------------------------------

def stored_event(block_hashes, parent_block_hash, token_ids, block_size,
                 cache_salt='', medium='GPU'):
    """A BlockStored as (tag, fields). The salt goes into extra_keys only
    when the event starts at block 0 (no parent), as [salt] for that block
    and nil for the others; extra_keys stays None (omitted) otherwise."""
    fields = {'block_hashes': list(block_hashes), 'parent_block_hash': parent_block_hash,
              'token_ids': list(token_ids), 'block_size': block_size,
              'lora_id': None, 'medium': medium, 'lora_name': None}
    if cache_salt and parent_block_hash is None and block_hashes:
        fields['extra_keys'] = [[cache_salt]] + [None] * (len(block_hashes) - 1)
    return STORED, fields


def removed_event(block_hashes, medium='GPU'):
    return REMOVED, {'block_hashes': list(block_hashes), 'medium': medium}


def cleared_event():
    return CLEARED, {}


def event_to_wire(tag, fields, form):
    """The msgpack-ready object msgspec would produce: a map with "type"
    first then fields in declaration order ('map', vLLM >= 0.26), or the tag
    then positional fields ('array', older). Optional fields equal to their
    default (None) are omitted from maps; arrays drop only trailing ones."""
    names, required = EVENT_FIELDS[tag]
    if form == 'map':
        out = {'type': tag}
        for i, name in enumerate(names):
            value = fields.get(name)
            if i < required or value is not None:
                out[name] = value
        return out
    values = [fields.get(name) for name in names]
    while len(values) > required and values[-1] is None:
        values.pop()
    return [tag] + values


def encode_batch(ts, events, form='map', data_parallel_rank=0):
    """An EventBatch as msgspec encodes it: [ts (float64), events, rank]."""
    wire = [float(ts), [event_to_wire(tag, fields, form) for tag, fields in events],
            data_parallel_rank]
    return msgpack.packb(wire, use_bin_type=True, use_single_float=False)


# --- decoder -----------------------------------------------------------------

def decode_event(raw):
    """(tag, fields, form, problems) for one event, map or array form."""
    problems = []
    if isinstance(raw, dict):
        form, tag = 'map', raw.get('type')
        fields = {k: v for k, v in raw.items() if k != 'type'}
    elif isinstance(raw, list) and raw:
        form, tag = 'array', raw[0]
        names = EVENT_FIELDS[tag][0] if isinstance(tag, str) and tag in EVENT_FIELDS else ()
        if len(raw) - 1 > len(names):
            problems.append('%s: %d positional fields, at most %d known'
                            % (tag, len(raw) - 1, len(names)))
        fields = dict(zip(names, raw[1:]))
    else:
        return None, {}, None, ['event is neither a map nor a tagged array: %r' % (raw,)]
    if not isinstance(tag, str) or tag not in EVENT_FIELDS:
        return None, fields, form, ['unknown event tag %r' % (tag,)]
    names, required = EVENT_FIELDS[tag]
    for name in names[:required]:
        if name not in fields:
            problems.append('%s (%s form) lacks required field %s' % (tag, form, name))
    # What msgspec (omit_defaults) would not have written. Consumers must not
    # rely on these, but a publisher matching vLLM byte for byte passes them.
    if form == 'map':
        keys = list(raw)
        known = [k for k in keys if k in names]
        if keys[0] != 'type' or known != sorted(known, key=names.index):
            problems.append('%s map keys %s are not in msgspec order' % (tag, keys))
        omitted = [n for n in names[required:] if n in fields and fields[n] is None]
    else:  # only trailing defaults are dropped from arrays
        count = min(len(raw) - 1, len(names))
        omitted = [names[count - 1]] if count > required and raw[count] is None else []
    if omitted:
        problems.append('%s (%s form) carries %s as nil; msgspec omits it'
                        % (tag, form, omitted[0]))
    return tag, fields, form, problems


def decode_batch(payload):
    """(ts, [(tag, fields, form)], data_parallel_rank, batch_form, problems).
    Raises on bytes that are not one msgpack object."""
    obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    problems = []
    if isinstance(obj, list):
        batch_form = 'array'
        if len(obj) == 3 and payload[1:2] != b'\xcb':
            problems.append('ts is not encoded as a float64 (0xcb)')
        if len(obj) != 3:
            problems.append('EventBatch has %d elements, expected 3 '
                            '[ts, events, data_parallel_rank]' % len(obj))
        obj = obj + [None] * (3 - len(obj))
        ts, raw_events, rank = obj[:3]
    elif isinstance(obj, dict):  # open question 1 of the research doc
        batch_form = 'map'
        ts, raw_events, rank = obj.get('ts'), obj.get('events'), obj.get('data_parallel_rank')
    else:
        raise ValueError('EventBatch is a %s' % type(obj).__name__)
    if not isinstance(ts, float):
        problems.append('ts is %r, expected a float64' % (ts,))
    if not isinstance(rank, int) or isinstance(rank, bool):
        problems.append('data_parallel_rank is %r, expected an int' % (rank,))
    if not isinstance(raw_events, list):
        problems.append('events is %r, expected an array' % (raw_events,))
        raw_events = []
    events = []
    for raw in raw_events:
        tag, fields, form, event_problems = decode_event(raw)
        problems.extend(event_problems)
        if tag is not None:
            events.append((tag, fields, form))
    return ts, events, rank, batch_form, problems


# --- the consumer ------------------------------------------------------------

class KvEventConsumer:
    """Subscribes to one publisher, keeps its block index, checks every event.

    Only the background thread touches the sockets; the index, stats and
    errors are read under a lock. All waits are bounded.
    """

    POLL_S = 0.05
    REPLAY_IDLE_S = 2.0     # longest wait for the next replay frame
    REPLAY_TOTAL_S = 10.0   # longest one replay may take
    REPLAY_RETRY_S = 1.0    # after a failed replay
    FOLLOW_UP_S = 1.0       # second replay after a (re)connect, if nothing came live
    STOP_TIMEOUT_S = 15.0

    def __init__(self, endpoint, replay_endpoint=None, topic_filter='kv@',
                 hash_seed='0', block_size=None, curve=None):
        self.endpoint = endpoint
        # (server public key, own public key, own secret key), Z85; None: plaintext.
        self.curve = curve
        self.replay_endpoint = replay_endpoint
        self.topic_filter = topic_filter.encode() if isinstance(topic_filter, str) else topic_filter
        self.hash_seed = hash_seed
        self.block_size = block_size
        self.errors = []
        self._none_hash = none_hash(hash_seed)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._stats = collections.Counter({k: 0 for k in (
            'batches', 'events', 'stored', 'removed', 'cleared', 'replays',
            'gaps_healed', 'resets', 'duplicates', 'replay_failures',
            'map_events', 'array_events', 'map_batches')})
        self._last_seq = -1
        self._counts = {}       # namespace -> Counter(hash -> count)
        self._known = {}        # hash -> (namespace, full digest or None)
        self._tiers = {}        # medium of a tier below the pool -> Counter(hash -> count)
        self._payload_sha = {}  # seq -> sha256 of the applied payload
        self._live_high = -1    # highest seq seen on the live stream
        self._stop = threading.Event()
        self._commands = collections.deque()
        self._thread = None
        self._ctx = None
        self._sub = self._dealer = None
        self._replay_at = None  # when the next replay from last+1 is due
        self._follow_up_at = None
        self._live_since_connect = False
        self._reset_requested = False
        self.last_reset_reason = None
        self.last_topic = None  # of the last live message

    # --- public API ---

    def start(self):
        self._ctx = zmq.Context()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,),
                                        name='kv-event-consumer', daemon=True)
        self._thread.start()
        if not ready.wait(10):
            self._error('consumer thread did not start in 10 s')
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.STOP_TIMEOUT_S)
            if self._thread.is_alive():
                self._error('consumer thread did not stop in %d s' % self.STOP_TIMEOUT_S)
                return  # its sockets are still open: leave the context alone
            self._thread = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def last_seq(self):
        with self._lock:
            return self._last_seq

    def wait_for_seq(self, seq, timeout):
        with self._cond:
            return self._cond.wait_for(lambda: self._last_seq >= seq, timeout)

    def tier_blocks(self):
        """{medium: {namespace: Counter(hash -> count)}} of the tiers below
        the pool (media other than the pool's GPU); a hash the pool never
        reported (a block another replica computed) is in namespace None."""
        with self._lock:
            out = {}
            for medium, counts in self._tiers.items():
                for h, n in counts.items():
                    ns = self._known[h][0] if h in self._known else None
                    out.setdefault(medium, {}).setdefault(ns, collections.Counter())[h] = n
            return out

    def blocks(self):
        with self._lock:
            return {ns: collections.Counter(c) for ns, c in self._counts.items() if c}

    def stats(self):
        with self._lock:
            return dict(self._stats)

    def disconnect(self, seconds):
        """Closes the SUB socket, stays away `seconds`, then reconnects and
        replays from last+1. Returns once the socket is closed (True), so
        batches the caller publishes next are missed live."""
        closed = threading.Event()
        self._commands.append((seconds, closed))
        return closed.wait(10)

    # --- thread ---

    def _error(self, message):
        with self._lock:
            self.errors.append(message)

    def _run(self, ready):
        try:
            self._connect()
            ready.set()
            while not self._stop.is_set():
                if self._commands:
                    self._away(*self._commands.popleft())
                    continue
                now = time.monotonic()
                if self._reset_requested:
                    self._reset('replayed batch differs from the one applied')
                    self._replay_at = now
                if self._follow_up_at is not None and now >= self._follow_up_at:
                    self._follow_up_at = None
                    if not self._live_since_connect and self._replay_at is None:
                        self._replay_at = now
                if self._replay_at is not None and now >= self._replay_at:
                    ok = self._replay()
                    self._replay_at = None if ok else time.monotonic() + self.REPLAY_RETRY_S
                if self._sub.poll(int(self.POLL_S * 1000)):
                    self._on_live(self._sub.recv_multipart())
        except Exception as e:  # a bug here must show up in errors, not kill silently
            self._error('consumer thread failed: %r' % (e,))
        finally:
            ready.set()
            for sock in (self._sub, self._dealer):
                if sock is not None:
                    sock.close(linger=0)
            self._sub = self._dealer = None

    def _secure(self, sock):
        if self.curve:
            server, public, secret = (k.encode() if isinstance(k, str) else k for k in self.curve)
            sock.setsockopt(zmq.CURVE_SERVERKEY, server)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)

    def _connect(self):
        self._sub = self._ctx.socket(zmq.SUB)
        self._secure(self._sub)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 100000)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic_filter)
        self._sub.connect(self.endpoint)
        self._live_since_connect = False
        if self.replay_endpoint:
            now = time.monotonic()
            self._replay_at = now
            self._follow_up_at = now + self.FOLLOW_UP_S

    def _away(self, seconds, closed):
        self._sub.close(linger=0)
        self._sub = None
        closed.set()
        if self._stop.wait(seconds):
            return
        self._connect()

    def _on_live(self, frames):
        if len(frames) != 3:
            self._error('live message has %d frames, expected 3' % len(frames))
            return
        topic, seq_bytes, payload = frames
        if len(seq_bytes) != 8:
            self._error('live seq frame has %d bytes, expected 8' % len(seq_bytes))
            return
        seq = int.from_bytes(seq_bytes, 'big')
        self.last_topic = topic.decode('utf-8', 'replace')
        self._live_since_connect = True
        # The live stream of one publisher only goes up (a reconnect of ours
        # only skips ahead), so a step back, or a known seq with other
        # bytes, means the publisher restarted with seq 0: start over.
        if seq <= self._live_high or self._differs(seq, payload):
            self._reset('live seq %d after %d' % (seq, max(self._live_high, self._last_seq)))
        self._live_high = seq
        if seq > self._last_seq + 1 and self.replay_endpoint:  # a gap (or a reset)
            if not self._replay():
                self._replay_at = time.monotonic() + self.REPLAY_RETRY_S
        if self._reset_requested:
            return  # the main loop resets and replays from 0, this batch included
        if seq == self._last_seq + 1:
            self._replay_at = None  # nothing before it is missing
        self._offer(seq, payload)

    def _differs(self, seq, payload):
        known = self._payload_sha.get(seq)
        return known is not None and known != hashlib.sha256(payload).digest()

    def _reset(self, why):
        with self._lock:
            self.last_reset_reason = why
            self._stats['resets'] += 1
            self._last_seq = -1
            self._counts.clear()
            self._known.clear()
            self._payload_sha.clear()
            self._cond.notify_all()
        self._live_high = -1
        self._reset_requested = False

    def _replay(self):
        """Asks for every buffered batch from last+1 and applies them in order,
        asking again from where a reply ended while replies bring new batches.
        True when the last reply's end marker came."""
        healed = [False]
        while True:
            before = self._last_seq
            if not self._replay_once(healed):
                return False
            if self._last_seq == before:
                return True

    def _replay_once(self, healed):
        """One request from last+1 and its reply. True when the end marker
        came; healed[0] is set once a batch past last arrived."""
        start = self._last_seq + 1
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._secure(self._dealer)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.setsockopt(zmq.SNDTIMEO, 1000)
            self._dealer.connect(self.replay_endpoint)
        try:
            self._dealer.send_multipart([b'', start.to_bytes(8, 'big')])
            with self._lock:
                self._stats['replays'] += 1
            deadline = time.monotonic() + self.REPLAY_TOTAL_S
            idle_until = time.monotonic() + self.REPLAY_IDLE_S
            while True:
                now = time.monotonic()
                if self._stop.is_set() or now >= min(deadline, idle_until):
                    raise TimeoutError('replay from %d: no end marker in time' % start)
                if not self._dealer.poll(int(min(0.1, deadline - now) * 1000) + 1):
                    continue
                frames = self._dealer.recv_multipart()
                idle_until = time.monotonic() + self.REPLAY_IDLE_S
                if not frames or frames[0] != b'':
                    self._error('replay reply lacks the empty delimiter frame: %r' % (frames[:1],))
                    continue
                frames = frames[1:]
                if len(frames) == 3:    # [topic, seq, payload] since vLLM #45177
                    seq_bytes, payload = frames[1], frames[2]
                elif len(frames) == 2:  # [seq, payload] before
                    seq_bytes, payload = frames
                else:
                    self._error('replay reply has %d frames after the delimiter' % len(frames))
                    continue
                if payload == b'':
                    if seq_bytes != END_SEQ:
                        self._error('replay end marker seq is %s, expected ff*8' % seq_bytes.hex())
                    break
                if len(seq_bytes) != 8:
                    self._error('replay seq frame has %d bytes' % len(seq_bytes))
                    continue
                seq = int.from_bytes(seq_bytes, 'big')
                if self._differs(seq, payload):
                    self._reset_requested = True  # the main loop resets and replays from 0
                    raise TimeoutError('replay hit a batch that differs: publisher restarted')
                if seq > self._last_seq and not healed[0]:
                    healed[0] = True  # counted before the batch can wake a waiter
                    with self._lock:
                        self._stats['gaps_healed'] += 1
                self._offer(seq, payload)
        except (zmq.ZMQError, TimeoutError):
            # Drop the socket so late replies cannot mix into the next replay.
            self._dealer.close(linger=0)
            self._dealer = None
            with self._lock:
                self._stats['replay_failures'] += 1
            return False
        return True

    def _offer(self, seq, payload):
        """Applies the batch if it is the next one; duplicates are ignored."""
        if seq <= self._last_seq:
            with self._lock:
                self._stats['duplicates'] += 1
            return
        if seq > self._last_seq + 1:
            self._error('batches %d..%d were missed and could not be replayed'
                        % (self._last_seq + 1, seq - 1))
        self._apply(seq, payload)

    # --- index ---

    def _apply(self, seq, payload):
        try:
            ts, events, rank, batch_form, problems = decode_batch(payload)
        except Exception as e:
            events, batch_form, problems = [], 'array', ['undecodable batch: %r' % (e,)]
        with self._lock:
            for p in problems:
                self.errors.append('seq %d: %s' % (seq, p))
            for tag, fields, form in events:
                self._stats['events'] += 1
                self._stats[form + '_events'] += 1
                try:
                    if tag == STORED:
                        self._apply_stored(seq, fields)
                    elif tag == REMOVED:
                        self._apply_removed(seq, fields)
                    else:
                        self._stats['cleared'] += 1
                        self._counts.clear()
                        self._known.clear()
                        self._tiers.clear()
                except Exception as e:
                    self.errors.append('seq %d: %s event broke the consumer: %r' % (seq, tag, e))
            self._stats['batches'] += 1
            if batch_form == 'map':
                self._stats['map_batches'] += 1
            self._payload_sha[seq] = hashlib.sha256(payload).digest()
            self._payload_sha.pop(seq - 100000, None)  # keep it bounded
            self._last_seq = seq
            self._cond.notify_all()

    def _hashes(self, seq, values, what):
        out = []
        for v in values if isinstance(values, list) else []:
            h = normalize_hash(v)
            if h is None:
                self.errors.append('seq %d: %s hash %r is neither int nor bytes' % (seq, what, v))
            else:
                out.append(h)
        if not isinstance(values, list):
            self.errors.append('seq %d: %s block_hashes is %r, not an array' % (seq, what, values))
        return out

    def _apply_tier(self, seq, f, stored):
        """A tier's event, as vLLM's offloading connector sends one: hashes
        only (no parent, no token ids), counted per medium."""
        what = 'BlockStored' if stored else 'BlockRemoved'
        hashes = self._hashes(seq, f.get('block_hashes'), what)
        if stored and (f.get('parent_block_hash') is not None or f.get('token_ids') != []):
            self.errors.append('seq %d: %s in %s has a parent or token ids' % (seq, what, f.get('medium')))
        counts = self._tiers.setdefault(f.get('medium'), collections.Counter())
        for h in hashes:
            if stored:
                counts[h] += 1
                self._stats['tier_stored'] += 1
                continue
            if counts[h] <= 0:
                self.errors.append('seq %d: BlockRemoved: hash %d is not in %s' % (seq, h, f.get('medium')))
                continue
            counts[h] -= 1
            if counts[h] == 0:
                del counts[h]
            self._stats['tier_removed'] += 1

    def _apply_stored(self, seq, f):
        if f.get('medium') in TIER_MEDIA:
            return self._apply_tier(seq, f, True)
        err = lambda msg: self.errors.append('seq %d: BlockStored: %s' % (seq, msg))
        hashes = self._hashes(seq, f.get('block_hashes'), 'BlockStored')
        tokens = f.get('token_ids')
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
            err('token_ids is not an array of non-negative ints')
            tokens = None
        size = f.get('block_size')
        if not isinstance(size, int) or size <= 0:
            err('block_size is %r' % (size,))
            size = tokens = None
        elif self.block_size is not None and size != self.block_size:
            err('block_size %d, expected %d' % (size, self.block_size))
        if not hashes:
            err('no block_hashes')
        if tokens is not None and size is not None and len(tokens) != len(hashes) * size:
            err('%d token_ids for %d blocks of %d' % (len(tokens), len(hashes), size))
            tokens = None
        extra = f.get('extra_keys')
        if extra is not None and (not isinstance(extra, list) or len(extra) != len(hashes)):
            err('extra_keys %r does not have one entry per block' % (extra,))
            extra = None
        if not isinstance(f.get('medium'), (str, type(None))):
            err('medium is %r' % (f.get('medium'),))

        raw_parent = f.get('parent_block_hash')
        parent = None if raw_parent is None else normalize_hash(raw_parent)
        if parent is None and raw_parent is not None:
            err('parent_block_hash %r is neither int nor bytes' % (raw_parent,))
        if parent is None:
            namespace, digest = '', self._none_hash
            first = extra[0] if extra else None
            if first is not None:
                if isinstance(first, list) and len(first) == 1 and isinstance(first[0], str):
                    namespace = first[0]
                else:
                    err('block 0 extra_keys %r is not [cache_salt]' % (first,))
        elif parent in self._known:
            namespace, digest = self._known[parent]
            if self._counts.get(namespace, {}).get(parent, 0) == 0:
                err('parent %d is no longer stored' % parent)
        else:
            err('parent %d is unknown' % parent)
            namespace, digest = '', None  # the chain cannot be checked from here

        for k, h in enumerate(hashes):
            keys = extra[k] if extra else None
            if keys is not None and (k > 0 or parent is not None):
                err('block %d (not block 0) has extra_keys %r' % (k, keys))
            if digest is not None and tokens is not None:
                digest = block_digest(digest, tokens[k * size:(k + 1) * size], keys)
                if published_hash(digest) != h:
                    err('block %d hash %d, sha256_cbor gives %d'
                        % (k, h, published_hash(digest)))
            else:
                digest = None
            old = self._known.get(h)
            if old is not None and old != (namespace, digest) and digest is not None \
                    and old[1] is not None:
                err('hash %d stored again with other content or namespace' % h)
            if old is None or digest is not None:
                self._known[h] = (namespace, digest)
            self._counts.setdefault(namespace, collections.Counter())[h] += 1
            self._stats['stored'] += 1

    def _apply_removed(self, seq, f):
        if f.get('medium') in TIER_MEDIA:
            return self._apply_tier(seq, f, False)
        for h in self._hashes(seq, f.get('block_hashes'), 'BlockRemoved'):
            namespace = self._known.get(h, ('', None))[0]
            counts = self._counts.get(namespace)
            if not counts or counts[h] <= 0:
                self.errors.append('seq %d: BlockRemoved: hash %d is not stored' % (seq, h))
                continue
            counts[h] -= 1
            if counts[h] == 0:
                del counts[h]
            self._stats['removed'] += 1
