"""The hybrid draft: the suffix side answers where it matches (as far as the threshold asks), the model elsewhere;
both sides stay in step."""

import pytest
import torch
from prometheus_client import REGISTRY

from draft_service.hybrid import HybridConfig, HybridProposer
from draft_service.model_draft import ModelProposer
from draft_service.suffix import SuffixProposer
from specdec.decoding.sampling import SamplingParams
from specdec.modeling.models import load_causal_lm

# A span the request's own suffix tree finds again: the prompt ends with its first 12 tokens, so the suffix side
# drafts the rest of the span (a 12-token match). UNSEEN never occurs in it: after it, nothing matches.
SPAN = [20 + 7 * i % 250 for i in range(30)]
REPEATED = SPAN + SPAN[:12]
UNIQUE = list(range(100, 140))
UNSEEN = 300


@pytest.fixture(scope="module")
def model(tiny_pair):
    return load_causal_lm(str(tiny_pair[1]))


def start(model, prompt, min_suffix=4, sampling=SamplingParams(), return_probs=False):
    return HybridProposer(SuffixProposer(), ModelProposer(model), min_suffix).start(prompt, sampling, return_probs)


def counting_feeds(seq, monkeypatch) -> list[int]:
    """The lengths the model side feeds, one entry per forward."""
    fed, original = [], seq.model._feed
    monkeypatch.setattr(seq.model, "_feed", lambda ids: fed.append(len(ids)) or original(ids))
    return fed


def blocks(source: str) -> float:
    return REGISTRY.get_sample_value("specdec_draft_hybrid_blocks_total", {"source": source}) or 0.0


def in_step(seq) -> bool:
    return seq.tokens == seq.suffix.tokens == seq.model.tokens


def served_info(model, max_context: int = 0):
    """The in-process draft's ModelInfo (tests.draft_service.inprocess.INFO) with the tiny model's vocabulary."""
    from specdec.v1 import common_pb2
    from tests.draft_service.inprocess import INFO

    info = common_pb2.ModelInfo()
    info.CopyFrom(INFO)
    info.vocab_size = info.tokenizer_vocab_size = model.config.vocab_size
    info.max_context = max_context
    return info


def test_a_repeated_span_is_drafted_by_the_suffix_side_without_a_model_forward(model, monkeypatch):
    """A suffix round costs the model nothing, not even the prompt's reading."""
    seq = start(model, REPEATED)
    fed = counting_feeds(seq, monkeypatch)
    seq.propose(6)
    assert seq.source == "suffix" and fed == []
    seq.update(len(REPEATED), [SPAN[12]])
    before = blocks("suffix")
    block = seq.propose(6)
    assert seq.source == "suffix" and block.token_ids == SPAN[13:19] and block.probs is None
    assert fed == [] and in_step(seq)  # the model side adopted the block's ids, nothing more
    assert blocks("suffix") == before + 1


def test_the_model_side_reads_the_prompt_when_it_first_drafts(model, monkeypatch):
    """Rounds the suffix side answers leave the prompt unread; the model's first block reads the prompt and the
    tokens since in one forward, then drafts (the verifier waits for that ask as a stream's opening). A request the
    suffix side answers throughout never pays the model's prompt read."""
    seq = start(model, REPEATED)
    fed = counting_feeds(seq, monkeypatch)
    seq.propose(6)
    assert seq.source == "suffix" and seq.model.cached_length == 0
    seq.update(len(REPEATED), [UNSEEN])  # nothing after UNSEEN matches: the model drafts
    seq.propose(2)
    assert seq.source == "model" and fed == [len(REPEATED) + 1, 1]  # the prompt and UNSEEN, then its first token


def test_a_suffix_block_goes_as_far_as_its_match_not_as_far_as_k(model):
    """The verifier's k prices the model side; a suffix block is sized by its evidence, up to `longest`, and says so
    (the verifier cuts it to what pays). A model block is exactly k and is not marked."""
    seq = HybridProposer(SuffixProposer(), ModelProposer(model), 4, longest=32).start(REPEATED, SamplingParams(), False)
    block = seq.propose(2)
    assert seq.source == "suffix" and block.sized_by_draft
    assert block.token_ids[:18] == SPAN[12:] and len(block.token_ids) <= 32  # the span's rest, and maybe past it
    assert in_step(seq)
    seq = HybridProposer(SuffixProposer(), ModelProposer(model), 4, longest=32).start(UNIQUE, SamplingParams(), False)
    block = seq.propose(2)
    assert seq.source == "model" and len(block.token_ids) == 2 and not block.sized_by_draft


def test_without_a_match_the_model_drafts(model):
    seq = start(model, UNIQUE)
    before = blocks("model")
    block = seq.propose(4)
    assert seq.source == "model" and len(block.token_ids) == 4
    reference = ModelProposer(model).start(UNIQUE, SamplingParams(), False).propose(4)
    assert block.token_ids == reference.token_ids  # greedy: the model side's own block
    assert in_step(seq) and blocks("model") == before + 1


def test_a_match_shorter_than_the_threshold_goes_to_the_model(model):
    """Two tokens that occurred before, followed by the same token: a 2-token match drafts at most 2 tokens, below
    --hybrid-min-suffix 4; at 2 the suffix side answers."""
    prompt = UNIQUE + [7, 8, 9] + UNIQUE[-2:]
    weak, strong = start(model, prompt, min_suffix=4), start(model, prompt, min_suffix=2)
    weak.propose(4)
    strong.propose(4)
    assert weak.source == "model" and strong.source == "suffix"
    assert in_step(weak) and in_step(strong)


def test_by_default_any_match_answers_and_the_model_drafts_only_where_the_suffix_side_has_nothing(model):
    """--hybrid-min-suffix defaults to 1: the last token occurred once before, followed by 7, and that 1-token match
    is the suffix side's block; after a token never seen, the model drafts."""
    assert HybridConfig().hybrid_min_suffix == 1
    seen_once = start(model, UNIQUE + [7, 8, 9] + UNIQUE[-1:], min_suffix=HybridConfig().hybrid_min_suffix)
    block = seen_once.propose(4)
    assert seen_once.source == "suffix" and block.token_ids[0] == 7 and block.sized_by_draft
    unseen = start(model, UNIQUE + [UNSEEN], min_suffix=HybridConfig().hybrid_min_suffix)
    unseen.propose(4)
    assert unseen.source == "model"
    assert in_step(seen_once) and in_step(unseen)


def test_the_verifiers_threshold_replaces_the_drafts_own_until_it_asks_for_that_again(model):
    """NextBlock.min_sized, the verifier's price of both sides: at 2 a 2-token match answers although
    --hybrid-min-suffix is 4; at 0 the draft's own rule is back; past the match the model drafts."""
    prompt = UNIQUE + [7, 8, 9] + UNIQUE[-2:]
    seq = start(model, prompt, min_suffix=4)
    seq.set_min_sized(2)
    block = seq.propose(4)
    assert seq.source == "suffix" and block.token_ids[:2] == [7, 8] and block.sized_by_draft
    for asked, source in ((0, "model"), (9, "model")):
        again = start(model, prompt, min_suffix=4)
        again.set_min_sized(asked)
        again.propose(4)
        assert again.source == source and in_step(again)
    strong = start(model, REPEATED, min_suffix=4)
    strong.set_min_sized(13)  # a 12-token match is not long enough for it
    strong.propose(4)
    assert strong.source == "model"


def test_the_threshold_is_judged_on_the_match_even_below_it(model):
    """k smaller than --hybrid-min-suffix: the suffix side still needs a match that long, and answers k tokens."""
    seq = start(model, REPEATED, min_suffix=4)
    block = seq.propose(2)
    assert seq.source == "suffix" and block.token_ids == SPAN[12:14]
    assert in_step(seq)  # the suffix's tokens past k were retracted
    short = start(model, UNIQUE + [7, 8, 9] + UNIQUE[-2:], min_suffix=4)
    short.propose(2)
    assert short.source == "model"


def test_rollback_keeps_both_sides_in_step_and_the_model_catches_up_in_one_forward(model, monkeypatch):
    seq = start(model, REPEATED)
    fed = counting_feeds(seq, monkeypatch)
    for _ in range(2):  # the suffix side answers twice; the target keeps 3 of each block, then its own token
        block = seq.propose(6)
        assert seq.source == "suffix"
        kept = len(seq.tokens) - len(block.token_ids) + 3
        seq.update(kept, [block.token_ids[3]])
        assert in_step(seq)
    assert fed == []  # not even the prompt: the model has not drafted yet
    seq.update(len(seq.tokens), [UNSEEN])  # nothing after UNSEEN matches: the model drafts
    lag = len(seq.tokens) - seq.model.cached_length
    block = seq.propose(3)
    assert seq.source == "model" and in_step(seq)
    assert fed[0] == lag and len(fed) == 3  # the whole lag (the prompt too) in one forward, then one per draft token
    seq.update(len(seq.tokens) - 2, [5])  # rolled back into the model's block
    assert in_step(seq) and seq.tokens[-2:] == [block.token_ids[0], 5]
    logits = seq.model._feed(seq.tokens[seq.model.cached_length:])
    with torch.inference_mode():
        fresh = model(input_ids=torch.tensor([seq.tokens])).logits[0, -1]
    torch.testing.assert_close(logits, fresh, rtol=1e-4, atol=1e-4)


def test_the_model_sides_kept_tokens_are_indexed_by_the_suffix_side(model):
    """Verified tokens enter the request's suffix tree whichever side drafted them; proposals never do."""
    seq = start(model, UNIQUE)
    block = seq.propose(4)
    assert seq.suffix.verified_length == len(UNIQUE)  # proposed, not verified
    seq.update(len(seq.tokens), [UNSEEN])
    assert seq.suffix.verified_length == len(UNIQUE) + 5
    seq.update(len(seq.tokens), UNIQUE[-4:])  # the prompt's last 4 tokens again: what followed them was the model's
    assert seq.propose(4).token_ids == block.token_ids and seq.source == "suffix"


def test_sampling_carries_q_for_model_blocks_and_none_for_suffix_blocks(model):
    """Each block from one side: the model's with its q rows, the suffix's one-hot (probs None)."""
    sampling = SamplingParams(temperature=0.8, top_k=5)
    seq = start(model, REPEATED, sampling=sampling, return_probs=True)
    suffix_block = seq.propose(4)
    assert seq.source == "suffix" and suffix_block.probs is None
    seq.update(len(seq.tokens), [UNSEEN])
    model_block = seq.propose(3)
    assert seq.source == "model" and model_block.probs.shape == (3, model.config.vocab_size)
    torch.testing.assert_close(model_block.probs.sum(-1), torch.ones(3))


def test_drafting_ahead_syncs_and_confirms_both_sides(model):
    seq = start(model, REPEATED)
    block = seq.propose(4)
    seq.update(len(seq.tokens), [SPAN[16]], assumed=True)  # the verifier's next sync, guessed
    assert in_step(seq) and seq.suffix.verified_length == len(REPEATED)
    seq.confirm(len(seq.tokens))
    assert seq.suffix.verified_length == len(REPEATED) + len(block.token_ids) + 1


def test_finish_caches_the_output_for_the_next_request(model):
    proposer = HybridProposer(SuffixProposer(), ModelProposer(model), 4)
    first = proposer.start(UNIQUE, SamplingParams(), False)
    output = list(range(200, 216))
    first.update(len(first.tokens), output)
    first.finish()
    first.close()
    second = proposer.start(list(range(150, 160)) + output[:6], SamplingParams(), False)
    assert second.propose(4).token_ids == output[6:10] and second.source == "suffix"


def test_min_suffix_below_one_is_refused():
    with pytest.raises(ValueError, match="--hybrid-min-suffix"):
        HybridConfig(hybrid_min_suffix=0)


def test_a_sized_only_ask_gets_the_suffix_sides_block_or_nothing_and_never_runs_the_model(model, monkeypatch):
    """NextBlock.sized_only (the verifier found the model's blocks do not pay): the suffix side answers where it
    would, sized by its match; where it would not, the answer is empty, and the model side neither drafts nor reads
    the prompt. The model reads it at its first real ask."""
    seq = start(model, REPEATED)
    fed = counting_feeds(seq, monkeypatch)
    block = seq.propose_sized(4)
    assert seq.source == "suffix" and block.sized_by_draft and block.token_ids == SPAN[12:16]
    assert fed == [] and in_step(seq)
    seq.update(len(REPEATED), [UNSEEN])
    assert seq.propose_sized(4).token_ids == [] and fed == [] and in_step(seq)
    assert len(seq.propose(4).token_ids) == 4 and seq.source == "model" and fed[0] == len(REPEATED) + 1
    assert in_step(seq)
    assert HybridProposer.sizes_some_blocks and not SuffixProposer.sizes_some_blocks


def test_the_draft_service_answers_sized_only_asks_also_on_a_pipelined_stream(model):
    """Over gRPC: GetDraftInfo says the hybrid sizes some blocks, and the verifier's link reads it; a sized-only
    ask on the repeated span gets the suffix side's block marked sized, on unseen text an empty one; on a pipelined
    stream likewise, and no block is drafted ahead after it (that would run the model)."""
    import asyncio

    from specdec.runtime.config import ServerConfig
    from specdec.v1 import draft_pb2
    from tests.draft_service.inprocess import draft_server
    from tests.draft_service.test_draft_limits import P, propose, start as start_message
    from verifier_service.draft.client import DraftLink

    def ask(keep, append, k, round_=0):
        return P(next=draft_pb2.NextBlock(keep_length=keep, append_token_ids=append, num_tokens=k, round=round_,
                                          sized_only=True))

    async def scenario():
        async with draft_server(proposer=HybridProposer(SuffixProposer(), ModelProposer(model), 4),
                                info=served_info(model), propose_ahead="always") as (address, _):
            link = DraftLink(address, ServerConfig(), served_info(model), timeout_s=5.0)
            await link.check_compatible()
            assert link.method == "hybrid" and link.sizes_some_blocks and not link.sizes_blocks
            await link.close()
            hit, miss = await propose(address, [start_message(REPEATED), ask(len(REPEATED), [], 4),
                                                ask(len(REPEATED), [UNSEEN], 4)])
            assert hit.sized_by_draft and list(hit.token_ids) == SPAN[12:16]
            assert list(miss.token_ids) == []
            pipelined = P(start=draft_pb2.StartSequence(request_id="p", prompt_token_ids=REPEATED, pipeline=True))
            answers = await propose(address, [pipelined, ask(len(REPEATED), [], 4, round_=1),
                                              ask(len(REPEATED), [UNSEEN], 4, round_=2)])
            assert [list(a.token_ids) for a in answers] == [SPAN[12:16], []]
            assert answers[0].sized_by_draft and not any(a.HasField("ahead") for a in answers)

    asyncio.run(asyncio.wait_for(scenario(), 60))
