#!/usr/bin/env bash
# Sets up Hearth and runs its main job: an agent task in a sandbox, visible
# in its execution stream. It builds Hearth and the claude-code image
# (a few minutes the first time, cached after), starts the daemon, adds
# credits, and runs the data-analyzer agent: the real Claude Code CLI in a
# jail reads a CSV from its session's inputs/ and writes
# outputs/report.md, while every step streams to the terminal.
#
# The model: with ANTHROPIC_API_KEY set, the real provider. Without it
# (these machines reach none), hearth-scripted-model stands in: a scripted
# Messages API server, not a model, that plays a fixed demo script and
# says so in its answers. Everything else is real.
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
ensure_fuse
ensure_go
# debootstrap and e2fsprogs build the images (a Debian root, then ext4).
ensure_packages debootstrap e2fsprogs
exec </dev/null # nothing below reads the terminal; exec forwards stdin otherwise
started=$SECONDS

demo=${HEARTH_DEMO_DIR:-/tmp/hearth-demo}
bin=$demo/bin
mkdir -p "$bin" "$demo/task" "$demo/state"
echo "==> building hearth and its guest agent (hearth-guest, static, beside it)"
go build -o "$bin/hearth" ./cmd/hearth
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bin/hearth-guest" ./cmd/hearth-guest
go build -o "$bin/hearth-scripted-model" ./cmd/hearth-scripted-model
model_conf=
stand_in=
if [ -z "${ANTHROPIC_API_KEY:-}" ]; then
  echo "==> no ANTHROPIC_API_KEY: hearth-scripted-model stands in for the model provider (a script, not a model)"
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$demo/model.key"
  "$bin/hearth-scripted-model" --listen 127.0.0.1:8089 --key-file "$demo/model.key" 2>"$demo/model.log" &
  stand_in=$!
  model_conf=$'[model]\nupstream = "http://127.0.0.1:8089"\napi_key_file = "'"$demo/model.key"'"'
fi
mkdir -p "$demo/state/agents"
cat > "$demo/hearth.toml" <<TOML
state_dir = "$demo/state"
[workspace]
mount = "$demo/agents"
[credits]
enabled = true
$model_conf
TOML
cat > "$demo/state/agents/data-analyzer.toml" <<'TOML'
description = "Reads CSV inputs and writes a short report."
image = "claude-code"
model = "claude-sonnet-4-5"
prompt = """
{{.Prompt}}

The data is in {{range $i, $f := .Inputs}}{{if $i}}, {{end}}{{$f}}{{end}}.
Write your findings to outputs/report.md.
"""
outputs = ["outputs/*.md"]

[limits]
usd = 5.0
turns = 30
wall_time = "15m"
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
  [ -n "$stand_in" ] && kill -TERM "$stand_in" 2>/dev/null
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

run images build claude-code
run credits add 20 --note demo

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
cd "$demo/task"
echo "\$ hearth agents run data-analyzer 'Analyze Q2 sales' --input sales.csv --budget 2"
hearth agents run data-analyzer 'Analyze Q2 sales' --input sales.csv --budget 2 | tee "$demo/run.log"
exec_id=$(grep -o -m1 '^exec-[0-9a-f]*' "$demo/run.log")
session=$(grep -o -m1 'session-[0-9a-f]*' "$demo/run.log")
run agents list
show cat "$demo/agents/$session/outputs/report.md"
run agents show "$exec_id"
run credits show

echo "==> stopping the daemon (SIGTERM): it unmounts $demo/agents"
kill -TERM "$daemon"
status=0
wait "$daemon" || status=$?
daemon=
[ $status = 0 ] || { echo "==> the daemon exited with status $status; its log: $demo/daemon.log" >&2; exit 1; }
echo "==> done in $((SECONDS - started))s; sessions and executions stay in $demo/state (start again with: $bin/hearth up --config $demo/hearth.toml)"
