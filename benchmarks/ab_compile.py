"""A/B of one decode step, interleaved in one process: eager LeanLM.forward, a torch.compile-d static
(whole-cache, masked) forward, and the same with fused qkv / gate-up weights.

The prototypes behind `LeanLM.enable_compile` (workbench/rollout/model.py: then static_forward, now lm_forward); run:
python benchmarks/ab_compile.py
"""

import statistics
import time

import torch
import torch.nn.functional as F

from workbench.models import load_model, resolve_model
from workbench.rollout.model import LeanLM
from workbench.rollout.rope import rotate_half

hf, _ = load_model(resolve_model("tiny"))
lm = LeanLM.from_hf(hf)


def decode_step(lm, tok, pos, ks, vs):
    """tok (B,1), pos (B,), caches: lists of (B, Tmax, Hkv, D). Full-length masked attention (no slicing)."""
    B = tok.shape[0]
    c = lm.cfg
    Tmax = ks[0].shape[1]
    x = lm.model.embed_tokens(tok)
    cos = lm.rope_cos[pos][:, None, None, :]
    sin = lm.rope_sin[pos][:, None, None, :]
    mask = (torch.arange(Tmax, device=tok.device)[None, :] <= pos[:, None])[:, None, None, :]  # (B,1,1,Tmax)
    rows = torch.arange(B, device=tok.device)
    for i, layer in enumerate(lm.model.layers):
        h = layer.input_layernorm(x)
        a = layer.self_attn
        q = a.q_proj(h).view(B, 1, c.num_heads, c.head_dim)
        k = a.k_proj(h).view(B, 1, c.num_kv_heads, c.head_dim)
        v = a.v_proj(h).view(B, 1, c.num_kv_heads, c.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        ks[i].index_put_((rows, pos), k[:, 0])
        vs[i].index_put_((rows, pos), v[:, 0])
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), ks[i].transpose(1, 2), vs[i].transpose(1, 2), attn_mask=mask, enable_gqa=True
        )
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, 1, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return lm.lm_head(lm.model.norm(x)).float()


def decode_fused(lm, tok, pos, ks, vs, W):
    B = tok.shape[0]
    c = lm.cfg
    Tmax = ks[0].shape[1]
    x = lm.model.embed_tokens(tok)
    cos = lm.rope_cos[pos][:, None, None, :]
    sin = lm.rope_sin[pos][:, None, None, :]
    mask = (torch.arange(Tmax, device=tok.device)[None, :] <= pos[:, None])[:, None, None, :]
    rows = torch.arange(B, device=tok.device)
    nq, nkv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    for i, layer in enumerate(lm.model.layers):
        h = layer.input_layernorm(x)
        a = layer.self_attn
        q, k, v = F.linear(h, W[i][0]).split([nq, nkv, nkv], -1)
        q = q.view(B, 1, c.num_heads, c.head_dim)
        k = k.view(B, 1, c.num_kv_heads, c.head_dim)
        v = v.view(B, 1, c.num_kv_heads, c.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        ks[i].index_put_((rows, pos), k[:, 0])
        vs[i].index_put_((rows, pos), v[:, 0])
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), ks[i].transpose(1, 2), vs[i].transpose(1, 2), attn_mask=mask, enable_gqa=True
        )
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, 1, -1))
        g, u = F.linear(layer.post_attention_layernorm(x), W[i][1]).split([inter, inter], -1)
        x = x + layer.mlp.down_proj(F.silu(g) * u)
    return lm.lm_head(lm.model.norm(x)).float()


W = [
    (
        torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight]),
        torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
    )
    for layer in lm.model.layers
]
comp = torch.compile(decode_step, dynamic=True)
comp2 = torch.compile(decode_fused, dynamic=True)
for B in (1, 8, 64):
    Tmax = 160
    cache = lm.new_cache(B, Tmax)
    x = torch.randint(3, 500, (B, 48))
    lm(x, torch.zeros(B, dtype=torch.long), cache)
    tok = torch.randint(3, 500, (B, 1))
    with torch.no_grad():
        t0 = time.perf_counter()
        comp(lm, tok, torch.full((B,), 48), cache.k, cache.v)
        print("compile s", time.perf_counter() - t0)
        # correctness vs eager LeanLM
        c2 = lm.new_cache(B, Tmax)
        lm(x, torch.zeros(B, dtype=torch.long), c2)
        ref, _ = lm(tok, torch.full((B,), 48), c2)
        c3 = lm.new_cache(B, Tmax)
        lm(x, torch.zeros(B, dtype=torch.long), c3)
        got = comp(lm, tok, torch.full((B,), 48), c3.k, c3.v)
        print("max diff", (ref - got).abs().max().item())
        comp2(lm, tok, torch.full((B,), 48), cache.k, cache.v, W)
        res = {"eager": [], "compiled": [], "fused": []}
        for rep in range(8):
            for name in ("eager", "compiled", "fused"):
                t0 = time.perf_counter()
                for i in range(64):
                    if name == "eager":
                        lm(tok, torch.full((B,), 49 + i), cache)
                    elif name == "compiled":
                        comp(lm, tok, torch.full((B,), 49 + i), cache.k, cache.v)
                    else:
                        comp2(lm, tok, torch.full((B,), 49 + i), cache.k, cache.v, W)
                res[name].append((time.perf_counter() - t0) / 64)
        e, cc = statistics.median(res["eager"]), statistics.median(res["compiled"])
        fu = statistics.median(res["fused"])
        print(
            f"B={B}: eager {1e3 * e:.3f} ms compiled {1e3 * cc:.3f} ms fused {1e3 * fu:.3f} ratio {e / cc:.2f} "
            f"{e / fu:.2f}"
        )
