#!/usr/bin/env bash
# build.sh builds the binaries the Kubernetes tests run into one folder,
# default .tools/kube (make kube-tools):
#
#   test/tools/build.sh [OUT_DIR]
#
#   kube-apiserver  k8s.io/kubernetes v1.35.4 with its 31 staging modules
#                   replaced by v0.35.4 (module test/tools/kube-apiserver)
#   etcd            go.etcd.io/etcd/server/v3 v3.6.16 (module test/tools/etcd)
#   helm            helm.sh/helm/v3 v3.22.0 (module test/tools/helm), for the
#                   chart test's `helm template` and `helm lint`
#   promtool        github.com/prometheus/prometheus v0.316.0 (Prometheus
#                   v3.16.0; module test/tools/promtool), for the alert
#                   tests' `promtool check rules` and `promtool test rules`
#
# test/envtest starts kube-apiserver and etcd from OUT_DIR (it is a
# KUBEBUILDER_ASSETS folder). Everything comes through the Go module proxy;
# nothing else is downloaded. Each tools module has its own go.mod and go.sum,
# so Kubernetes' dependency graph never reaches the fleetrepair go.mod, and
# each binary builds on the dependency set its release was made with.
#
# Each binary is built once: OUT_DIR/.stamp-NAME records the Go version, the
# module's go.mod and go.sum and the link flags, and a binary whose stamp
# matches is left alone. A binary is written under a temporary name and
# renamed, and its stamp written last, so an interrupted build is redone.
#
# Cold (empty module and build caches) the first three take about 1,070 CPU-seconds,
# three quarters of it kube-apiserver, and peak at 1.7 GiB of memory while
# linking kube-apiserver: 17.5 minutes on a 2-core machine shared with other
# builds (see README.md). Warm, the script takes well under a second.
# KUBE_TOOLS_P bounds parallel compiles (go build -p, default: the CPU count)
# on a machine with little memory.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/.tools/kube}
mkdir -p "$out"
out=$(cd "$out" && pwd)

export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
p=${KUBE_TOOLS_P:-$(nproc)}
gover=$(go version)

# build NAME MODULE_DIR PACKAGE LDFLAGS
build() {
	local name=$1 dir=$here/$2 pkg=$3 ldflags="-s -w $4" stamp start=$SECONDS
	stamp=$(printf '%s\n%s\n%s\n' "$gover" "$pkg" "$ldflags" | cat - "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -d' ' -f1)
	if [ -x "$out/$name" ] && [ "$(cat "$out/.stamp-$name" 2>/dev/null)" = "$stamp" ]; then
		echo "kube-tools: $out/$name is up to date"
		return
	fi
	rm -f "$out/.stamp-$name"
	echo "kube-tools: building $name from $pkg (go build -p $p)"
	(cd "$dir" && go build -p "$p" -trimpath -ldflags "$ldflags" -o "$out/.$name.tmp" "$pkg")
	mv -f "$out/.$name.tmp" "$out/$name"
	echo "$stamp" >"$out/.stamp-$name"
	echo "kube-tools: built $out/$name in $((SECONDS - start))s"
}

# The version variables make `kube-apiserver --version` and /version report
# the release instead of v0.0.0-master, and tell helm which Kubernetes
# release its client libraries are (as helm's own Makefile does).
cb=k8s.io/component-base/version
build kube-apiserver kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
	"-X $cb.gitVersion=v1.35.4 -X $cb.gitMajor=1 -X $cb.gitMinor=35 -X $cb.gitTreeState=clean"
build etcd etcd go.etcd.io/etcd/server/v3 ""
h=helm.sh/helm/v3
build helm helm $h/cmd/helm \
	"-X $h/internal/version.version=v3.22.0 -X $h/internal/version.gitTreeState=clean -X $h/pkg/chartutil.k8sVersionMajor=1 -X $h/pkg/chartutil.k8sVersionMinor=37 -X $h/pkg/lint/rules.k8sVersionMajor=1 -X $h/pkg/lint/rules.k8sVersionMinor=37"

pv=github.com/prometheus/common/version
build promtool promtool github.com/prometheus/prometheus/cmd/promtool \
	"-X $pv.Version=3.16.0 -X $pv.Branch=release-3.16"

echo "kube-tools: $out ready"
