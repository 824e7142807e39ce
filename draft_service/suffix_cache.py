"""SuffixDecoding's data structure: depth-limited suffix trees with counts, and a bounded cache of past outputs.

Pure Python (no torch, no gRPC). It follows the algorithm of Snowflake's arctic-inference
(`csrc/suffix_decoding/suffix_tree.cc`, the code behind vLLM's `suffix` method; Oliaro et al.,
arXiv 2411.04975), re-written here; no code is copied.

Glossary:
- suffix: a sequence's tokens from one position on, cut at `max_depth` tokens. A tree indexes every
  suffix of every sequence it holds.
- count (of a node): how many indexed suffixes pass through or end at the node, i.e. how often the
  pattern spelled from the root to the node's end occurs.
- match: a tail of the context, of `match_len` tokens, that the tree spells from the root.
- draft: from a match, follow the most frequent child. A token's probability is the product of
  child.count / node.count along the way; the draft stops below `min_token_prob`, or at
  `int(match_len * max_spec_factor + max_spec_offset)` tokens, or at the k asked for.
- score: the sum of the draft's token probabilities (its expected accepted length). The best
  score over all match lengths wins, ties to the longer match (found without trying them all).

Layout. Paths are compressed: a node holds a run of `length` tokens, stored as a reference
(`seq`, `start`) into a sequence that contains the whole path from the root to the node's end, so
a tree holds O(tokens) nodes (at most 2 per token). Appending one token extends the last
`max_depth` suffixes by one; a suffix alone on its leaf just lengthens the leaf, which is most of
them, so the work per token is small. A node's reference is the most recently added sequence
that reached it: when a cache evicts its oldest sequence, every node that survives was also
reached by a newer one, so no surviving node points into the evicted tokens and their memory is
freed. (Removing out of order stays correct, since a node refers to the token list itself, not an
id; it may keep that list alive longer.)
"""

from __future__ import annotations

import array
import collections
import dataclasses
import threading
from typing import Sequence

ROOT = 0
NONE = -1  # no node


@dataclasses.dataclass
class Draft:
    """The best continuation a tree found for a context."""

    token_ids: list[int] = dataclasses.field(default_factory=list)
    probs: list[float] = dataclasses.field(default_factory=list)  # [len(token_ids)] estimated probability of each
    score: float = 0.0  # sum(probs): the expected number of accepted tokens
    match_len: int = 0  # context tokens matched before the draft


class SuffixTree:
    """All suffixes (up to max_depth tokens) of the sequences added, with their counts.

    Nodes are ids into columns (arrays of int32/int64, a list of sequence references, a list of
    child dicts of int -> int), not objects. Python's cyclic GC does not track arrays or int-only
    dicts: with one object per node, a full collection would walk every node of the cache on the
    event loop; with columns it has almost nothing to walk (`python -m bench suffix-cost` measures it).
    """

    def __init__(self, max_depth: int):
        if max_depth < 2:
            raise ValueError(f"max_depth must be at least 2 (a match and a token), got {max_depth}")
        self.max_depth = max_depth
        self.num_tokens = 0
        # Node 0 is the root. Node n holds seq[n][start[n] : start[n] + length[n]].
        self._count = array.array("q", [0])  # suffixes that pass through or end at the node
        self._length = array.array("i", [0])
        self._start = array.array("i", [0])
        self._parent = array.array("i", [-1])
        self._best = array.array("i", [NONE])  # the most frequent child; NONE: no children, or unknown
        self._seq: list = [None]  # the sequence the node's tokens are read from
        self._children: list[dict[int, int] | None] = [None]  # first token -> child; None for a leaf
        self._free: list[int] = []  # ids of deleted nodes, to reuse

    @property
    def empty(self) -> bool:
        return self._count[ROOT] == 0

    @property
    def num_nodes(self) -> int:
        return len(self._count) - len(self._free) - 1

    def add(self, seq) -> None:
        """Index a whole sequence (a list, or an array of int32). The tree keeps a reference to it: do not
        change it afterwards."""
        suffixes = _Suffixes()
        for position in range(len(seq)):
            self._append(seq, position, suffixes)

    def track(self, seq: list[int]) -> Track:
        """Index `seq` as it grows: `Track.index_to(n)`; seq[:n] must not change once indexed."""
        return Track(self, seq)

    def _new_node(self, count: int, length: int, seq, start: int, parent: int) -> int:
        if self._free:
            node = self._free.pop()
            self._count[node], self._length[node], self._start[node] = count, length, start
            self._parent[node], self._best[node] = parent, NONE
            self._seq[node], self._children[node] = seq, None
            return node
        self._count.append(count)
        self._length.append(length)
        self._start.append(start)
        self._parent.append(parent)
        self._best.append(NONE)
        self._seq.append(seq)
        self._children.append(None)
        return len(self._count) - 1

    def _delete_node(self, node: int) -> None:
        self._seq[node] = self._children[node] = None  # let go of the sequence
        self._free.append(node)

    def _best_child(self, node: int) -> int:
        best = self._best[node]
        if best == NONE and self._children[node]:
            count = self._count
            best = self._best[node] = max(self._children[node].values(), key=count.__getitem__)
        return best

    def _append(self, seq, pos: int, suffixes: _Suffixes) -> None:
        """seq[:pos] is indexed: extend the last max_depth suffixes (and a new one) by seq[pos]."""
        count, length, start, parent_of = self._count, self._length, self._start, self._parent
        best_of, seq_of, children_of = self._best, self._seq, self._children
        token = seq[pos]
        self.num_tokens += 1
        expired = pos - self.max_depth  # the suffix that began there has max_depth tokens: it stops
        leaves = suffixes.leaves
        if expired >= 0:
            leaves.pop(expired, None)
        for leaf in leaves.values():
            length[leaf] += 1  # a suffix alone on its leaf grows the leaf (most suffixes, most of the time)
        shared = suffixes.shared
        if shared and shared[0][0] == expired:
            del shared[0]
        count[ROOT] += 1
        shared.append((pos, ROOT))  # the suffix that begins at pos
        still_shared = []
        for begin, node in shared:
            children = children_of[node]
            child = children.get(token, NONE) if children else NONE
            if child == NONE:
                if count[node] == 1 and node != ROOT:
                    length[node] += 1  # not reached: a suffix alone on its node is in `leaves`
                    leaves[begin] = node
                    continue
                leaf = self._new_node(1, 1, seq, pos, node)
                if children is None:
                    children_of[node] = {token: leaf}
                    best_of[node] = leaf
                else:
                    children[token] = leaf  # count 1 never beats an existing best (Arctic appends at the tail)
                leaves[begin] = leaf
                continue
            if count[node] == count[child] + 1 and node != ROOT:
                # Every other suffix through node goes on into child; this one ended at node.
                if length[child] == 1:
                    # Fuse: child takes node's place, one token longer.
                    parent = parent_of[node]
                    key = seq_of[node][start[node]]
                    count[child] += 1
                    length[child] = length[node] + 1
                    seq_of[child], start[child] = seq, pos + 1 - length[child]
                    parent_of[child] = parent
                    children_of[parent][key] = child
                    if best_of[parent] == node:
                        best_of[parent] = child
                    self._delete_node(node)
                    node = child
                else:
                    # node grows by one token into child, which gives up its first token.
                    length[node] += 1
                    seq_of[node], start[node] = seq, pos + 1 - length[node]
                    length[child] -= 1
                    start[child] += 1
                    del children[token]
                    children[seq_of[child][start[child]]] = child
            elif length[child] == 1:
                count[child] += 1
                seq_of[child], start[child] = seq, pos
                best = best_of[node]
                if best != NONE and best != child and count[child] >= count[best]:
                    best_of[node] = child  # the latest to grow wins a tie, as in Arctic
                node = child
            else:
                # Split child after its first token; this suffix ends at the upper part.
                upper = self._new_node(count[child] + 1, 1, seq, pos, node)
                children[token] = upper
                length[child] -= 1
                start[child] += 1
                parent_of[child] = upper
                children_of[upper] = {seq_of[child][start[child]]: child}
                best_of[upper] = child
                best = best_of[node]
                if best == child or best != NONE and count[upper] >= count[best]:
                    best_of[node] = upper
                node = upper
            still_shared.append((begin, node))
        suffixes.shared = still_shared

    def remove(self, seq) -> None:
        """Un-index a sequence added with `add` (the oldest one, for the memory claim in the module doc)."""
        count, length, start, parent_of = self._count, self._length, self._start, self._parent
        best_of, seq_of, children_of = self._best, self._seq, self._children
        depth = self.max_depth
        n = len(seq)
        for begin in range(n):
            count[ROOT] -= 1
            node, i, stop = ROOT, begin, min(n, begin + depth)
            while i < stop:
                children = children_of[node]
                child = children.get(seq[i], NONE) if children else NONE
                if child == NONE:
                    raise RuntimeError("suffix tree: removing a sequence that was not added")
                if best_of[node] == child:
                    best_of[node] = NONE  # it may no longer be the most frequent
                if count[child] == 1:
                    # A node only this suffix reaches is a leaf (a child's count is below its parent's).
                    del children[seq[i]]
                    if not children:
                        children_of[node] = None
                    self._delete_node(child)
                    break
                count[child] -= 1
                i += length[child]
                node = child
            # Where the suffix ended, node may be left with one child and the same count: merge them.
            children = children_of[node]
            if node != ROOT and children and len(children) == 1:
                (child,) = children.values()
                if count[child] == count[node]:
                    parent = parent_of[node]
                    key = seq_of[node][start[node]]
                    length[child] += length[node]
                    start[child] -= length[node]
                    parent_of[child] = parent
                    children_of[parent][key] = child
                    if best_of[parent] == node:
                        best_of[parent] = child
                    self._delete_node(node)
        self.num_tokens -= n

    def speculate(self, context, max_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1) -> Draft:
        """The best-scoring draft over every tail of the context (up to max_depth - 1 tokens) the tree holds.

        `context` must be of the type of the sequences added (a list, or an array of int32).
        (Arctic tries the tails shorter than the context it is given, the last max_depth tokens; here
        a context shorter than that may match whole. The same for contexts of max_depth - 1 or more.)
        """
        context = context[1 - self.max_depth:]
        if max_tokens <= 0:
            return Draft()
        # A tail that is usable (it matches, and some occurrence goes on) has usable tails, and
        # its longer tails' occurrences are among its own: binary-search the longest usable one.
        end = len(context)
        loci: dict[int, tuple[int, int]] = {}
        shortest_unusable, longest_usable = end + 1, 0
        while shortest_unusable - longest_usable > 1:
            match_len = (longest_usable + shortest_unusable) // 2
            found = self._usable(context, end - match_len)
            if found is None:
                shortest_unusable = match_len
            else:
                loci[match_len] = found
                longest_usable = match_len
        # From the longest down: a shorter match wins only with a strictly higher score, and its
        # score is at most its limit, which only shrinks.
        best, best_score = None, 0.0
        for match_len in range(longest_usable, 0, -1):
            limit = min(max_tokens, int(match_len * max_spec_factor + max_spec_offset + 1e-6))
            if limit <= best_score:
                break
            node, idx = loci.get(match_len) or self._match(context, end - match_len)
            score = self._walk(node, idx, limit, min_token_prob, None)
            if score > best_score:
                best, best_score = (node, idx, limit, match_len), score
        draft = Draft()
        if best is not None:
            node, idx, limit, draft.match_len = best
            draft.score = self._walk(node, idx, limit, min_token_prob, draft)
        return draft

    def _usable(self, context, begin: int) -> tuple[int, int] | None:
        """The locus of context[begin:] if the tree holds it and some occurrence goes on; else None."""
        found = self._match(context, begin)
        if found is None:
            return None
        node, idx = found
        return found if idx < self._length[node] or self._children[node] else None

    def _match(self, context, begin: int) -> tuple[int, int] | None:
        """Walk context[begin:] (not empty) down from the root: (node, tokens of node matched), or None."""
        length, start, seq_of, children_of = self._length, self._start, self._seq, self._children
        node, matched, i, end = ROOT, 0, begin, len(context)
        while i < end:
            children = children_of[node]
            node = children.get(context[i], NONE) if children else NONE
            if node == NONE:
                return None
            # The child's key is its first token: compare the rest of it.
            matched = length[node]
            if matched > end - i:
                matched = end - i
            if matched > 1:
                at = start[node]
                if seq_of[node][at + 1: at + matched] != context[i + 1: i + matched]:
                    return None
            i += matched
        return node, matched

    def _walk(self, node: int, idx: int, limit: int, min_token_prob: float, draft: Draft | None) -> float:
        """Follow the most frequent path from (node, idx) for up to `limit` tokens; return the score and,
        given a draft, fill in its tokens and probabilities."""
        count, length, start, seq_of, best_of = self._count, self._length, self._start, self._seq, self._best
        score, prob, drafted = 0.0, 1.0, 0
        while drafted < limit:
            take = length[node] - idx
            if take > 0:  # the rest of this node: one path, the same probability
                if take > limit - drafted:
                    take = limit - drafted
                if draft is not None:
                    at = start[node] + idx
                    draft.token_ids.extend(seq_of[node][at: at + take])
                    draft.probs.extend([prob] * take)
                score += prob * take
                drafted += take
                if drafted == limit:
                    break
            child = best_of[node]
            if child == NONE:
                child = self._best_child(node)
                if child == NONE:
                    break
            prob *= count[child] / count[node]
            if prob < min_token_prob:
                break
            node, idx = child, 0
        return score

    def check(self, live: list, refs: list | None = None) -> None:
        """For tests: raise AssertionError unless the counts equal a brute-force count over the `live`
        sequences and every node refers to one of `refs` (default: `live`)."""
        count, length, start, seq_of = self._count, self._length, self._start, self._seq
        expected: collections.Counter = collections.Counter()
        for seq in live:
            for begin in range(len(seq)):
                suffix = list(seq[begin: begin + self.max_depth])
                for end in range(1, len(suffix) + 1):
                    expected[tuple(suffix[:end])] += 1
        ref_ids = {id(seq) for seq in (live if refs is None else refs)}
        found: dict[tuple, int] = {}
        reached = 0
        stack = [(ROOT, ())]
        while stack:
            node, path = stack.pop()
            children = self._children[node] or {}
            for child in children.values():
                reached += 1
                label = tuple(seq_of[child][start[child]: start[child] + length[child]])
                if self._parent[child] != node or count[child] >= count[node] and node != ROOT:
                    raise AssertionError(f"node {path + label}: bad parent or count {count[child]} >= {count[node]}")
                if id(seq_of[child]) not in ref_ids:
                    raise AssertionError(f"node {path + label} refers to a sequence that was removed")
                full = path + label
                for end in range(len(path) + 1, len(full) + 1):
                    found[full[:end]] = count[child]
                stack.append((child, full))
            best = self._best[node]
            if best != NONE and count[best] != max(count[c] for c in children.values()):
                raise AssertionError(f"node {path}: best child is not the most frequent")
        if reached != self.num_nodes:
            raise AssertionError(f"{self.num_nodes} nodes allocated, {reached} reachable")
        if found != dict(expected):
            raise AssertionError(f"counts differ from brute force: {set(found.items()) ^ set(expected.items())}")


class _Suffixes:
    """The suffixes of the sequence being indexed that are still under max_depth tokens, by where each begins."""

    __slots__ = ("shared", "leaves")

    def __init__(self):
        # Suffixes that end at a node other suffixes also reach (or at the root), oldest first.
        self.shared: list[tuple[int, int]] = []
        # Suffixes alone on their leaf. Such a suffix stays alone: only a shorter suffix of the same
        # sequence could follow its path, and it would end above the leaf (at a smaller depth).
        self.leaves: dict[int, int] = {}


class Track:
    """A growing sequence indexed in its tree as it is verified (the per-request tree)."""

    def __init__(self, tree: SuffixTree, seq: list[int]):
        self.tree, self.seq = tree, seq
        self.length = 0  # seq[:length] is indexed
        self._suffixes = _Suffixes()

    def index_to(self, stop: int) -> None:
        for position in range(self.length, stop):
            self.tree._append(self.seq, position, self._suffixes)
        self.length = max(self.length, stop)


@dataclasses.dataclass
class Insertion:
    """What adding one output to the cache cost."""

    cached: int = 0  # tokens cached (fewer than given when the output was over the token budget)
    truncated: bool = False  # the output did not fit the budget whole
    evicted_for_requests: int = 0  # the scope's own older outputs evicted to respect max_requests
    evicted_for_tokens: int = 0  # the scope's own older outputs evicted to respect max_tokens
    evicted_for_scopes: int = 0  # outputs of the scope idle longest, evicted whole to respect max_scopes


DEFAULT_MAX_SCOPES = 8  # --suffix-max-tenants


class _Scope:
    """One scope's outputs (oldest first), their tree and their token count."""

    __slots__ = ("tree", "entries", "tokens")

    def __init__(self, max_depth: int):
        self.tree = SuffixTree(max_depth)
        self.entries: collections.deque[array.array] = collections.deque()
        self.tokens = 0


class SuffixCache:
    """Finished outputs, one tree per scope key (a tenant), each under its own request and token budgets.

    A scope evicts only its own oldest outputs, so no scope's traffic evicts another's entries or changes
    its drafts. At most `max_scopes` scopes are kept: a new one beyond that evicts, whole, the scope used
    (drafted from or added to) least recently. So memory is bounded by max_scopes * max_tokens tokens.
    Thread-safe (one lock); a caller on one event loop pays an uncontended lock per call.
    """

    def __init__(self, max_depth: int, max_requests: int, max_tokens: int, max_scopes: int = DEFAULT_MAX_SCOPES):
        if max_requests < 0 or max_tokens < 0:
            raise ValueError(f"cache budgets must be >= 0 (0 turns the cache off), got {max_requests} requests, "
                             f"{max_tokens} tokens")
        if max_scopes < 1:
            raise ValueError(f"the cache keeps at least 1 scope, got {max_scopes}")
        self.max_depth, self.max_requests, self.max_tokens = max_depth, max_requests, max_tokens
        self.max_scopes = max_scopes
        self._scopes: collections.OrderedDict[str, _Scope] = collections.OrderedDict()  # least recently used first
        self.cached_tokens = 0  # over all scopes
        self.cached_requests = 0
        self._lock = threading.Lock()

    @property
    def scopes(self) -> list[str]:
        """The scopes kept, least recently used first."""
        return list(self._scopes)

    def tree(self, scope: str) -> SuffixTree | None:
        kept = self._scopes.get(scope)
        return kept.tree if kept else None

    def outputs(self, scope: str) -> list[list[int]]:
        """The outputs cached under `scope`, oldest first (as cached: cut to the budget)."""
        kept = self._scopes.get(scope)
        return [list(seq) for seq in kept.entries] if kept else []

    def check(self) -> None:
        """For tests: each scope's tree counts exactly its own outputs and refers to nothing else; totals add up."""
        for kept in self._scopes.values():
            kept.tree.check(list(kept.entries))
            if kept.tokens != sum(map(len, kept.entries)) or kept.tokens > self.max_tokens:
                raise AssertionError(f"a scope counts {kept.tokens} tokens over {len(kept.entries)} outputs")
        if self.cached_tokens != sum(kept.tokens for kept in self._scopes.values()) or \
                self.cached_requests != sum(len(kept.entries) for kept in self._scopes.values()):
            raise AssertionError("the cache's totals differ from its scopes'")

    def insert(self, scope: str, tokens: Sequence[int]) -> Insertion:
        """Cache one finished output under `scope`, evicting that scope's oldest outputs to stay in its budget
        (and, for a new scope beyond max_scopes, the scope used least recently)."""
        result = Insertion()
        if not tokens or self.max_requests == 0 or self.max_tokens == 0:
            return result
        result.truncated = len(tokens) > self.max_tokens
        seq = array.array("i", tokens[: self.max_tokens])  # 4 bytes a token, and no int objects
        with self._lock:
            kept = self._scopes.get(scope)
            if kept is None:
                while len(self._scopes) >= self.max_scopes:
                    result.evicted_for_scopes += self._evict_least_recent_scope()
                kept = self._scopes[scope] = _Scope(self.max_depth)
            self._scopes.move_to_end(scope)
            while kept.entries and len(kept.entries) + 1 > self.max_requests:
                self._evict_oldest(kept)
                result.evicted_for_requests += 1
            while kept.entries and kept.tokens + len(seq) > self.max_tokens:
                self._evict_oldest(kept)
                result.evicted_for_tokens += 1
            kept.tree.add(seq)
            kept.entries.append(seq)
            kept.tokens += len(seq)
            self.cached_tokens += len(seq)
            self.cached_requests += 1
        result.cached = len(seq)
        return result

    def _evict_oldest(self, kept: _Scope) -> None:
        seq = kept.entries.popleft()
        kept.tree.remove(seq)
        kept.tokens -= len(seq)
        self.cached_tokens -= len(seq)
        self.cached_requests -= 1

    def _evict_least_recent_scope(self) -> int:
        """Drop the scope used least recently, tree and all (no per-output removal); returns its output count."""
        _, kept = self._scopes.popitem(last=False)
        self.cached_tokens -= kept.tokens
        self.cached_requests -= len(kept.entries)
        return len(kept.entries)

    def speculate(self, scope: str, context: Sequence[int], max_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1) -> Draft:
        with self._lock:
            kept = self._scopes.get(scope)
            if kept is None:
                return Draft()
            self._scopes.move_to_end(scope)  # in use: the last to be evicted for a new scope
            return kept.tree.speculate(array.array("i", context[1 - self.max_depth:]), max_tokens, max_spec_factor,
                                       max_spec_offset, min_token_prob)
