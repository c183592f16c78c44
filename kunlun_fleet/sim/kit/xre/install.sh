#!/bin/sh
# Kit XRE installer (runs from the payload of xre-Linux-x86_64-<version>.run).
#
# Behaves like the vendor's installer as far as the product can see:
#   * refuses to run unless given --silent --accept-license (prints the license prompt);
#   * needs KERNELDIR = a kernel headers tree with a Makefile (the modules are "built"
#     against it), else fails naming KERNELDIR and the package to install;
#   * logs to /var/log/xre-install.log;
#   * installs /usr/local/xpu (runtime + version), /usr/local/bin/xpu-smi,
#     /lib/modules/$(uname -r)/extra/{kunlun,kunlun_peermem}.ko (markers for the kit's
#     modprobe), /etc/udev/rules.d/99-kunlun.rules (MODE 0666);
#   * unloads and reloads kunlun_peermem + kunlun through modprobe (the kit's modprobe
#     creates /dev/xpu0..N-1 and /dev/xpuctrl with mknod on 1:3, mode 0666).
# Reboot rule: when the kunlun module is loaded and IN USE (a process holds an XPU node
# open, so it cannot be unloaded) and the installed version changes, the new files are
# installed, the old module stays loaded, /var/run/reboot-required is written and the
# installer prints "REBOOT REQUIRED"; exit status 0. Otherwise no reboot is needed.
# --uninstall removes what was installed (fails while the driver is in use).
# Every path is below $XRE_PREFIX (kit-only, default /) so tests can use a scratch root.
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=$(cat "$HERE/version")
P=${XRE_PREFIX:-/}
P=${P%/}
KREL=$(uname -r)
LOG="$P/var/log/xre-install.log"

SILENT=0
ACCEPT=0
UNINSTALL=0
for arg in "$@"; do
    case "$arg" in
        --silent) SILENT=1 ;;
        --accept-license) ACCEPT=1 ;;
        --uninstall) UNINSTALL=1 ;;
        -h|--help)
            echo "Usage: xre-Linux-x86_64-$VERSION.run --silent --accept-license [--uninstall]"
            echo "Environment: KERNELDIR=<kernel headers of the running kernel>"
            exit 0 ;;
        *) echo "ERROR: unknown option: $arg (see --help)" >&2; exit 2 ;;
    esac
done

if [ "$SILENT" -ne 1 ] || [ "$ACCEPT" -ne 1 ]; then
    cat "$HERE/LICENSE"
    echo
    echo "Do you accept the license agreement? (accept/decline)"
    echo "ERROR: the license was not accepted. Run non-interactively with:" >&2
    echo "       ./xre-Linux-x86_64-$VERSION.run --silent --accept-license" >&2
    exit 1
fi

mkdir -p "$P/var/log"
log() {
    echo "$*"
    echo "$(date '+%Y-%m-%d %H:%M:%S') $*" >> "$LOG"
}
die() {
    echo "ERROR: $*" >&2
    echo "$(date '+%Y-%m-%d %H:%M:%S') ERROR: $*" >> "$LOG"
    exit 1
}

log "XRE $VERSION installer started (uninstall=$UNINSTALL)"

modules_loaded() {
    [ -d "$P/run/kunlun-kit/modules/kunlun" ]
}
peermem_loaded() {
    [ -d "$P/run/kunlun-kit/modules/kunlun_peermem" ]
}

if [ "$UNINSTALL" -eq 1 ]; then
    if modules_loaded || peermem_loaded; then
        modprobe -r kunlun_peermem kunlun >> "$LOG" 2>&1 || \
            die "the kunlun driver is in use: stop the processes that use /dev/xpu* and rerun --uninstall"
    fi
    rm -rf "$P/usr/local/xpu" "$P/usr/local/bin/xpu-smi" \
        "$P/lib/modules/$KREL/extra/kunlun.ko" "$P/lib/modules/$KREL/extra/kunlun_peermem.ko" \
        "$P/etc/udev/rules.d/99-kunlun.rules"
    log "XRE $VERSION uninstalled"
    exit 0
fi

if [ -z "${KERNELDIR:-}" ]; then
    die "KERNELDIR is not set: set KERNELDIR to the kernel headers of the running kernel (KERNELDIR=/usr/src/linux-headers-$KREL; package linux-headers-$KREL)"
fi
if [ ! -d "$KERNELDIR" ] || [ ! -f "$KERNELDIR/Makefile" ]; then
    die "kernel headers not found: KERNELDIR=$KERNELDIR has no Makefile; install linux-headers-$KREL and point KERNELDIR at /usr/src/linux-headers-$KREL"
fi
if [ -f "$KERNELDIR/include/config/kernel.release" ] && \
        [ "$(cat "$KERNELDIR/include/config/kernel.release")" != "$KREL" ]; then
    die "KERNELDIR=$KERNELDIR holds headers for kernel $(cat "$KERNELDIR/include/config/kernel.release"), the running kernel is $KREL: point KERNELDIR at /usr/src/linux-headers-$KREL"
fi
log "Building kernel modules kunlun, kunlun_peermem against $KERNELDIR ... done"

PREVIOUS=""
[ -f "$P/usr/local/xpu/version" ] && PREVIOUS=$(cat "$P/usr/local/xpu/version")
[ -n "$PREVIOUS" ] && log "Found XRE $PREVIOUS installed"

mkdir -p "$P/usr/local/xpu/bin" "$P/usr/local/xpu/lib" "$P/usr/local/bin" \
    "$P/lib/modules/$KREL/extra" "$P/etc/udev/rules.d" "$P/etc/kunlun-kit"
cp "$HERE/version" "$P/usr/local/xpu/version"
cp "$HERE/firmware" "$P/usr/local/xpu/firmware"
cp "$HERE/LICENSE" "$P/usr/local/xpu/LICENSE"
printf 'XRE runtime %s (kit stand-in library)\n' "$VERSION" > "$P/usr/local/xpu/lib/libxpurt.so"
printf 'XCCL %s (kit stand-in library)\n' "$VERSION" > "$P/usr/local/xpu/lib/libbkcl.so"
cp "$HERE/xpu-smi" "$P/usr/local/xpu/bin/xpu-smi"
cp "$HERE/xpu-smi" "$P/usr/local/bin/xpu-smi"
chmod 0755 "$P/usr/local/xpu/bin/xpu-smi" "$P/usr/local/bin/xpu-smi"
for m in kunlun kunlun_peermem; do
    printf 'name=%s\nversion=%s\nvermagic=%s\n' "$m" "$VERSION" "$KREL" > "$P/lib/modules/$KREL/extra/$m.ko"
done
cat > "$P/etc/udev/rules.d/99-kunlun.rules" <<'EOF'
# Kunlunxin XPU device nodes, readable and writable by every user
KERNEL=="xpu[0-9]*", SUBSYSTEM=="kunlun", MODE="0666"
KERNEL=="xpuctrl", SUBSYSTEM=="kunlun", MODE="0666"
EOF
log "Installed XRE $VERSION: /usr/local/xpu, /usr/local/bin/xpu-smi, kunlun.ko, kunlun_peermem.ko, 99-kunlun.rules"

REBOOT=0
if modules_loaded || peermem_loaded; then
    log "Unloading kunlun_peermem, kunlun"
    if modprobe -r kunlun_peermem kunlun >> "$LOG" 2>&1; then
        :
    elif [ "$PREVIOUS" != "$VERSION" ]; then
        REBOOT=1
    else
        log "The kunlun driver is in use; the loaded driver is already $VERSION"
    fi
fi
if [ "$REBOOT" -eq 1 ]; then
    mkdir -p "$P/var/run"
    echo "*** System restart required ***" > "$P/var/run/reboot-required"
    echo "xre-$VERSION" >> "$P/var/run/reboot-required.pkgs"
    # the old kunlun stays loaded: give it back its peermem companion
    modprobe kunlun_peermem >> "$LOG" 2>&1 || true
    log "REBOOT REQUIRED: the kunlun driver is in use (a process holds /dev/xpu*); XRE $VERSION takes effect after a reboot"
else
    modprobe kunlun >> "$LOG" 2>&1 || die "modprobe kunlun failed (see $LOG)"
    modprobe kunlun_peermem >> "$LOG" 2>&1 || die "modprobe kunlun_peermem failed (see $LOG)"
    log "Loaded kunlun, kunlun_peermem $VERSION; no reboot required"
fi
log "XRE $VERSION installation complete"
exit 0
