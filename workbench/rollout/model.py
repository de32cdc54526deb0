"""A lean Llama-family forward for rollouts, with a preallocated KV cache and per-row positions.

Like gpt-fast and nano-vllm, generation does not go through transformers: this module loads the
Hugging Face weights (same parameter names, so ``load_state_dict(hf_model.state_dict())`` works)
and runs a minimal forward whose logits match transformers' ``LlamaForCausalLM``,
``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` and ``MistralForCausalLM`` to float tolerance
(``tests/test_architectures.py``; what each family adds, and what is refused: :mod:`workbench.rollout.arch`).

Per-row positions are what make batched speculative decoding with ragged acceptance simple: every
row b writes its new tokens into the cache at ``start_pos[b] + t`` and attends to cache positions
``<= start_pos[b] + t``. Cache entries beyond a row's accepted length are stale drafts; the
position mask never lets a query read them, and the next forward overwrites them. So no row is cut
back to the slowest one and nothing needs to be rolled back.

One forward, :func:`lm_forward`, a pure function of the flat weight list: eager mode calls it,
``LeanLM.enable_compile`` compiles it (fused q/k/v and gate/up weights, a bucketed attention
length). Its layer is :func:`workbench.rollout.layers.decoder_layer`, which the chain drafters run too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from workbench.rollout.arch import LMConfig
from workbench.rollout.fused import fuse, mark_static_address, replaced
from workbench.rollout.graphs import GRAPH_ATTENTION_MULTIPLE, StaticCachePool
from workbench.rollout.kv_cache import KVCache
from workbench.rollout.layers import (
    MLP,
    Attention,
    RMSNorm,
    cache_kv,
    decoder_layer,
    position_mask,
    rms_norm,
    rope_cos_sin,
    rope_tables,
)
from workbench.rollout.packing import PACKED_MIN_ROWS, check_packable, linear, prepack

# Entries per layer in :func:`lm_forward`'s flat weight list: input norm, q/k/v, o, post-attention
# norm, gate/up, down, q/k/v bias (or None), q/k norm weights (or None).
PER_LAYER = 8


class Block(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class _Body(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LeanLM(nn.Module):
    """Inference-only Llama-family forward over a KV cache with per-row start positions.

    Parameter names mirror transformers' ``*ForCausalLM`` (``model.layers.0.self_attn.q_proj``,
    Qwen2's ``.bias``, Qwen3's ``self_attn.q_norm`` ...), so weights load with ``load_state_dict``
    and sync from a trainer without renaming. The modules only hold the weights: every forward,
    eager or compiled, is :func:`lm_forward` over their tensors (and ``cfg.windows()``).
    """

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.windows = cfg.windows()  # per layer: sliding window in tokens, or None
        # True: every forward attends over the whole cache (masked), so a position's logits do not
        # depend on the step's attention length (see :meth:`forward`); rollout.fixed_attention_length
        self.fixed_attention_length = False
        self.model = _Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._init_rope()
        self.requires_grad_(False)

    def _init_rope(self) -> None:
        """RoPE cos/sin tables (P, D) for every position, in float32 whatever the weights' dtype."""
        cos, sin = rope_tables(self.cfg, self.lm_head.weight.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if "_fused" in self.__dict__:
            self.__dict__["_flat"] = self._flat_weights(fused=True)  # the compiled step's tables, current again

    @classmethod
    def from_hf(cls, hf_model: nn.Module, what: str = "model") -> "LeanLM":
        """Build from a transformers ``*ForCausalLM`` of a supported family (same device/dtype),
        copying its weights.

        Raises:
            ValueError: ``{what}: ...`` an architecture feature the forward does not implement
                (:func:`workbench.rollout.arch.check_supported`), or weights that do not fit.
        """
        cfg = LMConfig.from_hf(hf_model.config, what)
        p = next(hf_model.parameters())
        lm = cls(cfg).to(device=p.device, dtype=p.dtype)
        lm._init_rope()  # .to(dtype) also cast the tables; rebuild them in float32
        lm.load_weights(hf_model)
        return lm.eval()

    @torch.no_grad()
    def load_weights(self, hf_model: nn.Module) -> None:
        """Copy the trainer's current weights in place (the `prepare` stage's weight sync)."""
        missing, unexpected = self.load_state_dict(hf_model.state_dict(), strict=False)
        fused = self.__dict__.get("_fused")
        if fused is not None and any(
            replaced(layer, f, b) for layer, f, b in zip(self.model.layers, fused, self.__dict__["_fused_bias"])
        ):
            self._fuse_weights()  # something replaced the weights instead of copying into them
        if fused is not None:
            self.__dict__["_flat"] = self._flat_weights(fused=True)  # the compiled step's references, current again
        missing = [m for m in missing if not (self.cfg.tie_word_embeddings and m == "lm_head.weight")]
        if missing or [u for u in unexpected if "rotary" not in u]:
            raise ValueError(
                f"model: weights do not match the {self.cfg.model_type} layout (missing {missing[:4]}, unexpected "
                f"{unexpected[:4]})"
            )

    def _apply(self, fn, recurse=True):
        """``.to()``/``.half()``/...: the tensors get new storage, so the compiled step's fused
        weights (views) and flat list are rebuilt from the converted parameters."""
        super()._apply(fn, recurse)
        if "_fused" in self.__dict__:
            self._fuse_weights()
            self.__dict__["_flat"] = self._flat_weights(fused=True)
        return self

    def enable_compile(self, cuda_graphs: bool = False) -> None:
        """Run decode and verification steps (every forward without ``logits_col``, hidden states
        requested or not) through ``torch.compile`` (inductor, dynamic shapes) of :func:`lm_forward`,
        the function the eager forward runs, over fused q/k/v and gate/up weights. Steps that
        return the drafter's hidden states (mtp, eagle3) are compiled too, so their target runs
        as compiled as the autoregressive baseline's.

        The first calls of each new shape class compile (tens of seconds on CPU; a C++ compiler is
        needed there); afterwards a small model's step is one fused kernel sequence instead of ~100
        eager ops (measured in docs/results/engine-optimisation-log.md). Same logits to float tolerance.

        ``cuda_graphs``: compile with ``mode="reduce-overhead"`` (CUDA graphs through cudagraph
        trees) and lease KV caches from a :class:`workbench.rollout.graphs.StaticCachePool`, so
        graphs that write the cache in place can be replayed (see that module). Has no effect on
        the CPU beyond those (torch records graphs only for CUDA tensors).

        Idempotent: a second call with the same ``cuda_graphs`` changes nothing, and a call with
        the other one keeps the fused weights (same storage), so graphs recorded over them stay
        valid (``wb bench`` calls it once per drafter and k).
        """
        if "_fused" not in self.__dict__:
            self._fuse_weights()
            self.__dict__["_flat"] = self._flat_weights(fused=True)
        # Target and draft share compiled_step's compile cache, and batch 1 / one token per row
        # are specialised graphs, so a benchmark meets > 8 variants; past TorchDynamo's default
        # limit of 8 it silently runs eager. Raised as vLLM does (its compilation config).
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, name, max(getattr(cfg, name), 64))
        if "_compiled" in self.__dict__ and self.cuda_graphs == cuda_graphs:
            return  # already compiled in this mode: keep the callable, its graphs and the cache pool
        if cuda_graphs:
            # one graph per (batch bucket, tokens per row, attention span): more than torch's
            # default warning threshold of 8, by design (workbench.rollout.graphs)
            torch._inductor.config.triton.cudagraph_dynamic_shape_warn_limit = None
            self.__dict__["_pool"] = StaticCachePool()
        else:
            self.__dict__.pop("_pool", None)
        mode = "reduce-overhead" if cuda_graphs else None
        # fullgraph: a graph break would silently run (parts of) the forward eagerly, slower than eager
        self.__dict__["_compiled"] = torch.compile(compiled_step, dynamic=True, fullgraph=True, mode=mode)

    def enable_prepack(self, rows_hint: int = 16, min_rows: int | Callable[[int, int, int], int] | None = None) -> None:
        """Pack the linear weights once for oneDNN's prepacked CPU kernel
        (:func:`workbench.rollout.packing.prepack`; ``rollout.prepack_weights``), as vLLM-CPU does at load
        (``create_onednn_mm``): per layer one fused q/k/v and one fused gate/up weight (the Linears'
        parameters become views into them, as for the compiled step; vLLM's ``QKVParallelLinear`` and
        ``MergedColumnParallelLinear``), o, down, and the LM head. Forwards then run four GEMMs a layer
        instead of seven (fewer, larger calls; the eager step made ~9,700 op calls against vLLM's
        ~6,000, benchmarks/profile-engines-smollm2-spec-cpu.md). A weight written in place (the weight
        sync, or a trained draft model's ``load_weights``) is packed again at its next use. Costs one
        more copy of those weights in memory.

        ``min_rows``: calls with fewer rows (tokens) take ``F.linear``: a number for every weight, or
        a function (out_features, in_features, rows_hint) -> rows per weight shape (what ``wb`` passes:
        :func:`workbench.prepack_rows.measured_min_rows`, measured on this machine and cached); None =
        :data:`~workbench.rollout.packing.PACKED_MIN_ROWS`.

        With :meth:`enable_compile` too, the compiled step runs the packed GEMMs as opaque ops
        (:func:`workbench.rollout.packing.packed_linear`) and inductor fuses what lies between them.

        Raises:
            ValueError: weights not CPU float32: names rollout.prepack_weights.
        """
        check_packable(self.lm_head.weight)  # before fusing anything
        if "_fused" not in self.__dict__:
            self._fuse_weights()
            self.__dict__["_flat"] = self._flat_weights(fused=True)
        weights = [(self.lm_head.weight, ())]
        for layer, (qkv, gu) in zip(self.model.layers, self.__dict__["_fused"]):
            a, m = layer.self_attn, layer.mlp
            # the fused tensors' rows are the Linears' parameters (views with version counters of their own)
            weights += [
                (qkv, (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)),
                (a.o_proj.weight, ()),
                (gu, (m.gate_proj.weight, m.up_proj.weight)),
                (m.down_proj.weight, ()),
            ]
        for w, sources in weights:
            rows = min_rows(*w.shape, rows_hint) if callable(min_rows) else min_rows
            prepack(w, rows_hint, PACKED_MIN_ROWS if rows is None else rows, sources)
        self.__dict__["_prepacked"] = True

    @property
    def cuda_graphs(self) -> bool:
        """Whether :meth:`enable_compile` turned CUDA graphs on (caches then come from a static pool)."""
        return "_pool" in self.__dict__

    def _flat_weights(self, fused: bool = False) -> list:
        """The weights as :func:`lm_forward` takes them, one flat list: embedding, RoPE tables, per
        layer [input norm, q/k/v, o, post-attention norm, gate/up, down, q/k/v bias or None, (q
        norm, k norm) or None] (:data:`PER_LAYER`), final norm, LM head.

        The entries are the parameters themselves (or, ``fused``, the fused tensors they view), so
        the in-place weight sync reaches them. Unfused, q/k/v and gate/up are tuples of the
        Linears' weights (three and two matmuls, as the eager forward always ran). Fused (the
        compiled step): one (q+k+v, H) and one (2I, H) tensor per layer, marked static so their
        shapes are constants of the graph (docs/results/engine-optimisation-log.md, entries 4 and 8:
        plain tensors instead of the module spare TorchDynamo guarding ~30 module attributes per call).
        """
        m = self.model
        flat: list = [m.embed_tokens.weight, self.rope_cos, self.rope_sin]
        for i, layer in enumerate(m.layers):
            a, p = layer.self_attn, layer.mlp
            if fused:
                (qkv, gu), bias = self.__dict__["_fused"][i], self.__dict__["_fused_bias"][i]
            else:
                qkv, gu, bias = a.qkv_weight(), p.gate_up_weight(), a.qkv_bias()
            flat += [
                layer.input_layernorm.weight,
                qkv,
                a.o_proj.weight,
                layer.post_attention_layernorm.weight,
                gu,
                p.down_proj.weight,
                bias,
                a.qk_norm_weight(),
            ]
        flat += [m.norm.weight, self.lm_head.weight]
        if fused:
            for t in flat:
                for leaf in t if isinstance(t, tuple) else (t,):
                    if leaf is not None:
                        # weight shapes are constants of the graph (dynamic=True would make them symbolic)
                        torch._dynamo.mark_static(leaf)
                        mark_static_address(leaf)
        return flat

    def _fuse_weights(self) -> None:
        """Per layer, one (q+k+v, H) and one (2I, H) weight (and one (q+k+v,) bias if the layer has
        q/k/v biases): fewer, larger matmuls in the compiled step (6-14 % faster at batch 1-8,
        docs/results/engine-optimisation-log.md). The Linears' parameters become views into them, so
        the in-place weight sync (``load_weights``) updates both."""
        fused, biases = [], []
        for layer in self.model.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = [a.q_proj, a.k_proj, a.v_proj]
            fused.append((fuse([proj.weight for proj in qkv]), fuse([m.gate_proj.weight, m.up_proj.weight])))
            biases.append(fuse([proj.bias for proj in qkv]) if a.q_proj.bias is not None else None)
        self.__dict__["_fused"] = fused  # plain attributes: not parameters, not in state_dict
        self.__dict__["_fused_bias"] = biases

    def new_cache(self, batch: int, max_len: int, capacity: int | None = None) -> KVCache:
        """A KV cache of ``batch`` rows and ``max_len`` positions; ``capacity``: the most rows its
        ``select`` may expand it to in place (prefix sharing); required when caches come from the
        static pool, and saves a reallocation otherwise.

        Raises:
            ValueError: ``max_len`` beyond ``max_position_embeddings`` (names rollout.max_new_tokens).
        """
        if max_len > self.cfg.max_position_embeddings:
            raise ValueError(
                f"rollout: prompt + max_new_tokens + k needs {max_len} positions but the model has "
                f"max_position_embeddings={self.cfg.max_position_embeddings}; lower rollout.max_new_tokens"
            )
        w = self.lm_head.weight
        if self.cuda_graphs:
            return self.__dict__["_pool"].lease(self.cfg, batch, max_len, w.device, w.dtype, capacity=capacity)
        return KVCache(self.cfg, batch, max_len, w.device, w.dtype, capacity=capacity)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        start_pos: torch.Tensor,
        cache: KVCache,
        hidden_layers: tuple[int, ...] = (),
        logits_col: torch.Tensor | None = None,
        max_start: int | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run ``input_ids`` (B, T) at positions ``start_pos[b] + t``; write K/V into ``cache``.

        Args:
            input_ids: (B, T) long token ids.
            start_pos: (B,) long position of column 0 of each row.
            cache: the batch's KV cache; rows must match B.
            hidden_layers: indices i whose *input* hidden state (B, T, H) is returned
                (i == num_layers: the last layer's output before the final norm).
            logits_col: (B,) long; if given, logits only at column ``logits_col[b]`` of each row,
                (B, 1, V) (prefill of right-padded prompts needs just each row's last token).
            max_start: ``max(start_pos)`` (or an upper bound) known on the host; None = read it
                off the device (a synchronisation on CUDA).
        Returns:
            logits (B, T, V) float32 and ``{i: hidden (B, T, H)}``.
        """
        # the longest row's last position + 1 (a host read unless the caller knows it)
        need = (int(start_pos.max()) if max_start is None else max_start) + input_ids.shape[1]
        if self.fixed_attention_length:
            # One attention length for every step: the reduction over keys then no longer depends
            # on how far a step reaches (CPU attention kernels block it by length), so greedy
            # speculative == greedy autoregressive bit for bit where the kernels are also invariant
            # to the number of query rows (bf16 on CPU: tests/test_architectures.py).
            need = cache.max_len
        eps = self.cfg.rms_norm_eps
        compiled = self.__dict__.get("_compiled")
        if compiled is not None and logits_col is None:
            # attend over the cache up to the longest row, rounded up to a multiple of 32 (128 under
            # CUDA graphs) so the compiled graph sees few distinct lengths. The hidden layers are a
            # constant of the graph (one graph per drafter's layers), as flags (see compiled_step).
            m = GRAPH_ATTENTION_MULTIPLE if self.cuda_graphs else 32
            tk = min(cache.max_len, -(-need // m) * m)
            want = tuple(i in hidden_layers for i in range(self.cfg.num_layers + 1))
            logits, hidden = compiled(
                eps, self.__dict__["_flat"], input_ids, start_pos, cache.k, cache.v, tk, want, self.windows
            )
            if hidden and self.cuda_graphs:
                # a replay overwrites its outputs, and drafters keep hidden states past the next step
                hidden = {i: h.clone() for i, h in hidden.items()}
            return logits, hidden
        # eager (prefill with logits_col, or not compiled): attention over exactly `need` positions; the
        # weights read afresh from the modules on every call, or with packed weights the fused ones
        # (their packed copies are what `linear` runs; this forward never records autograd)
        W = self.__dict__["_flat"] if "_prepacked" in self.__dict__ else self._flat_weights()
        return lm_forward(eps, W, input_ids, start_pos, cache.k, cache.v, need, hidden_layers, logits_col, self.windows)


def compiled_step(
    eps: float,
    W: list,
    input_ids: torch.Tensor,
    start_pos: torch.Tensor,
    ks: list,
    vs: list,
    tk: int,
    want: tuple[bool, ...],
    windows: tuple = (),
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """:func:`lm_forward` of a decode or verification step, as ``enable_compile`` compiles it:
    ``want[i]`` (one flag per layer and one for the last layer's output) says whether hidden state
    i is returned. Flags, not the layer indices: under ``dynamic=True`` TorchDynamo makes integer
    inputs symbolic, and ``i in (0, 2)`` over symbolic ints came out False (no hidden states at
    all; torch 2.13), while booleans stay constants of the graph."""
    layers = tuple(i for i, w in enumerate(want) if w)
    return lm_forward(eps, W, input_ids, start_pos, ks, vs, tk, layers, None, windows)


def lm_forward(
    eps: float,
    W: list,
    input_ids: torch.Tensor,
    start_pos: torch.Tensor,
    ks: list,
    vs: list,
    tk: int,
    hidden_layers: tuple[int, ...] = (),
    logits_col: torch.Tensor | None = None,
    windows: tuple = (),
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The rollout model's one forward, on plain tensors: eager mode calls it, ``enable_compile``
    compiles it (and a CUDA graph could capture it: no module, no data-dependent shape inside).

    Args:
        eps: the RMSNorm epsilon.
        W: :meth:`LeanLM._flat_weights` (q/k/v and gate/up fused or as tuples).
        input_ids (B, T) long at positions ``start_pos[b] + t``, start_pos (B,) long.
        ks, vs: the cache's per-layer keys/values (B, T_max, Hkv, D); K/V of the new positions are written there.
        tk: attend over the first ``tk`` cache positions (>= every row's last position + 1; the
            caller passes the exact length eagerly, a bucketed one to the compiled graph) under the
            position mask.
        hidden_layers, logits_col: as :meth:`LeanLM.forward`.
        windows: per layer, a sliding attention window in tokens or None (full causal attention);
            empty = None for every layer (:meth:`LMConfig.windows`).
    Returns:
        logits (B, T, V) float32 ((B, 1, V) with ``logits_col``) and ``{i: hidden (B, T, H)}``.
    """
    B, T = input_ids.shape
    dev = input_ids.device
    n_layers = (len(W) - 5) // PER_LAYER
    pos = start_pos[:, None] + torch.arange(T, device=dev)[None, :]  # (B, T)
    mask = position_mask(pos, tk)  # (B, 1, T, tk)
    rows = torch.arange(B, device=dev)[:, None].expand(B, T)
    x = F.embedding(input_ids, W[0])  # (B, T, H)
    cos, sin = rope_cos_sin(W[1], W[2], pos, x.dtype)  # (B, T, 1, D)
    hidden: dict[int, torch.Tensor] = {}
    for i in range(n_layers):
        w_in, w_qkv, w_o, w_post, w_gu, w_down, b_qkv, qk_norm = W[3 + PER_LAYER * i : 3 + PER_LAYER * (i + 1)]
        if i in hidden_layers:
            hidden[i] = x
        window = windows[i] if windows else None
        kv = cache_kv(ks[i], vs[i], rows, pos, mask if window is None else position_mask(pos, tk, window), tk)
        x = decoder_layer(
            rms_norm(x, w_in, eps), x, w_qkv, w_o, w_post, w_gu, w_down, eps, cos, sin, kv, b_qkv, qk_norm
        )
    if n_layers in hidden_layers:
        hidden[n_layers] = x
    if logits_col is not None:
        x = x[torch.arange(B, device=dev), logits_col][:, None]  # (B, 1, H)
    return linear(rms_norm(x, W[-2], eps), W[-1]).float(), hidden
