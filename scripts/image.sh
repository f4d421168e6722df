#!/usr/bin/env bash
# Builds deploy/Dockerfile with Debian's podman (no Docker, no registry) and runs
# the image the way the Helm chart's DaemonSet does (scripts/daemonset_podman.py
# runs the rendered chart's pod: its init container, security context, host PID
# namespace, host mounts, env and limits), against a python3 http.server
# started here; checks /healthz and that the agent counted the requests sent.
# Idempotent; run as root.
#
#   bash scripts/image.sh      (scripts/setup.sh installs podman, runc and mmdebstrap)
#
# FROM debian:bookworm-slim is made locally with mmdebstrap when no such image
# exists ($DEBIAN_MIRROR, default deb.debian.org). pip in the build trusts this
# host's CA bundle ($PIP_CERT, else Debian's), and uses $PIP_INDEX_URL if set.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'image: FAILED: %s\n' "$*" >&2; exit 1; }
t0=$SECONDS
step() { printf 'image: %-6s %3ds  %s\n' "$1" $((SECONDS - t0)) "$2"; t0=$SECONDS; }

[ "$(id -u)" -eq 0 ] || die "run as root (rootful podman; the agent loads BPF programs)"
for tool in podman mmdebstrap runc curl python3; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y podman mmdebstrap runc curl)"
done
for dir in /sys/kernel/tracing /sys/kernel/debug /sys/fs/bpf /lib/modules /usr/src; do
    [ -d "$dir" ] || die "$dir missing (scripts/setup.sh mounts tracefs and debugfs)"
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image=${IMAGE:-localhost/sitsprobe:$version}
base=docker.io/library/debian:bookworm-slim    # what the Dockerfile's FROM resolves to
work=${IMAGE_WORK:-/var/tmp/sitsprobe-image}
mkdir -p "$work"

# crun refuses hybrid cgroups (v1 plus a v2 controller); podman's default
# rlimits (nofile 1048576) exceed the hard limits where CAP_SYS_RESOURCE is gone.
nproc=$(ulimit -Hu); [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$work/containers.conf

# -- the base ----------------------------------------------------------------------
if podman image exists "$base"; then
    step base "$base present"
else
    mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
    mmdebstrap --quiet --variant=minbase --format=tar \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm "$work/base.tar" \
        "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
        "deb ${mirror%/debian}/debian-security bookworm-security main" ||
        die "mmdebstrap of bookworm from $mirror"
    podman import --quiet --change 'CMD ["bash"]' "$work/base.tar" "$base" >/dev/null ||
        die "podman import of $work/base.tar"
    rm -f "$work/base.tar"
    step base "$base made with mmdebstrap from $mirror"
fi

# -- the image ---------------------------------------------------------------------
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
[ -r "$ca" ] || die "no CA bundle at $ca (set PIP_CERT)"
{ echo '[global]'; echo 'cert = /run/host-ca.crt'
  [ -z "${PIP_INDEX_URL:-}" ] || echo "index-url = $PIP_INDEX_URL"; } >"$work/pip.conf"
podman build --quiet -f deploy/Dockerfile --ignorefile deploy/Dockerfile.dockerignore \
    -v "$ca:/run/host-ca.crt:ro" -v "$work/pip.conf:/etc/pip.conf:ro" \
    -t "$image" . >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log" >&2; die "podman build (log: $work/build.log)"; }
size=$(podman image inspect "$image" --format '{{.Size}}')
step build "$image, $((size / 1000000)) MB"

# -- a run, as the DaemonSet does it ------------------------------------------------
run=$(mktemp -d /tmp/sitsprobe-image.XXXXXX)
tag=sitsprobe-image-$$-$RANDOM             # in the server's command line: the agent selects it
agent=$tag-agent server=
cleanup() {
    podman rm -f -t 20 "$agent" >/dev/null 2>&1 || true
    [ -z "$server" ] || kill "$server" 2>/dev/null || true
    rm -rf "$run"
}
trap cleanup EXIT
read -r sport mport < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
mkdir -p "$run/$tag"
echo ok >"$run/$tag/index.html"
python3 -m http.server "$sport" --bind 127.0.0.1 --directory "$run/$tag" >/dev/null 2>&1 &
server=$!
cat >"$run/values.yaml" <<EOF
kubernetesMetadata: false
config:
  select: {cmdline: ['$tag'], comms: [], ports: []}
EOF
# the chart rendered by helm; its init container, then the agent, as the kubelet runs them
.venv/bin/python scripts/daemonset_podman.py --image "$image" --values "$run/values.yaml" \
    --name "$agent" --port "$mport" --workdir "$run/pod" >/dev/null || die "the chart's pod under podman"

agent_failed() { podman logs "$agent" 2>&1 | tail -20 >&2; die "$*"; }
code=
for _ in $(seq 120); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$mport/healthz" || true)
    [ "$code" = 200 ] && break
    [ "$(podman inspect "$agent" --format '{{.State.Running}}')" = true ] || agent_failed "the agent exited"
    sleep 1
done
[ "$code" = 200 ] || agent_failed "/healthz answered ${code:-nothing} after 120 s"
step run "agent up, /healthz 200 (metrics on 127.0.0.1:$mport)"

n=20
for _ in $(seq $n); do curl -sf -o /dev/null "http://127.0.0.1:$sport/" || die "the server did not answer"; done
count=0
for _ in $(seq 15); do
    count=$(curl -s "http://127.0.0.1:$mport/metrics" | awk -v pid="$server" '
        /^sitsprobe_http_server_requests_total\{/ && index($0, "pid=\"" pid "\"") { s += $NF }
        END { printf "%d", s }')
    [ "$count" -ge "$n" ] && break
    sleep 1
done
[ "$count" -eq "$n" ] || agent_failed "the agent counted $count of $n requests to pid $server"
step check "$count of $n requests counted for pid $server"
