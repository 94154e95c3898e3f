"""A client for the Hearth daemon's API (standard library only).

The API is described by the daemon's OpenAPI document (GET /openapi.yaml,
appliance/api/openapi.yaml in the repository). Every request this module
makes goes through Client._call with a literal method and path template,
the same as the document's: appliance/sdk_test.go reads them from this file
and fails if one is not in the document, or if an operation the SDK must
cover is missing.

    from hearth import Client
    c = Client()                      # $HEARTH_ADDR + $HEARTH_TOKEN, else the unix socket
    sbx = c.sandboxes.create(image="base")
    for frame in c.sandboxes.exec(sbx["id"], ["echo", "hi"]):
        ...
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import urllib.parse
from typing import Any, Iterator, Mapping

__all__ = ["Client", "APIError", "ExecResult", "TERMINAL_STATUSES"]

DEFAULT_SOCKET = "/var/lib/hearth/hearth.sock"

# The statuses an execution ends in (agents/store's Status.Terminal).
TERMINAL_STATUSES = frozenset(
    {"completed", "failed", "budget_exceeded", "timed_out", "cancelled", "interrupted"}
)


class APIError(Exception):
    """An error response: {"error":{"code","message"}} with its HTTP status."""

    def __init__(self, status: int, code: str, message: str, step: str = ""):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.step = step

    def __str__(self) -> str:
        return f"{self.message} ({self.code}, HTTP {self.status})"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None):
        super().__init__("hearth", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


def _path(template: str, **params: str) -> str:
    """Fills a path template of the document (/v1/sandboxes/{id}) with
    escaped values ('/' inside one is escaped too)."""
    out = template
    for k, v in params.items():
        out = out.replace("{" + k + "}", urllib.parse.quote(str(v), safe=""))
    if "{" in out:
        raise ValueError(f"{template}: a path parameter is missing")
    return out


def _query(**params: Any) -> str:
    pairs = []
    for k, v in params.items():
        if v is None or v == "":
            continue
        if isinstance(v, (list, tuple)):
            pairs.extend((k, str(x)) for x in v)
        elif isinstance(v, bool):
            pairs.append((k, "true" if v else "false"))
        else:
            pairs.append((k, str(v)))
    return ("?" + urllib.parse.urlencode(pairs)) if pairs else ""


class _Response:
    """A streamed response and the connection it holds."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self.conn = conn
        self.resp = resp

    def lines(self) -> Iterator[bytes]:
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    return
                yield line
        finally:
            self.close()

    def close(self) -> None:
        self.resp.close()
        self.conn.close()


class ExecResult:
    """What sandboxes.run collected: exit code, output, the exit frame."""

    def __init__(self, code: int, stdout: bytes, stderr: bytes, exit: dict):
        self.code = code
        self.stdout = stdout
        self.stderr = stderr
        self.exit = exit

    def __repr__(self) -> str:
        return f"ExecResult(code={self.code}, stdout={self.stdout!r}, stderr={self.stderr!r})"


class Client:
    """A client for one daemon: over its unix socket, or over TCP with the
    API token (the config's api.tcp and api.token_file).

    With no argument it uses $HEARTH_ADDR (host:port) and $HEARTH_TOKEN
    when HEARTH_ADDR is set, as the hearth CLI does, else the socket in
    $HEARTH_SOCKET, else /var/lib/hearth/hearth.sock.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        addr: str | None = None,
        token: str | None = None,
        timeout: float = 60.0,
    ):
        if socket_path is None and addr is None:
            addr = os.environ.get("HEARTH_ADDR") or None
            if addr is not None and token is None:
                token = os.environ.get("HEARTH_TOKEN") or None
            if addr is None:
                socket_path = os.environ.get("HEARTH_SOCKET") or DEFAULT_SOCKET
        if addr is not None:
            if not token:
                raise ValueError(
                    "a TCP address needs the API token: pass token=, or set HEARTH_TOKEN "
                    "(the daemon's api.token_file, by default <state_dir>/api.token)"
                )
            if "://" in addr:
                raise ValueError(f"addr {addr!r}: give host:port, not a URL")
        self.socket_path = socket_path
        self.addr = addr
        self.token = token
        self.timeout = timeout
        self.sandboxes = Sandboxes(self)
        self.agents = Agents(self)
        self.workspace = Workspace(self)

    # -- transport -------------------------------------------------------

    def _conn(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.addr is not None:
            host, _, port = self.addr.rpartition(":")
            return http.client.HTTPConnection(host.strip("[]") or "127.0.0.1", int(port), timeout=timeout)
        return _UnixConnection(self.socket_path or DEFAULT_SOCKET, timeout)

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        content_type: str | None,
        accept: str,
        headers: Mapping[str, str] | None,
        timeout: float | None,
    ) -> _Response:
        conn = self._conn(timeout)
        h = {"Accept": accept}
        if content_type:
            h["Content-Type"] = content_type
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if headers:
            h.update(headers)
        try:
            conn.request(method, path, body=body, headers=h)
            resp = conn.getresponse()
        except (FileNotFoundError, ConnectionRefusedError) as e:
            conn.close()
            where = self.addr or self.socket_path
            raise ConnectionError(f"the hearth daemon at {where} does not answer ({e}): start it with 'hearth up'") from e
        except BaseException:
            conn.close()
            raise
        if resp.status >= 400:
            raw = resp.read()
            conn.close()
            try:
                err = json.loads(raw)["error"]
                raise APIError(resp.status, err.get("code", ""), err.get("message", ""), err.get("step", ""))
            except (ValueError, KeyError, TypeError):
                raise APIError(resp.status, "http", raw.decode("utf-8", "replace").strip() or resp.reason) from None
        return _Response(conn, resp)

    def _call(
        self,
        method: str,
        template: str,
        *,
        params: Mapping[str, str] | None = None,
        query: str = "",
        json_body: Any = None,
        raw_body: bytes | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
        headers: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> Any:
        """One operation of the document: method and path template as there."""
        path = _path(template, **(params or {})) + query
        body = raw_body
        if json_body is not None:
            body = json.dumps(json_body).encode()
            content_type = "application/json"
        # Streams are bounded by the caller (they end with the command, or
        # the execution); the rest by self.timeout.
        r = self._send(method, path, body, content_type, accept, headers, None if stream else self.timeout)
        if stream:
            return r
        try:
            data = r.resp.read()
            ctype = r.resp.getheader("Content-Type", "")
        finally:
            r.close()
        if accept == "application/json" and ctype.startswith("application/json"):
            return json.loads(data) if data else None
        return data

    def openapi(self) -> bytes:
        """The daemon's OpenAPI document, as YAML."""
        return self._call("GET", "/openapi.yaml", accept="application/yaml")

    def health(self) -> dict:
        return self._call("GET", "/v1/health")


class Sandboxes:
    """Sandboxes: machines to run commands in (hearth sandboxes)."""

    def __init__(self, c: Client):
        self._c = c

    def create(self, **req: Any) -> dict:
        """Boots a sandbox (id, image, session, cpus, memory, env, idle_timeout, ...)."""
        return self._c._call("POST", "/v1/sandboxes", json_body=req)

    def list(self) -> list:
        return self._c._call("GET", "/v1/sandboxes")

    def get(self, id: str) -> dict:
        return self._c._call("GET", "/v1/sandboxes/{id}", params={"id": id})

    def destroy(self, id: str) -> dict:
        return self._c._call("DELETE", "/v1/sandboxes/{id}", params={"id": id})

    def pause(self, id: str) -> dict:
        return self._c._call("POST", "/v1/sandboxes/{id}/pause", params={"id": id})

    def resume(self, id: str) -> dict:
        return self._c._call("POST", "/v1/sandboxes/{id}/resume", params={"id": id})

    def exec(
        self,
        id: str,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str = "",
        user: str = "",
        timeout: str = "",
    ) -> Iterator[dict]:
        """Runs argv, yielding its frames as they come: {"started":{pid}},
        {"stream":"stdout"|"stderr","data":bytes}, and last {"exit":{code,...}}.
        An error frame after the start raises APIError."""
        if not argv:
            raise ValueError("exec needs a command: argv is empty")
        req: dict[str, Any] = {"argv": list(argv)}
        if stdin is not None:
            req["stdin"] = base64.b64encode(stdin).decode()
        for k, v in (("env", env), ("cwd", cwd), ("user", user), ("timeout", timeout)):
            if v:
                req[k] = v
        r = self._c._call(
            "POST", "/v1/sandboxes/{id}/exec", params={"id": id}, json_body=req,
            accept="application/x-ndjson", stream=True,
        )
        for line in r.lines():
            if not line.strip():
                continue
            f = json.loads(line)
            if f.get("error"):
                e = f["error"]
                raise APIError(200, e.get("code", ""), e.get("message", ""))
            if "data" in f:
                f["data"] = base64.b64decode(f["data"])
            yield f

    def run(self, id: str, argv: list[str], **kw: Any) -> ExecResult:
        """exec, collected: the exit code and the whole output."""
        out, err, exit = bytearray(), bytearray(), {}
        for f in self.exec(id, argv, **kw):
            if f.get("stream") == "stdout":
                out += f["data"]
            elif f.get("stream") == "stderr":
                err += f["data"]
            elif f.get("exit"):
                exit = f["exit"]
        return ExecResult(exit.get("code", -1), bytes(out), bytes(err), exit)

    # -- files -----------------------------------------------------------

    def write_file(self, id: str, path: str, data: bytes, mode: str = "") -> dict:
        """Writes data to path in the sandbox, atomically; mode is octal ("0755")."""
        return self._c._call(
            "PUT", "/v1/sandboxes/{id}/files", params={"id": id}, query=_query(path=path, mode=mode),
            raw_body=data, content_type="application/octet-stream",
        )

    def read_file(self, id: str, path: str) -> bytes:
        return self._c._call(
            "GET", "/v1/sandboxes/{id}/files", params={"id": id}, query=_query(path=path),
            accept="application/octet-stream",
        )

    def stat(self, id: str, path: str) -> dict:
        return self._c._call("GET", "/v1/sandboxes/{id}/files/stat", params={"id": id}, query=_query(path=path))

    def list_dir(self, id: str, path: str) -> list:
        return self._c._call("GET", "/v1/sandboxes/{id}/files/list", params={"id": id}, query=_query(path=path))

    # -- background jobs -------------------------------------------------

    def start_job(self, id: str, argv: list[str], **req: Any) -> dict:
        """Starts argv in the background (env, cwd, user); it outlives the call."""
        return self._c._call("POST", "/v1/sandboxes/{id}/jobs", params={"id": id}, json_body={"argv": list(argv), **req})

    def jobs(self, id: str) -> list:
        return self._c._call("GET", "/v1/sandboxes/{id}/jobs", params={"id": id})

    def job(self, id: str, job: str) -> dict:
        return self._c._call("GET", "/v1/sandboxes/{id}/jobs/{job}", params={"id": id, "job": job})

    def job_output(self, id: str, job: str, stream: str = "stdout") -> bytes:
        return self._c._call(
            "GET", "/v1/sandboxes/{id}/jobs/{job}/output", params={"id": id, "job": job},
            query=_query(stream=stream), accept="application/octet-stream",
        )

    def stop_job(self, id: str, job: str, grace: str = "") -> dict:
        return self._c._call(
            "POST", "/v1/sandboxes/{id}/jobs/{job}/stop", params={"id": id, "job": job},
            json_body={"grace": grace} if grace else {},
        )

    # -- checkpoints -----------------------------------------------------

    def checkpoint(self, id: str, name: str = "") -> dict:
        return self._c._call("POST", "/v1/sandboxes/{id}/checkpoints", params={"id": id}, json_body={"name": name} if name else {})

    def checkpoints(self, id: str) -> list:
        return self._c._call("GET", "/v1/sandboxes/{id}/checkpoints", params={"id": id})

    def restore(self, id: str, name: str) -> dict:
        return self._c._call("POST", "/v1/sandboxes/{id}/checkpoints/{name}/restore", params={"id": id, "name": name})

    # -- ports -----------------------------------------------------------

    def expose(self, id: str, port: int, public: bool = False) -> dict:
        """Serves port of the sandbox at a preview URL on the daemon (it needs
        api.tcp): url needs the API token as a bearer; with public, public_url
        is a link anyone may open."""
        body: dict = {"port": port}
        if public:
            body["public"] = True
        return self._c._call("POST", "/v1/sandboxes/{id}/ports", params={"id": id}, json_body=body)

    def ports(self, id: str) -> list:
        return self._c._call("GET", "/v1/sandboxes/{id}/ports", params={"id": id})

    def unexpose(self, id: str, port: int) -> dict:
        return self._c._call("DELETE", "/v1/sandboxes/{id}/ports/{port}", params={"id": id, "port": str(port)})

    def revoke_public(self, id: str, port: int) -> dict:
        return self._c._call("DELETE", "/v1/sandboxes/{id}/ports/{port}/public", params={"id": id, "port": str(port)})


class Agents:
    """Agents: delegate tasks, follow them, fetch their outputs."""

    def __init__(self, c: Client):
        self._c = c

    def list(self) -> list:
        return self._c._call("GET", "/v1/agents")

    def run(self, agent: str, prompt: str, *, wait: bool = False, inputs: Mapping[str, bytes] | None = None, **req: Any) -> dict:
        """Delegates prompt to agent (session, outputs, limits, ...). With
        wait the answer comes when it has ended; without, once it is
        accepted: follow it with events()."""
        body: dict[str, Any] = {"agent": agent, "prompt": prompt, **req}
        if wait:
            body["wait"] = True
        if inputs:
            body["inputs"] = {k: base64.b64encode(v).decode() for k, v in inputs.items()}
        return self._c._call("POST", "/v1/executions", json_body=body)

    def get(self, id: str) -> dict:
        return self._c._call("GET", "/v1/executions/{id}", params={"id": id})

    def executions(self, *, agent: str = "", session: str = "", status: list[str] | None = None, limit: int | None = None) -> list:
        return self._c._call("GET", "/v1/executions", query=_query(agent=agent, session=session, status=status, limit=limit))

    def events(self, id: str, after: int = 0) -> Iterator[dict]:
        """Follows the execution live (Server-Sent Events): every event
        after seq `after`, then new ones as they happen, until its last."""
        r = self._c._call(
            "GET", "/v1/executions/{id}/events", params={"id": id}, query=_query(after=after or None),
            accept="text/event-stream", stream=True,
        )
        data: list[str] = []
        for raw in r.lines():
            line = raw.decode("utf-8").rstrip("\r\n")
            if line == "":
                if data:
                    ev = json.loads("\n".join(data))
                    data = []
                    yield ev
                continue
            if line.startswith(":"):
                continue  # a keep-alive comment
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if value.startswith(" ") else value)

    def event_page(self, id: str, after: int = 0, limit: int | None = None) -> dict:
        """A page of events as JSON: {events, next_after, ended}."""
        return self._c._call("GET", "/v1/executions/{id}/events", params={"id": id}, query=_query(after=after, limit=limit))

    def wait(self, id: str) -> dict:
        """Follows the execution to its end and returns it."""
        for _ in self.events(id):
            pass
        return self.get(id)

    def cancel(self, id: str) -> dict:
        return self._c._call("POST", "/v1/executions/{id}/cancel", params={"id": id})

    def retry(self, id: str, *, wait: bool = False) -> dict:
        return self._c._call("POST", "/v1/executions/{id}/retry", params={"id": id}, json_body={"wait": wait} if wait else {})

    def resume(self, session: str, prompt: str, *, wait: bool = False, **req: Any) -> dict:
        """Continues an agent session with a new prompt; the agent keeps its conversation."""
        body: dict[str, Any] = {"prompt": prompt, **req}
        if wait:
            body["wait"] = True
        return self._c._call("POST", "/v1/sessions/{id}/resume", params={"id": session}, json_body=body)

    def sessions(self, *, agent: str = "", limit: int | None = None) -> list:
        return self._c._call("GET", "/v1/sessions", query=_query(agent=agent, limit=limit))

    def outputs(self, id: str) -> list:
        return self._c._call("GET", "/v1/executions/{id}/outputs", params={"id": id})

    def output(self, id: str, path: str) -> bytes:
        """One file under the session's outputs/ ("report.md")."""
        return self._c._call(
            "GET", "/v1/executions/{id}/outputs/{path}", params={"id": id, "path": path},
            accept="application/octet-stream",
        )


class Workspace:
    """The workspace: sessions and their copy-on-write snapshots."""

    def __init__(self, c: Client):
        self._c = c

    def sessions(self) -> list:
        return self._c._call("GET", "/v1/workspace/sessions")

    def create_session(self, id: str) -> dict:
        return self._c._call("POST", "/v1/workspace/sessions", json_body={"id": id})

    def delete_session(self, id: str) -> dict:
        return self._c._call("DELETE", "/v1/workspace/sessions/{id}", params={"id": id})

    def snapshots(self, session: str = "") -> list:
        return self._c._call("GET", "/v1/workspace/snapshots", query=_query(session=session))

    def snapshot(self, session: str, name: str = "") -> dict:
        return self._c._call("POST", "/v1/workspace/snapshots", json_body={"session": session, "name": name})

    def delete_snapshot(self, session: str, name: str) -> dict:
        return self._c._call("DELETE", "/v1/workspace/snapshots", query=_query(session=session, name=name))

    def restore(self, session: str, snapshot: str) -> dict:
        return self._c._call("POST", "/v1/workspace/restore", json_body={"session": session, "snapshot": snapshot})

    def branch(self, session: str, snapshot: str, new_session: str) -> dict:
        return self._c._call(
            "POST", "/v1/workspace/branch",
            json_body={"session": session, "snapshot": snapshot, "new_session": new_session},
        )
