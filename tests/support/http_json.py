"""The JSON answer the test HTTP fakes (hub, vLLM) send from their BaseHTTPRequestHandler."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


def send_json(handler: BaseHTTPRequestHandler, obj, status: int = 200) -> None:
    body = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
