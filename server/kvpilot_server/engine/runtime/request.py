"""One request's life after admission: its sequence, text so far, and when it must stop."""

import time
from dataclasses import dataclass, field

import llguidance

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.engine.runtime.detokenizer import Detokenizer
from kvpilot_server.engine.runtime.pooling import Pooler
from kvpilot_server.engine.runtime.sequence import Sequence
from kvpilot_server.engine.structured.grammar import UnsatisfiableError
from kvpilot_server.outputs import CompletionOutput, RequestMetrics, RequestOutput, Sample


@dataclass
class Request:
    seq: Sequence
    prompt: str | None
    prompt_token_ids: list[int]  # copied once: seq.token_ids grows as tokens are generated
    detokenizer: Detokenizer
    eos_token_ids: list[int]
    max_model_len: int
    metrics: RequestMetrics
    logprobs: list[Sample] | None = None
    prompt_logprobs: list[Sample | None] | None = None
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    error: Exception | None = None
    # Structured outputs: the grammar's state after the tokens generated so far. Tokens are
    # never taken back (a preempted sequence keeps them and recomputes their KV), so neither is
    # the state.
    matcher: llguidance.LLMatcher | None = None
    pooler: Pooler | None = None  # an embedding request's vector so far

    def pool(self, hidden, first_position: int) -> None:
        assert self.pooler is not None
        self.pooler.add(hidden, first_position)

    def append(self, sample: Sample) -> None:
        """Take in the token the scheduler appended to the sequence (its text, logprobs and
        timing) and decide whether the request is done."""
        seq, params, metrics = self.seq, self.seq.params, self.metrics
        now = time.monotonic()
        if metrics.last_token_time is None:
            metrics.first_token_time = now
        else:
            metrics.inter_token_latencies.append(now - metrics.last_token_time)
        metrics.last_token_time = now
        self.delta_token_ids.append(sample.token_id)
        if self.logprobs is not None:
            self.logprobs.append(sample)
        self.delta_text += self.detokenizer.add(sample.token_id)
        token, done_min = sample.token_id, seq.num_output_tokens >= params.min_tokens
        if self.matcher is not None and not self.matcher.consume_token(token):
            raise UnsatisfiableError(self.matcher.get_error())
        if self.detokenizer.stop_reason is not None:
            self.finish("stop", self.detokenizer.stop_reason)
        elif done_min and not params.ignore_eos and token in self.eos_token_ids:
            self.finish("stop")
        elif done_min and token in params.stop_token_ids:
            self.finish("stop", token)
        elif self.matcher is not None and self.matcher.is_stopped():
            self.finish("stop")  # the grammar is complete: nothing but an end may follow
        elif seq.num_output_tokens >= seq.max_tokens or len(seq) >= self.max_model_len:
            self.finish("length")

    def replay(self, token: int) -> None:
        """Take in a token generated before this request began (SamplingParams.continue_from):
        the detokenizer and the grammar advance, and its text is not sent again."""
        self.detokenizer.add(token)
        if self.matcher is not None and not self.matcher.consume_token(token):
            raise UnsatisfiableError(self.matcher.get_error())
        if self.finished or self.detokenizer.stop_reason is not None:
            raise InvalidRequestError(
                "continue_from: the generation had already ended", "continue_from"
            )

    def add_prompt_logprobs(self, first_position: int, samples: list[Sample]) -> None:
        """Logprobs of prompt tokens from `first_position` on. A preempted request recomputes
        its prompt: what is already recorded is kept, not repeated."""
        assert self.prompt_logprobs is not None
        skip = len(self.prompt_logprobs) - first_position
        self.prompt_logprobs.extend(samples[max(0, skip) :])

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        if self.seq.finish_reason is not None:
            return
        self.seq.finish_reason, self.seq.stop_reason = reason, stop_reason
        self.delta_text += self.detokenizer.flush()
        self.metrics.finished_time = time.monotonic()

    @property
    def finished(self) -> bool:
        return self.seq.finish_reason is not None

    def take_output(self) -> RequestOutput:
        """A snapshot for the caller; the deltas restart from here."""
        seq, det = self.seq, self.detokenizer
        completion = CompletionOutput(
            index=0,
            text=det.text[: det.emitted],
            token_ids=list(seq.output_token_ids),
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
            delta_text=self.delta_text,
            delta_token_ids=self.delta_token_ids,
        )
        self.delta_text, self.delta_token_ids = "", []
        return RequestOutput(
            request_id=seq.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[completion],
            finished=self.finished,
            metrics=self.metrics,
            num_cached_tokens=seq.num_cached_tokens,
            error=self.error,
            # Not copied per output: an output follows a sampled token, so the whole prompt is
            # scored by then, and a preempted request's recompute adds nothing.
            prompt_logprobs=self.prompt_logprobs,
            embedding=self.pooler.result()
            if self.pooler is not None and self.seq.finish_reason == "stop"
            else None,
        )
