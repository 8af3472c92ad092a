"""POST /v1/embeddings in OpenAI's shape: `input` as a string, a list of strings, a list of token
ids or a list of such lists; `encoding_format` float or base64 (little-endian float32, as
OpenAI's SDK decodes it); `dimensions` where the model was trained for shortened vectors; and
`usage`. Each input is one engine request, batched with the others by the scheduler."""

import base64
import struct
import uuid
from typing import Annotated, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvpilot_common import trust
from kvpilot_common.errors import InvalidRequestError, OverloadedError
from kvpilot_common.http.auth import caller
from kvpilot_common.http.errors import from_exception
from kvpilot_common.metric_names import OUTCOME_ERROR, OUTCOME_REJECTED
from kvpilot_server.api.admission import Admission
from kvpilot_server.api.fanout import merge
from kvpilot_server.api.fields import Rule, check_extras, ignored_header
from kvpilot_server.api.generation import CLIENT_CLOSED, Accounting, unless_client_leaves
from kvpilot_server.api.metrics import ServerMetrics, api_of
from kvpilot_server.api.protocol import Body
from kvpilot_server.api.request_scope import exit_stack
from kvpilot_server.engine.runtime.async_engine import AsyncEngine
from kvpilot_server.engine.runtime.sequence import Tenant
from kvpilot_server.outputs import RequestOutput
from kvpilot_server.pooling_params import PoolingParams

# OpenAI's own limit on inputs per request; each input is also bounded by the context.
MAX_INPUTS = 2048
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]
Inputs = Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]
TokenInputs = TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]

REFUSED_EMBEDDINGS: dict[str, Rule] = {
    "truncate_prompt_tokens": (
        lambda v: v is None,
        "truncating inputs is not implemented: shorten the input",
    ),
}


class EmbeddingRequest(Body):
    input: Inputs | TokenInputs
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None  # accepted as OpenAI does; kvpilot keeps no per-user state

    def prompts(self) -> list[str | list[int]]:
        raw = self.input
        if isinstance(raw, str) or (raw and isinstance(raw[0], int)):
            return [raw]  # type: ignore[list-item]
        return list(raw)  # type: ignore[arg-type]


class Embeddings:
    def __init__(
        self, engine: AsyncEngine, admission: Admission, metrics: ServerMetrics, model: str
    ) -> None:
        self.engine, self.admission, self.metrics, self.model = engine, admission, metrics, model

    async def serve(self, request: Request, parsed: EmbeddingRequest) -> Response:
        headers = ignored_header(check_extras(parsed, REFUSED_EMBEDDINGS))
        request_id = f"embd-{uuid.uuid4().hex}"
        prompts = parsed.prompts()
        outputs: list[RequestOutput | None] = [None] * len(prompts)
        who = caller(request)
        api = api_of(request.url.path)
        done = Accounting(request_id, outputs, self.metrics, api, who=who, one_prompt=False)
        try:
            if self.engine.task != "embed":
                raise InvalidRequestError(
                    "This model generates text: it serves /v1/chat/completions and "
                    "/v1/completions, not /v1/embeddings",
                    "model",
                )
            params = PoolingParams(parsed.dimensions)
            ids = await self.engine.process(self._encode, prompts)
            # Released when the HTTP exchange ends, however it ends (as completions' are).
            resources = exit_stack(request)
            resources.enter_context(self.admission.admit(len(ids), who.tenant))
            sources = [
                self.engine.generate(
                    p, params, f"{request_id}-{i}", tenant=Tenant(who.tenant, who.weight)
                )
                for i, p in enumerate(ids)
            ]
            stream = self.admission.timed(merge(sources), self.admission.deadline(None))
            resources.push_async_callback(stream.aclose)

            async def collect() -> None:
                async for index, output in stream:
                    outputs[index] = output

            if not await unless_client_leaves(request, collect()):
                done(CLIENT_CLOSED, "abort")
                return Response(status_code=CLIENT_CLOSED)
        except Exception as exc:
            response = from_exception(exc)
            rejected = isinstance(exc, InvalidRequestError | OverloadedError)
            done(response.status_code, OUTCOME_REJECTED if rejected else OUTCOME_ERROR)
            return response
        done(200, None)
        finals: list[RequestOutput] = outputs  # type: ignore[assignment] - all finished
        if who.trusted:  # the gateway charges the tenant's tokens (kvpilot_common.trust)
            headers = {**(headers or {}), trust.USAGE_HEADER: str(done.tokens())}
        return JSONResponse(self._body(finals, parsed.encoding_format), headers=headers)

    def _encode(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """On a worker thread: every input's token ids, each checked against the context."""
        inputs, ids = self.engine.inputs, []
        for i, prompt in enumerate(prompts):
            try:
                tokens = inputs.encode(prompt)
                inputs.check_prompt_length(len(tokens))
            except InvalidRequestError as exc:
                where = "input" if len(prompts) == 1 else f"input.{i}"
                raise InvalidRequestError(str(exc), where) from None
            ids.append(tokens)
        return ids

    def _body(self, finals: list[RequestOutput], encoding: str) -> dict:
        data = []
        for index, output in enumerate(finals):
            vector = output.embedding or []
            if encoding == "base64":
                packed = struct.pack(f"<{len(vector)}f", *vector)
                embedding: list[float] | str = base64.b64encode(packed).decode("ascii")
            else:
                embedding = vector
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        tokens = sum(len(o.prompt_token_ids) for o in finals)
        return {
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
