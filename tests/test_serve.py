"""`taps serve` end to end: the real server as a subprocess on a free loopback port, driven by the
official `openai` client and httpx. SmolLM2-135M in float32 at temperature 0, short answers.

Both the server and the reference `taps.load(...)` in this process run torch on one thread,
so their float32 numerics match and answers compare token for token.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the serve tests need the serve-test extra")
httpx = pytest.importorskip("httpx", reason="the serve tests need the serve-test extra")
pytest.importorskip("uvicorn", reason="taps serve needs the serve extra")

import taps  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LatencyProfile")  # the reference speculator's default profile
MODEL = "smollm2-135m"
KEY = "sk-test"
HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
LONG = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]
PROMPTS = ["What is 2 + 2?", "Name a color.", "Write a haiku about rain.", "What is Python?",
           "Say hello in French.", "Give me a fruit.", "What is the capital of Italy?", "Tell me a joke."]
STARTUP_SECONDS = 300  # model load on a loaded 2-core machine
AUTH = {"Authorization": f"Bearer {KEY}"}


class ServerProcess:
    """`taps serve` in a subprocess, its output in a log file; stop() sends SIGTERM."""

    def __init__(self, log: Path, *extra: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(Path(taps.__file__).parents[1]), "OMP_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "taps.cli", "serve", "--target", MODEL, "--dtype", "float32",
                 "--port", str(self.port), *extra], stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"taps serve exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        pytest.fail(f"taps serve did not answer /health within {STARTUP_SECONDS} s")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def client(self, **kwargs):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=600, **kwargs)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}


@pytest.fixture(scope="module")
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("serve") / "server.log", "--api-key", KEY, "--max-queue", "32")
    yield proc
    assert proc.stop() == 0, proc.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def spec(one_thread):
    return taps.load(MODEL, dtype="float32")


@pytest.fixture(scope="module")
def hello(server):
    """The server's non-streamed answer to HELLO (12 tokens, T=0)."""
    return server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)


def test_chat_completion_equals_generate_token_for_token(hello, spec):
    expected = spec.generate(HELLO, max_new_tokens=12, temperature=0.0)
    extension = hello.to_dict()["taps"]
    assert extension["token_ids"] == expected.token_ids
    assert hello.choices[0].message.content == expected.text
    assert hello.choices[0].finish_reason == {"context": "length"}.get(expected.finish_reason, expected.finish_reason)
    assert hello.usage.prompt_tokens == expected.prompt_tokens
    assert hello.usage.completion_tokens == len(expected.token_ids)
    assert hello.usage.total_tokens == expected.prompt_tokens + len(expected.token_ids)
    assert extension["method"] == spec.method and extension["tau"] >= 1
    assert len(extension["accepted_per_round"]) == len(extension["tree_sizes"]) >= 1
    assert extension["tokens_per_second"] > 0


def test_completion_equals_generate(server, spec):
    prompt = "The capital of France is"
    answer = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, seed=3)
    expected = spec.generate(prompt, max_new_tokens=8, temperature=0.0, seed=3, chat=False)  # completions: raw text
    assert answer.choices[0].text == expected.text
    assert answer.to_dict()["taps"]["token_ids"] == expected.token_ids
    assert answer.to_dict()["taps"]["seed"] == 3


def test_streamed_deltas_concatenate_to_the_answer(server, hello):
    stream = server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0,
                                                     stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == hello.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    closing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in closing] == [hello.choices[0].finish_reason]
    assert closing[0].to_dict()["taps"]["token_ids"] == hello.to_dict()["taps"]["token_ids"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == hello.usage.completion_tokens


def test_completions_stream_is_sse_ending_with_done(server):
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=600) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "".join(c["choices"][0]["text"] for c in chunks) != ""


def _delta(line: str) -> str:
    """The text a chat SSE line adds ("" for other lines)."""
    if not line.startswith("data: {"):
        return ""
    choices = json.loads(line[len("data: "):]).get("choices") or [{}]
    return choices[0].get("delta", {}).get("content") or ""


CHAT = "/v1/chat/completions"
BAD_REQUESTS = {
    "unknown model": (CHAT, {"model": "gpt-9", "messages": HELLO}, 404, "model"),
    "missing messages": (CHAT, {"model": MODEL}, 422, "messages"),
    "empty messages": (CHAT, {"model": MODEL, "messages": []}, 400, "messages"),
    "bad role": (CHAT, {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    "max_tokens 0": (CHAT, {"model": MODEL, "messages": HELLO, "max_tokens": 0}, 400, "max_tokens"),
    "max_completion_tokens -1": (CHAT, {"model": MODEL, "messages": HELLO, "max_completion_tokens": -1}, 400,
                                 "max_completion_tokens"),
    "max_tokens over the context": (CHAT, {"model": MODEL, "messages": HELLO, "max_tokens": 10**6}, 400, "max_tokens"),
    "prompt over the context": (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 9000}]},
                                400, "messages"),
    "temperature 2.5": (CHAT, {"model": MODEL, "messages": HELLO, "temperature": 2.5}, 400, "temperature"),
    "temperature -1": (CHAT, {"model": MODEL, "messages": HELLO, "temperature": -1}, 400, "temperature"),
    "temperature a string": (CHAT, {"model": MODEL, "messages": HELLO, "temperature": "hot"}, 422, "temperature"),
    "top_p 0": (CHAT, {"model": MODEL, "messages": HELLO, "top_p": 0}, 400, "top_p"),
    "n 2": (CHAT, {"model": MODEL, "messages": HELLO, "n": 2}, 400, "n"),
    "five stop strings": (CHAT, {"model": MODEL, "messages": HELLO, "stop": list("abcde")}, 400, "stop"),
    "prompt missing": ("/v1/completions", {"model": MODEL}, 422, "prompt"),
    "token-id prompt": ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 3]}, 400, "prompt"),
    "invalid JSON": (CHAT, b'{"model": ', 400, None),
    "a JSON array": (CHAT, b"[1, 2]", 400, None),
    "body too large": (CHAT, b'{"model": "' + b"x" * (2 << 20) + b'"}', 413, None),
    "wrong API key": (CHAT, {"model": MODEL, "messages": HELLO}, 401, None),
    "no API key": ("/v1/models", b"", 401, None),
    "unknown route": ("/v1/embeddings", {"model": MODEL}, 404, None),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_gets_its_status_and_an_error_body(server, case):
    path, body, status, param = BAD_REQUESTS[case]
    headers = {"wrong API key": {"Authorization": "Bearer wrong"}, "no API key": {}}.get(case, AUTH)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    method = "GET" if path == "/v1/models" else "POST"
    response = httpx.request(method, f"{server.url}{path}", content=content, headers=headers, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200  # still serving


def test_the_openai_client_reads_our_errors(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        server.client().chat.completions.create(model="gpt-9", messages=HELLO)


def test_models_health_and_metrics(server, hello):
    assert [m.id for m in server.client().models.list()] == [MODEL]
    assert httpx.get(f"{server.url}/health", timeout=10).json()["status"] == "ok"
    metrics = server.metrics()
    assert metrics['taps_requests_total{path="/v1/chat/completions",status="200"}'] >= 1
    assert metrics["taps_completion_tokens_total"] >= hello.usage.completion_tokens
    assert metrics["taps_mean_tau"] >= 1 and metrics["taps_request_tokens_per_second_count"] >= 1
    assert metrics["taps_queue_depth"] == 0
    assert metrics['taps_server_info{method="taps",model="smollm2-135m"}'] == 1


def test_a_client_leaving_mid_stream_frees_the_engine(server):
    finished = server.metrics()["taps_request_tau_count"]
    body = {"model": MODEL, "messages": LONG, "max_tokens": 256, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}{CHAT}", json=body, headers=AUTH, timeout=600) as response:
        for line in response.iter_lines():
            if _delta(line):
                break  # the first token arrived: hang up
    answer = server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0)
    assert answer.usage.completion_tokens == 4
    assert server.metrics()["taps_request_tau_count"] == finished + 1  # the abandoned request never finished


def _answers(server, prompts: list[str]) -> list[str]:
    """The server's answers to `prompts`, all sent at once from one thread each."""
    out: list = [None] * len(prompts)

    def ask(i: int) -> None:
        reply = server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompts[i]}], max_tokens=6, temperature=0)
        out[i] = (reply.choices[0].message.content, reply.to_dict()["taps"]["token_ids"])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    return out


@pytest.mark.slow
def test_sixteen_concurrent_clients_get_their_solo_answers(server):
    solo = {p: _answers(server, [p])[0] for p in PROMPTS}
    asked = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    together = _answers(server, asked)
    assert together == [solo[p] for p in asked]


@pytest.mark.slow
def test_queue_overflow_gives_429_and_nothing_else(tmp_path):
    small = ServerProcess(tmp_path / "server.log", "--max-queue", "1")
    try:
        body = {"model": MODEL, "messages": HELLO, "max_tokens": 6, "temperature": 0}
        statuses, retry_after = [], []

        def ask() -> None:
            response = httpx.post(f"{small.url}{CHAT}", json=body, timeout=600)
            statuses.append(response.status_code)
            if response.status_code == 429:
                retry_after.append(int(response.headers["Retry-After"]))
                assert response.json()["error"]["code"] == "queue_full"

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        assert len(statuses) == 6 and set(statuses) == {200, 429}, statuses
        assert statuses.count(200) >= 2 and all(r >= 1 for r in retry_after)
    finally:
        assert small.stop() == 0


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_sigterm_during_a_stream_answers_everyone_and_exits_0(server):
    """Last in this file: it stops the module's server."""
    streamed, queued, first_token = [], [], threading.Event()

    def stream() -> None:
        body = {"model": MODEL, "messages": LONG, "max_tokens": 256, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{server.url}{CHAT}", json=body, headers=AUTH, timeout=600) as response:
            for line in response.iter_lines():
                streamed.append(line)
                if _delta(line):
                    first_token.set()

    def wait_queued() -> None:
        response = httpx.post(f"{server.url}{CHAT}", json={"model": MODEL, "messages": HELLO, "max_tokens": 4},
                              headers=AUTH, timeout=600)
        queued.append(response.status_code)

    running = threading.Thread(target=stream)
    running.start()
    assert first_token.wait(120)
    deadline = time.monotonic() + 60
    waiting = threading.Thread(target=wait_queued)
    waiting.start()
    while server.metrics()["taps_queue_depth"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    kids = _children(server.proc.pid)
    assert server.stop() == 0, server.log.read_text()[-3000:]
    running.join(60)
    waiting.join(60)
    assert queued == [503]
    events = [line for line in streamed if line]
    assert events[-1] == "data: [DONE]" and '"shutting_down"' in events[-2]
    assert not [k for k in kids if Path(f"/proc/{k}").exists()]  # no orphan left behind
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections may linger in TIME_WAIT
        s.bind(("127.0.0.1", server.port))  # nothing listens there any more
