"""The seam between vLLM's engine core and our draft service: a scheduler that reports each step's rows and
takes our draft blocks for the next step.

vLLM's scheduler lives in the engine core, which runs in the verifier's process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) whatever the tensor or pipeline parallel size: only the model
runners move into worker processes. It is also where vLLM itself puts a step's drafts before the next
step (`EngineCore.post_step` -> `Scheduler.update_draft_token_ids`), and every rank reads them from
the next `SchedulerOutput.scheduled_spec_decode_tokens`. So the step thread, after `engine.step()`:

    rows = scheduler.take_step()                          # what the step verified and emitted, row by row
    blocks = StepDrafter.propose(rows, scheduler.context)  # our bookkeeping and draft calls (vllm_bridge.py)
    scheduler.inject(request_ids, blocks)                 # update_draft_token_ids: the next step verifies them

The model runners' own proposer (vllm_proposer.NoDrafts) proposes nothing; vLLM's `post_step` hands its
empty lists to the scheduler first, and ours replace them. This needs synchronous scheduling
(`async_scheduling=False`): with async scheduling vLLM schedules step N+1 with placeholder drafts
before step N's tokens are known, and the model runner fills them in itself.
"""

from __future__ import annotations

import typing

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds

from specdec.runtime.grpc_server import ConfigError
from verifier_service.engines.vllm_bridge import StepRows

SCHEDULER = "verifier_service.engines.vllm_scheduler.DraftScheduler"


class DraftScheduler(Scheduler):
    """vLLM's scheduler, which also keeps the last step's rows until the step thread takes them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last_step: StepRows | None = None

    def update_from_output(self, scheduler_output, model_runner_output):
        # vLLM trims a stopped row's tokens in place: copy what the step emitted first
        sampled = model_runner_output.sampled_token_ids or []
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        request_ids = list(model_runner_output.req_ids or [])
        self._last_step = StepRows(
            request_ids=request_ids,
            emitted=[list(sampled[row]) if row < len(sampled) else [] for row in range(len(request_ids))],
            verified=[sum(1 for token in scheduled.get(request_id, ()) if token >= 0) for request_id in request_ids],
            step_tokens=int(scheduler_output.total_num_scheduled_tokens),
        )
        return super().update_from_output(scheduler_output, model_runner_output)

    def take_step(self) -> StepRows | None:
        """The rows of the step that finished since the last call (None if none did)."""
        rows, self._last_step = self._last_step, None
        return rows

    def inject(self, request_ids: list[str], blocks: list[list[int]]) -> None:
        """The next step's draft block per request (request_ids: [rows], blocks: [rows][k]), as post_step would."""
        self.update_draft_token_ids(DraftTokenIds(request_ids, blocks))

    def context(self, request_id: str) -> typing.Sequence[int] | None:
        """A live request's tokens (prompt and output so far); None once it finished."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished():
            return None
        return request.all_token_ids


def engine_scheduler(engine) -> DraftScheduler:
    """The DraftScheduler inside an LLMEngine whose engine core runs in this process."""
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)  # LLMEngine -> InprocClient -> core
    scheduler = getattr(core, "scheduler", None)
    if not isinstance(scheduler, DraftScheduler):
        raise ConfigError(
            "the vLLM engine core is not in this process (VLLM_ENABLE_V1_MULTIPROCESSING must be 0) or does not run "
            f"{SCHEDULER}: found {type(scheduler).__name__}")
    return scheduler
