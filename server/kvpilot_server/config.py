"""Engine configuration: one dataclass, checked at start so bad combinations fail early."""

from dataclasses import dataclass

from kvpilot_common import batch_limits, precision
from kvpilot_common import speculative as drafts
from kvpilot_common.errors import ConfigError
from kvpilot_common.naming import BUNDLED_MODEL

GiB = 1 << 30
# What a model serves: auto reads the checkpoint (engine/runtime/pooling.py says how).
TASKS = ("auto", "generate", "embed")


@dataclass
class EngineConfig:
    model: str = BUNDLED_MODEL
    dtype: str = precision.DEFAULT_DTYPE  # auto: precision.resolve_dtype picks per device
    device: str = "auto"
    # None: chosen from the device once it is known (kvpilot_common.batch_limits; settle_limits).
    block_size: int | None = None
    # KV cache size: bytes on CPU; fraction of free device memory on CUDA.
    kv_cache_bytes: int = 2 * GiB
    kv_cache_memory_fraction: float = 0.9
    max_model_len: int | None = None  # None: the model's own limit
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    # CUDA: decode steps replay graphs captured per batch size (engine/runtime/cuda_graphs.py);
    # True runs every step eagerly (vLLM's name).
    enforce_eager: bool = False
    quantization: str = precision.DEFAULT_QUANTIZATION
    # int4 only: weights per scale and minimum (why 32 by default: precision.py).
    quantization_group_size: int = precision.INT4_DEFAULT_GROUP_SIZE
    kv_cache_dtype: str = precision.DEFAULT_KV_CACHE_DTYPE
    # lm_head (and the embedding table when tied to it): none or int8 per vocabulary row.
    lm_head_quantization: str = precision.DEFAULT_LM_HEAD_QUANTIZATION
    seed: int = 0
    # Ranks one replica spans (engine/distributed/); None: every visible GPU on CUDA, 1 on CPU.
    tensor_parallel_size: int | None = None
    task: str = "auto"
    # LoRA adapters (engine/lora/): slots for this many at once, each of rank up to this.
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    # Speculative decoding: draft tokens looked up in the sequence's own text, verified in one
    # pass (engine/runtime/speculative.py).
    speculative: str = drafts.DEFAULT_METHOD  # none or ngram (prompt lookup)
    num_speculative_tokens: int = drafts.DEFAULT_NUM_TOKENS
    prompt_lookup_max: int = drafts.DEFAULT_LOOKUP_MAX
    prompt_lookup_min: int = drafts.DEFAULT_LOOKUP_MIN
    speculative_disable_by_batch_size: int = drafts.DEFAULT_DISABLE_BY_BATCH_SIZE

    def __post_init__(self) -> None:
        rules = [
            (_unset_or_positive(self.block_size), "block_size must be at least 1"),
            (self.kv_cache_bytes > 0, "kv_cache_bytes must be positive"),
            (
                0.0 < self.kv_cache_memory_fraction <= 1.0,
                "kv_cache_memory_fraction must be in (0, 1]",
            ),
            (_unset_or_positive(self.max_num_seqs), "max_num_seqs must be at least 1"),
            (
                self.tensor_parallel_size is None or self.tensor_parallel_size >= 1,
                "tensor_parallel_size must be at least 1",
            ),
            (self.max_loras >= 1, "max_loras must be at least 1"),
            (self.max_lora_rank >= 1, "max_lora_rank must be at least 1"),
            (
                _unset_or_positive(self.max_num_batched_tokens),
                "max_num_batched_tokens must be at least 1",
            ),
            (self.max_model_len is None or self.max_model_len >= 2, "max_model_len must be >= 2"),
            (self.dtype in precision.DTYPES, f"unknown dtype {self.dtype!r}"),
            (self.task in TASKS, f"task {self.task!r} is not one of {', '.join(TASKS)}"),
            (
                self.speculative in drafts.METHODS,
                f"speculative {self.speculative!r} is not one of {', '.join(drafts.METHODS)}",
            ),
            (self.num_speculative_tokens >= 1, "num_speculative_tokens must be at least 1"),
            (
                1 <= self.prompt_lookup_min <= self.prompt_lookup_max,
                "prompt_lookup_min must be at least 1 and at most prompt_lookup_max",
            ),
            (
                self.speculative_disable_by_batch_size >= 1,
                "speculative_disable_by_batch_size must be at least 1",
            ),
            (
                self.quantization in precision.QUANTIZATIONS,
                f"quantization {self.quantization!r} is not supported "
                f"({', '.join(precision.QUANTIZATIONS)})",
            ),
            (
                self.quantization_group_size in precision.INT4_GROUP_SIZES,
                f"quantization_group_size must be {_one_of(precision.INT4_GROUP_SIZES)}",
            ),
            # fp8 also needs a capable GPU: checked once the device is known
            # (engine/layers/kv_cache.py).
            (
                self.kv_cache_dtype in precision.KV_CACHE_DTYPES,
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported "
                f"({', '.join(precision.KV_CACHE_DTYPES)})",
            ),
            (
                self.lm_head_quantization in precision.LM_HEAD_QUANTIZATIONS,
                f"lm_head_quantization {self.lm_head_quantization!r} is not supported "
                f"({', '.join(precision.LM_HEAD_QUANTIZATIONS)}: int8 per vocabulary row)",
            ),
        ]
        for ok, message in rules:
            if not ok:
                raise ConfigError(message)

    def settle_limits(self, chosen: batch_limits.BatchLimits) -> batch_limits.BatchLimits:
        """Fills the batch limits and block size left unset with `chosen` (the device's:
        batch_limits.defaults), before anything reads them; returns them."""
        limits = batch_limits.settle(
            chosen,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size,
        )
        self.max_num_seqs = limits.max_num_seqs
        self.max_num_batched_tokens = limits.max_num_batched_tokens
        self.block_size = limits.block_size
        return limits

    def check_against_model(self, model_max_len: int, num_blocks: int) -> None:
        """Checks that need the model and the cache size, run once they are known."""
        assert self.max_model_len is not None and self.block_size is not None
        if self.max_model_len > model_max_len:
            raise ConfigError(
                f"max_model_len {self.max_model_len} exceeds the model's limit of {model_max_len}"
            )
        if num_blocks * self.block_size < self.max_model_len:
            raise ConfigError(
                f"KV cache holds {num_blocks * self.block_size} tokens ({num_blocks} blocks of "
                f"{self.block_size}), fewer than one sequence of max_model_len "
                f"{self.max_model_len}: raise the KV cache size or lower max_model_len"
            )


def _unset_or_positive(value: int | None) -> bool:
    return value is None or value >= 1


def _one_of(values: tuple[int, ...]) -> str:
    """(32, 64, 128) -> '32, 64 or 128'."""
    *head, last = map(str, values)
    return f"{', '.join(head)} or {last}" if head else last
