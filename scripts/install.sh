#!/usr/bin/env bash
# Install edgeinfer on a device as a systemd service (see docs/deploy.md).
#
#   sudo scripts/install.sh                      # venv in /opt/edgeinfer, config, unit, enable
#   sudo scripts/install.sh --uninstall          # remove unit and venv; keep config and state
#   sudo scripts/install.sh --uninstall --purge  # also remove /etc/edgeinfer and the state
#   DESTDIR=/tmp/root scripts/install.sh --no-enable   # stage into a tree (tests, packaging)
#
# Options:
#   --prefix DIR             where the venv goes (default /opt/edgeinfer): DIR/venv
#   --from PATH              edgeinfer source tree to install (default: the repo of this script)
#   --config FILE            config to install as /etc/edgeinfer/config.yaml if none is there
#                            (default: configs/pi4.yaml on a Pi, configs/jetson.yaml on a Jetson,
#                            else configs/camera-detect.yaml)
#   --extras LIST            pip extras (default broker,serial)
#   --system-site-packages   let the venv see the system's packages (always on on Raspberry Pi
#                            OS, for apt's python3-picamera2)
#   --no-enable              do not run systemctl daemon-reload / enable
#   --uninstall [--purge]    remove (see above)
# Environment: DESTDIR (staging root, default empty), PYTHON (default python3),
#   EDGEINFER_PIP_ARGS (extra pip install arguments, e.g. "--no-deps"; --no-build-isolation
#   also needs setuptools and wheel in the venv, which a stock bookworm venv lacks).
# Running it again is safe: the venv is reused and upgraded, an existing config is never touched.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PREFIX=/opt/edgeinfer
FROM=$(cd "$SCRIPT_DIR/.." && pwd)
CONFIG=
EXTRAS=broker,serial
SYSTEM_SITE=0
ENABLE=1
UNINSTALL=0
PURGE=0
DESTDIR=${DESTDIR:-}
PYTHON=${PYTHON:-python3}
# Overridable for tests only: the machine and the device-tree model file.
MACHINE=${EDGEINFER_INSTALL_MACHINE:-$(uname -m)}
MODEL_FILE=${EDGEINFER_INSTALL_MODEL_FILE:-/proc/device-tree/model}

log() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        --from) FROM=${2:?--from needs a path}; shift 2 ;;
        --from=*) FROM=${1#*=}; shift ;;
        --config) CONFIG=${2:?--config needs a file}; shift 2 ;;
        --config=*) CONFIG=${1#*=}; shift ;;
        --extras) EXTRAS=${2?--extras needs a list}; shift 2 ;;
        --extras=*) EXTRAS=${1#*=}; shift ;;
        --system-site-packages) SYSTEM_SITE=1; shift ;;
        --no-enable) ENABLE=0; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        --purge) PURGE=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

case "$PREFIX" in /*) ;; *) die "--prefix must be absolute: $PREFIX" ;; esac
[ "$PURGE" = 1 ] && [ "$UNINSTALL" = 0 ] && die "--purge goes with --uninstall"
PREFIX=${PREFIX%/}
VENV="$DESTDIR$PREFIX/venv"
ETC="$DESTDIR/etc/edgeinfer"
UNIT="$DESTDIR/etc/systemd/system/edgeinfer.service"

# systemctl only for a real install on a machine that runs systemd.
# PID 1's name from /proc (procps' ps may be missing on a minimal image).
pid1_name() { tr -d '\n' < /proc/1/comm 2>/dev/null || true; }
systemd_running() { [ -z "$DESTDIR" ] && [ -d /run/systemd/system ] && [ "$(pid1_name)" = systemd ]; }

board_model() { if [ -r "$MODEL_FILE" ]; then tr -d '\0' < "$MODEL_FILE"; fi; }
MODEL=$(board_model)
IS_PI=0; IS_JETSON=0
case "$MODEL" in *"Raspberry Pi"*) IS_PI=1 ;; esac
if [ -z "${EDGEINFER_INSTALL_MODEL_FILE:-}" ] && [ -e /etc/nv_tegra_release ]; then IS_JETSON=1; fi
case "$MODEL" in *Jetson*|*NVIDIA*) IS_JETSON=1 ;; esac

# ---- uninstall ---------------------------------------------------------------------------
if [ "$UNINSTALL" = 1 ]; then
    if systemd_running && [ -e "$UNIT" ]; then
        systemctl disable --now edgeinfer.service || true
    fi
    rm -f "$UNIT" "$UNIT.d/50-listen.conf"
    rmdir "$UNIT.d" 2>/dev/null || true
    rm -rf "$VENV"
    rmdir "$DESTDIR$PREFIX" 2>/dev/null || true
    if systemd_running; then systemctl daemon-reload; fi
    if [ "$PURGE" = 1 ]; then
        rm -rf "$ETC" "$DESTDIR/var/lib/edgeinfer" "$DESTDIR/var/lib/private/edgeinfer" \
            "$DESTDIR/var/cache/edgeinfer" "$DESTDIR/var/cache/private/edgeinfer"
        log "removed the unit, $PREFIX/venv, /etc/edgeinfer and the state and cache directories"
    else
        log "removed the unit and $PREFIX/venv; kept /etc/edgeinfer (config, credentials) and" \
            "/var/lib/edgeinfer (state); --purge removes them too"
    fi
    exit 0
fi

# ---- checks ------------------------------------------------------------------------------
# The unit's sandbox hides some trees from the service: a venv there cannot be executed
# (status 203/EXEC, "Failed at step EXEC") and the unit restart-loops.
hidden_by_sandbox() {
    case "$1/" in
        /home/*|/root/*|/run/user/*)
            echo "ProtectHome=yes hides /home, /root and /run/user from the service" ;;
        /tmp/*|/var/tmp/*)
            echo "PrivateTmp=yes gives the service its own empty /tmp and /var/tmp" ;;
    esac
}
for p in "$PREFIX" "$(realpath -m "$PREFIX" 2>/dev/null || printf '%s' "$PREFIX")"; do
    why=$(hidden_by_sandbox "$p")
    shown=$PREFIX; [ "$p" = "$PREFIX" ] || shown="$PREFIX (that is $p)"
    [ -z "$why" ] || die "--prefix $shown cannot hold the service's venv: $why," \
        "so the unit would fail at step EXEC and restart-loop. Use a prefix such as" \
        "/opt/edgeinfer (the default) or /usr/local/lib/edgeinfer."
done
case "$MACHINE" in
    x86_64|aarch64|arm64) ;;
    armv7l|armv6l|armhf|arm*)
        die "this is a 32-bit ARM system ($MACHINE). onnxruntime publishes no 32-bit ARM wheels," \
            "so edgeinfer cannot run here. Install the 64-bit Raspberry Pi OS (or another aarch64" \
            "OS) on this board: a Pi 3, 4 or 5 runs it." ;;
    *) die "unsupported machine $MACHINE: edgeinfer needs x86_64 or aarch64 (onnxruntime wheels)" ;;
esac
if [ ! -f "$FROM/pyproject.toml" ] || [ ! -d "$FROM/edgeinfer" ]; then
    die "--from $FROM is not an edgeinfer source tree"
fi
FROM=$(cd "$FROM" && pwd)
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (install python3, python3-venv)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "edgeinfer needs Python 3.11 or newer; $PYTHON is $("$PYTHON" -V 2>&1)"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$PYTHON cannot create virtual environments (apt install python3-venv)"

if [ -z "$CONFIG" ]; then
    if [ "$IS_PI" = 1 ]; then CONFIG="$FROM/configs/pi4.yaml"
    elif [ "$IS_JETSON" = 1 ]; then CONFIG="$FROM/configs/jetson.yaml"
    else CONFIG="$FROM/configs/camera-detect.yaml"; fi
fi
[ -f "$CONFIG" ] || die "config $CONFIG not found"
[ -n "$MODEL" ] && log "board: $MODEL"

# ---- venv --------------------------------------------------------------------------------
# On Raspberry Pi OS picamera2 (and libcamera's bindings) come from apt (python3-picamera2),
# not PyPI, so the venv must see the system's site-packages.
[ "$IS_PI" = 1 ] && SYSTEM_SITE=1
venv_args=()
[ "$SYSTEM_SITE" = 1 ] && venv_args+=(--system-site-packages)
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    log "reusing the virtual environment $PREFIX/venv"
    # Keep the system-site-packages setting in step with this run (a re-run on a Pi fixes it).
    if [ -f "$VENV/pyvenv.cfg" ]; then
        want=false; [ "$SYSTEM_SITE" = 1 ] && want=true
        sed -i "s/^include-system-site-packages = .*/include-system-site-packages = $want/" "$VENV/pyvenv.cfg"
    fi
else
    log "creating the virtual environment $PREFIX/venv${venv_args:+ (${venv_args[*]})}"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "${venv_args[@]}" "$VENV"
fi

# Build from a clean copy of the package files: pip builds in the source folder, where a
# build/ left by an earlier run could carry stale modules into the wheel.
STAGE=$(mktemp -d)
TMP_UNIT=
cleanup() { rm -rf "$STAGE"; [ -z "$TMP_UNIT" ] || rm -f "$TMP_UNIT"; }
trap cleanup EXIT
files=(pyproject.toml edgeinfer)
for f in README.md LICENSE setup.py setup.cfg MANIFEST.in; do [ ! -e "$FROM/$f" ] || files+=("$f"); done
tar -C "$FROM" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' -cf - "${files[@]}" \
    | tar -C "$STAGE" -xf -
spec="$STAGE"
[ -n "$EXTRAS" ] && spec="${STAGE}[${EXTRAS}]"
# shellcheck disable=SC2206  # EDGEINFER_PIP_ARGS is a list of words on purpose
pip_args=(--disable-pip-version-check --no-input --upgrade ${EDGEINFER_PIP_ARGS:-})
log "installing edgeinfer from $FROM${EXTRAS:+ with extras [$EXTRAS]}"
"$VENV/bin/python" -m pip install "${pip_args[@]}" "$spec"
"$VENV/bin/edgeinfer" --help >/dev/null || die "the installed edgeinfer does not start"
if [ -n "$DESTDIR" ]; then
    log "note: a venv is not relocatable; $VENV works from there, not from $PREFIX"
fi

if [ "$IS_JETSON" = 1 ]; then
    cat <<EOF
install.sh: Jetson: PyPI has no GPU build of onnxruntime for aarch64, so the venv runs on the CPU
  for now. For CUDA/TensorRT install the onnxruntime-gpu wheel NVIDIA publishes for your JetPack
  (see docs/deploy.md, "Jetson"): find the wheel for this JetPack and Python $("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  on NVIDIA's Jetson pip index / the Jetson Zoo, then
    sudo $PREFIX/venv/bin/pip uninstall -y onnxruntime
    sudo $PREFIX/venv/bin/pip install /path/to/onnxruntime_gpu-<version>-cp3XX-linux_aarch64.whl
  and uncomment the Jetson lines of the unit in a drop-in (systemctl edit edgeinfer).
EOF
fi

# ---- config, credentials, unit -----------------------------------------------------------
install -d -m 0755 "$ETC"
if [ -e "$ETC/config.yaml" ]; then
    log "keeping the existing /etc/edgeinfer/config.yaml"
else
    install -m 0644 "$CONFIG" "$ETC/config.yaml"
    log "installed /etc/edgeinfer/config.yaml from ${CONFIG#"$FROM"/}"
fi
install -d -m 0700 "$ETC/credentials"
chmod 0700 "$ETC/credentials"
# LoadCredential= fails the start on a missing file (systemd 252): keep an empty placeholder.
if [ ! -e "$ETC/credentials/mqtt_password" ]; then
    install -m 0600 /dev/null "$ETC/credentials/mqtt_password"
    log "created an empty /etc/edgeinfer/credentials/mqtt_password (write the broker password there)"
fi

install -d -m 0755 "$(dirname "$UNIT")"
TMP_UNIT=$(mktemp)
sed "/^Exec\(Start\|Reload\)=/s#/opt/edgeinfer/#$PREFIX/#" "$FROM/systemd/edgeinfer.service" > "$TMP_UNIT"
install -m 0644 "$TMP_UNIT" "$UNIT"
log "installed /etc/systemd/system/edgeinfer.service (ExecStart=$PREFIX/venv/bin/edgeinfer)"
# The ports the config listens on (web view, metrics, embedded broker), and no other: a drop-in
# made from the config, since the unit cannot know them. Made again at every run.
DROPIN_DIR="$UNIT.d"
install -d -m 0755 "$DROPIN_DIR"
if "$VENV/bin/edgeinfer" validate-config --systemd-dropin "$ETC/config.yaml" > "$TMP_UNIT" 2>/dev/null; then
    install -m 0644 "$TMP_UNIT" "$DROPIN_DIR/50-listen.conf"
    log "installed edgeinfer.service.d/50-listen.conf: binds only $(grep -c '^SocketBindAllow' "$DROPIN_DIR/50-listen.conf") configured port(s)"
else
    log "could not read /etc/edgeinfer/config.yaml here (credentials or variables set only" \
        "under systemd?): no port drop-in; make it with: edgeinfer validate-config" \
        "--systemd-dropin /etc/edgeinfer/config.yaml > $DROPIN_DIR/50-listen.conf"
fi

if [ "$ENABLE" = 1 ] && systemd_running; then
    systemctl daemon-reload
    systemctl enable edgeinfer.service
    systemctl try-restart edgeinfer.service  # a re-run (upgrade) restarts a running service
    log "enabled edgeinfer.service; check the config (edgeinfer validate-config" \
        "/etc/edgeinfer/config.yaml), then: systemctl restart edgeinfer; journalctl -u edgeinfer -f"
elif [ "$ENABLE" = 0 ]; then
    log "not enabling the service (--no-enable)"
elif [ -n "$DESTDIR" ]; then
    log "not enabling the service (staged into DESTDIR=$DESTDIR)"
else
    log "warning: not enabling the service: systemd is not running here (PID 1 is" \
        "'$(pid1_name)', /run/systemd/system $([ -d /run/systemd/system ] || echo 'missing')" \
        "); on the device run: systemctl daemon-reload; systemctl enable edgeinfer" >&2
fi
