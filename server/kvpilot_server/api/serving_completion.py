"""/v1/completions: a text prompt (or token ids) from its body to the engine and back."""

from starlette.requests import Request
from starlette.responses import Response

from kvpilot_server.api.completions import Completions
from kvpilot_server.api.fields import REFUSED_COMPLETIONS, check_extras, ignored_header
from kvpilot_server.api.prompts import text_prompt
from kvpilot_server.api.protocol import CompletionRequest
from kvpilot_server.api.serving import Intake


class ServingCompletion:
    def __init__(self, intake: Intake, completions: Completions) -> None:
        self.intake, self.completions = intake, completions

    async def create(self, request: Request) -> Response:
        parsed = await self.intake.parse(request, CompletionRequest)
        self.intake.generating()
        headers = ignored_header(check_extras(parsed, REFUSED_COMPLETIONS))
        engine = self.intake.engine
        prompt = await engine.process(text_prompt, engine.inputs, parsed.prompt, parsed.max_tokens)
        lora = self.intake.adapters.resolve(parsed.model)
        self.intake.continuing(request, parsed)
        return await self.completions.serve(
            request, parsed, prompt, chat=False, headers=headers, lora=lora
        )
