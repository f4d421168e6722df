#!/usr/bin/env bash
# Everything sitsprobe needs on a Debian 12 machine, idempotently: bcc and its
# Python binding, kernel headers for bcc to compile against, tracefs/debugfs,
# the peers the tests drive (nginx, ab, wrk, redis), and a virtual environment
# (.venv) with sitsprobe and its test extras installed. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1msetup:\033[0m %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: run as root (bcc loads BPF programs; apt installs packages)" >&2
    exit 1
fi

packages=(python3-bpfcc bpfcc-tools bpftool systemtap-sdt-dev nginx-light apache2-utils wrk redis-server
          openssl     # the TLS tests' self-signed certificates
          netcat-openbsd  # nc -N: a client that shuts its sending side and reads the answer
          nodejs      # Node.js: a keep-alive server that reads a body after its answer, and HTTPS
          haproxy     # a gateway no one here wrote, on event loops, reusing its upstream connections
          curl        # a client that sends each of its parallel requests with a traceparent of its own
          gcc         # the kernel's bucket expressions and write scan, built and held to their Python twins
          prometheus  # promtool and a live Prometheus: the alerting rules and the dashboards' PromQL
          podman runc mmdebstrap iptables)  # scripts/image.sh: the image built from Debian and run
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
release=$(uname -r)
# headers for bcc: the running kernel's if Debian has them, else the newest it has
# (sitsprobe's header resolver links the nearest tree and says so)
if [ ! -e "/lib/modules/$release/build" ] && ! ls -d /usr/src/linux-headers-*/include/generated >/dev/null 2>&1; then
    missing+=(HEADERS)
fi
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    pkgs=()
    for p in "${missing[@]}"; do [ "$p" = HEADERS ] || pkgs+=("$p"); done
    [ ${#pkgs[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
    if [[ " ${missing[*]} " == *" HEADERS "* ]]; then
        apt-get install -y -qq "linux-headers-$release" >/dev/null 2>&1 ||
            apt-get install -y -qq linux-headers-cloud-amd64 >/dev/null 2>&1 ||
            apt-get install -y -qq "linux-headers-$(dpkg --print-architecture)" >/dev/null
    fi
fi
# the packages start services we do not want holding ports
for svc in nginx redis-server prometheus; do
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
done
pkill -x nginx 2>/dev/null || true
pkill -x prometheus 2>/dev/null || true

mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug

py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    log "creating .venv with $($py --version)"
    "$py" -m venv .venv
fi
# bcc's binding is not on PyPI: expose Debian's (pure Python over libbcc) alone
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p .venv/bcc-only
ln -sfn /usr/lib/python3/dist-packages/bcc .venv/bcc-only/bcc
echo "$PWD/.venv/bcc-only" > "$site/bcc.pth"

stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
    log "installing sitsprobe and its test extras into .venv"
    .venv/bin/pip install -q --disable-pip-version-check -e ".[test]"
    rm -f .venv/.installed-* && touch "$stamp"
fi
bash scripts/helm.sh  # helm into .venv/bin, for the chart tests
.venv/bin/python -c 'import bcc, sitsprobe' || { echo "setup: bcc or sitsprobe not importable" >&2; exit 1; }
log "ready: .venv/bin/sitsprobe"
