#!/usr/bin/env bash
# Sets up Hearth and runs its main job as far as it goes today: start the
# daemon (it mounts the shared workspace), build the base image (cached
# after the first run), boot a sandbox on a session, run an agent-like task
# in it that reads the session's inputs and writes a report to its outputs,
# read the report from the host, pause and resume the sandbox, snapshot,
# branch and roll back the session, then clean up and stop the daemon.
# Real agents and their execution stream come with the agents issue.
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
ensure_fuse
ensure_go
# debootstrap and e2fsprogs build the base image (a Debian root, then ext4).
ensure_packages debootstrap e2fsprogs
exec </dev/null # nothing below reads the terminal; exec forwards stdin otherwise
started=$SECONDS

demo=${HEARTH_DEMO_DIR:-/tmp/hearth-demo}
bin=$demo/bin
mkdir -p "$bin" "$demo/task" "$demo/state"
echo "==> building hearth and its guest agent (hearth-guest, static, beside it)"
go build -o "$bin/hearth" ./cmd/hearth
CGO_ENABLED=0 go build -o "$bin/hearth-guest" ./cmd/hearth-guest
cat > "$demo/hearth.toml" <<TOML
state_dir = "$demo/state"
[workspace]
mount = "$demo/agents"
TOML
# hearth runs the CLI with the demo's config (before the arguments: exec
# passes what follows -- to the command); run also shows the command.
hearth() { local group=$1 verb=$2; shift 2; "$bin/hearth" "$group" "$verb" --config "$demo/hearth.toml" "$@"; }
run() { echo "\$ hearth $(quote "$@")"; hearth "$@"; }
show() { echo "\$ $(quote "$@")"; "$@"; }
# quote writes its arguments as a shell would need them typed.
quote() {
  local a out=()
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
  done
  echo "${out[*]}"
}

sbx=
daemon=
cleanup() {
  local rc=$?
  [ -n "$sbx" ] && hearth sandboxes destroy "$sbx" >/dev/null 2>&1
  if [ -n "$daemon" ]; then
    kill -TERM "$daemon" 2>/dev/null
    wait "$daemon" || { rc=1; echo "==> the daemon did not stop cleanly; its log: $demo/daemon.log" >&2; }
  fi
  [ $rc = 0 ] || echo "==> the demo failed (exit $rc); the daemon's log: $demo/daemon.log" >&2
  exit $rc
}
trap cleanup EXIT

echo "==> starting the daemon: hearth up --config $demo/hearth.toml (log: $demo/daemon.log)"
"$bin/hearth" up --config "$demo/hearth.toml" 2>"$demo/daemon.log" &
daemon=$!
until grep -q "API on unix socket" "$demo/daemon.log" 2>/dev/null; do
  if ! kill -0 "$daemon" 2>/dev/null; then
    cat "$demo/daemon.log" >&2
    daemon=
    exit 1
  fi
  sleep 0.1
done

run images build base
run images ls

# The task: a table of sales as the input, a small program as the agent.
sess=q2-sales-$(head -c2 /dev/urandom | od -An -tx1 | tr -d ' \n')
cat > "$demo/task/sales.csv" <<'CSV'
date,region,product,units,price
2026-04-02,north,kettle,12,39.90
2026-04-09,south,toaster,7,54.00
2026-04-17,north,toaster,3,54.00
2026-05-03,west,kettle,20,37.50
2026-05-21,south,kettle,9,39.90
2026-06-04,west,blender,4,89.00
2026-06-18,north,blender,6,89.00
2026-06-30,south,kettle,15,37.50
CSV
cat > "$demo/task/analyse.py" <<'PY'
import csv, collections
rows = list(csv.DictReader(open("inputs/sales.csv")))
revenue, units = collections.Counter(), collections.Counter()
for r in rows:
    revenue[r["region"]] += int(r["units"]) * float(r["price"])
    units[r["product"]] += int(r["units"])
with open("outputs/report.md", "w") as f:
    f.write(f"# Q2 sales: {len(rows)} orders, {sum(revenue.values()):,.2f} total\n\n")
    f.write("| region | revenue |\n|---|---|\n")
    for region, total in revenue.most_common():
        f.write(f"| {region} | {total:,.2f} |\n")
    best, n = units.most_common(1)[0]
    f.write(f"\nBest seller: {best} ({n} units)\n")
print(f"analysed {len(rows)} orders: wrote outputs/report.md")
PY

echo "\$ hearth sandboxes create --session $sess --memory 512M --cpus 1"
sbx=$(hearth sandboxes create --session "$sess" --memory 512M --cpus 1)
echo "$sbx"
cd "$demo/task"
run sandboxes exec "$sbx" -- sh -c 'id; exit 3' || echo "(exit status $?)"
run sandboxes cp sales.csv "$sbx:/workspace/agents/$sess/inputs/"
echo "\$ hearth sandboxes exec $sbx --cwd /workspace/agents/$sess -- python3 - < analyse.py"
hearth sandboxes exec "$sbx" --cwd "/workspace/agents/$sess" -- python3 - <analyse.py
show cat "$demo/agents/$sess/outputs/report.md"
run sandboxes ls
run sandboxes pause "$sbx"
run sandboxes exec "$sbx" -- true || echo "(exit status $?)"
run sandboxes resume "$sbx"

run workspace snapshot "$sess" first-draft
run sandboxes exec "$sbx" --cwd "/workspace/agents/$sess" -- sh -c 'echo "# Q2 sales: draft 2" > outputs/report.md'
show head -1 "$demo/agents/$sess/outputs/report.md"
run workspace branch "$sess" first-draft "$sess-alt"
run workspace restore "$sess" first-draft
run sandboxes exec "$sbx" -- head -1 "/workspace/agents/$sess/outputs/report.md"
run workspace ls

run sandboxes destroy "$sbx"
sbx=
echo "==> stopping the daemon (SIGTERM): it unmounts $demo/agents"
kill -TERM "$daemon"
status=0
wait "$daemon" || status=$?
daemon=
[ $status = 0 ] || { echo "==> the daemon exited with status $status; its log: $demo/daemon.log" >&2; exit 1; }
echo "==> done in $((SECONDS - started))s; the sessions stay in $demo/state (start again with: $bin/hearth up --config $demo/hearth.toml)"
