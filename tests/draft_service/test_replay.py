"""The replay draft: measured acceptance is its set alpha, it replays only on the recording, and it is refused
without --enable-benchmark-drafts."""

import pytest

from bench.core.speedup_model import rate_from_alpha
from bench.studies.efficiency import replay_acceptance_check
from draft_service.config import DraftConfig
from draft_service.replay import ReplayProposer, prompt_key, read_replay_file, replayed_token, write_replay_file
from specdec.decoding.sampling import SamplingParams

ALPHAS, KS = (0.5, 0.7, 0.9), (2, 4, 8)


def test_measured_acceptance_is_the_set_alpha_within_0_02_in_all_nine_cells():
    """A greedy verifier over 300 x 256 positions per cell (seeded): alpha^ = accepted / (accepted + rejections)
    is alpha within 0.02 (about 6 standard errors at alpha 0.5), and the acceptance *rate* the stack reports
    (accepted / drafted) is the model's (E - 1) / k, not alpha."""
    rows = replay_acceptance_check(list(ALPHAS), list(KS), sequences=300, length=256, seed=1)
    assert [(r["alpha"], r["k"]) for r in rows] == [(a, k) for a in ALPHAS for k in KS]
    for r in rows:
        assert abs(r["alpha_measured"] - r["alpha"]) <= 0.02, r
        assert r["acceptance_rate"] == pytest.approx(rate_from_alpha(r["alpha"], r["k"]), abs=0.02), r
        assert r["trials"] > 15000


def test_each_token_is_corrupted_independently_and_never_into_the_recorded_token():
    continuation = list(range(100, 100 + 4000))
    tokens = [replayed_token(continuation, "key", p, 0.7, seed=3, vocab_size=50000) for p in range(4000)]
    kept = [t == c for t, c in zip(tokens, continuation)]
    assert abs(sum(kept) / len(kept) - 0.7) < 0.03
    # independence: a kept token is followed by a kept one as often as any token is kept
    after_kept = [b for a, b in zip(kept, kept[1:]) if a]
    assert abs(sum(after_kept) / len(after_kept) - 0.7) < 0.04
    assert all(0 <= t < 50000 for t in tokens)
    assert tokens == [replayed_token(continuation, "key", p, 0.7, seed=3, vocab_size=50000) for p in range(4000)]


def test_it_replays_from_the_current_position_and_only_on_the_recording(tmp_path):
    prompt, continuation = [5, 6, 7], [10, 11, 12, 13, 14, 15]
    path = tmp_path / "replay.jsonl"
    write_replay_file(path, [(prompt, continuation)])
    assert read_replay_file(path) == {prompt_key(prompt): continuation}
    proposer = ReplayProposer.from_file(str(path), alpha=1.0, seed=0, vocab_size=100)
    sequence = proposer.start(prompt, SamplingParams(), False)
    assert sequence.propose(2).token_ids == [10, 11]
    sequence.update(4, [11])  # kept 10, the target said 11 (the draft's 11 rolled back, the target's appended)
    assert sequence.propose(3).token_ids == [12, 13, 14]
    sequence.update(5, [99])  # the target left the recording at position 2
    assert sequence.propose(3).token_ids == []
    sequence.update(5, [12])  # rolled back onto it again
    assert sequence.propose(9).token_ids == [13, 14, 15]  # up to the recording's end
    assert proposer.start([1, 2], SamplingParams(), False).propose(4).token_ids == []  # an unknown prompt


def test_alpha_zero_proposes_only_wrong_tokens():
    proposer = ReplayProposer({prompt_key([1]): list(range(20, 40))}, alpha=0.0, seed=0, vocab_size=64)
    block = proposer.start([1], SamplingParams(), False).propose(8).token_ids
    assert len(block) == 8 and all(t != c for t, c in zip(block, range(20, 28)))


def test_it_is_refused_without_the_benchmark_flag(tmp_path):
    with pytest.raises(ValueError, match="benchmarking tool.*--enable-benchmark-drafts"):
        DraftConfig(method="replay", replay_file="x.jsonl")
    with pytest.raises(ValueError, match="--replay-file is a benchmarking tool"):
        DraftConfig(replay_file="x.jsonl")
    with pytest.raises(ValueError, match="needs --replay-file"):
        DraftConfig(method="replay", enable_benchmark_drafts=True)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        DraftConfig(method="replay", enable_benchmark_drafts=True, replay_file="x.jsonl", replay_acceptance=1.5)
    assert DraftConfig(method="replay", enable_benchmark_drafts=True, replay_file="x.jsonl").method == "replay"
    assert DraftConfig().method == "ngram" and not DraftConfig().enable_benchmark_drafts  # off by default


def test_the_service_refuses_it_on_the_command_line(capsys):
    from draft_service.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["--method", "replay", "--replay-file", "x.jsonl"])
    assert exit_.value.code == 2
    assert "--enable-benchmark-drafts" in capsys.readouterr().err
