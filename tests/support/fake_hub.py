"""A stand-in for the Hugging Face Hub's HTTP API on loopback (stdlib), serving one repo from memory: enough
for huggingface_hub's `snapshot_download` (repo info, recursive tree, HEAD/GET of `resolve/`, ranges for
resume), so the online path of `weights fetch` runs without reaching a hub (`HF_ENDPOINT=url`).

`served` counts the bytes each file's GETs sent, so a test sees what was downloaded (and resumed) and what not;
`requests` lists (method, path, whether it carried the token).
"""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

from tests.support.http_json import send_json


class FakeHub:
    def __init__(self, repo_id: str, files: dict[str, bytes], commit: str, *, token: str | None = None):
        self.repo_id, self.files, self.commit, self.token = repo_id, files, commit, token
        self.served: dict[str, int] = {}
        self.requests: list[tuple[str, str, bool]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._answer(self, head=True)

            def do_GET(self):
                hub._answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def etag(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def _answer(self, h, *, head: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Authorization") == f"Bearer {self.token}"))
        api = f"/api/models/{self.repo_id}/"
        if path.startswith(api + "revision/"):
            return send_json(h, {"id": self.repo_id, "sha": self.commit,
                                  "siblings": [{"rfilename": f} for f in sorted(self.files)]})
        if path.startswith(api + "tree/"):
            return send_json(h, [{"type": "file", "path": f, "size": len(d), "oid": self.etag(d)[:40]}
                                  for f, d in sorted(self.files.items())])
        prefix = f"/{self.repo_id}/resolve/"
        if not path.startswith(prefix):
            return send_json(h, {"error": "not found"}, 404)
        name = path[len(prefix):].split("/", 1)[1]
        if name not in self.files:
            h.send_response(404)
            h.send_header("X-Error-Code", "EntryNotFound")
            h.send_header("Content-Length", "0")
            return h.end_headers()
        data = self.files[name]
        start = 0
        rng = h.headers.get("Range", "")
        if rng.startswith("bytes=") and not head:
            start = int(rng[6:].split("-")[0] or 0)
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", self.commit)
        h.send_header("ETag", f'"{self.etag(data)}"')
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if not head:
            h.wfile.write(data[start:])
            self.served[name] = self.served.get(name, 0) + len(data) - start
