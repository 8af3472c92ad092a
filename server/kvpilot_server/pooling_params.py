"""Per-request embedding settings (vLLM's PoolingParams): what an embedding request may choose
beyond its input. Validated against the model by the engine (engine/runtime/pooling.py)."""

from dataclasses import dataclass

from kvpilot_common.errors import InvalidRequestError


@dataclass(frozen=True)
class PoolingParams:
    # Matryoshka truncation: keep the first `dimensions` values, then normalize; only for
    # models trained for it (their config says so).
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and self.dimensions < 1:
            raise InvalidRequestError("dimensions must be at least 1", "dimensions")
