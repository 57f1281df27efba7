"""`taps serve`: an OpenAI-compatible HTTP server over one speculator from `taps.load`.

One process serves one model; its requests go through taps.serve_engine's FIFO queue, one
decode at a time, while the event loop accepts, validates (taps.serve_schema), streams and
refuses. A client that leaves (queued or mid-stream) cancels its job, which frees the engine
at the next round. On SIGINT/SIGTERM the running request is cancelled at its next round and
answered 503, the queued ones are answered 503, the worker ends and the process exits 0.

Stack: Starlette + uvicorn. Starlette is the maintained ASGI toolkit FastAPI itself is built
on; taps validates requests by hand (taps.serve_schema) to give OpenAI's error bodies and
statuses exactly, so FastAPI's pydantic layer would only add a dependency to override.
uvicorn is the reference ASGI server, and its `Server` lets us take the signals ourselves.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import signal
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn import Config
from uvicorn import Server as UvicornServer

from taps.serve_engine import Engine, Job, Metrics
from taps.serve_schema import (
    APIError,
    CompletionRequest,
    Envelope,
    parse_body,
    parse_request,
    taps_extension,
    token_budget,
)

log = logging.getLogger("taps.serve")
CLIENT_GONE = 499  # status logged for a request whose client left before its answer (nginx's convention)


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so only that can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _JobStream(StreamingResponse):
    """A server-sent-event response that cancels its job however the response ends (finished,
    client gone, or the server stopping): the engine is then free at the next round."""

    def __init__(self, job: Job, content):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def _sse(obj) -> str:
    """One server-sent event carrying a JSON object (compact) or a literal like [DONE]."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n"


@dataclass(frozen=True)
class ServeConfig:
    """How the server listens and admits requests (the model is `taps.load`'s business)."""

    host: str = "127.0.0.1"  # loopback: this machine only; 0.0.0.0 to listen on every interface
    port: int = 8000
    max_queue: int = 64  # requests that may wait besides the running one; one more gets 429
    api_key: str | None = None  # when set, /v1/* require "Authorization: Bearer <key>"
    model_name: str | None = None  # the id clients send and /v1/models lists; None: the target's name
    max_body: int = 1 << 20  # bytes; a larger request body gets 413

    def __post_init__(self):
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1 (requests that may wait), got {self.max_queue}")
        if self.max_body < 1:
            raise ValueError(f"max_body must be >= 1 byte, got {self.max_body}")
        if self.api_key == "":
            raise ValueError("the API key is empty: give a non-empty key or none")


class Server:
    """The routes of one app: an Engine, the served model's name, an optional API key."""

    def __init__(self, spec, cfg: ServeConfig):
        self.spec, self.api_key, self.max_body = spec, cfg.api_key, cfg.max_body
        self.model_name = cfg.model_name or spec.name
        self.metrics = Metrics(self.model_name, spec.method)
        self.engine = Engine(spec, cfg.max_queue, self.metrics)
        self.started = int(time.time())

    def check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")

    async def read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            raise APIError(413, f"the body is over {self.max_body} bytes", code="body_too_large")
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > self.max_body:
                raise APIError(413, f"the body is over {self.max_body} bytes", code="body_too_large")
        return bytes(raw)

    async def chat(self, request: Request) -> Response:
        return await self.complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self.complete(request, chat=False)

    async def complete(self, request: Request, chat: bool) -> Response:
        self.check_key(request)
        req = parse_request(parse_body(await self.read_body(request)), chat, self.model_name)
        try:
            prompt_tokens = len(self.spec.encode(req.prompt, chat=chat))  # completions: raw text
        except ValueError as error:
            raise APIError(400, str(error), param="messages" if chat else "prompt", code="invalid_value") from None
        seed = secrets.randbits(63) if req.seed is None else req.seed
        kwargs = dict(max_new_tokens=token_budget(req, prompt_tokens, self.spec.max_positions),
                      temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=seed,
                      stop=list(req.stop) or None, chat=chat)
        job = Job(req.prompt, kwargs, asyncio.get_running_loop())
        self.engine.submit(job)
        gone = asyncio.create_task(_client_gone(request))
        streaming = False  # once the stream owns the job, the stream cancels it
        try:
            event = await self._next(job, gone)  # a streamed answer's headers wait for its first event
            if req.stream and event is not None and event[0] != "error":
                streaming = True
                return _JobStream(job, self._stream(req, job, event, seed))
            while event is not None and event[0] == "piece":
                event = await self._next(job, gone)
            if event is None:
                return Response(status_code=CLIENT_GONE)
            if event[0] == "error":
                raise event[1]
            return JSONResponse(Envelope.new(chat, self.model_name).completion(event[1], self.spec.method, seed))
        finally:
            gone.cancel()
            if not streaming:
                job.cancel()  # a no-op once it is done; frees the engine if this handler was cut short

    async def _next(self, job: Job, gone: asyncio.Task) -> tuple | None:
        """The job's next event, or None when the client left first."""
        get = asyncio.ensure_future(job.events.get())
        await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
        return None

    async def _stream(self, req: CompletionRequest, job: Job, event: tuple, seed: int):
        envelope = Envelope.new(req.chat, self.model_name)
        if req.chat:
            yield _sse(envelope.chunk(first=True))
        while event[0] == "piece":
            yield _sse(envelope.chunk(event[1]))
            event = await job.events.get()
        if event[0] == "error":
            yield _sse(event[1].body())
        else:
            result = event[1]
            yield _sse(envelope.chunk(finish=result.finish_reason, taps=taps_extension(result, self.spec.method, seed)))
            if req.include_usage:
                yield _sse(envelope.usage_chunk(result))
        yield _sse("[DONE]")

    async def models(self, request: Request) -> Response:
        self.check_key(request)
        card = {"id": self.model_name, "object": "model", "created": self.started, "owned_by": "taps"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        state = {"status": "stopping" if self.engine.stopping else "ok", "model": self.model_name,
                 "method": self.spec.method, "queue": self.engine.waiting}
        return JSONResponse(state, 503 if self.engine.stopping else 200)

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _api_error(request: Request, error: APIError) -> Response:
    return JSONResponse(error.body(), error.status, headers=error.headers)


async def _http_error(request: Request, error: HTTPException) -> Response:
    return JSONResponse(APIError(error.status_code, f"{request.method} {request.url.path}: {error.detail}").body(),
                        error.status_code, headers=error.headers)


async def _internal_error(request: Request, error: Exception) -> Response:
    return JSONResponse(APIError(500, "internal error; see the server log", code="internal_error").body(), 500)


class _CountRequests:
    """ASGI middleware: count every HTTP response by route and status in taps_requests_total."""

    def __init__(self, app, metrics: Metrics, paths: set[str]):
        self.app, self.metrics, self.paths = app, metrics, paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in self.paths else "other"

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)


def build_app(spec, cfg: ServeConfig = ServeConfig()) -> Starlette:
    """The ASGI app serving `spec` (from `taps.load`); its engine thread runs for the app's
    lifespan. `app.state.server.engine.shutdown()` is what a signal triggers."""
    server = Server(spec, cfg)
    routes = [
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.prometheus, methods=["GET"]),
    ]

    @asynccontextmanager
    async def lifespan(app):
        server.engine.start()
        yield
        server.engine.shutdown()
        await asyncio.to_thread(server.engine.join, 30.0)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.add_middleware(_CountRequests, metrics=server.metrics, paths={r.path for r in routes})
    app.state.server = server
    return app


def serve(spec, cfg: ServeConfig = ServeConfig()) -> int:
    """Serve a loaded speculator (`taps.load`) until SIGINT/SIGTERM; returns the exit status (0)."""
    if cfg.host not in ("127.0.0.1", "localhost", "::1") and cfg.api_key is None:
        log.warning("listening on %s without an API key: anyone who reaches it may use it", cfg.host)
    app = build_app(spec, cfg)
    server = _GracefulServer(Config(app, host=cfg.host, port=cfg.port, log_level="info", timeout_graceful_shutdown=30))
    server.engine = app.state.server.engine
    server.run()
    return 0


class _GracefulServer(UvicornServer):
    """uvicorn's server with taps' shutdown: the engine answers everything at once, and the
    signal is not re-raised after a clean stop (uvicorn's own handler re-raises it), so the
    process exits 0."""

    engine: Engine

    def handle_exit(self, sig: int, frame) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop without waiting for connections
        self.should_exit = True
        # a signal handler may interrupt this thread while it holds the engine's lock: shut
        # the engine down from another thread, which waits for the lock instead
        threading.Thread(target=self.engine.shutdown, name="taps-shutdown").start()
