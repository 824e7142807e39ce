"""Several verifiers behind one gateway, as real processes (issue 35): one killed mid-stream, one drained.

A killed verifier (SIGKILL) loses no stream: the gateway resumes each of its requests on another verifier,
and the output is the undisturbed run's, token for token: greedy, and seeded sampling (transformers engine). A drained one (SIGTERM) fails no request:
its open streams finish there, new requests go to the others.
"""

from __future__ import annotations

from devkit.stack import running_stack, scrape_metrics
from tools.failover_probe import ENV, prompts, resumes_counted, run_streams, wait_usable

MAX_TOKENS = 100


def fleet(tiny_pair, tmp_path, verifiers: int, grace_s: float):
    target, draft = tiny_pair
    return running_stack(target, draft, method="ngram", env=ENV, log_dir=tmp_path, verifiers=verifiers,
                         verifier_args=["--threads", "1", "--grace-s", str(grace_s)],
                         gateway_args=["--peer-check-s", "1"])


def same(streams, reference) -> list[int]:
    """The indices of the streams whose output differs from the reference's."""
    return [i for i, (s, r) in enumerate(zip(streams, reference))
            if (s.token_ids, s.text, s.finish_reason) != (r.token_ids, r.text, r.finish_reason)]


def test_a_verifier_killed_mid_stream_loses_no_stream(tiny_pair, tmp_path):
    texts = prompts(6)
    with fleet(tiny_pair, tmp_path, verifiers=3, grace_s=1) as services:
        gateway = services["gateway"]
        wait_usable(gateway, 3)
        reference = run_streams(gateway.address, texts, MAX_TOKENS)
        assert not [s.error for s in reference if s.error]
        before = resumes_counted(scrape_metrics(gateway.metrics_port))
        disturbed = run_streams(gateway.address, texts, MAX_TOKENS,
                                when_all_have=(MAX_TOKENS // 4, services["verifier3"].kill))
        assert [s.error for s in disturbed if s.error] == []
        assert same(disturbed, reference) == []
        resumed = resumes_counted(scrape_metrics(gateway.metrics_port)) - before
        assert resumed >= 1, "the killed verifier carried none of the streams: nothing was tested"
        assert gateway.log().count("resuming on another") == resumed
        wait_usable(gateway, 2)
        again = run_streams(gateway.address, texts[:3], MAX_TOKENS)  # new requests: the two left serve them
        assert same(again, reference[:3]) == []
        assert resumes_counted(scrape_metrics(gateway.metrics_port)) - before == resumed

        # Seeded sampling: on the transformers engine a token's draw is keyed by (seed, absolute position),
        # which a resume does not move, so a resumed seeded stream is the undisturbed one too. Two streams on
        # the two verifiers left: least-outstanding gives each one, so killing one resumes exactly one stream.
        seeded, seeds = texts[:2], [11, 12]
        reference = run_streams(gateway.address, seeded, MAX_TOKENS, seeds=seeds)
        disturbed = run_streams(gateway.address, seeded, MAX_TOKENS, seeds=seeds,
                                when_all_have=(MAX_TOKENS // 4, services["verifier2"].kill))
        assert [s.error for s in disturbed if s.error] == [] and same(disturbed, reference) == []
        assert resumes_counted(scrape_metrics(gateway.metrics_port)) - before == resumed + 1


def test_a_drained_verifier_fails_no_request_and_takes_no_new_one(tiny_pair, tmp_path):
    texts = prompts(4)
    with fleet(tiny_pair, tmp_path, verifiers=2, grace_s=20) as services:
        gateway, draining = services["gateway"], services["verifier2"]
        wait_usable(gateway, 2)
        reference = run_streams(gateway.address, texts, MAX_TOKENS)
        newcomers = []

        def drain_then_ask_more() -> None:
            draining.process.terminate()  # SIGTERM: NOT_SERVING, finish what it has, exit
            wait_usable(gateway, 1, timeout_s=10)  # at once: the gateway follows its health
            newcomers.extend(run_streams(gateway.address, texts, MAX_TOKENS))

        disturbed = run_streams(gateway.address, texts, MAX_TOKENS, when_all_have=(MAX_TOKENS // 4,
                                                                                    drain_then_ask_more))
        assert [s.error for s in disturbed + newcomers if s.error] == []
        assert same(disturbed, reference) == [] and same(newcomers, reference) == []
        # nothing was resumed: the drained verifier finished its streams and was never sent a new one
        assert resumes_counted(scrape_metrics(gateway.metrics_port)) == 0
        assert draining.process.wait(30) == 0

