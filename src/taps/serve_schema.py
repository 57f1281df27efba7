"""The OpenAI wire format of `taps serve`: request bodies in, response bodies out.

Parsing is pure (no model, no server), so every rule about what a request may ask is in one
place and testable alone. A bad request raises `APIError`, which the server turns into
OpenAI's error body `{"error": {"message", "type", "param", "code"}}` with its status:
400 a value taps cannot honour (out of range, over the context, invalid JSON), 401 a wrong
API key, 404 an unknown model or route, 413 a body too large, 422 a field missing or of the
wrong JSON type, 429 a full queue, 503 a server shutting down.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

ERROR_TYPES = {401: "authentication_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}  # wire -> template
MAX_STOP = 4  # stop strings one request may give, as in the OpenAI API
MAX_TEMPERATURE = 2.0  # the OpenAI API's range is [0, 2]
# Fields of the OpenAI API that would change the answer in ways taps does not implement: a
# request must leave them at a value that means "off" rather than be silently half-served.
UNSUPPORTED = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "tools": (None, []), "functions": (None, []),
}
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}  # taps -> OpenAI


class APIError(Exception):
    """A request the server answers with an OpenAI-style error body instead of a completion."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers  # extra response headers, e.g. a 429's Retry-After

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class CompletionRequest:
    """One validated request of either endpoint; `prompt` is the text (completions) or the
    message list (chat) exactly as `taps.load(...).generate` takes it."""

    chat: bool
    model: str
    prompt: str | list[dict]
    max_tokens: int | None  # None: up to the context limit, as in the OpenAI API
    temperature: float
    top_p: float
    top_k: int  # an extension (as in vLLM); 0 = off
    seed: int | None  # None: the server draws one; it is reported in the `taps` object
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise APIError(400, f"the body is not valid JSON ({error}); send a JSON object", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object", code="invalid_json")
    return body


def _field(body: dict, name: str, kinds: tuple[type, ...], default: Any = None, required: bool = False,
           where: str = "") -> Any:
    """body[name] checked against JSON `kinds` (a bool is not a number here); 422 otherwise.
    `where` prefixes the parameter's name in errors (e.g. "messages[0].")."""
    param = where + name
    if name not in body or body[name] is None:
        if required:
            raise APIError(422, f"missing required parameter {param!r}", param=param, code="missing_required_parameter")
        return default
    value = body[name]
    numeric = any(k in (int, float) for k in kinds)
    if not isinstance(value, kinds) or (numeric and isinstance(value, bool)):
        names = " or ".join({int: "an integer", float: "a number", str: "a string", bool: "a boolean",
                             list: "an array", dict: "an object"}[k] for k in kinds)
        raise APIError(422, f"{param!r} must be {names}, got {json.dumps(value)[:80]}", param=param,
                       code="invalid_type")
    return value


def _invalid(name: str, message: str) -> APIError:
    return APIError(400, f"{name!r} {message}", param=name, code="invalid_value")


def _messages(body: dict) -> list[dict]:
    messages = _field(body, "messages", (list,), required=True)
    if not messages:
        raise _invalid("messages", "must hold at least one message")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(422, f"{where} must be an object with 'role' and 'content'", param=where,
                           code="invalid_type")
        role = _field(message, "role", (str,), required=True, where=f"{where}.")
        if role not in ROLES:
            raise _invalid(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        content = _field(message, "content", (str, list), required=True, where=f"{where}.")
        if isinstance(content, list):  # content parts: only text ones
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise _invalid(f"{where}.content", "parts must all be {\"type\": \"text\", \"text\": ...}")
            content = "".join(texts)
        out.append({"role": ROLES[role], "content": content})
    return out


def _prompt(body: dict) -> str:
    prompt = _field(body, "prompt", (str, list), required=True)
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise _invalid("prompt", "must be one string (token-id prompts and several prompts are not supported)")
        prompt = prompt[0]
    if not prompt:
        raise _invalid("prompt", "is empty: give some text")
    return prompt


def _stop(body: dict) -> tuple[str, ...]:
    stop = _field(body, "stop", (str, list), default=[])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise _invalid("stop", f"must be a non-empty string or up to {MAX_STOP} of them")
    return tuple(stop)


def parse_request(body: dict, chat: bool, served_model: str) -> CompletionRequest:
    """A request body of /v1/chat/completions (chat) or /v1/completions -> CompletionRequest."""
    model = _field(body, "model", (str,), required=True)
    if model != served_model:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {served_model!r}",
                       param="model", code="model_not_found")
    prompt = _messages(body) if chat else _prompt(body)
    for name, off in UNSUPPORTED.items():
        if body.get(name) not in off:
            raise _invalid(name, f"is not supported by taps serve; leave it unset or at {off[1]!r}")
    length_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _field(body, length_field, (int,))
    if max_tokens is not None and max_tokens < 1:
        raise _invalid(length_field, f"must be >= 1, got {max_tokens}")
    temperature = float(_field(body, "temperature", (int, float), default=1.0))
    if not (math.isfinite(temperature) and 0 <= temperature <= MAX_TEMPERATURE):
        raise _invalid("temperature", f"must be in [0, {MAX_TEMPERATURE:g}], got {temperature}")
    top_p = float(_field(body, "top_p", (int, float), default=1.0))
    if not 0 < top_p <= 1:
        raise _invalid("top_p", f"must be in (0, 1], got {top_p}")
    top_k = _field(body, "top_k", (int,), default=0)
    if top_k < 0:
        raise _invalid("top_k", f"must be >= 0 (0 = off), got {top_k}")
    seed = _field(body, "seed", (int,))
    if seed is not None and not 0 <= seed < 2**63:
        raise _invalid("seed", f"must be in [0, 2**63), got {seed}")
    options = _field(body, "stream_options", (dict,), default={})
    return CompletionRequest(
        chat=chat, model=model, prompt=prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
        top_k=top_k, seed=seed, stop=_stop(body), stream=_field(body, "stream", (bool,), default=False),
        include_usage=bool(options.get("include_usage")),
    )


def token_budget(request: CompletionRequest, prompt_tokens: int, max_positions: int) -> int:
    """Most tokens to generate: max_tokens, else what the context leaves; 400 when the prompt
    and max_tokens together do not fit (the OpenAI API's rule)."""
    param = "messages" if request.chat else "prompt"
    room = max_positions - prompt_tokens
    if room < 1:
        raise APIError(400, f"the prompt has {prompt_tokens} tokens but the context holds {max_positions}; "
                            "shorten it", param=param, code="context_length_exceeded")
    if request.max_tokens is not None and request.max_tokens > room:
        raise APIError(400, f"the context holds {max_positions} tokens: {prompt_tokens} in the prompt leave "
                            f"{room} for the answer, not {request.max_tokens}; lower max_tokens",
                       param="max_tokens", code="context_length_exceeded")
    return request.max_tokens or room


@dataclass(frozen=True)
class Envelope:
    """What every response body of one request repeats: id, creation time, model, endpoint."""

    chat: bool
    model: str
    id: str
    created: int

    @classmethod
    def new(cls, chat: bool, model: str) -> Envelope:
        return cls(chat, model, ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, int(time.time()))

    def _wrap(self, obj: str, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices, **extra}

    def completion(self, result, method: str, seed: int) -> dict:
        """The non-streaming body of a finished GenerationResult."""
        choice = {"index": 0, "finish_reason": FINISH_REASONS[result.finish_reason], "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        obj = "chat.completion" if self.chat else "text_completion"
        return self._wrap(obj, [choice], usage=usage(result), taps=taps_extension(result, method, seed))

    def chunk(self, text: str | None = None, *, first: bool = False, finish: str | None = None, **extra) -> dict:
        """A streamed chunk: `text` (a chat chunk opens the assistant's turn when `first`) or the
        closing chunk carrying `finish` (a taps finish reason)."""
        reason = FINISH_REASONS[finish] if finish else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            return self._wrap("chat.completion.chunk", [choice], **extra)
        return self._wrap("text_completion", [{"index": 0, "text": text or "", "finish_reason": reason,
                                                "logprobs": None}], **extra)

    def usage_chunk(self, result) -> dict:
        return self._wrap("chat.completion.chunk" if self.chat else "text_completion", [], usage=usage(result))


def usage(result) -> dict:
    n = len(result.token_ids)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": n, "total_tokens": result.prompt_tokens + n}


def taps_extension(result, method: str, seed: int) -> dict:
    """The per-response `taps` object: how speculation went for this request."""
    s = result.stats
    return {"method": method, "seed": seed, "tau": s.tau, "accepted_per_round": list(s.accepted_per_round),
            "tree_sizes": list(s.tree_sizes), "tokens_per_second": s.tokens_per_second,
            "token_ids": list(result.token_ids)}
