"""The methods compared: requests through the running stack, and Hugging Face in-process generation.

Every method turns one Prompt into one Sample: tokens, wall time, TTFT and, for the
stack, the speculation statistics and the verifier's forward/draft-wait time
taken from Prometheus histogram deltas around the request.
"""

from __future__ import annotations

import dataclasses
import time

from bench.core import prom
from bench.core.workloads import Prompt
from draft_service.config import MODEL_METHODS
from specdec.runtime.config import ModelConfig, choices, model_dir, optional_model_dir
from verifier_service.config import VerifierConfig


@dataclasses.dataclass
class Sample:
    """One timed request."""

    workload: str
    prompt_id: str
    method: str
    repeat: int
    completion_tokens: int
    wall_s: float
    ttft_s: float | None = None
    num_rounds: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_fallback_rounds: int = 0
    forward_s: float | None = None  # target forward passes, summed over the request's rounds
    forward_count: int = 0
    draft_wait_s: float | None = None  # time rounds waited for their draft block, summed
    draft_compute_s: float = 0.0  # draft model time (estimate; 0 for n-gram)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    position: int = -1  # the prompt's index in its workload (-1: not recorded, runs before it was)

    def overhead_per_round_s(self) -> float | None:
        """Time a decode round spends outside the target's forward pass and the draft model's compute.

        decode wall = wall - ttft covers rounds 2..N (the first piece arrives after prefill + round 1), so
        per-round wall = (wall - ttft) / (N - 1); the per-round model time is (forward + draft compute) / N.
        """
        if self.ttft_s is None or self.forward_s is None or self.num_rounds < 2:
            return None
        wall_per_round = (self.wall_s - self.ttft_s) / (self.num_rounds - 1)
        return wall_per_round - (self.forward_s + self.draft_compute_s) / self.num_rounds


class StackMethod:
    """Requests to the gateway over GenerateStream; k=None leaves num_speculative_tokens unset (server default)."""

    def __init__(self, name: str, gateway_address: str, verifier_metrics_port: int, k: int | None,
                 draft_step_s: float = 0.0, timeout_s: float = 600.0):
        import grpc

        from specdec.v1 import gateway_pb2_grpc

        self.name, self.k, self.draft_step_s, self.timeout_s = name, k, draft_step_s, timeout_s
        self.metrics_port = verifier_metrics_port
        self.channel = grpc.insecure_channel(gateway_address)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)

    def request(self, prompt: Prompt, max_tokens: int | None = None):
        from specdec.v1 import gateway_pb2

        request = gateway_pb2.GenerateRequest(
            prompt=prompt.text, max_tokens=max_tokens or prompt.max_tokens, temperature=prompt.temperature,
            stop=prompt.stop)
        if prompt.seed is not None:
            request.seed = prompt.seed
        if self.k is not None:
            request.num_speculative_tokens = self.k
        return request

    def run(self, prompt: Prompt, repeat: int = 0, max_tokens: int | None = None) -> Sample:
        request = self.request(prompt, max_tokens)
        before = prom.scrape(self.metrics_port)
        started = time.perf_counter()
        ttft = None
        last = None
        token_ids: list[int] = []
        for piece in self.stub.GenerateStream(request, timeout=self.timeout_s):
            if ttft is None and piece.text:
                ttft = time.perf_counter() - started
            token_ids.extend(piece.token_ids)
            last = piece
        wall = time.perf_counter() - started
        after = prom.scrape(self.metrics_port)
        forward_s, forward_count = prom.histogram_delta(before, after, "specdec_verify_forward_seconds")
        wait_s, _ = prom.histogram_delta(before, after, "specdec_draft_wait_seconds")
        stats = last.speculation
        return Sample(
            workload=prompt.workload, prompt_id=prompt.id, method=self.name, repeat=repeat,
            completion_tokens=last.usage.completion_tokens, wall_s=wall, ttft_s=ttft,
            num_rounds=stats.num_rounds, num_drafts=stats.num_drafts, num_draft_tokens=stats.num_draft_tokens,
            num_accepted_tokens=stats.num_accepted_tokens, num_fallback_rounds=stats.num_fallback_rounds,
            forward_s=forward_s, forward_count=int(forward_count), draft_wait_s=wait_s,
            draft_compute_s=self.draft_step_s * stats.num_draft_tokens, token_ids=token_ids, position=prompt.position)

    def close(self) -> None:
        self.channel.close()


class FreshStackMethod:
    """A stack of its own, restarted whenever the reset key changes: its draft's learnt state starts empty.

    For a draft that learns from earlier outputs (suffix): a restart empties its cache, so a repeat
    never drafts from its own earlier pass over the same prompts. Each (re)start serves one warm-up
    request (`warmup`), whose output is the only thing in the cache before the first timed request.
    """

    def __init__(self, name: str, start_stack, warmup: Prompt, k: int | None = None):
        self.name, self.k, self.warmup = name, k, warmup
        self.start_stack = start_stack  # () -> a context manager yielding running_stack's services
        self.key = None
        self._stack = self._method = None

    def reset(self, key) -> bool:
        """Restart the stack if key differs from the last one; True if it did."""
        if key == self.key and self._method is not None:
            return False
        self.close()
        stack = self.start_stack()
        services = stack.__enter__()  # on failure it has stopped what it started
        self._stack = stack
        self._method = StackMethod(self.name, services["gateway"].address, services["verifier"].metrics_port, self.k)
        self._method.run(self.warmup, repeat=-1, max_tokens=16)
        self.key = key
        return True

    def run(self, prompt: Prompt, repeat: int = 0, max_tokens: int | None = None) -> Sample:
        if self._method is None:
            raise RuntimeError(f"{self.name}: reset() starts the stack; call it before run()")
        return self._method.run(prompt, repeat, max_tokens)

    def close(self) -> None:
        if self._method is not None:
            self._method.close()
        if self._stack is not None:
            self._stack.__exit__(None, None, None)
        self._stack = self._method = None


class HFModel:
    """The anchor: the same target in-process with transformers, bf16 (or --dtype)."""

    def __init__(self, model_dir: str, dtype: str = "bfloat16", threads: int = 0):
        import torch

        from specdec.modeling.models import load_causal_lm, load_tokenizer

        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = load_tokenizer(model_dir)
        self.model = load_causal_lm(model_dir, dtype=dtype)
        self.eos = self.model.generation_config.eos_token_id
        if self.eos is None:
            self.eos = self.tokenizer.eos_token_id
        self.pad = self.model.generation_config.pad_token_id
        if self.pad is None:
            self.pad = self.eos if isinstance(self.eos, int) else self.eos[0]

    def generate(self, prompt: Prompt, lookup: int = 0, max_tokens: int | None = None) -> tuple[list[int], float]:
        import torch

        ids = self.tokenizer(prompt.text, return_tensors="pt", add_special_tokens=False)
        kwargs = {"max_new_tokens": max_tokens or prompt.max_tokens, "eos_token_id": self.eos,
                  "pad_token_id": self.pad}
        if prompt.temperature > 0:
            torch.manual_seed(prompt.seed or 0)
            kwargs.update(do_sample=True, temperature=prompt.temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        if lookup:
            kwargs["prompt_lookup_num_tokens"] = lookup
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(**ids, **kwargs)
        wall = time.perf_counter() - started
        return out[0, ids["input_ids"].shape[1]:].tolist(), wall


class HFMethod:
    """Plain `model.generate` (lookup=0) or prompt lookup assisted generation (lookup=N)."""

    def __init__(self, name: str, model: HFModel, lookup: int = 0):
        self.name, self.hf, self.lookup = name, model, lookup

    def run(self, prompt: Prompt, repeat: int = 0, max_tokens: int | None = None) -> Sample:
        tokens, wall = self.hf.generate(prompt, self.lookup, max_tokens)
        return Sample(workload=prompt.workload, prompt_id=prompt.id, method=self.name, repeat=repeat,
                      completion_tokens=len(tokens), wall_s=wall, token_ids=tokens, position=prompt.position)

    def close(self) -> None:
        pass


def draft_step_seconds(model_dir: str, dtype: str, threads: int, context: int = 200, trials: int = 12) -> float:
    """Median time of one single-token forward of a (draft) model with a KV cache at `context` tokens."""
    import statistics

    import torch

    from specdec.modeling.models import load_causal_lm

    if threads:
        torch.set_num_threads(threads)
    model = load_causal_lm(model_dir, dtype=dtype)
    vocab = model.config.vocab_size
    context = min(context, int(getattr(model.config, "max_position_embeddings", 512) or 512) - trials - 2)
    ids = torch.randint(3, vocab, (1, context))
    times = []
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        cache = out.past_key_values
        token = ids[:, -1:]
        for _ in range(trials):
            started = time.perf_counter()
            out = model(token, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - started)
            cache = out.past_key_values
    del model
    return statistics.median(times[2:])


def add_stack_options(parser, repeats: int | None, max_tokens: int = 48) -> None:
    """The options of the load tools (bench context, bench concurrency) that choose and start the stack; repeats
    None: the tool runs each request once, and offers no --repeats."""
    parser.add_argument("--model", required=True, type=model_dir, help="target model directory")
    parser.add_argument("--draft-model", default="", type=optional_model_dir,
                        help="a draft model of the target's family (method model); default: the n-gram draft")
    parser.add_argument("--engine", default="transformers", choices=choices(VerifierConfig, "engine"),
                        help="verifier engine")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="the interpreter with vLLM")
    parser.add_argument("--dtype", default="bfloat16", choices=choices(ModelConfig, "dtype"))
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the transformers verifier")
    parser.add_argument("--out", default="", help="JSON file to write (default bench/results/<tool>_<engine>.json)")


def stack_kwargs(args, verifier_args=()) -> dict:
    """running_stack(...) keyword arguments for those options: an n-gram stack (or a model draft's, with
    --draft-model) with the chosen engine."""
    verifier = ["--dtype", args.dtype, "--engine", args.engine, *verifier_args]
    if args.engine == "transformers":
        verifier += ["--threads", str(args.threads)]
    draft_model = getattr(args, "draft_model", "")
    method = getattr(args, "method", "") or ("model" if draft_model else "ngram")
    draft = {"method": method, "draft_dir": draft_model or None,
             "draft_args": ["--dtype", args.dtype] if draft_model and method in MODEL_METHODS else []}
    return {**draft, "verifier_args": verifier, "env": {"OMP_WAIT_POLICY": "PASSIVE"},
            "timeout_s": 900 if draft_model else 300,
            "verifier_python": args.vllm_python if args.engine == "vllm" else None}
