"""A local stand-in for the Hugging Face Hub's HTTP API: the endpoints ``HfApi.create_repo`` and
``HfApi.upload_folder`` call (every file sent inline, as the Hub does for small ones), on
127.0.0.1. Point huggingface_hub at it with ``HF_ENDPOINT``. It keeps the repos created and the
files each commit sent, so a test can load what the Hub would hold."""

from __future__ import annotations

import base64
import gzip
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

NAMESPACE = "stand-in-user"
"""The owner of a repo created without one (the token's user on the Hub)."""
KNOWN_PIPELINE_TAGS = ("unconditional-image-generation", "robotics", "text-to-image", "image-to-image",
                       "time-series-forecasting", "tabular-regression")
"""Some of the Hub's task categories (its list is longer)."""


@dataclass
class Repo:
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)

    def write_to(self, folder: Path) -> Path:
        """The repo's files as a folder (what a download would give)."""
        for name, data in self.files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        return folder


class HubStandIn:
    """``with HubStandIn(token) as hub:`` serves at ``hub.endpoint``; ``hub.repos`` by repo id,
    ``hub.requests`` as (method, path) in order; a request without ``token`` is refused 401."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.metadata: list[dict[str, object]] = []
        """The front matter of each card validated."""
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet test output
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                stand_in._post(self)

            def do_GET(self) -> None:  # noqa: N802
                stand_in.requests.append(("GET", self.path))
                self._reply(404, {"error": "not served by the stand-in"})

            def _reply(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._handler = Handler
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubStandIn:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _post(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?")[0]
        self.requests.append(("POST", path))
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return request._reply(401, {"error": "Invalid credentials in Authorization header"})  # type: ignore[attr-defined]
        reply = request._reply  # type: ignore[attr-defined]
        if path == "/api/validate-yaml":  # upload_folder has the Hub check a README's front matter first
            return self._validate_yaml(json.loads(body)["content"], reply)
        if path == "/api/repos/create":
            spec = json.loads(body)
            repo_id = f"{spec.get('organization') or NAMESPACE}/{spec['name']}"
            private = bool(spec.get("private")) or spec.get("visibility") == "private"
            self.repos.setdefault(repo_id, Repo(private=private))
            return reply(200, {"url": f"{self.endpoint}/{repo_id}", "name": repo_id, "id": repo_id})
        parts = path.strip("/").split("/")  # api/models/OWNER/NAME/(preupload|commit)/REVISION
        if len(parts) == 6 and parts[:2] == ["api", "models"] and f"{parts[2]}/{parts[3]}" in self.repos:
            repo_id = f"{parts[2]}/{parts[3]}"
            if parts[4] == "preupload":
                files = json.loads(body)["files"]
                return reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                             for f in files]})
            if parts[4] == "commit":
                return reply(200, self._commit(repo_id, body))
        return reply(404, {"error": f"no such endpoint or repo: {path}"})

    def _validate_yaml(self, content: str, reply: Callable[[int, object], None]) -> None:
        """The front matter must be a YAML mapping whose pipeline tag the Hub knows (some of them)."""
        head, _, _ = content.removeprefix("---\n").partition("\n---")
        try:
            meta = yaml.safe_load(head)
        except yaml.YAMLError as exc:
            return reply(400, {"errors": [{"message": f"invalid YAML: {exc}"}]})
        if not isinstance(meta, dict):
            return reply(400, {"errors": [{"message": "the metadata is not a mapping"}]})
        if meta.get("pipeline_tag", KNOWN_PIPELINE_TAGS[0]) not in KNOWN_PIPELINE_TAGS:
            return reply(400, {"errors": [{"message": f"unknown pipeline_tag {meta['pipeline_tag']!r}"}]})
        self.metadata.append(meta)
        return reply(200, {"warnings": []})

    def _commit(self, repo_id: str, body: bytes) -> dict[str, object]:
        repo = self.repos[repo_id]
        for line in body.decode().splitlines():
            item = json.loads(line)
            if item["key"] == "header":
                repo.commits.append(item["value"]["summary"])
            elif item["key"] == "file":
                value = item["value"]
                assert value.get("encoding") == "base64", value.keys()
                repo.files[value["path"]] = base64.b64decode(value["content"])
            else:
                raise AssertionError(f"the stand-in does not take commit items of kind {item['key']!r}")
        oid = f"{len(repo.commits):040x}"
        return {"commitUrl": f"{self.endpoint}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
