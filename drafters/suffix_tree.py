"""Suffix tries with counts over GRPO rollouts, and the speculation rule of suffix decoding.

Pure Python over token ids (lists of int); no torch, no drafter interface (``drafters.suffix`` is
the glue). Semantics follow Arctic Inference's suffix decoding (Oliaro et al. 2024, arXiv
2411.04975; vLLM ``method: "suffix"``), read in their ``suffix_tree.cc``; the code is ours.

**Corpus.** A :class:`SuffixTrie` counts every substring of length <= ``max_depth`` (tokens) of a
set of sequences that all start with one shared prefix: a prompt and its rollouts, each sequence
= prompt + completion so far. A node at depth d is one pattern s of d tokens; ``count`` = its
occurrences in the corpus (every start position, overlaps included), so a child's count / its
node's count is the empirical probability that an occurrence of s continues with the child's token.
Occurrences without a next token (a sequence's current end: the querying row's own suffix, a
sibling that is as far as it is) count in the node, as in Arctic, so these probabilities sum to
<= 1 over the children.

**Speculation** (:func:`speculate`, Arctic's ``speculate`` with path drafts): for every match
length m = 1 .. min(len, max_depth - 1), the node of the row's last m tokens yields a greedy draft:
from it, repeatedly take the child with the highest count (ties: smallest token id), multiply the
running probability by child count / node count, and stop before the running probability falls
below ``min_token_prob``, after n(m) = min(k, floor(max_spec_factor * m), max_depth - m) tokens
(the tree depth bounds match + draft), or where no occurrence continues. Its score = the sum of the
running probabilities of its tokens (an estimate of the expected number of accepted drafts). The
draft with the highest score wins; ties go to the longer match. No match, no drafts.

**Cursors.** A sequence being extended is represented by its cursor: the nodes of its current
suffixes, ``cursor[i]`` = the node of its last i+1 tokens, i < min(len, max_depth). Appending a
token extends every cursor node by one (O(max_depth)), so the trie grows as tokens are generated,
never rebuilt within a batch; the cursor also gives the query's match nodes with no walk from the
root. Across batches finished rollouts are kept as token ids (:class:`RolloutHistory`), and a
prompt's trie is built again from them when the prompt comes back: memory stays one int per kept
token instead of up to max_depth nodes per token.

Where this differs from Arctic (for RL rollouts): one corpus per prompt (own row + siblings + that
prompt's history) instead of a per-request prompt tree beside one global tree of all responses
compared by score; the match may cover the whole row (m = len: siblings share its prompt; Arctic
stops at len - 1); ties between children go to the smallest token id.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

_EPS = 1e-6  # floor(factor * m + eps), as Arctic: 0.29 * 100 is 28.999999999999996 in floats, meant as 29


Cursor = list  # list[int]: cursor[i] = node id of the sequence's last i+1 tokens


class SuffixTrie:
    """Counts of all substrings of length <= ``max_depth`` of a set of sequences (module doc).

    Nodes are ints indexing flat lists (``count``, ``best``, ``token``) and one edge dict, not
    Python objects: CPython's garbage collector walks every container object at each full
    collection, which made node objects cost ~4 µs each here. Node 0 is the root (the empty
    pattern). Counts only grow (a trie lives for one rollout batch; nothing is removed from it),
    so each node's most frequent child is kept up to date in O(1) per count increment.

    Memory: one node per distinct substring of length <= max_depth (at most max_depth per token
    added), ~150 bytes each. Raises ValueError for max_depth < 2 (no room for a match and a draft).
    """

    def __init__(self, max_depth: int):
        if max_depth < 2:
            raise ValueError(f"suffix trie: max_depth must be >= 2, got {max_depth}")
        self.max_depth = max_depth
        self.count = [0]  # (N,) occurrences of each node's pattern in the corpus
        self.best = [-1]  # (N,) the child with the highest count, ties to the smallest token; -1: none
        self.token = [-1]  # (N,) the last token of each node's pattern
        self.edges: dict[int, int] = {}  # (node << 32 | token) -> child node

    def __len__(self) -> int:
        return len(self.count)

    def extend(self, cursor: Cursor, token: int, weight: int = 1) -> Cursor:
        """Append ``token`` to the sequence at ``cursor``; return its new cursor (the old one is
        left as it was, so a shared prefix's cursor can seed several sequences).

        ``weight``: how many identical sequences this append stands for (a prompt shared by
        ``weight`` rollouts is added once). Cost O(min(len, max_depth)) dict and list operations.
        """
        count, best, tok, edges = self.count, self.best, self.token, self.edges
        out = []
        for node in [0, *cursor[: self.max_depth - 1]]:  # a suffix already max_depth long is not extended
            key = node << 32 | token
            ch = edges.get(key)
            if ch is None:
                ch = edges[key] = len(count)
                count.append(0)
                best.append(-1)
                tok.append(token)
            c = count[ch] = count[ch] + weight
            b = best[node]
            if b != ch and (b < 0 or c > count[b] or (c == count[b] and token < tok[b])):
                best[node] = ch  # only the incremented child can overtake the leader
            out.append(ch)
        return out

    def extend_many(self, cursor: Cursor, tokens: Iterable[int], weight: int = 1) -> Cursor:
        """:meth:`extend` token by token; O(len(tokens) * max_depth)."""
        for t in tokens:
            cursor = self.extend(cursor, t, weight)
        return cursor


def max_spec_tokens(match_len: int, k: int, max_depth: int, max_spec_factor: float) -> int:
    """n(m) = min(k, floor(max_spec_factor * m), max_depth - m): drafts allowed for a match of m tokens."""
    return max(0, min(k, int(max_spec_factor * match_len + _EPS), max_depth - match_len))


def greedy_path(trie: SuffixTrie, node: int, n: int, min_token_prob: float) -> tuple[list[int], float]:
    """Up to ``n`` tokens following ``node`` greedily by count while the running probability (the
    product of child count / node count) stays >= ``min_token_prob``; returns (tokens, score = the
    sum of the running probabilities). O(n)."""
    count, best, tok = trie.count, trie.best, trie.token
    toks: list[int] = []
    prob, score = 1.0, 0.0
    while len(toks) < n:
        child = best[node]
        if child < 0:
            break
        prob *= count[child] / count[node]
        if prob < min_token_prob:
            break
        toks.append(tok[child])
        score += prob
        node = child
    return toks, score


@dataclass
class Draft:
    """A speculation: ``tokens`` (<= k), ``score`` (sum of their running probabilities), and the
    ``match_len`` (tokens) of the suffix they continue (0: no drafts)."""

    tokens: list[int] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


def speculate(trie: SuffixTrie, cursor: Cursor, k: int, max_spec_factor: float, min_token_prob: float) -> Draft:
    """The draft of the sequence at ``cursor`` in ``trie`` (module doc: the best-scoring greedy path
    over all match lengths, ties to the longer match).

    Cost O(max_depth + k * (matches tried)) per call: match lengths are tried from the longest down,
    one whose pattern never continues elsewhere is skipped at once, and one whose n(m) cannot beat
    the best score so far (a score is at most n(m)) is skipped too.
    """
    D, best = trie.max_depth, Draft()
    for m in range(min(len(cursor), D - 1), 0, -1):
        node = cursor[m - 1]
        if trie.best[node] < 0:  # no occurrence of the last m tokens continues (yet)
            continue
        n = max_spec_tokens(m, k, D, max_spec_factor)
        if n <= best.score:  # score <= n: cannot be strictly better than a longer match
            continue
        toks, score = greedy_path(trie, node, n, min_token_prob)
        if score > best.score:
            best = Draft(toks, score, m)
    return best


class RolloutHistory:
    """Finished rollouts (completion token ids) by prompt, at most ``max_requests`` in all, the
    oldest evicted first (FIFO, Arctic's eviction order). 0 keeps none. O(1) per add and eviction.

    Raises ValueError for a negative ``max_requests``.
    """

    def __init__(self, max_requests: int):
        if max_requests < 0:
            raise ValueError(f"rollout history: max_requests must be >= 0, got {max_requests}")
        self.max_requests = max_requests
        self._order: deque[tuple[int, ...]] = deque()  # one prompt key per kept rollout, oldest first
        self._by_prompt: dict[tuple[int, ...], deque[tuple[int, ...]]] = {}

    def __len__(self) -> int:
        return len(self._order)

    def add(self, prompt: Sequence[int], completion: Sequence[int]) -> None:
        if self.max_requests == 0:
            return
        key = tuple(prompt)
        self._by_prompt.setdefault(key, deque()).append(tuple(completion))
        self._order.append(key)
        while len(self._order) > self.max_requests:
            old = self._order.popleft()  # a prompt's rollouts are FIFO too: its oldest is the global oldest of it
            q = self._by_prompt[old]
            q.popleft()
            if not q:
                del self._by_prompt[old]

    def rollouts(self, prompt: Sequence[int]) -> Sequence[tuple[int, ...]]:
        """The kept completions of ``prompt``, oldest first."""
        return self._by_prompt.get(tuple(prompt), ())


class SuffixBatch:
    """The suffix tries of one rollout batch: row b = one rollout (prompt + tokens generated so far).

    Rows with the same prompt (a GRPO group) share one trie holding the prompt, every such row's
    completion as generated and the kept history rollouts of that prompt; so a row drafts from its
    own tokens, its siblings' tokens generated so far and the prompt's earlier rollouts. Only tokens
    given to :meth:`append` enter a trie: a sibling's token is never read before it is generated.

    Lazy per prompt: :meth:`append` only records the tokens; a prompt's trie is built, and its
    rows' (finished ones included) new tokens are added, when one of its rows is next asked for a
    proposal. A trie's counts do not depend on the order in which its sequences grew, so the
    proposals equal adding every token at once; but a batch that adaptive speculation decodes
    plainly (k_t = 0) never pays for the tries, and one that speculates only in its long tail pays
    only for the prompts still generating there.

    Building costs O((P + H) * max_depth) node visits per distinct prompt (P prompt tokens, H history
    tokens of it; the prompt is added once with weight = its sequences), each appended token
    O(max_depth), each :meth:`propose` O(max_depth * k) at worst.
    """

    def __init__(self, history: RolloutHistory, prompts: list[Sequence[int]], max_depth: int):
        self.history, self.max_depth = history, max_depth
        self.rows = [_Row(tuple(p)) for p in prompts]  # (B,) the live rows
        self.of_prompt: dict[tuple[int, ...], list[_Row]] = {}  # every row of each prompt, finished ones too
        for row in self.rows:
            self.of_prompt.setdefault(row.key, []).append(row)
        self.tries: dict[tuple[int, ...], SuffixTrie] = {}  # built at a prompt's first proposal
        # rows with tokens not yet in their prompt's trie, by prompt: a proposal syncs only these, so a
        # step costs O(rows that moved), not O(rows of the prompt) per proposal (B^2 for one prompt's
        # B rows: 30k audit rows spent minutes scanning rows with nothing new)
        self.pending: dict[tuple[int, ...], list[_Row]] = {}
        self.finished: list[_Row] = []  # rows that left, in the order they did

    def __len__(self) -> int:
        return len(self.rows)

    def append(self, row: int, tokens: Iterable[int]) -> None:
        """Row ``row`` generated ``tokens`` (in order): recorded, added to the trie when needed. O(len(tokens))."""
        r = self.rows[row]
        r.completion += tokens
        if not r.pending and len(r.completion) > r.added:
            r.pending = True
            self.pending.setdefault(r.key, []).append(r)

    def _sync(self, key: tuple[int, ...]) -> SuffixTrie:
        """The prompt's trie with every token its rows have generated so far."""
        trie = self.tries.get(key)
        if trie is None:
            rows = self.of_prompt[key]
            trie = self.tries[key] = SuffixTrie(self.max_depth)
            old = self.history.rollouts(key)
            start = trie.extend_many([], key, weight=len(rows) + len(old))
            for completion in old:
                trie.extend_many(start, completion)
            for r in rows:
                r.cursor = start
        for r in self.pending.pop(key, ()):
            r.cursor = trie.extend_many(r.cursor, r.completion[r.added :])
            r.added, r.pending = len(r.completion), False
        return trie

    def add_row(self, prompt: Sequence[int], tokens: Iterable[int]) -> None:
        """A row joins the batch (continuous batching) with its prompt and first ``tokens``. Its
        prompt's trie, if built, counts the prompt once more, as if built with the row in it."""
        row = _Row(tuple(prompt))
        self.rows.append(row)
        self.of_prompt.setdefault(row.key, []).append(row)
        trie = self.tries.get(row.key)
        if trie is not None:
            row.cursor = trie.extend_many([], row.key)
        self.append(len(self.rows) - 1, tokens)

    def propose(self, row: int, k: int, max_spec_factor: float, min_token_prob: float) -> Draft:
        r = self.rows[row]
        return speculate(self._sync(r.key), r.cursor, k, max_spec_factor, min_token_prob)

    def select(self, keep: Sequence[int]) -> None:
        """Keep rows ``keep`` (in that order); the others finished. A finished row stays in its
        prompt's corpus (its siblings still draft from it) and enters the history at :meth:`finish`."""
        kept = set(keep)
        self.finished += [r for b, r in enumerate(self.rows) if b not in kept]
        self.rows = [self.rows[b] for b in keep]

    def finish(self) -> None:
        """End of the batch: the finished rows go into the history, in the order they finished (rows
        still generating, of a batch abandoned midway, do not); the tries are dropped."""
        for r in self.finished:
            self.history.add(r.key, r.completion)
        self.finished, self.tries, self.rows, self.of_prompt, self.pending = [], {}, [], {}, {}


@dataclass
class _Row:
    """One rollout of a batch: its prompt, its completion so far, and how much of it is in the trie."""

    key: tuple[int, ...]
    completion: list[int] = field(default_factory=list)
    cursor: Cursor = field(default_factory=list)  # in its prompt's trie, after `added` tokens
    added: int = 0
    pending: bool = False  # listed in SuffixBatch.pending: has tokens past `added`
