#!/usr/bin/env bash
# Sets up Hearth and runs its main job as far as it goes today: start the
# daemon, which mounts the shared workspace, make a session, write to it
# through the mount, snapshot it, change it, branch and roll back.
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
ensure_fuse
ensure_go

demo=${HEARTH_DEMO_DIR:-/tmp/hearth-demo}
mkdir -p "$demo/bin"
echo "==> building hearth"
go build -o "$demo/bin/hearth" ./cmd/hearth
cat > "$demo/hearth.toml" <<TOML
state_dir = "$demo/state"
[workspace]
mount = "$demo/agents"
TOML
hearth() { "$demo/bin/hearth" "$@" --config "$demo/hearth.toml"; }
run() { echo "\$ hearth $*"; hearth "$@"; }

"$demo/bin/hearth" up --config "$demo/hearth.toml" 2>"$demo/daemon.log" &
daemon=$!
trap 'kill -INT $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 50); do [ -S "$demo/state/hearth.sock" ] && break; sleep 0.1; done

sess=session-$(head -c3 /dev/urandom | od -An -tx1 | tr -d ' \n')
run workspace create "$sess"
echo "\$ echo '# Q2 analysis' > $demo/agents/$sess/outputs/report.md"
echo '# Q2 analysis' > "$demo/agents/$sess/outputs/report.md"
run workspace snapshot "$sess" first-draft
echo "\$ echo 'revised' > $demo/agents/$sess/outputs/report.md"
echo 'revised' > "$demo/agents/$sess/outputs/report.md"
run workspace snapshots "$sess"
run workspace branch "$sess" first-draft "$sess-alt"
run workspace restore "$sess" first-draft
echo "\$ cat $demo/agents/$sess/outputs/report.md"
cat "$demo/agents/$sess/outputs/report.md"
run workspace ls
echo "\$ ls $demo/agents"
ls "$demo/agents"
echo "==> done; the daemon stops now (its log: $demo/daemon.log)"
