"""/v1/chat/completions: a chat request from its body to the engine and back. The Responses and
Messages APIs translate their requests into the same `ChatCompletionRequest` and share
`prepare` (prompt, tools, reasoning, constraints, adapter); only their wire shapes differ."""

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from kvpilot_server.api.adapters import Adapters
from kvpilot_server.api.assistant import ChatShape, ChatTemplate, chat_shape
from kvpilot_server.api.completions import Completions
from kvpilot_server.api.fields import REFUSED_CHAT, check_extras, ignored_header
from kvpilot_server.api.prompts import ContextOverflow, chat_prompt
from kvpilot_server.api.protocol import ChatCompletionRequest
from kvpilot_server.api.serving import Intake
from kvpilot_server.engine.runtime.async_engine import AsyncEngine

TRUNCATED_HEADER = "X-KVPilot-Dropped-Messages"


@dataclass
class ChatInput:
    """A chat request made ready for the engine."""

    prompt: list[int]
    shape: ChatShape  # how the output is read: content, reasoning, tool calls
    lora: str | None
    headers: dict[str, str]


class ServingChat:
    def __init__(
        self,
        intake: Intake,
        completions: Completions,
        adapters: Adapters,
        template: ChatTemplate,
        overflow: ContextOverflow,
    ) -> None:
        self.intake, self.completions, self.adapters = intake, completions, adapters
        self.template, self.overflow = template, overflow
        self.engine: AsyncEngine = intake.engine

    async def create(self, request: Request) -> Response:
        parsed = await self.intake.parse(request, ChatCompletionRequest)
        headers = ignored_header(check_extras(parsed, REFUSED_CHAT))
        ready = await self.prepare(request, parsed, headers)
        return await self.completions.serve(
            request,
            parsed,
            ready.prompt,
            chat=True,
            headers=ready.headers,
            shape=ready.shape,
            lora=ready.lora,
        )

    async def prepare(
        self,
        request: Request,
        parsed: ChatCompletionRequest,
        headers: dict[str, str],
        overflow: ContextOverflow | None = None,  # the request's own policy; None: the server's
    ) -> ChatInput:
        """The prompt under the context policy, the output's shape and the constraint its
        tools, format and reasoning make (set on `parsed`)."""
        self.intake.generating()
        inputs = self.engine.inputs
        plan = parsed.tool_plan()
        messages, tools = self.template.prompt_messages(parsed.template_messages(), plan)
        prompt, dropped = await self.engine.process(
            chat_prompt,
            inputs,
            messages,
            parsed.requested_tokens,
            overflow or self.overflow,
            tools,
            parsed.template_kwargs(),
        )
        if dropped is not None:
            headers = {**headers, TRUNCATED_HEADER: str(dropped)}
        shape = chat_shape(self.template, plan, inputs.tokenizer.decode(prompt[-8:]))
        reasoning = self.template.reasoning
        parsed.constrain(
            shape.tools,
            plan,
            (reasoning.start, reasoning.end) if reasoning is not None else None,
            shape.opened,
        )
        lora = self.adapters.resolve(parsed.model)
        self.intake.continuing(request, parsed)
        return ChatInput(prompt, shape, lora, headers)
