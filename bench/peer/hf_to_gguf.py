#!/usr/bin/python3
"""Hugging Face folder -> GGUF (version 3), for the llama.cpp peer of
bench/peer/peer_bench.py: the same weights chunkattn loads, in the file
format llama.cpp reads. Written here from the GGUF specification; it needs
only numpy (Debian's python3-numpy, through /usr/bin/python3).

  /usr/bin/python3 bench/peer/hf_to_gguf.py MODEL_DIR OUT.gguf [--type f32|f16|bf16|q8_0]
      [--tokenizer tokenizer.model|tokenizer.json]

Reads config.json and model.safetensors (or model.safetensors.index.json and
its shards; F32, F16 and BF16 tensors), parsed by hand. Architectures: the
ones chunkattn serves (proto/model/model_config.cc):
  LlamaForCausalLM, MistralForCausalLM -> GGUF arch "llama"
  Qwen2ForCausalLM (q/k/v biases)      -> "qwen2"
  Qwen3ForCausalLM (q/k RMSNorm)       -> "qwen3"
Rope scaling: none, "linear" (GGUF rope.scaling keys) and Llama 3's
("llama3": per-frequency divisors in a rope_freqs.weight tensor, which
llama.cpp's rope applies as freq_factors).

Rotary layout. A Hugging Face checkpoint rotates halves: dimension i of a head
pairs with i + d/2. llama.cpp's "llama" architecture rotates adjacent pairs
(2i, 2i+1), so each q_proj/k_proj head's rows (and biases) are reordered
[0, d/2, 1, d/2+1, ...] for it; "qwen2" and "qwen3" use llama.cpp's NEOX rope,
which is the halves layout already, and are written as they are.

Weight types (--type): f32 everything; f16 (bf16) the matrices in F16
(BF16, rounded to nearest even); q8_0 the
matrices in Q8_0 (blocks of 32 along a row, an F16 scale max|x|/127 each;
F16 where a row is not a multiple of 32). Norm weights, biases and
rope_freqs stay F32, as llama.cpp expects.

Tokenizer (from the folder, or --tokenizer): a SentencePiece tokenizer.model
becomes tokenizer.ggml.model "llama" (pieces, scores, types, parsed from its
protobuf by hand); a Hugging Face BPE tokenizer.json becomes "gpt2" (vocab,
merges, added tokens). A vocabulary smaller than the model's vocab_size (the
benchmark's 32k-row model with the demo's 2k-piece tokenizer) is padded with
unused tokens, so the embedding's rows and the token list agree.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

GGUF_MAGIC = b'GGUF'
GGUF_VERSION = 3
ALIGNMENT = 32

# GGUF metadata value types.
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, T_UINT64, \
    T_INT64, T_FLOAT64 = range(13)
# ggml tensor types used here.
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
# general.file_type (llama_ftype).
FILE_TYPES = {'f32': 0, 'f16': 1, 'q8_0': 7, 'bf16': 32}
# Token types (SentencePiece's numbering, which GGUF shares).
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_USER_DEFINED, TOK_UNUSED, TOK_BYTE = 1, 2, 3, 4, 5, 6

ARCHES = {'LlamaForCausalLM': 'llama', 'MistralForCausalLM': 'llama', 'Qwen2ForCausalLM': 'qwen2',
          'Qwen3ForCausalLM': 'qwen3'}


# ---------------------------------------------------------------- safetensors

def _st_dtype(name, dtype, path):
    if dtype == 'F32':
        return np.dtype('<f4')
    if dtype == 'F16':
        return np.dtype('<f2')
    if dtype == 'BF16':
        return np.dtype('<u2')  # widened to F32 in read_tensor
    raise ValueError('%s: tensor %s has dtype %s (F32, F16 or BF16 expected)' % (path, name, dtype))


class SafeTensors:
    """The tensors of a folder's safetensors file(s), memory-mapped."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, 'model.safetensors.index.json')
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)['weight_map'].values()))
        else:
            files = ['model.safetensors']
        self.where = {}  # name -> (memmap, dtype string, shape)
        for name in files:
            path = os.path.join(model_dir, name)
            with open(path, 'rb') as f:
                (n,) = struct.unpack('<Q', f.read(8))
                header = json.loads(f.read(n))
            data = np.memmap(path, dtype=np.uint8, mode='r', offset=8 + n)
            for key, info in header.items():
                if key == '__metadata__':
                    continue
                begin, end = info['data_offsets']
                self.where[key] = (data[begin:end], info['dtype'], tuple(info['shape']), path)

    def __contains__(self, name):
        return name in self.where

    def shape(self, name):
        if name not in self.where:
            raise KeyError('tensor %s is missing from the safetensors' % name)
        return self.where[name][2]

    def read(self, name):
        """The tensor as float32, in its safetensors shape."""
        if name not in self.where:
            raise KeyError('tensor %s is missing from the safetensors' % name)
        raw, dtype, shape, path = self.where[name]
        a = raw.view(_st_dtype(name, dtype, path))
        if dtype == 'BF16':
            a = (a.astype(np.uint32) << 16).view(np.float32)
        a = a.astype(np.float32).reshape(shape)
        return a


# ---------------------------------------------------------------- tokenizers

def _varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7f) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _proto_fields(buf):
    """(field number, wire type, value) of one protobuf message; value is an
    int (varint), bytes (length-delimited) or the raw 4/8 bytes (fixed)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError('tokenizer.model: protobuf wire type %d is not supported' % wire)
        yield field, wire, value


def read_sentencepiece(path):
    """ModelProto.pieces (field 1) of a SentencePiece model: [(piece, score, type)]."""
    with open(path, 'rb') as f:
        buf = f.read()
    pieces = []
    for field, wire, value in _proto_fields(buf):
        if field != 1 or wire != 2:
            continue
        piece, score, kind = '', 0.0, TOK_NORMAL
        for f2, w2, v2 in _proto_fields(value):
            if f2 == 1:
                piece = bytes(v2).decode('utf-8')
            elif f2 == 2:
                (score,) = struct.unpack('<f', v2)
            elif f2 == 3:
                kind = v2
        pieces.append((piece, score, kind))
    if not pieces:
        raise ValueError('%s: no SentencePiece pieces found' % path)
    return pieces


def sentencepiece_metadata(path, vocab_size, config):
    pieces = read_sentencepiece(path)
    if len(pieces) > vocab_size:
        raise ValueError('%s has %d pieces, more than vocab_size %d' % (path, len(pieces), vocab_size))
    tokens = [p for p, _, _ in pieces]
    scores = [s for _, s, _ in pieces]
    types = [t for _, _, t in pieces]
    for i in range(len(pieces), vocab_size):
        tokens.append('<unused%d>' % i)
        scores.append(-1e4)
        types.append(TOK_UNUSED)
    kv = [('tokenizer.ggml.model', T_STRING, 'llama'),
          ('tokenizer.ggml.tokens', T_ARRAY, (T_STRING, tokens)),
          ('tokenizer.ggml.scores', T_ARRAY, (T_FLOAT32, scores)),
          ('tokenizer.ggml.token_type', T_ARRAY, (T_INT32, types))]
    unk = [i for i, t in enumerate(types) if t == TOK_UNKNOWN]
    if unk:
        kv.append(('tokenizer.ggml.unknown_token_id', T_UINT32, unk[0]))
    kv += _special_ids(config, tokens, '<s>', '</s>')
    kv.append(('tokenizer.ggml.add_bos_token', T_BOOL, True))
    kv.append(('tokenizer.ggml.add_eos_token', T_BOOL, False))
    return kv


def _special_ids(config, tokens, bos_text, eos_text):
    kv = []
    bos = config.get('bos_token_id')
    eos = config.get('eos_token_id')
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if bos is None and bos_text in tokens:
        bos = tokens.index(bos_text)
    if eos is None and eos_text in tokens:
        eos = tokens.index(eos_text)
    if bos is not None:
        kv.append(('tokenizer.ggml.bos_token_id', T_UINT32, int(bos)))
    if eos is not None:
        kv.append(('tokenizer.ggml.eos_token_id', T_UINT32, int(eos)))
    return kv


def _guess_pre(tok):
    """llama.cpp names its pre-tokenizers (tokenizer.ggml.pre); guessed from
    the pre_tokenizer's split regex. Token ids go in and out of the benchmark,
    so a wrong guess changes text tokenization only."""
    text = json.dumps(tok.get('pre_tokenizer'))
    if r'\\p{N}{1,3}' in text and r"(?i:'s|'t|'re|'ve|'m|'ll|'d)" in text:
        return 'llama-bpe'
    if r'\\p{N}' in text and r"(?i:'s|'t|'re|'ve|'m|'ll|'d)" in text:
        return 'qwen2'
    return 'default'


def bpe_metadata(path, vocab_size, config):
    with open(path, encoding='utf-8') as f:
        tok = json.load(f)
    model = tok.get('model', {})
    if model.get('type') != 'BPE':
        raise ValueError('%s: model.type %r; only BPE tokenizer.json files are supported' % (path, model.get('type')))
    if model.get('byte_fallback'):
        # Llama 2's tokenizer.json: SentencePiece's BPE in JSON, not byte-level BPE.
        raise ValueError('%s is SentencePiece-style (byte_fallback): convert with its tokenizer.model' % path)
    by_id = {}
    for piece, i in model['vocab'].items():
        by_id[i] = piece
    added = {}
    for a in tok.get('added_tokens', []):
        by_id[a['id']] = a['content']
        added[a['id']] = TOK_CONTROL if a.get('special') else TOK_USER_DEFINED
    n = max(vocab_size, max(by_id) + 1)
    if n > vocab_size:
        raise ValueError('%s has token ids up to %d, more than vocab_size %d' % (path, n - 1, vocab_size))
    tokens, types = [], []
    for i in range(n):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(added.get(i, TOK_NORMAL))
        else:
            tokens.append('[PAD%d]' % i)
            types.append(TOK_UNUSED)
    merges = []
    for m in model.get('merges', []):
        merges.append(m if isinstance(m, str) else ' '.join(m))
    kv = [('tokenizer.ggml.model', T_STRING, 'gpt2'),
          ('tokenizer.ggml.pre', T_STRING, _guess_pre(tok)),
          ('tokenizer.ggml.tokens', T_ARRAY, (T_STRING, tokens)),
          ('tokenizer.ggml.token_type', T_ARRAY, (T_INT32, types)),
          ('tokenizer.ggml.merges', T_ARRAY, (T_STRING, merges))]
    kv += _special_ids(config, tokens, '<|begin_of_text|>', '<|endoftext|>')
    kv.append(('tokenizer.ggml.add_bos_token', T_BOOL, config.get('bos_token_id') is not None and
               ARCHES.get(config['architectures'][0]) == 'llama'))
    return kv


def tokenizer_metadata(model_dir, override, vocab_size, config):
    candidates = [override] if override else [os.path.join(model_dir, 'tokenizer.model'),
                                             os.path.join(model_dir, 'tokenizer.json')]
    for path in candidates:
        if path and os.path.exists(path):
            if path.endswith('.json'):
                return bpe_metadata(path, vocab_size, config)
            return sentencepiece_metadata(path, vocab_size, config)
    raise ValueError('%s has no tokenizer.model or tokenizer.json: give --tokenizer' % model_dir)


# ---------------------------------------------------------------- tensors

def quantize_q8_0(a):
    """(rows, cols) float32 -> Q8_0 bytes: per block of 32 along a row, an F16
    scale d = max|x| / 127 then 32 int8 values round(x / d)."""
    blocks = a.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=1)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0).astype(np.float32)
    scaled = blocks * inv[:, None]
    q = np.clip(np.trunc(scaled + np.copysign(0.5, scaled)), -127, 127).astype(np.int8)  # half away from 0
    out = np.empty(blocks.shape[0], dtype=[('d', '<f2'), ('q', 'i1', 32)])
    out['d'] = d.astype(np.float16)
    out['q'] = q
    return out.tobytes()


def to_bfloat16(a):
    """float32 -> bfloat16 bits (uint16), rounded to nearest even, as
    chunkattn's --weight_dtype bfloat16 rounds (finite values)."""
    u = np.ascontiguousarray(a, dtype='<f4').view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype('<u2')


def permute_rotary(w, n_heads):
    """Rows of q_proj/k_proj (or their bias) per head from the halves layout
    [0..d/2), [d/2..d) to the adjacent pairs llama.cpp's "llama" rope wants:
    new row 2i is old row i, new row 2i+1 is old row d/2 + i."""
    shape = w.shape
    d = shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def llama3_rope_freqs(config, head_dim):
    """Llama 3 rope scaling as llama.cpp's per-frequency divisors: inv_freq
    of dimension pair i becomes inv_freq / factor_i."""
    s = config['rope_scaling'] if config.get('rope_scaling') else config['rope_parameters']
    base = float(config.get('rope_theta', s.get('rope_theta', 10000.0)))
    factor = float(s['factor'])
    low, high = float(s.get('low_freq_factor', 1.0)), float(s.get('high_freq_factor', 4.0))
    old_ctx = float(s.get('original_max_position_embeddings', 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def plan_tensors(config, st, arch):
    """[(gguf name, callable giving the float32 array, its HF shape)] in file order."""
    L = config['num_hidden_layers']
    heads = config['num_attention_heads']
    kv_heads = config.get('num_key_value_heads', heads)
    tied = config.get('tie_word_embeddings', False) or 'lm_head.weight' not in st
    plan = []

    def add(gguf_name, hf_name, rotary_heads=None):
        if rotary_heads and arch == 'llama':
            get = lambda: permute_rotary(st.read(hf_name), rotary_heads)  # noqa: E731
        else:
            get = lambda: st.read(hf_name)  # noqa: E731
        plan.append((gguf_name, get, st.shape(hf_name)))

    add('token_embd.weight', 'model.embed_tokens.weight')
    for i in range(L):
        p = 'model.layers.%d.' % i
        b = 'blk.%d.' % i
        add(b + 'attn_norm.weight', p + 'input_layernorm.weight')
        for short, hf, n in (('attn_q', 'q_proj', heads), ('attn_k', 'k_proj', kv_heads), ('attn_v', 'v_proj', None)):
            add(b + short + '.weight', p + 'self_attn.%s.weight' % hf, n)
            if p + 'self_attn.%s.bias' % hf in st:
                add(b + short + '.bias', p + 'self_attn.%s.bias' % hf, n)
        if arch == 'qwen3':
            add(b + 'attn_q_norm.weight', p + 'self_attn.q_norm.weight')
            add(b + 'attn_k_norm.weight', p + 'self_attn.k_norm.weight')
        add(b + 'attn_output.weight', p + 'self_attn.o_proj.weight')
        add(b + 'ffn_norm.weight', p + 'post_attention_layernorm.weight')
        add(b + 'ffn_gate.weight', p + 'mlp.gate_proj.weight')
        add(b + 'ffn_up.weight', p + 'mlp.up_proj.weight')
        add(b + 'ffn_down.weight', p + 'mlp.down_proj.weight')
    add('output_norm.weight', 'model.norm.weight')
    if not tied:
        add('output.weight', 'lm_head.weight')
    return plan


def tensor_type(shape, wtype, name):
    """The ggml type a tensor of `shape` is written in under --type `wtype`."""
    if len(shape) == 1 or wtype == 'f32' or name == 'rope_freqs.weight':
        return GGML_F32
    if wtype == 'q8_0' and shape[-1] % 32 == 0:
        return GGML_Q8_0
    if wtype == 'bf16':
        return GGML_BF16
    return GGML_F16


def encode(a, wtype, name):
    """(ggml type, bytes) of a float32 array under --type `wtype`."""
    t = tensor_type(a.shape, wtype, name)
    if t == GGML_F32:
        return t, np.ascontiguousarray(a, dtype='<f4').tobytes()
    if t == GGML_Q8_0:
        return t, quantize_q8_0(a)
    if t == GGML_BF16:
        return t, to_bfloat16(a).tobytes()
    return t, np.ascontiguousarray(a, dtype='<f2').tobytes()


# ---------------------------------------------------------------- writing

class Writer:
    def __init__(self):
        self.buf = bytearray()

    def u32(self, v):
        self.buf += struct.pack('<I', v)

    def u64(self, v):
        self.buf += struct.pack('<Q', v)

    def string(self, s):
        b = s.encode('utf-8')
        self.u64(len(b))
        self.buf += b

    def value(self, vtype, v):
        if vtype == T_STRING:
            self.string(v)
        elif vtype == T_ARRAY:
            etype, items = v
            self.u32(etype)
            self.u64(len(items))
            if etype == T_STRING:
                for s in items:
                    self.string(s)
            else:
                fmt = {T_FLOAT32: '<f', T_INT32: '<i', T_UINT32: '<I'}[etype]
                self.buf += np.array(items, dtype=np.dtype(fmt)).tobytes()
        else:
            fmt = {T_UINT8: '<B', T_INT8: '<b', T_UINT16: '<H', T_INT16: '<h', T_UINT32: '<I', T_INT32: '<i',
                   T_FLOAT32: '<f', T_BOOL: '<?', T_UINT64: '<Q', T_INT64: '<q', T_FLOAT64: '<d'}[vtype]
            self.buf += struct.pack(fmt, v)


def _pad(n):
    return (ALIGNMENT - n % ALIGNMENT) % ALIGNMENT


def context_length(config):
    """max_position_embeddings, or a shorter sliding window (Mistral), as
    chunkattn reads it: full attention is exact up to the window."""
    n = int(config.get('max_position_embeddings', 2048))
    window = config.get('sliding_window')
    if window and config.get('use_sliding_window', True) and 0 < int(window) < n:
        n = int(window)
    return n


def model_metadata(config, arch, wtype, name):
    hidden = config['hidden_size']
    heads = config['num_attention_heads']
    head_dim = config.get('head_dim') or (128 if arch == 'qwen3' else hidden // heads)
    kv = [('general.architecture', T_STRING, arch),
          ('general.name', T_STRING, name),
          ('general.file_type', T_UINT32, FILE_TYPES[wtype]),
          ('general.alignment', T_UINT32, ALIGNMENT),
          (arch + '.context_length', T_UINT32, context_length(config)),
          (arch + '.embedding_length', T_UINT32, hidden),
          (arch + '.block_count', T_UINT32, config['num_hidden_layers']),
          (arch + '.feed_forward_length', T_UINT32, config['intermediate_size']),
          (arch + '.attention.head_count', T_UINT32, heads),
          (arch + '.attention.head_count_kv', T_UINT32, config.get('num_key_value_heads', heads)),
          (arch + '.attention.layer_norm_rms_epsilon', T_FLOAT32, float(config.get('rms_norm_eps', 1e-6))),
          (arch + '.attention.key_length', T_UINT32, head_dim),
          (arch + '.attention.value_length', T_UINT32, head_dim),
          (arch + '.rope.dimension_count', T_UINT32, head_dim),
          (arch + '.vocab_size', T_UINT32, config['vocab_size'])]
    scaling = config.get('rope_scaling') or (config.get('rope_parameters') or {})
    theta = config.get('rope_theta', scaling.get('rope_theta', 10000.0) if isinstance(scaling, dict) else 10000.0)
    kv.append((arch + '.rope.freq_base', T_FLOAT32, float(theta)))
    kind = (scaling.get('rope_type') or scaling.get('type') or 'default') if isinstance(scaling, dict) else 'default'
    if kind == 'linear':
        kv.append((arch + '.rope.scaling.type', T_STRING, 'linear'))
        kv.append((arch + '.rope.scaling.factor', T_FLOAT32, float(scaling['factor'])))
    elif kind not in ('default', 'llama3'):
        raise ValueError('rope scaling %r is not supported (none, linear, llama3)' % kind)
    return kv, head_dim, kind


def convert(model_dir, out_path, wtype='f32', tokenizer=None, log=print):
    with open(os.path.join(model_dir, 'config.json')) as f:
        config = json.load(f)
    architecture = config['architectures'][0]
    if architecture not in ARCHES:
        raise ValueError('architecture %s is not supported (%s)' % (architecture, ', '.join(ARCHES)))
    arch = ARCHES[architecture]
    if config.get('use_sliding_window') and config.get('sliding_window'):
        raise ValueError('sliding-window attention is not converted')
    st = SafeTensors(model_dir)
    kv, head_dim, rope_kind = model_metadata(config, arch, wtype, os.path.basename(os.path.normpath(model_dir)))
    kv += tokenizer_metadata(model_dir, tokenizer, config['vocab_size'], config)
    plan = plan_tensors(config, st, arch)
    if rope_kind == 'llama3':
        freqs = llama3_rope_freqs(config, head_dim)
        plan.append(('rope_freqs.weight', lambda: freqs, freqs.shape))

    # Tensor infos come before the data: each one's type and byte size from
    # its shape (the safetensors header), not from converting it twice.
    infos, offset = [], 0
    for name, get, shape in plan:
        ggml_type = tensor_type(shape, wtype, name)
        n = int(np.prod(shape))
        size = n * 4 if ggml_type == GGML_F32 else n * 2 if ggml_type in (GGML_F16, GGML_BF16) else n // 32 * 34
        infos.append((name, shape, ggml_type, offset, size))
        offset += size + _pad(size)
    w = Writer()
    w.buf += GGUF_MAGIC
    w.u32(GGUF_VERSION)
    w.u64(len(infos))
    w.u64(len(kv))
    for key, vtype, value in kv:
        w.string(key)
        w.u32(vtype)
        w.value(vtype, value)
    for name, shape, ggml_type, off, _ in infos:
        w.string(name)
        w.u32(len(shape))
        for dim in reversed(shape):  # ggml's ne[0] is the innermost (row) length
            w.u64(dim)
        w.u32(ggml_type)
        w.u64(off)
    w.buf += b'\0' * _pad(len(w.buf))
    tmp = out_path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(w.buf)
        for (name, get, _), (_, shape, ggml_type, off, size) in zip(plan, infos):
            t, data = encode(get(), wtype, name)
            if t != ggml_type or len(data) != size:
                raise AssertionError('%s: %d bytes of type %d, planned %d of %d' % (name, len(data), t, size, ggml_type))
            f.write(data)
            f.write(b'\0' * _pad(size))
    os.replace(tmp, out_path)
    log('wrote %s: arch %s, %s, %d tensors, %.1f MB' % (out_path, arch, wtype, len(infos),
                                                         os.path.getsize(out_path) / 1e6))
    return out_path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('model_dir')
    p.add_argument('out')
    p.add_argument('--type', default='f32', choices=sorted(FILE_TYPES))
    p.add_argument('--tokenizer', default=None,
                   help='tokenizer.model or tokenizer.json to use instead of the folder\'s')
    args = p.parse_args()
    try:
        convert(args.model_dir, args.out, args.type, args.tokenizer)
    except (ValueError, KeyError, OSError) as e:
        print('hf_to_gguf: %s' % e, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
