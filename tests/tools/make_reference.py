#!/usr/bin/env python3
"""Builds tiny random Llama-family models and records reference logits.

For each model it writes OUT/<name>/:
  config.json, model.safetensors   the model, fp32, in the Hugging Face layout
  reference.json                   prompts, greedy continuations, library versions
  reference.safetensors            "logits.<i>": (len(prompt i), vocab) fp32 logits

Backends:
  transformers  Hugging Face LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM in PyTorch
                (the reference no one here wrote; run it where transformers is
                installed and commit the output under tests/fixtures/transformers)
  numpy         an independent float64 NumPy forward pass of the same
                architecture, from its published definition; runs in CI
                (Debian's python3-numpy) until the transformers fixtures exist

Usage: make_reference.py --out DIR [--backend numpy|transformers]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# Shapes are tiny but exercise what the C++ model must get right: MHA, GQA
# with llama3 rope scaling (all three frequency bands at head_dim 16), q/k/v
# bias with tied embeddings and linear rope scaling, Qwen3's per-head q/k
# RMSNorm with a head_dim apart from hidden / heads (64, not 16: also a size the
# CUDA kernels take), several chunks per prompt.
MODELS = {
    "llama_mha": dict(
        architecture="LlamaForCausalLM", model_type="llama", vocab_size=256, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, rope_theta=10000.0, rope_scaling=None,
        tie_word_embeddings=False, attention_bias=False, max_position_embeddings=256),
    "llama3_gqa": dict(
        architecture="LlamaForCausalLM", model_type="llama", vocab_size=256, hidden_size=128,
        intermediate_size=256, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=128),
        tie_word_embeddings=False, attention_bias=False, max_position_embeddings=1024),
    "qwen2_tied": dict(
        architecture="Qwen2ForCausalLM", model_type="qwen2", vocab_size=256, hidden_size=64,
        intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=1000000.0,
        rope_scaling=dict(rope_type="linear", factor=2.0),
        tie_word_embeddings=True, attention_bias=True, max_position_embeddings=512),
    "qwen3_qk_norm": dict(
        architecture="Qwen3ForCausalLM", model_type="qwen3", vocab_size=256, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, rope_theta=1000000.0, rope_scaling=None,
        tie_word_embeddings=False, attention_bias=False, max_position_embeddings=512),
}
RMS_EPS = 1e-5
PROMPT_LENS = [1, 7, 23, 50]
GREEDY_STEPS = 8


def random_weights(spec, seed):
    """HF tensor names -> float32 arrays. std 1/sqrt(fan_in) keeps activations O(1),
    so the logits are spread out and greedy choices are not near-ties."""
    rng = np.random.default_rng(seed)
    h, i, v, d = spec["hidden_size"], spec["intermediate_size"], spec["vocab_size"], spec["head_dim"]
    q, kv = spec["num_attention_heads"] * d, spec["num_key_value_heads"] * d

    def linear(out_f, in_f):
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((v, h)).astype(np.float32)}
    for layer in range(spec["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = linear(q, h)
        w[p + "self_attn.k_proj.weight"] = linear(kv, h)
        w[p + "self_attn.v_proj.weight"] = linear(kv, h)
        if spec["attention_bias"]:
            for name, n in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"self_attn.{name}_proj.bias"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
        if qk_norm(spec):
            # Far from ones (and unlike each other), so a model that skips or swaps them is caught.
            w[p + "self_attn.q_norm.weight"] = (1.0 + 0.5 * rng.standard_normal(d)).astype(np.float32)
            w[p + "self_attn.k_norm.weight"] = (1.0 + 0.5 * rng.standard_normal(d)).astype(np.float32)
        w[p + "self_attn.o_proj.weight"] = linear(h, q)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = linear(i, h)
        w[p + "mlp.up_proj.weight"] = linear(i, h)
        w[p + "mlp.down_proj.weight"] = linear(h, i)
    w["model.norm.weight"] = norm(h)
    if not spec["tie_word_embeddings"]:
        w["lm_head.weight"] = linear(v, h)
    return w


def qk_norm(spec):
    """Qwen3 normalizes each q and k head (RMSNorm over head_dim) before RoPE."""
    return spec["architecture"] == "Qwen3ForCausalLM"


def write_safetensors(path, tensors):
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, dtype="<f4")
        blob = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def hf_config(spec):
    cfg = {k: v for k, v in spec.items() if k != "architecture"}
    cfg["architectures"] = [spec["architecture"]]
    cfg.update(hidden_act="silu", rms_norm_eps=RMS_EPS, torch_dtype="float32",
               bos_token_id=1, eos_token_id=2)
    if spec["architecture"] == "Qwen2ForCausalLM":
        cfg.pop("attention_bias")  # implied by the architecture
    if spec["architecture"] in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        cfg["use_sliding_window"] = False
    return cfg


# ---- NumPy forward pass (float64), written from the Llama definition ----

def inv_frequencies(spec):
    d = spec["head_dim"]
    # fp32 base frequencies, as transformers computes them
    inv = (1.0 / (np.float32(spec["rope_theta"]) **
                  (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / np.float32(d)))).astype(np.float64)
    rs = spec["rope_scaling"]
    if rs is None:
        return inv
    if rs["rope_type"] == "linear":
        return inv / rs["factor"]
    assert rs["rope_type"] == "llama3"
    old = rs["original_max_position_embeddings"]
    low_wl, high_wl = old / rs["low_freq_factor"], old / rs["high_freq_factor"]
    wavelen = 2 * np.pi / inv
    out = np.where(wavelen > low_wl, inv / rs["factor"], inv)
    smooth = (old / wavelen - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
    smoothed = (1 - smooth) * out / rs["factor"] + smooth * out
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    return np.where(medium, smoothed, out)


def rms_norm(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * w


def rope(x, cos, sin):  # x: (T, heads, d); rotate_half pairs i with i + d/2
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def numpy_logits(spec, w, ids):
    W = {k: v.astype(np.float64) for k, v in w.items()}
    T, d = len(ids), spec["head_dim"]
    nh, nkv = spec["num_attention_heads"], spec["num_key_value_heads"]
    x = W["model.embed_tokens.weight"][np.asarray(ids)]
    angles = np.outer(np.arange(T, dtype=np.float32), inv_frequencies(spec).astype(np.float32)).astype(np.float32)
    cos, sin = np.cos(angles.astype(np.float64)), np.sin(angles.astype(np.float64))
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for layer in range(spec["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, W[p + "input_layernorm.weight"])
        proj = {}
        for name in ("q", "k", "v"):
            y = h @ W[p + f"self_attn.{name}_proj.weight"].T
            if spec["attention_bias"]:
                y = y + W[p + f"self_attn.{name}_proj.bias"]
            proj[name] = y.reshape(T, -1, d)
        if qk_norm(spec):  # per head: rms_norm's last axis is head_dim here
            proj["q"] = rms_norm(proj["q"], W[p + "self_attn.q_norm.weight"])
            proj["k"] = rms_norm(proj["k"], W[p + "self_attn.k_norm.weight"])
        q, k, v = rope(proj["q"], cos, sin), rope(proj["k"], cos, sin), proj["v"]
        group = nh // nkv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(d) + mask
        scores -= scores.max(axis=-1, keepdims=True)
        p_attn = np.exp(scores)
        p_attn /= p_attn.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", p_attn, v).reshape(T, nh * d)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"])
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if spec["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def build_numpy(name, spec, seed, out_dir):
    w = random_weights(spec, seed)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), w)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(spec), f, indent=2)
    return lambda ids: numpy_logits(spec, w, ids), {"numpy": np.__version__}


def transformers_config(transformers, spec):
    """The model's config object, in the form this transformers takes: 5.x folds rope_theta and
    rope_scaling into rope_parameters (and its backward-compatible path has dropped rope_theta
    before), 4.x takes them apart. Checked against the spec after construction."""
    import inspect
    cfg_dict = {k: v for k, v in hf_config(spec).items() if k not in ("architectures", "torch_dtype")}
    cls = {"qwen2": transformers.Qwen2Config, "qwen3": getattr(transformers, "Qwen3Config", None)}.get(
        spec["model_type"], transformers.LlamaConfig)
    assert cls is not None, f"this transformers ({transformers.__version__}) has no {spec['model_type']}"
    theta, scaling = cfg_dict.pop("rope_theta"), cfg_dict.pop("rope_scaling")
    if "rope_parameters" in inspect.signature(cls.__init__).parameters or hasattr(cls(), "rope_parameters"):
        params = {"rope_type": "default", "rope_theta": theta}
        params.update(scaling or {})
        cfg = cls(rope_parameters=params, **cfg_dict)
        got = dict(cfg.rope_parameters)
        want = dict(params)
    else:
        cfg = cls(rope_theta=theta, rope_scaling=scaling, **cfg_dict)
        got = {"rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})}
        want = {"rope_theta": theta, **(scaling or {})}
    for k, v in want.items():
        if k == "rope_type" and v == "default" and k not in got:
            continue
        assert got.get(k) == v, f"{spec['model_type']}: transformers took rope {k}={got.get(k)!r}, spec {v!r}"
    cfg.architectures = [spec["architecture"]]
    return cfg


def build_transformers(name, spec, seed, out_dir):
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_config(transformers_config(transformers, spec)).float()
    # Same weight distribution as the NumPy backend (the default init is tiny
    # and makes greedy choices near-ties).
    weights = random_weights(spec, seed)
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all("lm_head" in m for m in missing), missing  # tied head only
    model.eval()
    model.save_pretrained(out_dir)  # safetensors
    # The config.json real checkpoints carry (rope_theta, rope_scaling), which
    # the C++ loader reads, rather than this transformers' own spelling.
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config(spec), f, indent=2)

    def logits(ids):
        with torch.no_grad():
            got = model(torch.tensor([ids])).logits[0].double().numpy()
        # transformers and the independent float64 pass must agree before
        # either becomes a fixture (fp32 against float64 through a few layers).
        want = numpy_logits(spec, weights, ids)
        err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
        assert err < 1e-3, f"{name}: transformers and the NumPy reference differ by {err:.3g} (relative)"
        return got
    return logits, {"torch": torch.__version__, "transformers": transformers.__version__,
                    "numpy": np.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=["numpy", "transformers"], default="numpy")
    args = ap.parse_args()
    build = build_numpy if args.backend == "numpy" else build_transformers
    for index, (name, spec) in enumerate(MODELS.items()):
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        logits_fn, versions = build(name, spec, seed=1000 + index, out_dir=out_dir)
        rng = np.random.default_rng(2000 + index)
        prompts = [rng.integers(3, spec["vocab_size"], size=n).tolist() for n in PROMPT_LENS]
        tensors, greedy, margins = {}, [], []
        for i, ids in enumerate(prompts):
            tensors[f"logits.{i}"] = logits_fn(ids).astype(np.float32)
            seq = list(ids)
            for _ in range(GREEDY_STEPS):
                last = logits_fn(seq)[-1]
                top2 = np.sort(last)[-2:]
                margins.append(float(top2[1] - top2[0]))
                seq.append(int(np.argmax(last)))
            greedy.append(seq[len(ids):])
        write_safetensors(os.path.join(out_dir, "reference.safetensors"), tensors)
        with open(os.path.join(out_dir, "reference.json"), "w") as f:
            json.dump({"backend": args.backend, "versions": versions, "prompts": prompts,
                       "greedy": greedy, "min_greedy_margin": min(margins)}, f, indent=1)
        print(f"{name}: {len(prompts)} prompts, smallest greedy top-2 margin {min(margins):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
