"""The Python SDK against a live daemon (appliance/sdk_test.go runs it).

Environment: HEARTH_SOCKET (the daemon's unix socket), HEARTH_TEST_ADDR
and HEARTH_TEST_TOKEN (its TCP API), HEARTH_TEST_AGENT (an agent whose
scripted model follows the prompts below). Exits non-zero naming the
first check that failed.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from hearth import APIError, Client, TERMINAL_STATUSES  # noqa: E402


def check(ok, what):
    if not ok:
        raise AssertionError(what)


def expect_error(code, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except APIError as e:
        check(e.code == code, f"{fn.__name__}: error code {e.code!r} ({e}), want {code!r}")
        return e
    raise AssertionError(f"{fn.__name__}: no error, want {code!r}")


def main():
    c = Client(os.environ["HEARTH_SOCKET"])
    agent = os.environ["HEARTH_TEST_AGENT"]

    # Transport: TCP with the token, TCP without it, the served document.
    tcp = Client(addr=os.environ["HEARTH_TEST_ADDR"], token=os.environ["HEARTH_TEST_TOKEN"])
    check("store_ok" in tcp.health(), "health over TCP")
    bad = Client(addr=os.environ["HEARTH_TEST_ADDR"], token="not-the-token-0123456789")
    e = expect_error("unauthorized", bad.health)
    check(e.status == 401, f"a wrong token: status {e.status}, want 401")
    check(b"operationId: execSandbox" in c.openapi(), "GET /openapi.yaml lacks execSandbox")

    # Sandboxes: exec streaming in order, stdin, files, jobs.
    sbx = c.sandboxes.create(id="py-sdk", idle_timeout="0")
    try:
        check(sbx["status"] == "running", f"created sandbox status {sbx['status']}")
        check(any(s["id"] == "py-sdk" for s in c.sandboxes.list()), "the sandbox is not listed")
        frames = list(c.sandboxes.exec("py-sdk", ["sh", "-c", "echo one; sleep 0.3; echo two >&2; sleep 0.3; cat; exit 3"], stdin=b"from stdin\n"))
        check("started" in frames[0], f"first frame {frames[0]}, want started")
        streams = [(f["stream"], f["data"]) for f in frames if "stream" in f]
        check(streams == [("stdout", b"one\n"), ("stderr", b"two\n"), ("stdout", b"from stdin\n")], f"exec frames {streams}")
        check(frames[-1]["exit"]["code"] == 3, f"last frame {frames[-1]}, want exit 3")

        # Streaming: the first line arrives while the command still runs.
        start = time.monotonic()
        at = {}
        for f in c.sandboxes.exec("py-sdk", ["sh", "-c", "echo early; sleep 2; echo late"]):
            if f.get("stream") == "stdout":
                at[f["data"]] = time.monotonic() - start
        check(set(at) == {b"early\n", b"late\n"}, f"streamed output {at}")
        gap = at[b"late\n"] - at[b"early\n"]
        check(gap > 1.5, f"early came {gap:.2f}s before late: not streamed")

        w = c.sandboxes.write_file("py-sdk", "/tmp/data bin", bytes(range(256)), mode="0600")
        check(w["size"] == 256, f"write_file {w}")
        check(c.sandboxes.read_file("py-sdk", "/tmp/data bin") == bytes(range(256)), "read_file bytes differ")
        st = c.sandboxes.stat("py-sdk", "/tmp/data bin")
        check(st["size"] == 256 and st["mode"] == 0o600, f"stat {st}")
        check(any(f["name"] == "data bin" for f in c.sandboxes.list_dir("py-sdk", "/tmp")), "list_dir lacks the file")
        expect_error("not_found", c.sandboxes.read_file, "py-sdk", "/no/such/file")
        check(c.sandboxes.run("py-sdk", ["cat", "/tmp/data bin"]).stdout == bytes(range(256)), "run stdout")

        paused = c.sandboxes.pause("py-sdk")
        check(paused["status"] == "paused", f"paused {paused['status']}")
        expect_error("conflict", c.sandboxes.run, "py-sdk", ["true"])
        check(c.sandboxes.resume("py-sdk")["status"] == "running", "resumed")
        c.sandboxes.run("py-sdk", ["sh", "-c", 'echo kept > "$HOME/keep"'])
        exposed = c.sandboxes.expose("py-sdk", 8000, public=True)
        check(exposed["port"] == 8000 and exposed["url"].startswith("http://") and exposed.get("public_url"), f"exposed {exposed}")
        check([p["port"] for p in c.sandboxes.ports("py-sdk")] == [8000], "ports list")
        check(not c.sandboxes.revoke_public("py-sdk", 8000).get("public_url"), "public link revoked")
        c.sandboxes.unexpose("py-sdk", 8000)
        check(c.sandboxes.ports("py-sdk") == [], "port closed")
        cp = c.sandboxes.checkpoint("py-sdk", "cp1")
        check(cp["name"] == "cp1", f"checkpoint {cp}")
        c.sandboxes.run("py-sdk", ["sh", "-c", 'rm "$HOME/keep"'])
        check([x["name"] for x in c.sandboxes.checkpoints("py-sdk")] == ["cp1"], "checkpoints list")
        check(c.sandboxes.restore("py-sdk", "cp1")["status"] == "running", "restored")
        back = c.sandboxes.run("py-sdk", ["sh", "-c", 'cat "$HOME/keep"'])
        check(back.stdout == b"kept\n", f"after restore the file holds {back.stdout!r} ({back.stderr!r})")

        # The other transport streams too: exec over TCP with the token.
        r = tcp.sandboxes.run("py-sdk", ["sh", "-c", "echo over-tcp"])
        check(r.code == 0 and r.stdout == b"over-tcp\n", f"exec over TCP {r}")

        job = c.sandboxes.start_job("py-sdk", ["sh", "-c", "echo job-out; sleep 300"])
        check(job["state"] == "running", f"job {job}")
        check([j["id"] for j in c.sandboxes.jobs("py-sdk")] == [job["id"]], "jobs list")
        deadline = time.monotonic() + 30
        while c.sandboxes.job_output("py-sdk", job["id"]) != b"job-out\n":
            check(time.monotonic() < deadline, "the job's output did not come within 30s")
            time.sleep(0.05)
        stopped = c.sandboxes.stop_job("py-sdk", job["id"], grace="1s")
        check(stopped["state"] == "cancelled", f"stopped job {stopped}")
        check(c.sandboxes.job("py-sdk", job["id"])["state"] == "cancelled", "job state after stop")
        out = c.sandboxes.job_output("py-sdk", job["id"])
        check(out == b"job-out\n", f"job output after stop {out!r}")
    finally:
        c.sandboxes.destroy("py-sdk")
    expect_error("not_found", c.sandboxes.get, "py-sdk")

    # Workspace: sessions, snapshots, restore, branch.
    c.workspace.create_session("py-ws")
    check(any(s["ID"] == "py-ws" for s in c.workspace.sessions()), "session not listed")
    snap = c.workspace.snapshot("py-ws", "first")
    check(snap["name"] == "first", f"snapshot {snap}")
    check([s["Name"] for s in c.workspace.snapshots("py-ws")] == ["first"], "snapshots list")
    c.workspace.restore("py-ws", "first")
    c.workspace.branch("py-ws", "first", "py-ws-branch")
    check(any(s["ID"] == "py-ws-branch" for s in c.workspace.sessions()), "branch not listed")
    c.workspace.delete_snapshot("py-ws", "first")
    c.workspace.delete_session("py-ws-branch")
    c.workspace.delete_session("py-ws")

    # Agents: run, follow live, outputs, resume, cancel.
    check(any(a["name"] == agent for a in c.agents.list()), f"agent {agent} not listed")
    run = c.agents.run(agent, "write-report please")
    check(run["status"] in ("pending", "running"), f"run without wait: {run['status']}")
    types = [ev["type"] for ev in c.agents.events(run["id"])]
    check("tool_call" in types and types[-1] == "status", f"live events {types}")
    done = c.agents.get(run["id"])
    check(done["status"] == "completed" and done["result"] == "report written", f"execution {done['status']}: {done.get('result')!r} {done.get('error')!r}")
    outs = c.agents.outputs(run["id"])
    check(any(o["path"] == "outputs/report.md" and o["matched"] for o in outs), f"outputs {outs}")
    check(c.agents.output(run["id"], "report.md") == b"# test report\n", "report.md content")
    expect_error("bad_request", c.agents.output, run["id"], "../.home/x")
    page = c.agents.event_page(run["id"], 0, 2)
    check(len(page["events"]) == 2 and not page["ended"], f"event page {page}")

    resumed = c.agents.resume(done["session"], "summarize it", wait=True)
    check(resumed["status"] == "completed" and resumed["result"] == "summary added" and resumed["previous"] == run["id"], f"resumed {resumed}")
    check(any(s["id"] == done["session"] for s in c.agents.sessions(agent=agent)), "agent sessions")

    long = c.agents.run(agent, "sleep-long now")
    for ev in c.agents.events(long["id"]):
        if ev["type"] == "tool_call":
            break
    cancelled = c.agents.cancel(long["id"])
    check(cancelled["status"] == "cancelled", f"cancelled {cancelled['status']}")
    check(cancelled["status"] in TERMINAL_STATUSES, "cancelled is terminal")
    expect_error("conflict", c.agents.cancel, long["id"])
    retried = c.agents.retry(long["id"], wait=True)
    check(retried["status"] == "completed" and retried["previous"] == long["id"], f"retried {retried['status']} {retried.get('previous')}")
    check({long["id"], run["id"], retried["id"]} <= {e["id"] for e in c.agents.executions(agent=agent)}, "executions list")
    print("python sdk: ok")


if __name__ == "__main__":
    main()
