#!/usr/bin/env bash
# Installs what the tests need and runs them: vet, staticcheck, gofmt,
# every test with the race detector, every fuzz target briefly, then every
# benchmark once.
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
ensure_fuse
ensure_go
# btrfs-progs: the reflink test formats a loop-mounted btrfs image.
ensure_packages btrfs-progs
# debootstrap, e2fsprogs: image's TestBuild builds real images (debootstrap a
# Debian root, then mkfs.ext4 and e2fsck -fn on the result).
ensure_packages debootstrap e2fsprogs
# busybox-static: the jail tests build a small image root from it.
ensure_packages busybox-static
# chromium: the dashboard's tests drive a real headless browser.
# qemu-system-x86 (with qemu-system-common's virtiofsd): the VM tiers boot
# real VMs under TCG, and the Cloud Hypervisor driver's tests run virtiofsd.
ensure_packages chromium qemu-system-x86 qemu-system-common
# nodejs, npm, python3: the SDKs' tests run against a live daemon; the
# TypeScript SDK is compiled with its pinned compiler (sdk/typescript's
# devDependencies).
ensure_packages python3
# postgresql: the cluster's store and job queue are tested on a real
# server, started per test from a fresh initdb (internal/pgtest).
ensure_packages postgresql
# bubblewrap: the sandbox-create benchmark measures bwrap beside Hearth.
# bash-completion: the generated bash completion script is run in a real
# bash, which needs its helpers. sshfs, openssh-client: nodes mount the
# served workspace over SFTP.
ensure_packages bubblewrap bash-completion sshfs openssh-client
ensure_command node nodejs
ensure_command npm npm
(cd sdk/typescript && npm install --no-audit --no-fund --loglevel=error)

echo "==> go vet"
go vet ./...
echo "==> staticcheck"
go tool staticcheck ./...
echo "==> gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
# Packages that run machines on real images share one image cache.
export HEARTH_TEST_IMAGES="${HEARTH_TEST_IMAGES:-/var/tmp/hearth-test-images}"
# Screenshots and other files tests leave for people to look at.
export HEARTH_ARTIFACTS="${HEARTH_ARTIFACTS:-$PWD/.artifacts}"
mkdir -p "$HEARTH_ARTIFACTS"
# The images the tests boot are built first, outside any test's time
# limit: minutes each on a fresh machine, nothing once cached.
echo "==> images (cache $HEARTH_TEST_IMAGES)"
go run ./cmd/hearth images build --cache "$HEARTH_TEST_IMAGES" base claude-code codex opencode gemini code-server
echo "==> go test -race"
go test -race -count=1 -timeout 45m ./...
# Every fuzz target (a parser of bytes an agent, a provider or a file can
# control) runs briefly on top of its committed corpus in testdata/fuzz.
# A count, not a duration: Go 1.26's fuzzing coordinator can fail a target
# with "context deadline exceeded" when a duration ends (Go issue 75804).
echo "==> fuzz targets (${HEARTH_FUZZTIME:=10000x} each)"
for file in $(git ls-files '*_test.go'); do
  for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$HEARTH_FUZZTIME" "./$(dirname "$file")"
  done
done
# One package at a time (-p 1): a benchmark's ratio is against a baseline
# measured in the same run, which means little while another package's
# benchmark loads the same two cores.
echo "==> benchmarks (one round each; ratios against a baseline in the same run, see docs)"
go test -p 1 -run '^$' -bench . -benchtime 1x -timeout 30m ./...
