"""An LLM judge over real HTTP for tests: a minimal OpenAI-compatible ``/chat/completions`` endpoint."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeJudge(BaseHTTPRequestHandler):
    """Replies with ``reply`` (a text, or a function of the request's first message), ``status`` and
    ``delay`` as the test sets them; ``seen`` records every request (path, body, Authorization).
    ``models`` maps a requested model name to its own reply function, so one server can stand for the
    tiers being profiled beside their judge."""

    reply: str | Callable[[str], str] = "Rating: [[8]]"
    status: int = 200
    delay: float = 0.0
    seen: list[dict[str, Any]] = []
    models: dict[str, Callable[[str], str]] = {}

    def do_POST(self) -> None:
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls.seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        time.sleep(cls.delay)
        reply = cls.models.get(body.get("model"), cls.reply)
        text = reply(body["messages"][0]["content"]) if callable(reply) else reply
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(cls.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_judge() -> Iterator[str]:
    """Start :class:`FakeJudge` (its settings reset) on a free loopback port; yields its ``/v1`` base URL."""
    FakeJudge.reply, FakeJudge.status, FakeJudge.delay, FakeJudge.seen = "Rating: [[8]]", 200, 0.0, []
    FakeJudge.models = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
