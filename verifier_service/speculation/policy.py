"""How many tokens to draft this round (k), per request: the speedup model, fed with measurements.

A request that sets k gets exactly that k. A request that leaves it unset gets the k that
maximises expected tokens per second,

    k* = argmax_k  E(k, alpha) / T(k),   E(k, alpha) = (1 - alpha^(k+1)) / (1 - alpha),

where E is the expected number of tokens a round emits when each draft token is accepted with
probability alpha (Leviathan et al. 2023), and T(k) is the measured wall time of a round that
verifies k draft tokens (forward pass, draft wait, transport), k = 0 being a plain step:
- T(k) is learnt server-wide by `RoundCost` (round times are a property of the machine and the
  model, not of the request): the plain step's average for k = 0, and for k >= 1 the average
  round time of each block size seen, linear between them and past them along a line fitted to
  those averages. A CPU's verify-cost curve has steps that a line would smooth into the wrong k,
  so the policy reads the measured times at each block size, and predicts the size just past the
  timed ones at the largest timed size's cost until it is timed (`RoundCost.optimistic`), so that
  it tries that size once instead of trusting the line. What every drafted round pays once (the
  draft's wait, the round trip to a remote draft) counts in full;
- alpha is this request's acceptance, with the server-wide acceptance of requests with the same
  kind of sampling (greedy or not: sampled text is accepted far less often) as a prior worth a
  few draft tokens, so that a request of a low-acceptance workload does not pay to find out.
  Acceptance is counted as the model defines it: a block stops being judged at its first
  rejected token, so a block of 8 with 2 accepted is 2 accepted of 3 judged, not of 8 (counting
  all 8 makes long blocks look worse than they are and switches speculation off);
- a draft that sizes its own blocks (suffix decoding drafts only as far as its evidence goes, and
  returns fewer tokens, or none, where a match is weak) is asked for the longest block whenever
  drafting pays: the draft knows better than the policy where its proposal turns uncertain. An
  empty block is a plain step, not rejected tokens;
- such a draft may chain past its match (`--suffix-chain`: it matches again on the context plus
  its draft) and say so (`DraftBlock.num_chained`, the block's last tokens). Chained tokens are
  judged apart, with a server-wide acceptance of their own counted only where the tokens before
  them were all accepted, and verified only as far as they pay;
- a constrained request's draft may end its block with tokens its grammar forced (`DraftBlock.num_forced`,
  after any chained ones: the text the grammar leaves no choice over, as the tokenizer spells it). The
  target accepts them almost always: they are judged apart, as chained ones are, with a server-wide
  acceptance of their own whose prior is 1 (FORCED_PRIOR), and never count in the acceptance that prices k,
  which would otherwise be inflated by tokens no free draft could miss;
- such a draft's block is verified only as far as it pays (`cut_block`: the n, from none to all,
  with the most expected tokens per second on the measured round times, the draft's wait being
  paid already). Its matched tokens are judged by the server-wide acceptance of blocks whose
  match was as long (`RoundCost.by_length`), with the request's as the prior: a short match is
  accepted far less often than a long one, and where verifying a token costs more than a plain
  step, a short block pays only at an acceptance it seldom reaches. A block too weak to pay is a
  plain step ("weak_draft"); a length whose blocks are cut learns nothing new, so its evidence
  fades with each cut, back to the request's;
- k* = 0 turns speculation off ("not_paying"), but only if it is still 0 with the acceptance half a
  standard error higher (EXPLORE_Z): an estimate from a few judged tokens just under break-even
  drafts on and learns, where turning off would stop the evidence. The request then drafts again
  only after a cool-down (8 plain rounds, doubling up to 256 each time the retry also loses), with
  the block whose round is cheapest (`probe_k`), so a request that reaches a copy-heavy stretch
  later can still win. A retry pays only if its round beat plain steps in time, not merely if
  tokens of its block were accepted: a draft as slow as the target has every block accepted and
  still loses. A retry whose ask comes back empty (an n-gram with no match) is over, and the
  request's evidence decides as after any retry that did not pay: asking again every round until a
  block came would pay a round trip to the draft each time. Where the measured round times say that
  even blocks accepted whole would lose (a slow or far draft), the cool-down is the longest at
  once: every retry would cost a draft round for nothing;
- where one forward pass verifies many sequences' blocks (the vLLM engine's batched step), a row's
  block delays every row of the step, so the choice maximises the step's tokens per second, not the
  row's: k* = argmax_k (E(k, alpha) + S) / T_step(k), where S is what the other rows emit per step
  and T_step(k) the step's time with this row's k more tokens, from `StepCost`'s measured line of
  step time against the tokens a step computes. Alone in the step (S = 0) this is the rule above.
  Where the block would pay for the row but not for the step, the row decodes plainly ("load")
  and asks again next step, without a cool-down: it is the load, not the text, that says no;
- speculation turns off while more sequences are live than `max_concurrency` (a fixed cap, for
  operators who want one), and back on when load drops;
- a far draft (its answer takes over FAR_DRAFT_WAIT of a plain step: another host, a slow model) is not
  always waited for (`step_while_drafting`): a round may ask for its block and decode a plain step
  meanwhile, and the next round verifies the block after the step's token if the draft guessed it; a retry
  whose first token the step showed wrong is over (`observe_first_token`). The round trip then overlaps a
  step that emits a token anyway, instead of being paid for a block that may bring nothing. Stepping is
  priced at what a block of that size, asked during a step, was measured to take from its ask to its answer
  (`RoundCost.ready_time`): where the two share cores, each slows the other, and the round waits instead.
  Such a step is not a plain step's price (neither its round time nor its forward is learnt as one).
Every choice is lossless: k only changes how fast tokens arrive. `python -m bench policy-sim`
replays the policy over the target's known greedy outputs of the shipped workloads, against
every fixed k, in seconds; the replays behind each rule are in docs/design.md ("The evidence
behind the rules").
"""

from __future__ import annotations

import dataclasses
import typing

from specdec.decoding.speedup import expected_tokens

EWMA = 0.2  # weight of the newest sample in the running averages
PRIOR_DRAFT_TOKENS = 4.0  # weight of a prior acceptance in an estimate, in judged draft tokens
PRIOR_ALPHA = 0.5  # acceptance assumed before any draft has been verified
SERVER_DECAY = 0.99  # the server-wide acceptance counts fade by this per drafted round
PRIOR_SLOPE = 0.1  # T(k) = T(0) (1 + 0.1 k) until rounds at two block sizes have been measured
MEASURED_AFTER = 2  # rounds of a block size before its own average stands for T(k)
COOLDOWN_ROUNDS = 8  # plain rounds before speculation is retried (doubles on each failed retry)
MAX_COOLDOWN_ROUNDS = 256
STEP_DECAY = 0.98  # StepCost's sums fade by this per observed engine step
HOPELESS_AFTER_ROUNDS = 4  # drafted rounds measured server-wide before blocks may be judged unable to pay
PROBE_K = 1  # the block a retry drafts before round times are known (then the cheapest: probe_k)
DECAY = 0.9  # a request's acceptance counts fade by this per drafted round, so it follows the text
EXPLORE_Z = 0.5  # standard errors added to the acceptance before speculation is turned off
# A block's matched tokens are judged by the server-wide acceptance of blocks whose match was as long, up to this
LENGTH_BUCKETS = 8
FAR_DRAFT_WAIT = 0.05  # a draft whose answer takes less than this share of a plain step is near: always wait for it
FORCED_PRIOR = 1.0  # acceptance assumed of a token the grammar forced: the target has no other choice of text
PLAIN_PRIOR_TOKENS = 8.0  # weight of the server-wide plain share of a hybrid's free rounds in a request's, in tokens
# matched tokens of the hybrid's suffix blocks judged server-wide before --hybrid-threshold priced overrules the draft
PRICED_AFTER_JUDGED = 16.0
CALIBRATION_PRIOR_TOKENS = 2.0  # weight of the prior in a sized blocks' calibration, in expected accepted tokens


def with_draft_pace(cost: RoundCost, times: list[float] | None, pace: typing.Any) -> list[float] | None:
    """`times` (from cost.times(max_k)) where a block size not yet timed costs at least a plain step plus the draft's
    predicted answer time for it (pace: `verifier_service.draft.pace.DraftPace`). Without it, an untimed size is priced on the prior
    slope, as if drafting were free: a slow model draft would then be asked for blocks that take several steps to
    arrive. Timed sizes keep their measured cost, which holds the draft's wait as it was paid (or hidden by drafting
    ahead)."""
    if times is None or pace is None:
        return times
    adjusted = list(times)
    for k in range(1, len(times)):
        timed = cost.seconds.get(k)
        predicted = pace.predicted(k)
        if predicted is not None and (timed is None or timed.samples < MEASURED_AFTER):
            adjusted[k] = max(times[k], times[0] + predicted)
    return adjusted


def waiting_and_stepping(alpha: float, k: int, plain_s: float, round_s: float, wait_s: float,
                         ready_s: float | None = None) -> tuple[float, float]:
    """Expected tokens per second of a block of k accepted at alpha a token, two ways: waiting for the draft's answer
    (a round of round_s, its wait_s included), and a plain step of plain_s meanwhile followed by the block's round,
    reached with probability alpha (a draft slower than the step is waited for, for the rest of its time). ready_s:
    the time from such a block's ask to its answer, the step decoded meanwhile, as measured (`RoundCost.ready_time`);
    None: the longer of the step and the draft's wait alone, as where the draft has cores of its own (where the two
    share cores, each slows the other)."""
    tokens = expected_tokens(alpha, k)
    waiting = tokens / round_s
    ready_s = max(plain_s, wait_s) if ready_s is None else max(plain_s, ready_s)
    stepping = (1 + alpha * tokens) / (ready_s + alpha * max(round_s - wait_s, plain_s))
    return waiting, stepping


def fitted_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) with t = a + b k fitted by least squares to (k, t) points (at least one): through a single point, with
    the prior slope (PRIOR_SLOPE of the intercept); the slope never negative."""
    if len(points) == 1:
        k, t = points[0]
        a = t / (1 + PRIOR_SLOPE * k)
        return a, a * PRIOR_SLOPE
    n = len(points)
    mean_k = sum(k for k, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    var = sum((k - mean_k) ** 2 for k, _ in points)
    b = max(0.0, sum((k - mean_k) * (t - mean_t) for k, t in points) / var)
    return max(mean_t - b * mean_k, 1e-9), b


def increasing(points: list[tuple[int, float, int]]) -> dict[int, float]:
    """{n: value} for (n, value, weight) sorted by n, made non-decreasing in n by pooling adjacent violators: the
    least-squares fit, weighted, among non-decreasing curves (isotonic regression)."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count of points] of each pooled run
    for _, value, weight in points:
        weight = max(weight, 1)
        blocks.append([value * weight, float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, w, count = blocks.pop()
            blocks[-1] = [blocks[-1][0] + total, blocks[-1][1] + w, blocks[-1][2] + count]
    values = [total / w for total, w, count in blocks for _ in range(count)]
    return {n: value for (n, _, _), value in zip(points, values)}


def along(measured: dict[int, float], k: int, slope: float) -> float:
    """The time at block size k from the times measured at some sizes (at least one): linear between the two nearest,
    along `slope` before the smallest and past the largest."""
    below = max((n for n in measured if n <= k), default=None)
    above = min((n for n in measured if n >= k), default=None)
    if below is not None and above is not None:
        return measured[below] if below == above else \
            measured[below] + (measured[above] - measured[below]) * (k - below) / (above - below)
    if below is not None:
        return measured[below] + slope * (k - below)
    return measured[above] - slope * (above - k)


def judged(num_draft_tokens: int, num_accepted: int) -> int:
    """Draft tokens the target judged: the accepted ones and the first rejected one, if any.

    Verification stops at the first rejection; the tokens after it say nothing about alpha.
    """
    return num_accepted + (num_accepted < num_draft_tokens)


@dataclasses.dataclass
class Ewma:
    value: float | None = None
    samples: int = 0

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else (1 - EWMA) * self.value + EWMA * sample
        self.samples += 1


def matched_part(num_draft_tokens: int, num_accepted: int, num_chained: int, num_forced: int = 0) -> tuple[int, int]:
    """A block's tokens before its chained and forced ones (the ones the draft matched: the block is laid out
    [matched][chained][forced]), and how many of them were accepted."""
    matched = num_draft_tokens - num_chained - num_forced
    return matched, min(num_accepted, matched)


@dataclasses.dataclass
class PlainShare:
    """Of the tokens a hybrid draft's rounds emitted before its model was asked, the share that plain steps emitted
    (its free side had no block worth verifying there): the tokens its model would draft
    (`SpeculationPolicy.model_read_pays`). Sums fading by `decay` per round."""

    decay: float = 1.0
    plain: float = 0.0
    tokens: float = 0.0

    def add(self, tokens: int, plain: bool) -> None:
        self.plain = self.decay * self.plain + (tokens if plain else 0)
        self.tokens = self.decay * self.tokens + tokens

    def value(self, prior: float, weight: float) -> float:
        """The share, with `prior` worth `weight` tokens."""
        return (self.plain + prior * weight) / (self.tokens + weight)


@dataclasses.dataclass
class Acceptance:
    """Accepted over judged draft tokens, both fading by `decay` per drafted round, with a prior."""

    decay: float
    prior: float = PRIOR_ALPHA
    accepted: float = 0.0
    judged: float = 0.0

    def add(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.accepted = self.decay * self.accepted + num_accepted
        self.judged = self.decay * self.judged + judged(num_draft_tokens, num_accepted)

    def fade(self) -> None:
        """One decay with nothing added: the evidence ages where nothing is judged."""
        self.accepted *= self.decay
        self.judged *= self.decay

    def value(self, prior: float | None = None) -> float:
        prior = self.prior if prior is None else prior
        return (self.accepted + prior * PRIOR_DRAFT_TOKENS) / (self.judged + PRIOR_DRAFT_TOKENS)

    def upper(self, prior: float | None = None, z: float = EXPLORE_Z) -> float:
        """The value plus z standard errors of a rate over judged + prior tokens."""
        alpha = self.value(prior)
        return min(1.0, alpha + z * (alpha * (1.0 - alpha) / (self.judged + PRIOR_DRAFT_TOKENS)) ** 0.5)


@dataclasses.dataclass
class Calibration:
    """Draft tokens accepted over those expected, both summed over the same rounds and fading by `decay` per round: how
    far an estimate of a block's accepted tokens is borne out, with a prior (1: it is) worth CALIBRATION_PRIOR_TOKENS
    expected tokens."""

    decay: float
    expected: float = 0.0
    realized: float = 0.0

    def add(self, expected: float, realized: int) -> None:
        self.expected = self.decay * self.expected + expected
        self.realized = self.decay * self.realized + realized

    def value(self, prior: float = 1.0) -> float:
        return (self.realized + prior * CALIBRATION_PRIOR_TOKENS) / (self.expected + CALIBRATION_PRIOR_TOKENS)


class RoundCost:
    """Server-wide: the wall time of a round against its block size, and the acceptance rate."""

    def __init__(self):
        self.seconds: dict[int, Ewma] = {}  # by verified draft tokens
        self.acceptance = {True: Acceptance(SERVER_DECAY), False: Acceptance(SERVER_DECAY)}  # by greedy
        # the matched tokens of blocks judged apart (the hybrid's suffix side), by greedy: their prior, not the model's
        self.sized_acceptance = {True: Acceptance(SERVER_DECAY), False: Acceptance(SERVER_DECAY)}
        self.chained = {True: Acceptance(SERVER_DECAY), False: Acceptance(SERVER_DECAY)}  # chained tokens, by greedy
        self.forced = {greedy: Acceptance(SERVER_DECAY, FORCED_PRIOR) for greedy in (True, False)}  # grammar-forced
        self.by_length: dict[bool, dict[int, Acceptance]] = {True: {}, False: {}}  # matched tokens, by drafted match
        # the blocks judged apart, by greedy: their accepted tokens over those their price expected (`cut_block`)
        self.sized_calibration = {True: Calibration(SERVER_DECAY), False: Calibration(SERVER_DECAY)}
        self.plain_since_drafted = 0  # plain rounds server-wide since the last drafted one
        self.wait = Ewma()  # what a round that asked the draft waited for its answer (round trip + drafting)
        self.forward: dict[int, Ewma] = {}  # the target's forward pass alone, by verified draft tokens
        self.plain_share = PlainShare(SERVER_DECAY)  # of a hybrid's tokens before its model was asked, server-wide
        # a block asked during a plain step (decoded while the draft drafted it), from its ask to its answer, by the
        # tokens asked: where the two share cores, longer than either alone
        self.ready: dict[int, Ewma] = {}

    def observe_forward(self, num_draft_tokens: int, forward_s: float) -> None:
        if forward_s > 0:
            self.forward.setdefault(num_draft_tokens, Ewma()).add(forward_s)

    def forward_times(self, max_k: int) -> list[float] | None:
        """The target's forward pass over a round of k draft tokens, k = 0..max_k, with no draft wait in it: what a
        block whose answer is already here costs to verify. The timed sizes' averages made non-decreasing in k, each
        size weighted by its samples (`increasing`), linear between them, along the line fitted to them beyond
        (PRIOR_SLOPE with one size). None before any forward was timed. Clamped to the running maximum instead, one
        slow forward at a size seldom timed since (one that ran beside the draft's prompt read, say) set the price of
        every longer block, and long blocks were verified as if their extra tokens were free."""
        timed = sorted((n, e.value, e.samples) for n, e in self.forward.items() if e.value is not None)
        if not timed:
            return None
        _, slope = fitted_line([(n, value) for n, value, _ in timed])
        measured = increasing(timed)
        times: list[float] = []
        for k in range(max_k + 1):
            t = max(along(measured, k, slope), 1e-9)
            times.append(max(t, times[-1]) if times else t)
        return times

    def observe(self, num_draft_tokens: int, num_accepted: int, round_s: float, greedy: bool = True,
                num_chained: int = 0, drafted_matched: int = 0, num_forced: int = 0, apart: bool = False) -> None:
        """num_chained: the block's tokens chained past the draft's match (`SpeculationPolicy.cut_block`), and
        num_forced: its last tokens, forced by the grammar; each timed with the block but judged apart, and only
        when the tokens before them were all accepted. apart: a block the draft sized by its evidence though it does
        not size all its blocks (the hybrid's suffix side): its time and acceptance are not the blocks' the policy
        sizes (the model side's), so it is judged only among blocks matched as far (`by_length`), by which such
        blocks are cut."""
        self.plain_since_drafted = 0 if num_draft_tokens and not apart else self.plain_since_drafted + 1
        if round_s > 0 and not apart:
            self.seconds.setdefault(num_draft_tokens, Ewma()).add(round_s)
        matched, accepted = matched_part(num_draft_tokens, num_accepted, num_chained, num_forced)
        if matched:
            (self.sized_acceptance if apart else self.acceptance)[greedy].add(matched, accepted)
            if drafted_matched:
                self.by_length[greedy].setdefault(min(drafted_matched, LENGTH_BUCKETS), Acceptance(SERVER_DECAY)).add(
                    matched, accepted)
        if num_chained and num_accepted >= matched:
            self.chained[greedy].add(num_chained, min(num_accepted - matched, num_chained))
        if num_forced and num_accepted >= matched + num_chained:
            self.forced[greedy].add(num_forced, num_accepted - matched - num_chained)

    def observe_wait(self, wait_s: float) -> None:
        self.wait.add(wait_s)

    def observe_ready(self, asked: int, ready_s: float) -> None:
        """A block of `asked` tokens asked during a plain step: the time from its ask to its answer (or to giving up
        on it)."""
        if asked > 0 and ready_s > 0:
            self.ready.setdefault(asked, Ewma()).add(ready_s)

    def ready_time(self, asked: int) -> float | None:
        """The time from the ask to the answer of a block of `asked` tokens asked during a plain step, as measured at
        that size, else linear between the sizes measured and along their fitted line beyond; None before any was
        timed. Priced per size, not as a ratio over the draft's average wait: a step beside a drafting model took
        about as long whatever the wait averaged over the block sizes asked meanwhile, and a ratio over that average,
        itself an average, lagged it as k moved."""
        timed = {n: e.value for n, e in self.ready.items() if e.value is not None}
        if not timed or asked <= 0:
            return None
        _, slope = fitted_line(sorted(timed.items()))
        return max(along(timed, asked, slope), 1e-9)

    def stepping_ready_time(self, k: int) -> float | None:
        """`ready_time` of the block a round of k asks during its plain step: one token longer
        (`DraftSession.prefetch`), so that k remain after the step's token."""
        return self.ready_time(k + 1)

    def line(self, drafted_only: bool = False) -> tuple[float, float] | None:
        """(a, b) with T(k) = a + b k fitted to the measured block sizes (only k >= 1 when drafted_only),
        or None before any round was timed."""
        points = [(k, e.value) for k, e in self.seconds.items() if e.value is not None and (k or not drafted_only)]
        return fitted_line(points) if points else None

    def times(self, max_k: int) -> list[float] | None:
        """The predicted wall time of a round that verifies k draft tokens, for k = 0..max_k; None before any
        round was timed.

        A plain step (k = 0) is its own measurement: a round with a block also waits for the draft and
        pays the round trip to it, a fixed cost that a line through all block sizes would spread over
        k, making blocks look cheaper than they are when the draft is far away. With rounds at two or
        more block sizes measured, drafted rounds follow the measured curve: each size's own average
        once it has MEASURED_AFTER rounds, linear between those, and along the drafted rounds' fitted
        line's slope before the first and past the last; never falling as k grows, except at a size whose own
        average was measured cheaper: a CPU's kernels can run a longer forward faster, and clamping that away
        would hide the best block from the policy."""
        through_all = self.line()
        if through_all is None:
            return None
        plain = self.seconds.get(0)
        t0 = plain.value if plain is not None and plain.value is not None else through_all[0]
        drafted_sizes = sum(1 for n, e in self.seconds.items() if n and e.value is not None)
        a, b = self.line(drafted_only=True) if drafted_sizes >= 2 else through_all
        fitted = [a + b * k for k in range(max_k + 1)]
        measured = {n: e.value for n, e in self.seconds.items()
                    if n and e.value is not None and e.samples >= MEASURED_AFTER} if drafted_sizes >= 2 else {}
        times = [t0]
        for k in range(1, max_k + 1):
            t = along(measured, k, b) if measured else fitted[k]
            times.append(t if k in measured or k == 1 else max(t, times[-1]))
        return times

    def optimistic(self, times: list[float] | None) -> list[float] | None:
        """`times` (from times(max_k)) with the block size just past the timed ones predicted to cost no more than
        the largest timed one, so that the policy tries it and learns its cost (at most one size past where
        blocks stop paying). A CPU's curve has steps that a line through the sizes timed so far puts in the wrong
        place, and nothing else would ever time them."""
        timed = [n for n, e in self.seconds.items() if n and e.samples >= MEASURED_AFTER]
        if times is None or not timed or max(timed) >= len(times) - 1:
            return times
        largest = max(timed)
        return times[:largest + 1] + [min(times[largest + 1], times[largest])] + times[largest + 2:]

    def hopeless(self, times: list[float] | None) -> bool:
        """Whether blocks lose even when accepted whole: (k + 1) tokens per T(k) never beat 1 per T(0), for the
        round times `times` (from times(max_k)). Judged only once enough drafted rounds were timed, and only for
        MAX_COOLDOWN_ROUNDS plain rounds server-wide after the last drafted one: the verdict comes from old
        drafted rounds (a draft's first, cold ones, say) and nothing else would ever re-time them, so a server
        whose requests are shorter than the longest cool-down would never draft again."""
        drafted = sum(e.samples for n, e in self.seconds.items() if n)
        if times is None or drafted < HOPELESS_AFTER_ROUNDS or self.plain_since_drafted >= MAX_COOLDOWN_ROUNDS:
            return False
        return all((k + 1) / times[k] <= 1 / times[0] for k in range(1, len(times)))

    def beat_plain(self, num_accepted: int, round_s: float) -> bool:
        """Whether a drafted round emitted its tokens faster than plain steps would have."""
        plain = self.time(0)
        return plain is None or round_s <= (num_accepted + 1) * plain

    def time(self, k: int) -> float | None:
        """times(k)[k]: the predicted wall time of a round that verifies k draft tokens."""
        times = self.times(k)
        return None if times is None else times[k]


@dataclasses.dataclass
class Batch:
    """The rest of the engine step a row's block would join (the vLLM engine verifies every row in one pass)."""

    other_tokens: float  # tokens the step's other rows emit
    base_s: float  # the step's time without this row's block
    per_token_s: float  # what each draft token of the block adds to it
    wait_s: float  # what waiting for draft blocks adds to it

    def times(self, max_k: int) -> list[float]:
        """The step's wall time with this row verifying k draft tokens, k = 0..max_k."""
        return [self.base_s + (self.per_token_s * k + self.wait_s if k else 0.0) for k in range(max_k + 1)]


class StepCost:
    """Server-wide, for a batched engine: an engine step's time against the tokens it computes, T(n) = a + b n.

    Fitted by least squares over decode-only steps (a prefill's tokens cost differently), their sums
    fading by STEP_DECAY per step. Until the steps have spanned at least two token counts, the line runs
    through the origin (b = T / n, every token as dear as the average one: the compute-bound worst
    case), so an unmeasured batch does not draft on credit. The wait for the draft blocks, paid once by
    a step that verifies any, is its own average.
    """

    def __init__(self):
        self.sums = [0.0] * 5  # weight, n, t, n^2, n t
        self.wait = Ewma()

    def observe(self, num_tokens: int, forward_s: float) -> None:
        """One decode-only step: the tokens it computed (rows + their draft tokens) and its time, draft wait excluded."""
        if num_tokens <= 0 or forward_s <= 0:
            return
        sample = (1.0, num_tokens, forward_s, num_tokens * num_tokens, num_tokens * forward_s)
        self.sums = [STEP_DECAY * total + x for total, x in zip(self.sums, sample)]

    def observe_wait(self, wait_s: float) -> None:
        self.wait.add(wait_s)

    def line(self) -> tuple[float, float] | None:
        """(a, b) with T(n) = a + b n; None before any step was observed."""
        weight, n, t, nn, nt = self.sums
        if weight <= 0:
            return None
        mean_n, mean_t = n / weight, t / weight
        var = nn / weight - mean_n ** 2
        b = max(0.0, (nt / weight - mean_n * mean_t) / var) if var > 0.25 else mean_t / mean_n
        if mean_t - b * mean_n < 0:  # steeper than through the origin: noise; no token is dearer than the average
            b = mean_t / mean_n
        return max(0.0, mean_t - b * mean_n), b  # through the origin, round-off can leave -1e-19

    def batch(self, step_tokens: int, other_tokens: float) -> Batch | None:
        """What a row's block would join: a step computing `step_tokens` without it, whose other rows emit
        `other_tokens`. None while the row is alone (other_tokens = 0) or no step was observed."""
        line = self.line()
        if line is None or other_tokens <= 0:
            return None
        a, b = line
        return Batch(other_tokens, a + b * step_tokens, b, self.wait.value or 0.0)


class SpeculationPolicy:
    def __init__(self, default_k: int, max_k: int, requested_k: int | None = None, max_concurrency: int = 0,
                 cost: RoundCost | None = None, greedy: bool = True, draft_sizes_blocks: bool = False,
                 far_draft: str = "auto", priced_threshold: bool = False):
        self.max_k = max_k
        self.fixed = requested_k is not None
        self.k = min(max_k, default_k if requested_k is None else requested_k)
        self.max_concurrency = max_concurrency
        self.cost = cost if cost is not None else RoundCost()
        self.greedy = greedy
        self.draft_sizes_blocks = draft_sizes_blocks  # ask for max_k whenever drafting pays: the draft cuts it
        self.far_draft = far_draft  # auto: step_while_drafting weighs it; wait / step: always that (--far-draft)
        self.priced_threshold = priced_threshold  # min_sized prices the hybrid's sides (--hybrid-threshold priced)
        self.acceptance = Acceptance(DECAY)  # this request's
        self.sized_acceptance = Acceptance(DECAY)  # this request's, of the blocks judged apart (`sized_alpha`)
        self.chained_acceptance = Acceptance(DECAY)  # this request's, of chained tokens (`chained_alpha`)
        self.sized_calibration = Calibration(DECAY)  # this request's, of the blocks judged apart (`sized_borne_out`)
        self.cooldown = 0  # plain rounds left before speculation is retried
        self.next_cooldown = COOLDOWN_ROUNDS
        self.probing = False
        self.off_reason = ""
        self.cut_times: list[float] | None = None  # round times to cut blocks on (None: verify what the draft matched)
        self.cut_alpha: float | None = None  # the acceptance the round's k was chosen on (None: alpha())
        self.cut_from = 0  # the matched length of the block last cut, as drafted: its round's evidence files under it
        # a block judged apart, as cut: (tokens verified, accepted tokens its price expected), for its calibration
        self.cut_expected: tuple[int, float] | None = None
        self.plain_share = PlainShare()  # of this request's tokens before its hybrid draft's model was asked

    def alpha(self) -> float:
        """This request's acceptance, with the server-wide one as a prior."""
        return self.acceptance.value(prior=self.cost.acceptance[self.greedy].value())

    def sized_alpha(self) -> float:
        """This request's acceptance of the blocks a draft that sizes only some of its blocks sized by their evidence
        (the hybrid's suffix side), with the server-wide one of such blocks as a prior. Judged by the model's
        acceptance instead, a weak suffix side had its blocks verified as far as the model's would be, much further
        than the suffix draft alone has its own verified."""
        return self.sized_acceptance.value(prior=self.cost.sized_acceptance[self.greedy].value())

    def chained_alpha(self) -> float:
        """This request's acceptance of chained tokens (those a draft chained past its match), with the server-wide
        one as a prior. Server-wide alone, code's chained tokens, seldom right, priced extraction's, mostly right
        where the output copies its input, and the hybrid's suffix side lost rounds there that it would have won."""
        return self.chained_acceptance.value(prior=self.cost.chained[self.greedy].value())

    def sized_borne_out(self) -> float:
        """The share of the accepted tokens a price expected of the blocks judged apart (the hybrid's suffix side) that
        this request's such blocks brought, with the server's share as a prior. Their price reads the acceptance by
        matched length server-wide, with this request's as a mere prior and half a standard error up (so that
        `cut_block` explores), and chained tokens with the server's as a prior: it errs high on text whose short
        matches are seldom right, and the request's own blocks show by how much."""
        return self.sized_calibration.value(prior=self.cost.sized_calibration[self.greedy].value())

    def alpha_upper(self) -> float:
        """alpha() plus EXPLORE_Z standard errors of this request's evidence."""
        return self.acceptance.upper(prior=self.cost.acceptance[self.greedy].value())

    def best_k(self, times: list[float] | None, other_tokens: float = 0.0, alpha: float | None = None) -> int:
        """The k with the most expected tokens per second for the round times `times` (cost.times(max_k), or a
        Batch's step times with the other rows emitting `other_tokens`); 0 when no block beats a plain step.
        alpha: the acceptance to judge by (default alpha())."""
        if times is None:
            return self.k
        alpha = min(self.alpha() if alpha is None else alpha, 0.999)
        return max(range(self.max_k + 1), key=lambda k: ((expected_tokens(alpha, k) + other_tokens) / times[k], -k))

    def probe_k(self, times: list[float] | None) -> int:
        """The block a retry drafts: the one whose round is cheapest (PROBE_K before any round was timed). That
        is k = 1 on most machines, but not on all: on a CPU where a forward over 2 tokens costs more than one
        over 6, a retry of k = 1 would pay the most for the least evidence."""
        if times is None:
            return PROBE_K
        return min(range(1, self.max_k + 1), key=lambda k: (times[k], k))

    def block_size(self, remaining_tokens: int, remaining_context: int, live_sequences: int = 1,
                   batch: Batch | None = None, pace: typing.Any = None) -> int:
        """k for the next round; 0 decodes without speculation. pace: the draft's measured answer time by block
        size (`verifier_service.draft.pace.DraftPace`), if any."""
        self.off_reason = ""
        self.cut_times, self.cut_alpha = None, None
        self.cut_from, self.cut_expected = 0, None
        k = self.k
        if not self.fixed:
            if self.max_concurrency and live_sequences > self.max_concurrency:
                self.off_reason = "load"
                return 0
            if self.cooldown > 0:
                self.cooldown -= 1
                self.off_reason = "not_paying"
                self.probing = self.cooldown == 0
                return 0
            times = self.cost.times(self.max_k)  # the lines fitted once per round
            optimistic = with_draft_pace(self.cost, self.cost.optimistic(times), pace)
            times = with_draft_pace(self.cost, times, pace)
            k = self.probe_k(times) if self.probing else self.best_k(optimistic)
            alpha = None  # judged by alpha(), unless the evidence is too thin to turn off on
            hopeless = k == 0 and self.cost.hopeless(times)
            if k == 0 and not hopeless:  # off only if still so half a standard error higher
                alpha = self.alpha_upper()
                k = self.best_k(optimistic, alpha=alpha)
            if k > self.k and not self.draft_sizes_blocks and pace is not None and pace.predicted(k) is None:
                # a draft none of whose blocks was timed is asked for the configured k: priced as if drafting were free,
                # a model draft was asked for max_k, took longer than the floor's wait, timed out, and was asked again
                k = self.k
            if k and batch is not None:
                step_k = self.best_k(batch.times(self.max_k), batch.other_tokens, alpha=alpha)
                if step_k == 0:
                    self.off_reason = "load"  # pays for this row, costs the others more: asked again next step
                    return 0
                k = k if self.probing else step_k
            if k and not self.probing:  # blocks the draft sizes are cut on these (all its blocks, or some: hybrid)
                self.cut_times, self.cut_alpha = optimistic, alpha
                if self.draft_sizes_blocks:
                    k = self.max_k
            if k == 0:
                if hopeless:
                    self.next_cooldown = MAX_COOLDOWN_ROUNDS
                self.cooldown = self.next_cooldown
                self.next_cooldown = min(MAX_COOLDOWN_ROUNDS, self.next_cooldown * 2)
                self.off_reason = "not_paying"
        # A round emits k + 1 tokens at most: keep it within max_tokens and the context.
        return max(0, min(k, remaining_tokens - 1, remaining_context - 1))

    def sized_only_k(self, remaining_tokens: int, remaining_context: int, model_unread: bool = False) -> int:
        """In a round block_size left plain because blocks do not pay ("not_paying"), the k of an ask for a block
        only if the draft sizes it by its evidence at no forward's cost (NextBlock.sized_only: the hybrid draft's
        suffix side, where its model's blocks do not pay), cut like any such block on the forward's times
        (`cut_block`); 0: no such ask (a fixed k, under load, no round timed yet). Such a block costs a forward
        over more tokens and no draft time, so it is judged apart from the blocks k sizes (`observe`'s sized).
        model_unread: in a round whose k the policy chose, the draft's model is not to be asked, since reading the
        sequence would cost it more than its blocks would save (`model_read_pays`; off reason "read_not_paying")."""
        if model_unread and not self.fixed:
            self.off_reason = "read_not_paying"
        if self.fixed or self.off_reason not in ("not_paying", "read_not_paying"):
            return 0
        times = self.cost.times(self.max_k)
        if times is None:
            return 0
        self.cut_times, self.cut_alpha = times, None
        return max(0, min(self.max_k, remaining_tokens - 1, remaining_context - 1))

    @staticmethod
    def _model_block_rate(k: int, alpha: float, times: list[float], verify_s: float, draft_s: float | None,
                          ready_s: float | None = None) -> float:
        """Expected tokens per second of a model block of k: its round's measured time times[k] where the draft's
        answer time draft_s is not known; else the better of waiting for it (verify_s + draft_s) and of a plain step
        meanwhile followed by the block's round (`step_while_drafting`). A block drafted ahead or asked during the
        plain step before arrives at once, so its round's measured time holds little or none of the draft's: priced
        on that alone, a dear model side looked cheaper than a free suffix block. ready_s: the measured time from the
        ask to the answer of such a block asked during a plain step (`RoundCost.ready_time`; None: not timed)."""
        if draft_s is None:
            return expected_tokens(alpha, k) / times[k]
        return max(waiting_and_stepping(alpha, k, times[0], verify_s + draft_s, draft_s, ready_s))

    def draft_wait_cap(self, k: int) -> float | None:
        """The longest wait for a block of k that could still pay: k plain steps (a round that waits W and verifies
        emits at most k + 1 tokens in W plus at least one step). None before a plain step was timed."""
        plain = self.cost.time(0)
        return None if plain is None or k <= 0 else k * plain

    def step_while_drafting(self, k: int) -> bool:
        """Whether the round should decode a plain step while the draft drafts (`DraftSession.prefetch`) instead of
        waiting for the block: the next round then verifies the block after the step's token, if the draft's first
        token was that one (probability alpha). Per the speedup model, a wait-and-verify round emits E(k) tokens in
        T(k) (the measured round, the draft's wait W included), and a step followed by that round emits
        1 + alpha E(k) tokens in max(T(0), W) + alpha (T(k) - W) (a draft slower than the step is waited for, for
        the rest of its time, before its first token is judged). Only for a far draft (W over FAR_DRAFT_WAIT of a
        plain step) and an adaptive k: near or fixed, the round waits as before. --far-draft wait / step: always
        that."""
        if self.far_draft != "auto":
            return self.far_draft == "step" and k > 0
        wait = self.cost.wait.value
        if self.fixed or k <= 0 or wait is None:
            return False
        times = self.cost.times(self.max_k)
        if times is None or wait < FAR_DRAFT_WAIT * times[0]:
            return False
        k = min(k, self.max_k)
        alpha = min(self.alpha(), 0.999)
        waiting, stepping = waiting_and_stepping(alpha, k, times[0], times[k], wait, self.cost.stepping_ready_time(k))
        return stepping > waiting

    def observe_first_token(self, accepted: bool) -> None:
        """A prefetched block's first token against the plain step's. A retry whose first token was wrong is over, as
        one that came back empty. It is not counted in the acceptance: the step is a filter that costs nothing, and
        the blocks it passes are the ones verified. Its misses fall where stepping was chosen, where acceptance is
        low: counted, they would drag the server-wide prior down and turn speculation off for the next requests."""
        if not accepted:
            self.probing = False

    def cut_block(self, num_tokens: int, num_chained: int, num_forced: int = 0, sized: bool = False) -> int:
        """How many of a block's num_tokens to verify, its last num_chained chained past the draft's match: the n
        from none up to all that emits the most expected tokens per second, where the matched tokens are accepted
        with alpha each and a chained one, reached only past them all, with the server-wide acceptance of chained
        tokens (`RoundCost.observe`). None (a plain step) where no prefix beats one: the draft's wait is paid, but a
        block too short for its acceptance costs more to verify than it emits. Only in a round whose k the policy
        chose (not at a fixed k, not in a retry): else the matched ones. The last num_forced, forced by the grammar,
        are judged by the server-wide acceptance of forced tokens; kept at a fixed k unless chained ones come
        before them. sized: the draft sized this block by its evidence though it does not size all its blocks (the
        hybrid draft's suffix side): cut as a sizing draft's."""
        matched = num_tokens - num_chained - num_forced
        times = self.cut_times if self.draft_sizes_blocks or sized else None
        # only a block the draft sized files its evidence by its match (a model block's length is the k asked)
        self.cut_from = matched if self.draft_sizes_blocks or sized else 0
        if times is None or not num_tokens:
            return matched if num_chained else num_tokens
        sunk = self.cost.wait.value or 0.0  # the draft's answer is here: its wait is no longer a cost of verifying
        alpha = min(self.alpha() if self.cut_alpha is None else self.cut_alpha, 0.999)
        apart = sized and not self.draft_sizes_blocks
        if apart:
            # a draft that sizes only some blocks (hybrid): the round times hold the other side's waits (a model's), not
            # this block's, which came at once; what verifying it costs is the forward alone. Its acceptance is that
            # of such blocks, not the model's, as borne out
            times, sunk = self.cost.forward_times(len(times) - 1) or times, 0.0
            alpha = min(self.sized_alpha(), 0.999)
        best, _, expected = self._best_prefix(num_tokens, num_chained, num_forced,
                                              times[:1] + [t - sunk for t in times[1:]], alpha,
                                              self.sized_borne_out() if apart else 1.0)
        if apart and best:
            self.cut_expected = (best, expected)
        alike = self.cost.by_length[self.greedy].get(min(matched, LENGTH_BUCKETS))
        if alike is not None and best < matched:
            alike.fade()
        return best

    def _best_prefix(self, num_tokens: int, num_chained: int, num_forced: int, times: list[float],
                     alpha: float, scale: float = 1.0) -> tuple[int, float, float]:
        """(n, its expected tokens per second, its expected accepted tokens unscaled): the prefix of a block, from none
        to all of its num_tokens, that emits the most tokens per second when a round verifying n costs times[n]. Its
        matched tokens are accepted with the acceptance of blocks matched as far (`RoundCost.by_length`, alpha as its
        prior), each chained one with this request's acceptance of chained tokens (`chained_alpha`), each forced one
        with the server's of forced tokens; scale: the share of the accepted tokens so expected that is counted (the
        sized blocks' calibration, `sized_borne_out`)."""
        matched = num_tokens - num_chained - num_forced
        alike = self.cost.by_length[self.greedy].get(min(matched, LENGTH_BUCKETS))  # blocks matched as far
        if alike is not None:
            alpha = min(alike.upper(prior=alpha), 0.999)
        alpha_chained = min(self.chained_alpha(), 0.999)
        alpha_forced = min(self.cost.forced[self.greedy].value(), 0.999)
        longest = min(num_tokens, len(times) - 1)
        accepted, reach = 0.0, 1.0  # expected accepted tokens of a round verifying n; the chance all n were accepted
        best, best_rate, best_accepted = 0, 1.0 / times[0], 0.0
        for n in range(1, longest + 1):
            reach *= alpha if n <= matched else alpha_chained if n <= matched + num_chained else alpha_forced
            accepted += reach
            rate = (1.0 + scale * accepted) / max(times[n], 1e-9)
            if rate > best_rate:
                best, best_rate, best_accepted = n, rate, accepted
        return best, best_rate, best_accepted

    def min_sized(self, k: int, sized_only: bool = False, pace: typing.Any = None) -> int:
        """With priced_threshold (--hybrid-threshold priced), for a draft that sizes some of its blocks by their
        evidence at no forward's cost (the hybrid's suffix side; its other blocks, the model's, cost a forward per
        token): the shortest match at which such a block answers this round of k (NextBlock.min_sized). In a
        sized-only round (`sized_only_k`: the model's blocks do not pay) any match, 1: `cut_block` verifies the block
        only as far as it pays. Else the shortest match at which such a block is worth more than the model's block
        of k: its worth is its expected tokens per second verified as far as it pays (`_best_prefix`, on the
        forward's times plus a plain round's overhead beyond its forward, with the acceptance of blocks matched as
        far, its accepted tokens scaled by the share of those expected that such blocks brought, `sized_borne_out`);
        the model block's is its tokens over its whole cost, the draft's time included (`_model_block_rate`);
        max_k + 1 where no match pays more. A match counts with the chained tokens that follow it up to max_k, once
        chained tokens have been judged (`RoundCost.chained`). In a retry of the model's blocks (after a cool-down),
        with either rule, max_k + 1: the model answers it. 0 (the draft's own rule) without priced_threshold,
        where the policy did not choose k (a fixed k), before a forward was timed, or before the server has
        judged PRICED_AFTER_JUDGED matched tokens of such blocks: priced on the prior and a warm-up's one rejected
        token, with no chained token judged, no match beat the model, so none was verified and the price was never
        learnt. pace: the draft's measured answer time by block size (`verifier_service.draft.pace.DraftPace`)."""
        if k > 0 and self.probing and not sized_only:
            # a retry is there to re-time the model's blocks: answered by the suffix side, it taught nothing, and a
            # model turned off on a few dear rounds stayed off for the rest of the request (chat: every retry's k of 1
            # went to a 1-token match, rejected, and the cool-downs doubled)
            return self.max_k + 1
        if not self.priced_threshold or k <= 0:
            return 0
        if sized_only:
            return 1
        if self.cost.sized_acceptance[self.greedy].judged < PRICED_AFTER_JUDGED:
            return 0
        times = self.cut_times
        forward = self.cost.forward_times(self.max_k)
        if times is None or forward is None or not 0 < k < len(times):
            return 0
        alpha = min(self.alpha() if self.cut_alpha is None else self.cut_alpha, 0.999)
        overhead = max(times[0] - forward[0], 0.0)  # a round's sampling, bookkeeping and transport
        model_rate = self._model_block_rate(k, alpha, times, forward[k] + overhead,
                                            pace.predicted(k) if pace is not None else None,
                                            self.cost.stepping_ready_time(k))
        sized_times = [t + overhead for t in forward]
        # such a block goes on past its match with chained tokens (the suffix side drafts up to the longest block it
        # may), worth what chained tokens have been accepted at; priced on its match alone, a 1-token match looked
        # worse than a model block where it brought more tokens per second
        chains = self.cost.chained[self.greedy].judged > 0
        sized_alpha = min(self.sized_alpha(), 0.999)
        scale = self.sized_borne_out()
        for length in range(1, self.max_k + 1):
            chained = self.max_k - length if chains else 0
            if self._best_prefix(length + chained, chained, 0, sized_times, sized_alpha, scale)[1] >= model_rate:
                return length
        return self.max_k + 1

    def observe_free_round(self, tokens: int, plain: bool) -> None:
        """A round of a hybrid draft whose model has not drafted yet: the tokens it emitted, and whether it was a
        plain step (the free side had no block worth verifying). What `model_read_pays` weighs."""
        self.plain_share.add(tokens, plain)
        self.cost.plain_share.add(tokens, plain)

    def model_read_pays(self, k: int, remaining_tokens: int, read_s: float | None) -> bool:
        """For a hybrid draft whose model has not drafted yet in this request (its free side, suffix decoding, has
        answered so far): whether asking it pays for the read it costs once, of the sequence so far (`read_s`, the
        draft's measured read time for it: `DraftPace.read_s`; None: not known, so asked, and learnt). Its blocks
        would answer where the free side has none: the tokens plain steps emitted, a share of those the free rounds
        emitted so far (this request's, with the server's as a prior worth PLAIN_PRIOR_TOKENS tokens; without any,
        all of them). Each such token costs a plain round's time, and with the model a block's round over its
        expected tokens, as the policy priced the block of k it chose (its round times and acceptance: where it
        explores, the model is asked as it would be without the read to pay); the model is asked where that saving,
        over that share of the remaining tokens, exceeds the read. On extraction a 0.5B drafter's read of a long
        prompt took longer than its few blocks saved in a short answer, where suffix decoding answered most rounds.
        True where the policy did not choose k (a fixed k, a retry) or nothing is timed."""
        if read_s is None or self.fixed or k <= 0 or self.cut_times is None or k >= len(self.cut_times):
            return True
        times = self.cut_times
        alpha = min(self.alpha() if self.cut_alpha is None else self.cut_alpha, 0.999)
        server = self.cost.plain_share
        share = self.plain_share.value(server.value(1.0, 0.0) if server.tokens > 0 else 1.0, PLAIN_PRIOR_TOKENS)
        return remaining_tokens * share * (times[0] - times[k] / expected_tokens(alpha, k)) > read_s

    def observe(self, num_draft_tokens: int, num_accepted: int, round_s: float, asked_k: int = 0,
                num_chained: int = 0, num_forced: int = 0, sized: bool = False) -> None:
        """Learn from a verified round: its draft size, accepted count and wall time. asked_k: the block the draft
        was asked for (0: none); a retry that came back empty is over, and has not paid. num_chained: the block's
        tokens the draft chained past its match, num_forced: its last ones the grammar forced (both judged apart:
        `RoundCost.observe`). sized: the draft sized this block by its evidence (`cut_block`'s sized): from a draft
        that does not size all its blocks (the hybrid), it is priced apart from the blocks k sizes."""
        drafted_matched, self.cut_from = self.cut_from, 0
        cut_expected, self.cut_expected = self.cut_expected, None
        apart = sized and not self.draft_sizes_blocks
        if apart and cut_expected is not None and cut_expected[0] == num_draft_tokens:  # verified as cut
            self.sized_calibration.add(cut_expected[1], num_accepted)
            self.cost.sized_calibration[self.greedy].add(cut_expected[1], num_accepted)
        self.cost.observe(num_draft_tokens, num_accepted, round_s, self.greedy, num_chained, drafted_matched,
                          num_forced, apart)
        if not num_draft_tokens:
            if asked_k:
                self.probing = False
            return
        matched, accepted = matched_part(num_draft_tokens, num_accepted, num_chained, num_forced)
        if num_chained and num_accepted >= matched:  # judged only where the match before them was accepted whole
            self.chained_acceptance.add(num_chained, min(num_accepted - matched, num_chained))
        if apart:  # not evidence on the blocks k sizes: neither this request's acceptance nor a retry's outcome
            if matched:
                self.sized_acceptance.add(matched, accepted)
            # a retry the other side answered is over, unjudged: the next round weighs the model's blocks again.
            # Kept on, every round was that retry, each suffix block cut to the retry's k
            self.probing = False
            return
        if matched:
            self.acceptance.add(matched, accepted)
        if self.probing:
            self.probing = False
            if num_accepted and self.cost.beat_plain(num_accepted, round_s):
                self.next_cooldown = COOLDOWN_ROUNDS  # the retry paid: back to short cool-downs
