#!/usr/bin/env bash
# Run the arm64-marked tests inside arm64 Debian root filesystems under qemu user-mode emulation:
# an x86_64 host standing in for a Raspberry Pi 4 (or 5). Two roots: Debian 12 bookworm (Python
# 3.11) and Debian 13 trixie (Python 3.13, the base of current Raspberry Pi OS). Each venv gets
# edgeinfer[dev] and the backends that install on aarch64 (onnxruntime, LiteRT, OpenVINO); trixie
# adds ARM NN from Debian's packages (python3-pyarmnn, its CpuAcc backend and TFLite parser).
#
#   scripts/test-arm64.sh                   # build the root filesystems once, then run the subset
#   scripts/test-arm64.sh --suite trixie    # one root only (bookworm, trixie or all)
#   scripts/test-arm64.sh -k tflite -x      # further arguments go to pytest
#   scripts/test-arm64.sh --cpu cortex-a76  # a Raspberry Pi 5 instead of a Pi 4, in every root
#   scripts/test-arm64.sh --suite trixie --shell   # a shell inside instead of the tests
#   scripts/test-arm64.sh --rebuild         # throw the cached root filesystems away first
#   scripts/test-arm64.sh --build-only      # only build (or reuse) the root filesystems
#
# Without --cpu, bookworm runs as a Pi 4 (cortex-a72: no FP16 arithmetic) and trixie as a Pi 5
# (cortex-a76: FP16, dot product), so both kinds of CPU are covered in one run.
#
# Environment:
#   EDGEINFER_ARM64_ROOT    where the root filesystems are cached, one folder per suite
#                           (default ${XDG_CACHE_HOME:-$HOME/.cache}/edgeinfer/arm64-rootfs)
#   EDGEINFER_ARM64_SUITE   bookworm, trixie or all (default all); --suite wins
#   EDGEINFER_ARM64_CPU     qemu CPU for every root: cortex-a72 (Pi 4) or cortex-a76 (Pi 5)
#   EDGEINFER_ARM64_MIRROR  Debian mirror (default: the one this host's apt uses)
#
# Needs root (apt-get, debootstrap, a private mount namespace, chroot). Everything mounted for
# the run lives in that namespace and disappears with it. Exits with the first failing suite's
# pytest exit code (0 when every suite passed).
set -euo pipefail

SUITES=(bookworm trixie)
BASE_INCLUDE=python3,python3-venv,python3-pip,ca-certificates
# ARM NN (libarmnn 33) from Debian: the Python binding, the Arm Compute Library backend (CpuAcc;
# Debian builds no CpuRef) and the TFLite parser pyarmnn loads models with.
ARMNN_INCLUDE=python3-pyarmnn,libarmnn-cpuacc-backend33,libarmnntfliteparser24t64
# Installed into every venv beside edgeinfer[dev] (ai-edge-litert is a dependency already).
EXTRA_PIP=openvino
# Bump the number to make every cached venv anew (a change of dependencies only updates it).
VENV_RECIPE="venv-recipe 2 $EXTRA_PIP"
VENV=/opt/venv
SELF=$(readlink -f "${BASH_SOURCE[0]}")
SRC=$(cd "$(dirname "$SELF")/.." && pwd)

# set_suite SUITE: SUITE, INCLUDE, ROOTFS_ID and ROOT for one root filesystem.
set_suite() {
    SUITE=$1
    INCLUDE=$BASE_INCLUDE
    ARMNN=
    if [[ $SUITE == trixie ]]; then INCLUDE+=,$ARMNN_INCLUDE ARMNN=1; fi
    # Bump the number to rebuild every cached root filesystem when the recipe below changes.
    ROOTFS_ID="2 $SUITE $INCLUDE"
    ROOT=$ROOT_BASE/$SUITE
}

log() { printf '== arm64%s: %s\n' "${SUITE:+ $SUITE}" "$*"; }
die() { printf 'test-arm64.sh: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$SELF"; }
# detect_mirror, remove_root
# shellcheck source=scripts/_rootfs.sh
. "$(dirname "$SELF")/_rootfs.sh"

# --- host side ---------------------------------------------------------------------------------

ensure_host_tools() {
    local need=()
    if [[ $(uname -m) != aarch64 ]]; then
        command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
        command -v update-binfmts >/dev/null || need+=(binfmt-support)
    fi
    command -v debootstrap >/dev/null || need+=(debootstrap)
    [[ -e /usr/share/keyrings/debian-archive-keyring.gpg ]] || need+=(debian-archive-keyring)
    ((${#need[@]})) || return 0
    command -v apt-get >/dev/null || die "please install: ${need[*]}"
    log "installing host packages: ${need[*]}"
    # the lock timeout: .ci/run runs this beside test-systemd.sh --build-only, which may install too
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}" \
        >/dev/null
}

ensure_binfmt() {
    local entry=/proc/sys/fs/binfmt_misc/qemu-aarch64
    [[ -e /proc/sys/fs/binfmt_misc/status ]] ||
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
    if ! grep -qx enabled "$entry" 2>/dev/null; then
        # The package's start script registers nothing without systemd.
        log "registering qemu-aarch64 with binfmt_misc"
        update-binfmts --enable qemu-aarch64
    fi
    grep -qx enabled "$entry" 2>/dev/null || die "binfmt_misc has no enabled qemu-aarch64 handler"
}

build_rootfs() {
    if [[ -f $ROOT/.edgeinfer-rootfs && $(<"$ROOT/.edgeinfer-rootfs") == "$ROOTFS_ID" ]]; then
        log "reusing the root filesystem in $ROOT"
        return
    fi
    local tmp=$ROOT.partial t0=$SECONDS mirror deb
    mirror=$(detect_mirror "${EDGEINFER_ARM64_MIRROR:-}")
    log "building an arm64 $SUITE root filesystem in $ROOT (mirror $mirror)"
    remove_root "$ROOT"
    remove_root "$tmp"
    mkdir -p "$tmp"
    touch "$tmp/.edgeinfer-partial"
    if ! debootstrap --arch=arm64 --foreign --variant=minbase --include="$INCLUDE" \
        "$SUITE" "$tmp" "$mirror" >"$tmp.log" 2>&1; then
        tail -n 25 "$tmp.log" >&2
        die "debootstrap failed (full log: $tmp.log)"
    fi
    rm -f "$tmp.log"
    # Unpack natively instead of running the emulated second stage (3 s instead of 200 s).
    # No maintainer scripts run: what they would have made is made here by hand.
    for deb in "$tmp"/var/cache/apt/archives/*.deb; do dpkg -x "$deb" "$tmp"; done
    cp "$tmp/usr/share/base-passwd/passwd.master" "$tmp/etc/passwd"
    cp "$tmp/usr/share/base-passwd/group.master" "$tmp/etc/group"
    rm -rf "$tmp/debootstrap" "$tmp"/var/cache/apt/archives/*.deb
    mkdir -p "$tmp/src" "$tmp/tmp" "$tmp/root" "$tmp/etc/ssl/certs"
    touch "$tmp/etc/resolv.conf" "$tmp/etc/hosts"
    # A handler registered without the F flag is looked up inside the chroot: put it there.
    local entry=/proc/sys/fs/binfmt_misc/qemu-aarch64 interp
    interp=$(sed -n 's/^interpreter //p' "$entry" 2>/dev/null || true)
    if [[ -n $interp ]] && ! grep -q '^flags:.*F' "$entry"; then
        mkdir -p "$tmp$(dirname "$interp")"
        cp -L "$interp" "$tmp$interp"
    fi
    chroot "$tmp" /sbin/ldconfig
    echo "$ROOTFS_ID" >"$tmp/.edgeinfer-rootfs"
    rm "$tmp/.edgeinfer-partial"
    mv "$tmp" "$ROOT"
    log "root filesystem ready in $((SECONDS - t0)) s"
}

# A hash of what the venv is built from: pyproject's dependencies and this script's recipe.
deps_hash() {
    local py=${PYTHON:-python3}
    {
        echo "$VENV_RECIPE"
        "$py" - "$SRC/pyproject.toml" <<'EOF' 2>/dev/null || cat "$SRC/pyproject.toml"
import json, sys, tomllib
with open(sys.argv[1], "rb") as f:
    doc = tomllib.load(f)
project = doc.get("project", {})
print(json.dumps({
    "build": doc.get("build-system", {}).get("requires", []),
    "python": project.get("requires-python"),
    "dependencies": project.get("dependencies", []),
    "dev": project.get("optional-dependencies", {}).get("dev", []),
}, sort_keys=True))
EOF
    } | sha256sum | cut -c1-16
}

ca_bundle() {
    local f
    for f in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" "${REQUESTS_CA_BUNDLE:-}" \
        /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
        if [[ -n $f && -f $f ]]; then echo "$f"; return; fi
    done
}

# The host's pip configuration files, copied where pip inside looks for them (same precedence).
copy_pip_config() {
    local user_conf=${XDG_CONFIG_HOME:-$HOME/.config}/pip/pip.conf f
    rm -f "$ROOT/etc/pip.conf" "$ROOT/etc/xdg/pip/pip.conf" "$ROOT/root/.config/pip/pip.conf" \
        "$ROOT/root/.pip/pip.conf" "$ROOT/etc/edgeinfer-pip-config-file.conf"
    for f in /etc/pip.conf /etc/xdg/pip/pip.conf; do
        if [[ -f $f ]]; then install -D -m 644 "$f" "$ROOT$f"; fi
    done
    if [[ -f $user_conf ]]; then
        install -D -m 644 "$user_conf" "$ROOT/root/.config/pip/pip.conf"
    fi
    if [[ -f $HOME/.pip/pip.conf ]]; then
        install -D -m 644 "$HOME/.pip/pip.conf" "$ROOT/root/.pip/pip.conf"
    fi
    if [[ -n ${PIP_CONFIG_FILE:-} && -f $PIP_CONFIG_FILE ]]; then
        install -D -m 644 "$PIP_CONFIG_FILE" "$ROOT/etc/edgeinfer-pip-config-file.conf"
    fi
}

# The files a pip configuration names (constraint = ..., requirement = ..., from any config file
# or PIP_* variable), and the files those name in turn (-c/-r lines), bind-mounted read-only at
# the same paths inside: a configuration copied without them makes pip inside fail at its first
# command ("Could not open requirements file").
mount_pip_named_files() {
    local py=${PYTHON:-python3} conf f
    local -A seen=()
    conf=$("$py" -m pip config list 2>/dev/null) || return 0
    while IFS= read -r f; do
        mount_requirements_file "$f" 0
    done < <(sed -n "s/^[^=]*\.\(constraints\{0,1\}\|requirements\{0,1\}\|build-constraint\)='\(.*\)'$/\2/p" \
                 <<<"$conf" | tr -s ' \t' '\n' | sed -n 's,^file://,,p; \,^/,p')
}

mount_requirements_file() {  # mount_requirements_file PATH DEPTH (uses seen from the caller)
    local f=$1 depth=$2 line ref
    [[ -f $f && -z ${seen[$f]:-} ]] || return 0
    seen[$f]=1
    ((depth < 8)) || die "pip configuration: -c/-r files nested deeper than 8 levels at $f"
    log "pip configuration names $f: shared read-only inside"
    bind_ro "$f" "$ROOT$f"
    while IFS= read -r line; do
        ref=$(sed -n 's/^[ \t]*\(-[cr]\|--constraint\|--requirement\)[ \t=]*\([^ \t#]*\).*/\2/p' <<<"$line")
        [[ -n $ref ]] || continue
        ref=${ref#file://}
        [[ $ref == /* ]] || ref=$(dirname "$f")/$ref
        mount_requirements_file "$ref" $((depth + 1))
    done <"$f"
}

# Local folders the host's pip reads packages from (find-links, file:// indexes): these are
# bind-mounted read-only at the same paths inside so pip there sees the same index. A local
# PEP 503 index links to files beside it (ROOT/simple -> ../../files), so its parent is shared.
pip_local_paths() {
    local py=${PYTHON:-python3} conf
    conf=$("$py" -m pip config list 2>/dev/null) || return 0
    local_paths() {
        sed -n "s/^[^=]*\.$1='\(.*\)'$/\1/p" <<<"$conf" | tr -s ' \t' '\n' |
            sed -n 's,^file://,,p; \,^/,p'
    }
    {
        local_paths find-links
        local_paths '[a-z-]*index-url' | while IFS= read -r p; do
            dirname "${p%/}"
        done
    } | sort -u
}

snapshot_source() {
    local dest=$1
    mkdir -p "$dest"
    if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        # Tracked and untracked-but-not-ignored files: what a commit of this tree would hold.
        git -C "$SRC" ls-files -z --cached --others --exclude-standard |
            tar -C "$SRC" --null -T - --ignore-failed-read -cf - 2>/dev/null |
            tar -C "$dest" -xf -
    else
        tar -C "$SRC" --exclude-vcs --exclude=__pycache__ --exclude='*.egg-info' \
            --exclude=./build --exclude=./dist --exclude=./.venv --exclude='./.*_cache' -cf - . |
            tar -C "$dest" -xf -
    fi
}

cpuinfo() {
    local features variant part revision board hardware="" i
    case $1 in
        cortex-a72)
            features="fp asimd evtstrm crc32 cpuid" variant=0x0 part="0xd08 3"
            revision=c03114 board="Raspberry Pi 4 Model B Rev 1.4"
            hardware=$'Hardware\t: BCM2835\n' ;;
        cortex-a76)
            features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid"
            features+=" asimdrdm lrcpc dcpop asimddp" variant=0x4 part="0xd0b 1"
            revision=d04170 board="Raspberry Pi 5 Model B Rev 1.0" ;;
    esac
    for i in 0 1 2 3; do
        printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: %s\nCPU implementer\t: 0x41\n' \
            "$i" "$features"
        printf 'CPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: %s\n\n' \
            "$variant" "${part% *}" "${part#* }"
    done
    printf '%sRevision\t: %s\nSerial\t\t: 10000000a1b2c3d4\nModel\t\t: %s\n' \
        "$hardware" "$revision" "$board"
}

# --- inside the private mount namespace (still host code, before the chroot) ------------------

bind_ro() {  # bind_ro HOSTPATH TARGET
    if [[ -d $1 ]]; then mkdir -p "$2"; else mkdir -p "$(dirname "$2")"; touch "$2"; fi
    mount --bind "$1" "$2"
    mount -o remount,bind,ro "$2"
}

in_namespace() {
    local p bundle
    mount --rbind /proc "$ROOT/proc"
    mount --rbind /sys "$ROOT/sys"
    mount --rbind /dev "$ROOT/dev"
    mount -t tmpfs -o mode=1777 tmpfs "$ROOT/tmp"
    mkdir -p "$ROOT/tmp/.edgeinfer"
    if [[ $(uname -m) != aarch64 ]]; then
        # Debian's qemu shows the host's x86 /proc/cpuinfo, and onnxruntime's CPU detection
        # then crashes at import: show the board's instead.
        cpuinfo "$CPU" >"$ROOT/tmp/.edgeinfer/cpuinfo"
        mount --bind "$ROOT/tmp/.edgeinfer/cpuinfo" "$ROOT/proc/cpuinfo"
    fi
    bind_ro "$SRC" "$ROOT/src"
    # The example models this host fetched (.ci/run fetches them first), read-only: the tests
    # inside compare backends on the same files instead of downloading them into every root.
    if [[ -d $MODELS ]]; then bind_ro "$MODELS" "$ROOT/opt/edgeinfer-models"; fi
    while IFS= read -r p; do
        if [[ -e $p ]]; then bind_ro "$p" "$ROOT$p"; fi
    done < <(printf '%s\n' /etc/resolv.conf /etc/hosts; pip_local_paths)
    bundle=$(ca_bundle)
    if [[ -n $bundle ]]; then cp -L "$bundle" "$ROOT/etc/ssl/certs/ca-certificates.crt"; fi
    copy_pip_config
    mount_pip_named_files
    # `import openvino` sends usage telemetry from a forked child unless the user declined (or
    # CI=true); a fork of the multi-threaded test process under qemu can hang the run (seen
    # once in trixie: 5 minutes, until the child was killed). Declined, as opt_in_out does.
    mkdir -p "$ROOT/root/intel"
    printf 0 >"$ROOT/root/intel/openvino_telemetry"
    # Build artefacts (build/, *.egg-info) land in this copy, never in the host tree.
    snapshot_source "$ROOT/tmp/src"

    local env=(
        "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" PYTHONUNBUFFERED=1
        QEMU_CPU="$CPU" EDGEINFER_EXPECT_ARCH=aarch64
        PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt
        SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
        REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
    )
    if [[ -d $MODELS ]]; then env+=(EDGEINFER_MODELS=/opt/edgeinfer-models); fi
    # The backends installed here: their tests fail instead of skipping when one is missing.
    env+=("EDGEINFER_EXPECT_BACKENDS=onnxruntime litert openvino${ARMNN:+ armnn}")
    if [[ -f $ROOT/etc/edgeinfer-pip-config-file.conf ]]; then
        env+=(PIP_CONFIG_FILE=/etc/edgeinfer-pip-config-file.conf)
    fi
    local v
    for v in $(compgen -e); do
        case $v in
            PIP_CERT | PIP_CONFIG_FILE | PIP_DISABLE_PIP_VERSION_CHECK | PIP_NO_INPUT) ;;
            PIP_* | CI | EDGEINFER_TEST_BROKER | http_proxy | https_proxy | no_proxy | HTTP_PROXY | \
                HTTPS_PROXY | NO_PROXY)
                env+=("$v=${!v}") ;;
        esac
    done
    chroot "$ROOT" /usr/bin/env -i "${env[@]}" /bin/bash -c "$INSIDE" inside \
        "$DEPS" "$SHELL_MODE" "$EXTRA_PIP" "$SUITE" "$VENV_RECIPE" "$@"
}

# A real mosquitto on the host's loopback for the MQTT test inside (the chroot shares the
# network); its address reaches the tests as EDGEINFER_TEST_BROKER. Stopped when we exit.
start_broker() {
    local bin dir port
    bin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
    [[ -x $bin ]] || die "mosquitto is not installed (apt-get install -y mosquitto)"
    dir=$(mktemp -d /tmp/edgeinfer-arm64-broker.XXXXXX)
    port=$(( 20000 + RANDOM % 20000 ))
    printf 'listener %s 127.0.0.1\nallow_anonymous true\n' "$port" >"$dir/mosquitto.conf"
    "$bin" -c "$dir/mosquitto.conf" >"$dir/log" 2>&1 &
    BROKER_PID=$!
    trap 'kill "$BROKER_PID" 2>/dev/null; rm -rf "'"$dir"'"' EXIT
    local i
    for i in $(seq 1 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            export EDGEINFER_TEST_BROKER=127.0.0.1:$port
            log "mosquitto for the MQTT test on 127.0.0.1:$port"
            return
        fi
        kill -0 "$BROKER_PID" 2>/dev/null || die "mosquitto did not start: $(cat "$dir/log")"
        sleep 0.1
    done
    die "mosquitto did not listen on 127.0.0.1:$port"
}

# --- inside the chroot (arm64, emulated) -------------------------------------------------------

# shellcheck disable=SC2016  # expanded inside the chroot
INSIDE='
set -euo pipefail
deps=$1 shell_mode=$2 extra_pip=$3 suite=$4 venv_recipe=$5; shift 5
log() { printf "== arm64 %s: %s\n" "$suite" "$*"; }
# pip, without its note for every project that a configured local index does not hold.
pipq() {
    { pip -q --no-cache-dir "$@" 2>&1 1>&3 3>&- |
        { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }; } 3>&1
}
stamp=/opt/venv/.edgeinfer-deps
recipe=/opt/venv/.edgeinfer-recipe
t0=$SECONDS
if [[ -f $stamp && $(<"$stamp") != "$deps" && -f $recipe && $(<"$recipe") == "$venv_recipe" ]]; then
    # Only pyproject'"'"'s dependencies changed: pip brings the venv up to them (what is already
    # installed and still fits stays), minutes less under emulation than a new venv. A
    # dependency dropped from pyproject stays installed; --rebuild starts from nothing.
    log "dependencies changed: updating /opt/venv to edgeinfer[dev] of this tree"
    # shellcheck disable=SC2086  # a list of requirements
    pipq install "/tmp/src[dev]" $extra_pip
    echo "$deps" >"$stamp"
    log "venv updated in $((SECONDS - t0)) s"
elif [[ ! -f $stamp || $(<"$stamp") != "$deps" ]]; then
    log "creating /opt/venv and installing edgeinfer[dev] with its dependencies (a few minutes)"
    rm -rf /opt/venv
    python3 -m venv /opt/venv
    pipq install --upgrade setuptools wheel
    # shellcheck disable=SC2086  # a list of requirements
    pipq install "/tmp/src[dev]" $extra_pip
    echo "$venv_recipe" >"$recipe"
    # Debian'"'"'s pyarmnn (trixie) into the venv, alone: --system-site-packages would hand the venv
    # Debian'"'"'s numpy and others in place of the wheels every other root tests.
    if [[ -d /usr/lib/python3/dist-packages/pyarmnn ]]; then
        ln -s /usr/lib/python3/dist-packages/pyarmnn \
            "$(python -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])")/pyarmnn"
    fi
    echo "$deps" >"$stamp"
    log "venv ready in $((SECONDS - t0)) s"
else
    log "reusing /opt/venv; installing edgeinfer from this tree (no dependencies)"
    pipq install --no-deps --no-index --no-build-isolation --force-reinstall /tmp/src
    log "installed in $((SECONDS - t0)) s"
fi
cd /tmp/src
if ((shell_mode)); then
    log "shell inside: machine $(uname -m), QEMU_CPU=$QEMU_CPU; /tmp/src is a copy of the tree,"
    log "/src the live tree (read-only); run: python -m pytest -m arm64 -p no:cacheprovider"
    exec bash -i
fi
# -n 0: in one process, as before pyproject'"'"'s -n auto: under emulation every xdist worker would
# import and collect the whole suite again, for a subset of a few dozen tests (-n 2 overrides)
log "python -m pytest -m arm64 -q -p no:cacheprovider -n 0 $*"
exec python -m pytest -m arm64 -q -p no:cacheprovider -n 0 "$@"
'

# --- main --------------------------------------------------------------------------------------

if [[ ${_EDGEINFER_ARM64_NS:-} == 1 ]]; then
    in_namespace "$@"
    exit
fi

SUITE=
# Where edgeinfer.model.catalog keeps the example models on this host (edgeinfer/paths.py's order).
MODELS=${EDGEINFER_MODELS:-${EDGEINFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgeinfer}/models}
ROOT_BASE=${EDGEINFER_ARM64_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/edgeinfer/arm64-rootfs}
CPU=${EDGEINFER_ARM64_CPU:-}
WANT=${EDGEINFER_ARM64_SUITE:-all}
SHELL_MODE=0
REBUILD=0
BUILD_ONLY=0
PYTEST_ARGS=()
while (($#)); do
    case $1 in
        --shell) SHELL_MODE=1 ;;
        --rebuild) REBUILD=1 ;;
        --build-only) BUILD_ONLY=1 ;;
        --cpu) CPU=${2:?--cpu needs a value}; shift ;;
        --cpu=*) CPU=${1#*=} ;;
        --suite) WANT=${2:?--suite needs a value}; shift ;;
        --suite=*) WANT=${1#*=} ;;
        -h | --help) usage; exit 0 ;;
        --) shift; PYTEST_ARGS+=("$@"); break ;;
        *) PYTEST_ARGS+=("$1") ;;
    esac
    shift
done
case $CPU in
    '' | cortex-a72 | cortex-a76) ;;
    *) die "--cpu: expected cortex-a72 (Raspberry Pi 4) or cortex-a76 (Raspberry Pi 5), got $CPU" ;;
esac
case $WANT in
    all) RUN_SUITES=("${SUITES[@]}") ;;
    bookworm | trixie) RUN_SUITES=("$WANT") ;;
    *) die "--suite: expected bookworm, trixie or all, got $WANT" ;;
esac
if ((SHELL_MODE && ${#RUN_SUITES[@]} > 1)); then
    die "--shell opens one root: add --suite bookworm or --suite trixie"
fi
[[ $(id -u) == 0 ]] || die "needs root (debootstrap, mount namespace, chroot); try sudo"
[[ $ROOT_BASE == /* && $ROOT_BASE != / ]] ||
    die "EDGEINFER_ARM64_ROOT must be an absolute path, not /"

START=$SECONDS
mkdir -p "$ROOT_BASE"
ensure_host_tools
if [[ $(uname -m) != aarch64 ]]; then ensure_binfmt; fi
# Before trixie, the folder was the bookworm root itself: move it to where bookworm lives now.
if [[ -f $ROOT_BASE/.edgeinfer-rootfs ]]; then
    log "moving the bookworm root filesystem in $ROOT_BASE to $ROOT_BASE/bookworm"
    mv "$ROOT_BASE" "$ROOT_BASE.moving"
    mkdir -p "$ROOT_BASE"
    mv "$ROOT_BASE.moving" "$ROOT_BASE/bookworm"
fi
if ((!BUILD_ONLY)); then start_broker; fi

# run_suite SUITE: build (or reuse) its root and run the tests there; the first failing
# pytest exit code goes to RC.
run_suite() {
    local t0=$SECONDS cpu rc=0
    set_suite "$1"
    cpu=${CPU:-$([[ $SUITE == trixie ]] && echo cortex-a76 || echo cortex-a72)}
    exec 9>"$ROOT.lock"
    flock -n 9 || { log "waiting for another test-arm64.sh using $ROOT"; flock 9; }
    if ((REBUILD)); then log "removing $ROOT"; remove_root "$ROOT"; fi
    build_rootfs
    if ((BUILD_ONLY)); then exec 9>&-; return; fi
    log "running under qemu as $cpu (source $SRC)"
    _EDGEINFER_ARM64_NS=1 ROOT=$ROOT CPU=$cpu DEPS=$(deps_hash) SHELL_MODE=$SHELL_MODE \
        SUITE=$SUITE MODELS=$MODELS ARMNN=$ARMNN unshare --mount --propagation private -- "$SELF" "${PYTEST_ARGS[@]}" || rc=$?
    exec 9>&-
    SUMMARY+=("$SUITE ($cpu): exit code $rc in $((SECONDS - t0)) s")
    if ((rc && !RC)); then RC=$rc; fi
}

SUMMARY=()
RC=0
for s in "${RUN_SUITES[@]}"; do run_suite "$s"; done
SUITE=
for line in "${SUMMARY[@]}"; do log "$line"; done
log "done in $((SECONDS - START)) s, exit code $RC"
exit "$RC"
