"""Exceptions the engine raises for bad input; the HTTP layer maps them to OpenAI-shaped errors."""


class KvpilotError(Exception):
    """Base class for every error kvpilot raises on purpose."""


class InvalidRequestError(KvpilotError, ValueError):
    """A request's parameters are invalid (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class AdapterError(InvalidRequestError):
    """A LoRA adapter cannot be loaded or used: its files, its config, or its fit to the base
    model or to the server's limits (HTTP 400; at start, the server refuses to start)."""


class ContextOverflowError(InvalidRequestError):
    """Prompt plus requested completion does not fit the model's context (HTTP 400)."""

    def __init__(
        self, max_model_len: int, prompt_tokens: int, max_tokens: int | None, at_least: bool = False
    ) -> None:
        # at_least: the prompt was refused from its length in characters, before tokenizing.
        count = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        if max_tokens is None:
            message = (
                f"This model's maximum context length is {max_model_len} tokens, "
                f"but the prompt has {count} tokens, leaving no room for a completion."
            )
        else:
            message = (
                f"This model's maximum context length is {max_model_len} tokens. "
                f"However, you requested {'at least ' if at_least else ''}"
                f"{prompt_tokens + max_tokens} tokens "
                f"({count} in the prompt, {max_tokens} for the completion). "
                "Please reduce the prompt or max_tokens."
            )
        super().__init__(message, param="messages")
        self.max_model_len = max_model_len
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens


class ConfigError(KvpilotError, ValueError):
    """The engine configuration is invalid or inconsistent; raised at start."""


class ModelLoadError(KvpilotError):
    """The model could not be found or loaded (missing path, corrupt weights)."""


class UnsupportedArchitectureError(ModelLoadError):
    """The checkpoint's architecture has no kvpilot implementation."""

    def __init__(self, architecture: str, supported: list[str]) -> None:
        super().__init__(
            f"Unsupported model architecture {architecture!r}. "
            f"kvpilot supports: {', '.join(sorted(supported))}."
        )
        self.architecture = architecture


class RequestFailedError(KvpilotError):
    """A request failed inside the engine (HTTP 500); other requests were not affected."""


class StepFailedError(KvpilotError, RuntimeError):
    """A whole engine step failed (the model run or sampling), and every request in it with it;
    the cause is chained. The engine itself goes on serving."""


class UnavailableError(KvpilotError):
    """This replica cannot take the request now; another one may (HTTP 503)."""


class EngineDeadError(UnavailableError):
    """The engine loop has stopped; no request can be served."""


class DrainingError(UnavailableError):
    """The server is shutting down and finishing in-flight requests."""


class OverloadedError(KvpilotError):
    """The waiting queue is full (HTTP 429 with Retry-After)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeoutError(KvpilotError):
    """The request ran past its deadline and was aborted (HTTP 408)."""


class BodyTimeoutError(RequestTimeoutError):
    """The client stopped sending its body (HTTP 408; the connection is closed)."""


class PayloadTooLargeError(KvpilotError):
    """The body exceeds the limit (HTTP 413; the rest is not read, the connection is closed)."""


class ModelNotFoundError(KvpilotError):
    """The request names a model this server does not serve (HTTP 404)."""


class NotFoundError(KvpilotError):
    """The request names something else that is not here, such as a stored response (HTTP 404)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
