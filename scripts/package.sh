#!/usr/bin/env bash
# Builds the Debian package dist/hearth_<version>_amd64.deb: hearth and
# hearth-guest (static, stamped with the version and commit), the default
# /etc/hearth/hearth.toml, the systemd unit and the maintainer scripts in
# packaging/, put together by nfpm (pinned in packaging/nfpm/go.mod).
#
# Usage: scripts/package.sh [--version V] [--dist DIR]
#   DIR is where the package goes (default dist; binaries in DIR/build).
#   V is a Debian version (it must start with a digit); without it, one is
#   made from the newest tag v<digit>...: v1.2.0 gives 1.2.0, 3 commits
#   after it 1.2.0+3.g<hash>; with no such tag, 0.0.0~git<commit date>.<hash>
#   (+dirty, or .dirty, for a tree with uncommitted changes).
# Prints the path of the package.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_go

version=
dist=dist
while [ $# -gt 0 ]; do
  case $1 in
    --version) version=${2:?--version needs a value}; shift 2 ;;
    --version=*) version=${1#--version=}; shift ;;
    --dist) dist=${2:?--dist needs a directory}; shift 2 ;;
    --dist=*) dist=${1#--dist=}; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown argument $1 (see $0 --help)" >&2; exit 2 ;;
  esac
done

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -z "$version" ]; then
  dirty=
  if desc=$(git describe --tags --dirty --match 'v[0-9]*' 2>/dev/null) &&
    [[ ${desc%-dirty} =~ ^v([0-9][0-9A-Za-z.~+]*)(-([0-9]+)-g([0-9a-f]+))?$ ]]; then
    version=${BASH_REMATCH[1]}
    [ -n "${BASH_REMATCH[3]}" ] && version+="+${BASH_REMATCH[3]}.g${BASH_REMATCH[4]}"
    [ "$desc" != "${desc%-dirty}" ] && dirty=1
  else
    when=$(git log -1 --format=%cd --date=format:%Y%m%d 2>/dev/null || date -u +%Y%m%d)
    version="0.0.0~git${when}.${commit:0:7}"
    git diff --quiet HEAD 2>/dev/null || dirty=1
  fi
  if [ -n "$dirty" ]; then
    case $version in *+*) version+=".dirty" ;; *) version+="+dirty" ;; esac
  fi
fi
if ! [[ $version =~ ^[0-9][0-9A-Za-z.+~-]*$ ]]; then
  echo "$0: --version $version: a Debian version starts with a digit and has only letters, digits and . + ~ -" >&2
  exit 2
fi

mkdir -p "$dist"
dist=$(cd "$dist" && pwd)
build=$dist/build
mkdir -p "$build"
ldflags="-X hearth/internal/version.Version=$version -X hearth/internal/version.Commit=$commit"
echo "==> building hearth $version (commit ${commit:0:12})" >&2
# Static binaries: the guest agent must be (it runs inside any image), and
# the daemon then needs nothing but the kernel and the packages it names.
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$build/hearth" ./cmd/hearth
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags -s -w" -o "$build/hearth-guest" ./cmd/hearth-guest
(cd packaging/nfpm && go build -o "$build/nfpm" github.com/goreleaser/nfpm/v2/cmd/nfpm)

deb="$dist/hearth_${version}_amd64.deb"
rm -f "$deb"
HEARTH_VERSION=$version HEARTH_BUILD=$build "$build/nfpm" package --config packaging/nfpm.yaml --packager deb --target "$deb" >&2
echo "$deb"
