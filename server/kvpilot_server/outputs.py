"""What the engine hands back: vLLM-shaped request and completion outputs, plus usage. Plain
data without torch, so the HTTP side's formatting and metrics can be read without the engine."""

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One chosen token, with its logprob and best alternatives when they were asked for."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None  # best first, as OpenAI returns them


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    stop_reason: int | str | None = None  # the stop string or stop token that ended it
    logprobs: list[Sample] | None = None
    delta_text: str = ""  # what this output adds to the previous one of the same request
    delta_token_ids: list[int] = field(default_factory=list)


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    # Gap before each token after the first: the per-token ITL histogram is fed from these.
    inter_token_latencies: list[float] = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    error: Exception | None = None  # set when this request failed on its own
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None for the first.
    prompt_logprobs: list[Sample | None] | None = None
    embedding: list[float] | None = None  # an embedding request's vector, once finished

    @property
    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=len(self.prompt_token_ids),
            completion_tokens=sum(len(o.token_ids) for o in self.outputs),
            cached_tokens=self.num_cached_tokens,
        )
