"""Offline generation in the style of vLLM: `LLM(model=...).generate(prompts, params)`."""

import itertools
from collections.abc import Sequence as Seq

from tqdm import tqdm

from kvpilot_common.errors import StepFailedError
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.runtime.llm_engine import LLMEngine
from kvpilot_server.lora_request import LoRARequest
from kvpilot_server.outputs import RequestOutput
from kvpilot_server.pooling_params import PoolingParams
from kvpilot_server.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str = EngineConfig.model, **engine_args) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of the prompts. A bare token-id list counts as one prompt.
        `lora_request`: one adapter for all of them, or one (or None: the base) per prompt."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        adapters = (
            [lora_request] * len(prompts)
            if lora_request is None or isinstance(lora_request, LoRARequest)
            else list(lora_request)
        )
        ids = []
        for prompt, p, adapter in zip(prompts, params, adapters, strict=True):
            ids.append(f"gen-{next(self._ids)}")
            self.engine.add_request(ids[-1], prompt, p, lora=self._adapter(adapter))
        return self._run(ids, use_tqdm)

    def _adapter(self, request: LoRARequest | None) -> str | None:
        """The adapter's name, its files read first if the engine does not know it yet."""
        if request is None:
            return None
        lora = self.engine.lora
        if lora is None or request.lora_name not in lora.names:
            path = request.lora_path
            self.engine.add_adapter(self.engine.read_adapter(request.lora_name, path))
        return request.lora_name

    def embed(
        self, prompts: Prompt | Seq[Prompt], params: PoolingParams | None = None
    ) -> list[RequestOutput]:
        """An embedding model's vectors (`output.embedding`), in the order of the prompts."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        ids = []
        for prompt in prompts:
            ids.append(f"embed-{next(self._ids)}")
            self.engine.add_request(ids[-1], prompt, params or PoolingParams())
        return self._run(ids, use_tqdm=False)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Apply the model's chat template, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.engine.apply_chat_template(c) for c in conversations]
        return self.generate(prompts, params, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        """Raises StepFailedError if a whole step failed: outputs without their completions
        would pass for answers. A request that failed alone comes back with its error set."""
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Generating", unit="req", disable=not use_tqdm)
        try:
            while len(done) < len(ids):
                for output in self.engine.step():
                    if isinstance(output.error, StepFailedError):
                        raise output.error
                    if output.finished:
                        done[output.request_id] = output
                        bar.update()
        finally:
            bar.close()
            for request_id in set(ids) - set(done):
                self.engine.abort_request(request_id)
        return [done[i] for i in ids]
