from hearth import Client

c = Client()  # $HEARTH_ADDR and $HEARTH_TOKEN when set, else the unix socket

# A sandbox: write a file, run a command with its output streamed, clean up.
sbx = c.sandboxes.create(idle_timeout="0")
try:
    c.sandboxes.write_file(sbx["id"], "/tmp/hello.txt", b"hello from the sandbox\n")
    for frame in c.sandboxes.exec(sbx["id"], ["sh", "-c", "cat /tmp/hello.txt; echo warming up >&2"]):
        if "stream" in frame:
            print(frame["stream"], frame["data"].decode().strip())
        elif "exit" in frame:
            print("exit", frame["exit"]["code"])
finally:
    c.sandboxes.destroy(sbx["id"])

# An agent: delegate a task, follow it live, fetch what it wrote.
run = c.agents.run("analyst", "Summarise inputs/notes.txt into outputs/report.md",
                   inputs={"notes.txt": b"first\nsecond\n"})
for event in c.agents.events(run["id"]):
    print(event["seq"], event["type"])
done = c.agents.get(run["id"])
print(done["status"], f"${done['usd']:.4f}")
print(c.agents.output(run["id"], "report.md").decode())
