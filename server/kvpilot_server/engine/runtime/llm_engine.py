"""The synchronous engine: admit requests, run steps, hand back outputs.

One step = schedule -> run the model -> sample -> the scheduler's update (tokens computed, full
blocks keyed, sampled tokens appended) -> detokenize/stop checks. A failure confined to one
request fails that request only; a failure of the whole step fails the requests in it with a
StepFailedError and the engine goes on with the rest.
"""

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from kvpilot_common.errors import (
    AdapterError,
    InvalidRequestError,
    ModelLoadError,
    StepFailedError,
)
from kvpilot_common.step_memory import GRAPH_SCRATCH_BLOCKS
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.distributed.group import SINGLE
from kvpilot_server.engine.distributed.sharding import check
from kvpilot_server.engine.distributed.workers import Workers, tensor_parallel_size
from kvpilot_server.engine.layers import kv_cache
from kvpilot_server.engine.lora.adapter import LoraAdapter, load_adapter
from kvpilot_server.engine.lora.slots import LoraSlots
from kvpilot_server.engine.models.loader import load_hf_config
from kvpilot_server.engine.models.model_config import ModelConfig
from kvpilot_server.engine.models.model_setup import (
    build_model,
    count_blocks,
    cpu_kernel,
    describe_device,
    device_limits,
    dtype_name,
    resolve_device,
    resolve_dtype,
)
from kvpilot_server.engine.runtime import cuda_graphs, pooling, speculative
from kvpilot_server.engine.runtime.block_pool import BlockPool
from kvpilot_server.engine.runtime.detokenizer import Detokenizer
from kvpilot_server.engine.runtime.inputs import InputProcessor
from kvpilot_server.engine.runtime.model_runner import ModelRunner
from kvpilot_server.engine.runtime.request import Request
from kvpilot_server.engine.runtime.sampler import Sampler
from kvpilot_server.engine.runtime.scheduler import Scheduler
from kvpilot_server.engine.runtime.sequence import ANONYMOUS, Priority, Sequence, Tenant
from kvpilot_server.engine.structured.grammar import GrammarCompiler
from kvpilot_server.engine.structured.masks import MaskWorker, StepMasks
from kvpilot_server.models.resolve import resolve_model
from kvpilot_server.outputs import RequestMetrics, RequestOutput, Sample
from kvpilot_server.pooling_params import PoolingParams
from kvpilot_server.sampling_params import SamplingParams

# An embedding's sequence samples nothing; the scheduler and runner read these defaults.
_POOLED = SamplingParams(max_tokens=1)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot: the engine thread makes a new one after each step, readers never see it
    change (a list being sorted in place reads as empty from another thread)."""

    running: dict[Priority, int]
    waiting: dict[Priority, int]
    kv_cache_usage: float
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    # Prompt tokens the model computed: cache hits excluded, recomputation after preemption in.
    num_prefill_tokens: int = 0
    speculation: "speculative.Counts" = field(default_factory=lambda: speculative.Counts())
    # LoRA: the adapters loaded, and those with sequences running or waiting (names, sorted).
    adapters: tuple[str, ...] = ()
    adapters_resident: tuple[str, ...] = ()  # in a slot now
    adapters_running: tuple[str, ...] = ()
    adapters_waiting: tuple[str, ...] = ()


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        # Decided and said before anything is built or compiled.
        self.device = resolve_device(config.device)
        log.info("device %s: %s", config.device, describe_device(self.device))
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.dtype_name = dtype_name(config.dtype, self.device)  # auto resolved; ranks get it
        meaning = self.dtype_name
        if str(self.dtype) != f"torch.{meaning}":  # bfloat16 on CPU: layers/half_matrices.py
            meaning += " matrices; float32 activations and KV cache"
        log.info("dtype %s: %s", config.dtype, meaning)
        path = self.model_path = resolve_model(config.model)
        size = tensor_parallel_size(config, self.device)
        # Checked before any worker starts: a size that cannot split the model is a config error.
        hf = load_hf_config(path)
        self.full_cfg = ModelConfig.from_hf(hf)  # the whole model's: adapters are checked on it
        limits = config.settle_limits(
            device_limits(self.device, self.dtype, self.full_cfg, config.kv_cache_dtype)
        )
        log.info(
            "batch limits: %d sequences, %d tokens a step; KV cache blocks of %d tokens",
            limits.max_num_seqs,
            limits.max_num_batched_tokens,
            limits.block_size,
        )
        check(self.full_cfg, size)
        self.task, self.pooling = pooling.resolve(path, config.task, hf.to_dict())
        if self.pooling is not None:  # a cached block's hidden states are never computed
            config.enable_prefix_caching = False
        self.workers = (
            Workers(config, size, path, self.device, self.dtype_name) if size > 1 else None
        )
        try:
            self._build(config, path)
        except BaseException:
            self.close()
            raise

    def _build(self, config: EngineConfig, path) -> None:
        tp = SINGLE if self.workers is None else self.workers.tp
        self.model = build_model(config, path, self.dtype, self.device, tp)
        self.model.pools = self.pooling is not None
        self.tokenizer: PreTrainedTokenizerBase = _tokenizer(path)
        cfg = self.model.cfg
        if config.max_model_len is None:
            config.max_model_len = cfg.max_position_embeddings
        self.max_model_len = config.max_model_len
        num_blocks = count_blocks(config, self.model, self.dtype, self.device, tp)
        if self.workers is not None:
            self.workers.ready = True  # they now wait for plans (or the stop)
        graphs = cuda_graphs.wanted(self.device, config.enforce_eager)
        # The last blocks: the graphs' padding rows' (plans count them out too).
        pooled = num_blocks - GRAPH_SCRATCH_BLOCKS if graphs else num_blocks
        config.check_against_model(cfg.max_position_embeddings, pooled)
        self.pool = BlockPool(pooled, config.block_size, config.enable_prefix_caching)
        self.lora = None
        if self.model.lora is not None:
            self.lora = LoraSlots(self.model.lora[1], self.model.lora[0], config.max_loras)
        self.scheduler = Scheduler(config, self.pool, self.lora)
        self.speculation = speculative.Counts()
        if self.scheduler.proposer is not None:
            drafts = self.scheduler.proposer
            log.info(
                "speculative decoding: %s, up to %d draft tokens from the last %d..%d tokens "
                "looked up, none while more than %d sequences run",
                config.speculative,
                drafts.num_tokens,
                drafts.lookup_max,
                drafts.lookup_min,
                config.speculative_disable_by_batch_size,
            )
        cache = kv_cache.allocate(
            cfg, self.dtype, self.device, num_blocks, config.block_size, config.kv_cache_dtype
        )
        kernel = cpu_kernel(self.device, self.dtype, cfg.head_dim)
        self.runner = ModelRunner(
            self.model,
            cache,
            config.block_size,
            self.max_model_len,
            kernel,
            self.workers,
            self.lora,
        )
        if graphs:
            self.runner.graphs = cuda_graphs.build(
                self.runner, config.max_num_seqs, self.max_model_len, scratch_block=pooled
            )
        self.sampler = Sampler(cfg.eos_token_ids, config.seed)
        self.inputs = InputProcessor(self.tokenizer, cfg.vocab_size, self.max_model_len)
        self.grammars = GrammarCompiler(self.tokenizer, cfg.vocab_size, cfg.eos_token_ids)
        self.masks = MaskWorker(cfg.vocab_size)
        self.requests: dict[str, Request] = {}

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (from the thread that steps the engine)."""
        if self.workers is not None:
            self.workers.close()
        if hasattr(self, "masks"):
            self.masks.close()

    # -- requests -----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | PoolingParams,
        priority: Priority = Priority.INTERACTIVE,
        arrival_time: float | None = None,
        lora: str | None = None,  # a loaded adapter's name; None: the base model
        tenant: Tenant = ANONYMOUS,
    ) -> None:
        if request_id in self.requests:
            raise InvalidRequestError(f"Request id {request_id!r} is already in use")
        wanted = "embed" if isinstance(params, PoolingParams) else "generate"
        if wanted != self.task:
            raise InvalidRequestError(
                f"This model serves {self.task} requests, not {wanted} ones"
                + (" (/v1/embeddings)" if self.task == "embed" else "")
            )
        if lora is not None and (self.lora is None or lora not in self.lora.names):
            raise AdapterError(f"no LoRA adapter named {lora!r} is loaded")
        token_ids = self.inputs.encode(prompt)
        if isinstance(params, PoolingParams):
            seq = Sequence(request_id, token_ids, _POOLED, 0, priority, pooled=True, tenant=tenant)
            self._add_embedding(seq, prompt, params, arrival_time)
            self._use_adapter(request_id, lora)
            return
        max_tokens = self.inputs.max_tokens(len(token_ids), params)
        if params.logit_bias:
            self.inputs.check_ids(list(params.logit_bias), "logit_bias")
        structured = params.structured_outputs
        # The server compiled it off this thread already; the offline LLM compiles here.
        grammar = self.grammars.compile(structured) if structured is not None else None
        seq = Sequence(request_id, token_ids, params, max_tokens, priority, tenant=tenant)
        # Drafts are checked one position at a time by the sampler; a grammar's mask is
        # computed for the next position only.
        seq.speculate = grammar is None
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        request = Request(
            seq=seq,
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=list(token_ids),
            detokenizer=Detokenizer(
                self.tokenizer,
                token_ids,
                params.stop,
                params.include_stop_str_in_output,
                params.skip_special_tokens,
            ),
            eos_token_ids=self.sampler.eos_token_ids,
            max_model_len=self.max_model_len,
            metrics=RequestMetrics(arrival_time=seq.arrival_time),
            logprobs=[] if params.logprobs is not None else None,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
            matcher=grammar.matcher() if grammar is not None else None,
        )
        if params.continue_from:
            self._continue(request, list(params.continue_from))
        self.requests[request_id] = request
        self._use_adapter(request_id, lora)
        self.scheduler.add(seq)

    def _continue(self, request: Request, output: list[int]) -> None:
        """A generation taken over after `output` (another replica's, cut short): the tokens
        become the sequence's first outputs, as if sampled here (the budget, penalties, the
        grammar and stop strings see them), their text counted as already sent."""
        self.inputs.check_ids(output, "continue_from")
        seq = request.seq
        if len(seq) + len(output) >= min(self.max_model_len, len(seq) + seq.max_tokens):
            raise InvalidRequestError(
                "continue_from: the tokens already generated leave no budget to continue",
                "continue_from",
            )
        for token in output:
            seq.token_ids.append(token)
            request.replay(token)

    def _use_adapter(self, request_id: str, lora: str | None) -> None:
        """Give the request's sequence its adapter (checked last: nothing else can refuse it)."""
        if lora is not None:
            assert self.lora is not None
            self.requests[request_id].seq.adapter = self.lora.use(lora)

    def _add_embedding(self, seq: Sequence, prompt, params, arrival_time) -> None:
        assert self.pooling is not None
        self.pooling.check(params)
        self.inputs.check_prompt_length(len(seq))
        request_id, token_ids = seq.request_id, seq.token_ids
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        self.requests[request_id] = Request(
            seq=seq,
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=list(token_ids),
            detokenizer=Detokenizer(self.tokenizer, token_ids, [], False, True),
            eos_token_ids=[],
            max_model_len=self.max_model_len,
            metrics=RequestMetrics(arrival_time=seq.arrival_time),
            pooler=pooling.Pooler(self.pooling, params),
        )
        self.scheduler.add(seq)

    # -- LoRA adapters ------------------------------------------------------------------------

    def read_adapter(self, name: str, path: str) -> LoraAdapter:
        """Read and check an adapter's files (any thread: it touches no engine state)."""
        if self.lora is None:
            raise AdapterError("this server serves no LoRA adapters (start it with --enable-lora)")
        tp = SINGLE if self.workers is None else self.workers.tp
        dense = self.full_cfg.experts is None
        return load_adapter(name, path, self.full_cfg, self.config.max_lora_rank, dense, tp)

    def add_adapter(self, adapter: LoraAdapter) -> None:
        assert self.lora is not None
        self.lora.add(adapter)

    def remove_adapter(self, name: str) -> None:
        if self.lora is None:
            raise AdapterError("this server serves no LoRA adapters (start it with --enable-lora)")
        self.lora.remove(name)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return self.inputs.chat(messages)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        request = self.requests.get(request_id)
        if request is None:
            return None
        request.finish("abort")
        return self._release(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- steps --------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        batch = scheduled.num_new_tokens
        if not batch:
            return []
        now = time.monotonic()
        for seq in batch:
            metrics = self.requests[seq.request_id].metrics
            metrics.first_scheduled_time = metrics.first_scheduled_time or now
        pending = self._start_masks(scheduled.num_new_tokens)
        try:
            logits, sampling, drafted, prompt_rows = self.runner.run(scheduled)
            masks = pending.result() if pending is not None else None
            samples = self.sampler.sample(logits[: len(sampling)], sampling, masks)
            # Each sampling sequence's new tokens (several where a draft was accepted).
            results: list[tuple[Sequence, list[Sample] | Exception]] = [
                (seq, s if isinstance(s, Exception) else [s])
                for seq, s in zip(sampling, samples, strict=True)
            ]
            for seq, rows in drafted:
                draft = list(scheduled.drafts[seq])
                results.append((seq, speculative.verify(self.sampler, logits[rows], seq, draft)))
            pooled = []
            for seq, rows, first in prompt_rows:
                if seq.pooled:
                    self.requests[seq.request_id].pool(logits[rows], first)
                    pooled.append(seq)
                    continue
                targets = seq.token_ids[first : first + rows.stop - rows.start]
                k = seq.params.prompt_logprobs or 0
                found = self.sampler.prompt_logprobs(logits[rows], targets, k)
                self.requests[seq.request_id].add_prompt_logprobs(first, found)
            tokens = {
                seq: [s.token_id for s in new]
                for seq, new in results
                if not isinstance(new, Exception)
            }
            self.scheduler.update(scheduled, tokens)
            self.speculation.count(scheduled.drafts, tokens)
        except Exception as exc:  # the whole step failed: fail its requests, keep serving
            log.exception("engine step failed; failing %d requests", len(batch))
            error = StepFailedError(f"Engine step failed: {exc}")
            error.__cause__ = exc
            return [self._fail(self.requests[s.request_id], error) for s in batch]
        outputs = []
        for seq in pooled:
            request = self.requests[seq.request_id]
            if seq.num_computed_tokens == len(seq):
                request.finish("stop")
                outputs.append(self._release(request))
        for seq, new in results:
            request = self.requests[seq.request_id]
            try:
                if isinstance(new, Exception):
                    raise new
                # The request takes its tokens one at a time, each seeing the sequence as it
                # was then: a stop (end of text, stop string, length) drops those after it.
                del seq.token_ids[len(seq) - len(new) :]
                for sample in new:
                    seq.token_ids.append(sample.token_id)
                    request.append(sample)
                    if request.finished:
                        break
            except Exception as exc:  # confined to this request
                log.exception("request %s failed", seq.request_id)
                outputs.append(self._fail(request, exc))
                continue
            outputs.append(self._release(request) if request.finished else request.take_output())
        return outputs

    def _start_masks(self, batch: Mapping[Sequence, int]) -> "Future[StepMasks] | None":
        """The masks of the constrained sequences that sample this step, computed while the
        model runs."""
        matchers = {}
        for seq, n in batch.items():
            matcher = self.requests[seq.request_id].matcher
            if matcher is not None and seq.num_computed_tokens + n == len(seq):
                matchers[seq.seq_id] = matcher
        return self.masks.start(matchers) if matchers else None

    def fail_all(self, exc: Exception) -> list[RequestOutput]:
        return [self._fail(request, exc) for request in list(self.requests.values())]

    def _fail(self, request: Request, exc: Exception) -> RequestOutput:
        request.error = exc
        request.finish("error")
        return self._release(request)

    def _release(self, request: Request) -> RequestOutput:
        self.scheduler.remove(request.seq)
        if request.seq.adapter:
            self.lora.done(request.seq.adapter)  # type: ignore[union-attr]
        del self.requests[request.seq.request_id]
        return request.take_output()

    def stats(self) -> EngineStats:
        running = {p: 0 for p in Priority}
        for seq in self.scheduler.running:
            running[seq.priority] += 1
        return EngineStats(
            running=running,
            waiting={p: self.scheduler.num_waiting(p) for p in Priority},
            kv_cache_usage=self.pool.usage(),
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=self.pool.num_queries,
            prefix_cache_hits=self.pool.num_hits,
            num_prefill_tokens=self.scheduler.num_prefill_tokens,
            speculation=self.speculation.snapshot(),
            **self._adapter_stats(),
        )

    def _adapter_stats(self) -> dict[str, tuple[str, ...]]:
        if self.lora is None:
            return {}
        adapters = self.lora.adapters

        def names(seqs) -> tuple[str, ...]:
            return tuple(sorted({adapters[s.adapter].name for s in seqs if s.adapter}))

        waiting = list(self.scheduler.waiting)
        return {
            "adapters": tuple(self.lora.known()),
            "adapters_resident": tuple(self.lora.resident()),
            "adapters_running": names(self.scheduler.running),
            "adapters_waiting": names(waiting),
        }


def _tokenizer(path) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot load the tokenizer in {path}: {exc}") from exc
