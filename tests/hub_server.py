"""A small Hugging Face Hub on 127.0.0.1 for the tests: the HTTP endpoints the real
``huggingface_hub`` client (2.x) calls to download and upload model repositories, with
commits kept in memory. It answers as the Hub does (``X-Error-Code`` headers for a missing
repository, revision or file; ``ETag``, ``X-Repo-Commit`` and ``Content-Length`` on
``resolve``) and logs every request, so a test can say which files were fetched."""
from __future__ import annotations

import base64
import hashlib
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


class Repo:
    """A model repository: commits (sha -> files) and branches (name -> sha)."""

    def __init__(self) -> None:
        self.commits: Dict[str, Dict[str, bytes]] = {}
        self.branches: Dict[str, str] = {}

    def resolve(self, revision: str) -> Optional[str]:
        return self.branches.get(revision) or (revision if revision in self.commits else None)


class HubServer:
    """``ThreadingHTTPServer`` on a random port; ``url`` is its endpoint (``HF_ENDPOINT``).

    ``log`` holds ``(method, path)`` of each request; ``sizes[(repo, file)]`` makes the
    server list and announce another size for a file than it has (a huge weights file);
    ``tokens`` the ``Authorization`` headers it was sent."""

    def __init__(self) -> None:
        self.repos: Dict[str, Repo] = {}
        self.log: List[Tuple[str, str]] = []
        self.sizes: Dict[Tuple[str, str], int] = {}
        self.tokens: List[str] = []
        self.lock = threading.Lock()
        self._count = itertools.count()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                        kwargs=dict(poll_interval=0.01))  # (a quick stop)

    def start(self) -> "HubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    # --- the repositories, as a test sets them up -------------------------------------------
    def create(self, repo_id: str) -> bool:
        """Create ``repo_id`` with the Hub's first commit (``.gitattributes``); False if
        it exists."""
        with self.lock:
            if repo_id in self.repos:
                return False
            self.repos[repo_id] = Repo()
        self.commit(repo_id, {".gitattributes": GITATTRIBUTES})
        return True

    def commit(self, repo_id: str, files: Dict[str, bytes], branch: str = "main",
               deleted: Tuple[str, ...] = ()) -> str:
        """A new commit on ``branch`` of ``repo_id``: its parent's files, ``files`` added or
        replaced, ``deleted`` removed; its sha."""
        with self.lock:
            repo = self.repos.setdefault(repo_id, Repo())
            parent = repo.branches.get(branch)
            tree = dict(repo.commits[parent]) if parent else {}
            tree.update(files)
            for name in deleted:
                tree.pop(name, None)
            sha = hashlib.sha1(f"{repo_id}:{parent}:{next(self._count)}".encode()).hexdigest()
            repo.commits[sha] = tree
            repo.branches[branch] = sha
            return sha

    def requested(self, repo_id: str) -> List[str]:
        """The files of ``repo_id`` that were asked for (HEAD or GET on resolve)."""
        prefix = f"/{repo_id}/resolve/"
        return [unquote(path[len(prefix):]).split("/", 1)[1] for _, path in self.log
                if path.startswith(prefix)]

    def fetched(self, repo_id: str) -> List[str]:
        """The files of ``repo_id`` whose bytes were sent (GET on resolve)."""
        prefix = f"/{repo_id}/resolve/"
        return [unquote(path[len(prefix):]).split("/", 1)[1] for method, path in self.log
                if method == "GET" and path.startswith(prefix)]


def _handler(hub: HubServer) -> type:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # (quiet)
            pass

        def do_HEAD(self):
            self._route("HEAD")

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        # --- answers ----------------------------------------------------------------------
        def _send(self, status: int, body: bytes = b"", headers: Optional[Dict] = None,
                  length: Optional[int] = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, data, status: int = 200) -> None:
            self._send(status, json.dumps(data).encode(), {"Content-Type": "application/json"})

        def _error(self, status: int, code: Optional[str], message: str,
                   headers: Optional[Dict] = None) -> None:
            extra = {"X-Error-Code": code} if code else {}
            self._send(status, json.dumps({"error": message}).encode(),
                       {"Content-Type": "application/json", "X-Error-Message": message,
                        **extra, **(headers or {})})

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        # --- routing ----------------------------------------------------------------------
        def _route(self, method: str) -> None:
            url = urlsplit(self.path)
            with hub.lock:
                hub.log.append((method, url.path))
                if self.headers.get("Authorization"):
                    hub.tokens.append(self.headers["Authorization"])
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            query = parse_qs(url.query)
            if method == "POST" and parts == ["api", "repos", "create"]:
                return self._create()
            if method == "POST" and parts == ["api", "validate-yaml"]:
                return self._validate_yaml()
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id, rest = "/".join(parts[2:4]), parts[4:]
                if method == "GET" and (not rest or rest[0] == "revision" and len(rest) == 2):
                    return self._info(repo_id, rest[1] if rest else "main", "blobs" in query)
                if method == "POST" and len(rest) == 2 and rest[0] in ("preupload", "commit"):
                    return getattr(self, f"_{rest[0]}")(repo_id, rest[1])
            if method in ("HEAD", "GET") and len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            self._error(404, None, f"no route for {method} {url.path}")

        def _repo(self, repo_id: str) -> Optional[Repo]:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
            return repo

        def _commit_of(self, repo: Repo, revision: str) -> Optional[str]:
            sha = repo.resolve(revision)
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return sha

        def _size(self, repo_id: str, name: str, data: bytes) -> int:
            return hub.sizes.get((repo_id, name), len(data))

        # --- downloads ----------------------------------------------------------------------
        def _info(self, repo_id: str, revision: str, blobs: bool) -> None:
            repo = self._repo(repo_id)
            sha = repo and self._commit_of(repo, revision)
            if repo is None or sha is None:
                return
            siblings = [dict(rfilename=name, **(dict(
                size=self._size(repo_id, name, data),
                blobId=hashlib.sha1(data).hexdigest()) if blobs else {}))
                for name, data in sorted(repo.commits[sha].items())]
            self._json(dict(id=repo_id, modelId=repo_id, sha=sha, private=False, tags=[],
                            siblings=siblings))

        def _resolve(self, repo_id: str, revision: str, name: str) -> None:
            repo = self._repo(repo_id)
            sha = repo and self._commit_of(repo, revision)
            if repo is None or sha is None:
                return
            data = repo.commits[sha].get(name)
            if data is None:
                return self._error(404, "EntryNotFound", f"{name} does not exist",
                                   {"X-Repo-Commit": sha})
            headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": sha,
                       "Content-Type": "application/octet-stream"}
            # (HEAD announces the size the test set; a GET sends the bytes it has)
            self._send(200, data, headers, self._size(repo_id, name, data)
                       if self.command == "HEAD" else None)

        # --- uploads ------------------------------------------------------------------------
        def _create(self) -> None:
            payload = json.loads(self._body())
            repo_id = f"{payload.get('organization')}/{payload['name']}"
            url = f"{hub.url}/{repo_id}"  # (in a 409 too: the client reads it)
            if not hub.create(repo_id):
                return self._json(dict(error="You already created this model repo", url=url),
                                  409)
            self._json(dict(url=url, name=repo_id))

        def _validate_yaml(self) -> None:
            import yaml  # (the Hub validates a card's metadata before a commit)

            content = json.loads(self._body())["content"]
            try:
                if content.startswith("---\n"):
                    yaml.safe_load(content[4:].split("\n---\n", 1)[0])
            except yaml.YAMLError as err:
                return self._json(dict(errors=[dict(message=str(err))]), 400)
            self._json(dict(errors=[], warnings=[]))

        def _branch(self, repo_id: str, revision: str) -> bool:
            """Whether ``revision`` is a branch of ``repo_id`` (a commit goes on one)."""
            repo = self._repo(repo_id)
            if repo is not None and revision not in repo.branches:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return repo is not None and revision in repo.branches

        def _preupload(self, repo_id: str, revision: str) -> None:
            if not self._branch(repo_id, revision):
                return
            files = json.loads(self._body())["files"]
            self._json(dict(files=[dict(path=f["path"], uploadMode="regular",
                                        shouldIgnore=False, oid=None) for f in files]))

        def _commit(self, repo_id: str, revision: str) -> None:
            if not self._branch(repo_id, revision):
                return
            added, deleted = {}, []
            for line in self._body().splitlines():
                item = json.loads(line)
                value = item["value"]
                if item["key"] == "file":
                    added[value["path"]] = base64.b64decode(value["content"])
                elif item["key"] == "deletedFile":
                    deleted.append(value["path"])
                elif item["key"] != "header":
                    return self._error(400, None, f"this test Hub takes no {item['key']}")
            sha = hub.commit(repo_id, added, revision, tuple(deleted))
            self._json(dict(commitUrl=f"{hub.url}/{repo_id}/commit/{sha}", commitOid=sha,
                            pullRequestUrl=None))

    return Handler
