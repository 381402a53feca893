"""The live evaluator's replay sends what ``boute verify`` sends: MT-Bench turn 2 with its first exchange."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from boute.optimize.replay import NO_PROFILE_PROMPT, replay, replay_conversations
from boute.quality.profiles import load_profile
from boute.serving.replay_requests import replay_messages
from boute.workload import Workload


class _Recorder(BaseHTTPRequestHandler):
    """A gateway stand-in: records each request body and answers "ok" as tier ``t``."""

    bodies: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        out = json.dumps({"choices": [{"message": {"content": "ok"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("x-boute-tier", "t")
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


def test_live_replay_sends_multi_turn_queries_with_their_first_exchange() -> None:
    mt = load_profile("builtin:mt-bench")
    turn2 = [i for i in range(len(mt)) if mt.served_prompts[i] != mt.prompts[i]]
    assert turn2, "MT-Bench has turn-2 queries"
    rows = np.array([turn2[0], -1], dtype=np.int64)
    messages = replay_conversations(mt, rows)
    assert messages[0] == replay_messages(mt, turn2[0]) and len(messages[0]) == 2
    assert messages[1] == [{"role": "user", "content": NO_PROFILE_PROMPT}]

    _Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        w = Workload(np.array([0.0, 0.01]), np.array([10, 10]), np.array([5, 7]), rows, 100.0, 0.01)
        res = replay(f"http://127.0.0.1:{server.server_port}", w, messages, timeout_s=10.0)
    finally:
        server.shutdown()
        server.server_close()
    assert res.ok.all() and res.tier == ["t", "t"]
    sent = sorted(_Recorder.bodies, key=lambda b: "max_tokens" in b)
    assert sent[0] == {"model": "boute", "messages": messages[0]}  # a profile row: the recorded answer's length
    assert sent[1] == {"model": "boute", "messages": messages[1], "max_tokens": 7}
