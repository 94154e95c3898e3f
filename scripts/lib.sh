# Shared by the scripts: checks and installs what Hearth needs on a
# Debian or Ubuntu host.
set -euo pipefail

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "$0: run as root (Hearth mounts FUSE filesystems and will create namespaces): sudo $0" >&2
    exit 1
  fi
}

ensure_packages() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# ensure_command installs the Debian packages after CMD when the command
# CMD is missing: a host may have it from elsewhere (a Node.js that
# bundles npm conflicts with Debian's npm package).
ensure_command() {
  local cmd=$1
  shift
  command -v "$cmd" >/dev/null || ensure_packages "$@"
}

# ensure_go makes sure a Go that can build go.mod's version is on PATH.
ensure_go() {
  export PATH="/usr/local/go/bin:$PATH"
  if ! command -v go >/dev/null; then
    ensure_packages golang-go
  fi
  local want
  want=$(awk '/^go /{print $2}' go.mod)
  if ! go version | grep -qE "go(1\.(2[6-9]|[3-9][0-9]))"; then
    # Go 1.21 and later fetch the toolchain go.mod asks for from the module proxy.
    export GOTOOLCHAIN="go${want}.0+auto"
    go version >/dev/null 2>&1 || {
      echo "$0: Go ${want} or newer is needed and this Go cannot fetch it: install it from your distribution's backports" >&2
      exit 1
    }
  fi
}

ensure_fuse() {
  [ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
  if [ ! -e /dev/fuse ]; then
    echo "$0: /dev/fuse is missing: load the fuse module (modprobe fuse) or run on a host that has it" >&2
    exit 1
  fi
}
