"""Request bodies of the OpenAI-compatible API, validated by pydantic, and their engine mapping."""

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kvpilot_common.errors import InvalidRequestError
from kvpilot_server.api.chat import ChatMessage, ToolFields, ToolPlan
from kvpilot_server.api.structured import StructuredFields
from kvpilot_server.api.tools.formats import ToolFormat
from kvpilot_server.api.tools.grammar import tools_grammar
from kvpilot_server.engine.runtime.sequence import Priority
from kvpilot_server.sampling_params import SamplingParams, StructuredOutputsParams

PositiveInt = Annotated[int, Field(ge=1)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]
MAX_CHOICES = 16
# Stop strings are matched after every token of every choice, so their number and length are
# bounded (docs/limits.md). OpenAI allows 4; clients of self-hosted models often send a model's
# several end markers, so 16.
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_LOGIT_BIAS = 300  # OpenAI's limit too


def _check_stop(stop: str | list[str] | None) -> str | list[str] | None:
    strings = [stop] if isinstance(stop, str) else stop or []
    if len(strings) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_LENGTH for s in strings):
        raise PydanticCustomError(
            "stop_limit",
            "at most {count} stop strings of at most {length} characters each "
            "(got {got} strings, the longest {longest} characters)",
            {
                "count": MAX_STOP_STRINGS,
                "length": MAX_STOP_LENGTH,
                "got": len(strings),
                "longest": max(map(len, strings)),
            },
        )
    return stop


_STOP_STRING = {"type": "string", "maxLength": MAX_STOP_LENGTH}
# The limits in /openapi.json too, so clients and the fuzzer see them.
_STOP_SCHEMA = {
    "anyOf": [
        _STOP_STRING,
        {"type": "array", "items": _STOP_STRING, "maxItems": MAX_STOP_STRINGS},
        {"type": "null"},
    ],
    "default": None,
}


class Body(BaseModel):
    """Strict types, as OpenAI's API: "5" is not a number and 0 is not false. Unknown fields are
    kept aside for fields.check_extras: refused if they would change the answer, else ignored
    and named in the response, so clients written for newer OpenAI features still work. A
    field sent as null that has no null value of its own is absent, as OpenAI reads it: clients
    send nulls for what they leave unset (openai-agents' parallel_tool_calls)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        # Where null is one of the field's own values it stays: a completion's max_tokens null
        # is "up to the context", as in vLLM (and as the gateway reserves for it).
        if isinstance(data, dict):
            fields = cls.model_fields
            return {
                key: value
                for key, value in data.items()
                if value is not None or (key in fields and _takes_null(fields[key].annotation))
            }
        return data


def _takes_null(annotation: Any) -> bool:
    return annotation is type(None) or any(_takes_null(arg) for arg in get_args(annotation))


class StreamOptions(Body):
    include_usage: bool = False


class Continuation(Body):
    """kvpilot_continue: the gateway's takeover of a stream whose replica failed. The output
    tokens the client already has, and the response's id and created, which the rest keeps."""

    token_ids: list[Annotated[int, Field(ge=0)]]  # none yet: only the role chunk went out
    id: Annotated[str, Field(min_length=1, max_length=128)]
    created: Annotated[int, Field(ge=0)]


class SamplingFields(Body, StructuredFields):
    """Fields shared by chat and text completions (OpenAI's, plus vLLM's extras)."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stop: Annotated[
        str | list[str] | None, AfterValidator(_check_stop), WithJsonSchema(_STOP_SCHEMA)
    ] = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    top_k: int = -1
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0)] = 1.0
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    service_tier: Literal["auto", "default", "flex"] | None = None
    # Seconds; --request-timeout is the ceiling: a request may shorten its deadline, not extend it.
    timeout: Annotated[float, Field(gt=0.0)] | None = None
    priority: int = 0  # vLLM semantics, lower is more important: above 0 selects the batch class
    # Token id (as a string, OpenAI's JSON) -> a bias added to its logit before sampling.
    logit_bias: Annotated[dict[str, Bias], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    # vLLM's: each choice carries its token ids (a stream chunk: the ones its text came from),
    # and the response its prompt's.
    return_token_ids: bool = False
    # kvpilot's own, honoured only with the gateway secret (kvpilot_common/trust.py).
    kvpilot_continue: Continuation | None = None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=stop,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            logit_bias=self._logit_bias(),
            structured_outputs=self.structured_spec(),
            continue_from=tuple(self.kvpilot_continue.token_ids) if self.kvpilot_continue else (),
        )

    def _logit_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        try:
            return {int(token): bias for token, bias in self.logit_bias.items()}
        except ValueError:
            raise InvalidRequestError(
                "logit_bias keys must be token ids (integers as strings)", "logit_bias"
            ) from None

    def scheduling_class(self) -> Priority:
        batch = self.service_tier == "flex" or self.priority > 0
        return Priority.BATCH if batch else Priority.INTERACTIVE

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields, ToolFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # Set by the route once the prompt is known (constrain()).
    _tools_grammar: str | None = PrivateAttr(None)
    _reasoning: tuple[str, str] | None = PrivateAttr(None)
    _reasoning_opened: bool = PrivateAttr(False)

    def template_messages(self) -> list[dict]:
        return [m.template_message(f"messages.{i}") for i, m in enumerate(self.messages)]

    def constrain(
        self,
        tools: ToolFormat | None,
        plan: ToolPlan | None,
        reasoning: tuple[str, str] | None,
        opened: bool,
    ) -> None:
        """What the model's template adds to the constraint: the grammar of calls in its tool
        format (a JSON response format folded in: the answer that calls nothing follows it), and
        thinking before the answer that the constraint must leave free."""
        grammar = None
        if tools is not None and plan is not None:
            answer = self.json_answer()  # first: a constraint no call can sit beside is a 400
            answer = None if plan.forced else answer  # a forced call is the whole output
            grammar = tools_grammar(tools, plan.offered, plan.forced, plan.parallel, answer)
        self._tools_grammar, self._reasoning, self._reasoning_opened = grammar, reasoning, opened

    def structured_spec(self) -> StructuredOutputsParams | None:
        if self._tools_grammar is not None:  # the response format, if any, is in it
            spec: StructuredOutputsParams | None = StructuredOutputsParams(
                lark=self._tools_grammar, source="tools"
            )
        else:
            spec = super().structured_spec()
        if spec is not None and self._reasoning is not None:
            spec.reasoning, spec.reasoning_opened = self._reasoning, self._reasoning_opened
        return spec

    def engine_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs: true", "top_logprobs")
        k = (self.top_logprobs or 0) if self.logprobs else None
        return self.sampling_params(self.requested_tokens, k)

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    max_tokens: PositiveInt | None = 16  # OpenAI's default for completions
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] = False

    def engine_params(self) -> SamplingParams:
        return self.sampling_params(self.max_tokens, self.logprobs)


class TokenizeRequest(Body):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]
