# Install probes shared by scripts/test, the bench scripts and their test (tests/scripts/probes).
# Source it (bash). Every probe answers with its exit status and must give the same answer under
# `set -euo pipefail` as without it: a probe never ends a pipeline with `grep -q` (grep's early exit
# can SIGPIPE the writer, and pipefail then reports the writer's status, not grep's), and never
# lets a command that is expected to fail decide the answer. Output is captured first, then matched.

# probe_have PROGRAM: PROGRAM is on PATH.
probe_have() { command -v "$1" >/dev/null 2>&1; }

# The font the plots of `iscsi sweep`, `iscsi model` and `iscsi pdu-cost` draw text with
# (crates/analysis/src/plot.rs looks here first; Debian package fonts-dejavu-core).
# PROBE_PLOT_FONT set beforehand replaces it (tests/scripts/fresh-machine points it at a file that is not there).
PROBE_PLOT_FONT=${PROBE_PLOT_FONT:-/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf}

# probe_plot_font: the plot font is installed.
probe_plot_font() { [ -f "$PROBE_PLOT_FONT" ]; }

# The URL the qemu-img probe opens: port 1 on loopback, which refuses at once, so no traffic leaves
# the machine and the probe takes milliseconds.
PROBE_QEMU_ISCSI_URL=iscsi://127.0.0.1:1/iqn.2026-11.rs.iscsi:probe/0

# probe_qemu_iscsi_missing: qemu-img is absent, or it cannot open iscsi:// URLs. `qemu-img --help`
# lists iscsi even when its module cannot load, so the probe asks qemu-img to open a URL; qemu-img
# always fails (nothing listens), and only what it says tells the two cases apart:
#   "Unable to load module iscsi"  qemu-utils without qemu-block-extra of the same version
#   "Unknown protocol 'iscsi'"     a qemu-img built without the driver
# Anything else (the driver's own "iSCSI: Failed to connect ..." error) means the driver loaded.
probe_qemu_iscsi_missing() {
    probe_have qemu-img || return 0
    local said
    said=$(qemu-img info "$PROBE_QEMU_ISCSI_URL" 2>&1 </dev/null) || true
    case $said in
        *'Unable to load module'* | *'Unknown protocol'*) return 0 ;;
        *) return 1 ;;
    esac
}

# probe_rust_toolchain NAME: rustup lists a toolchain whose name starts with NAME (e.g. nightly).
probe_rust_toolchain() {
    local listed
    listed=$(rustup toolchain list 2>/dev/null) || return 1
    grep -q "^$1" <<<"$listed"
}

# probe_rust_component NAME: rustup lists component NAME (rustfmt, clippy...) as installed.
probe_rust_component() {
    local listed
    listed=$(rustup component list --installed 2>/dev/null) || return 1
    grep -q "^$1" <<<"$listed"
}

# qemu_block_extra_versions: the qemu-utils and qemu-block-extra versions to install together so
# that qemu-img loads the iscsi module (the module only loads into a qemu-img of its own version).
# Keeps the installed qemu-utils when the archive has a qemu-block-extra of that very version (a
# backport of both); otherwise both at qemu-block-extra's candidate (which may downgrade a backported
# qemu-utils). Prints "qemu-utils=V qemu-block-extra=V"; fails with a message if there is none.
qemu_block_extra_versions() {
    local installed candidate available
    installed=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null) || installed=""
    available=$(apt-cache madison qemu-block-extra 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}') ||
        available=
    if [ -n "$installed" ] && grep -qxF -- "$installed" <<<"$available"; then
        echo "qemu-utils=$installed qemu-block-extra=$installed"
        return 0
    fi
    candidate=$(apt-cache policy qemu-block-extra 2>/dev/null | awk '/Candidate:/ {print $2}') ||
        candidate=""
    if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
        echo "no qemu-block-extra in this machine's apt sources" >&2
        return 1
    fi
    echo "qemu-utils=$candidate qemu-block-extra=$candidate"
}

# probe_tshark_lua: tshark is there and runs Lua dissectors (tools/wireshark/iser-iwarp.lua needs
# them). Debian's tshark is built with Lua; `tshark -v` names it in its "Compiled ... with Lua
# 5.2.4" paragraph (or "without Lua"), wrapped at any word, so lines are joined before matching.
probe_tshark_lua() {
    probe_have tshark || return 1
    local said
    said=$(tshark -v 2>/dev/null </dev/null) || return 1
    said=${said//$'\n'/ }
    case $said in
        *'with Lua'*) return 0 ;;
        *) return 1 ;;
    esac
}

# probe_iscsi_iser BIN: the iscsi binary BIN has an iSER portal (`iscsi target --iser ADDR`): its
# `target --help` names --iser. A binary that fails to run has none.
probe_iscsi_iser() {
    local said
    said=$("$1" target --help 2>/dev/null </dev/null) || return 1
    case $said in
        *--iser*) return 0 ;;
        *) return 1 ;;
    esac
}

# probe_deb_installed PACKAGE [VERSION]: dpkg has PACKAGE installed ("install ok installed"; a
# package removed with its configuration files left is "deinstall ok config-files" and does not
# count), at exactly VERSION when given. dpkg-query prints one line per architecture of a
# Multi-Arch package: any line will do.
probe_deb_installed() {
    local said
    said=$(dpkg-query -W -f='${Status}|${Version}\n' "$1" 2>/dev/null) || return 1
    if [ $# -ge 2 ]; then
        grep -qxF -- "install ok installed|$2" <<<"$said"
    else
        grep -q '^install ok installed|' <<<"$said"
    fi
}

# probe_deb_available PACKAGE VERSION: this machine's apt sources offer PACKAGE at exactly VERSION
# (e.g. the linux-source of a kernel that is no longer the newest).
probe_deb_available() {
    local said listed
    # apt-cache's own status, not the one of a pipeline's last command (pipefail may be off).
    said=$(apt-cache madison "$1" 2>/dev/null) || return 1
    listed=$(awk -F'|' '{gsub(/ /, "", $2); print $2}' <<<"$said")
    grep -qxF -- "$2" <<<"$listed"
}

# debian_mirror: the Debian mirror this machine's apt uses (deb822 .sources first, then the
# one-line format; never the security archive), else deb.debian.org: build-image's debootstrap and
# build-tgt's source package come from where the machine's packages come from.
debian_mirror() {
    local f mirror=""
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        mirror=$(awk '$1=="URIs:" && $2 !~ /security/ {print $2; exit}' "$f")
        [ -n "$mirror" ] && break
    done
    if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
        mirror=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
    fi
    echo "${mirror:-http://deb.debian.org/debian}"
}

# apt_install WHO PACKAGE...: installs the PACKAGEs that a script's probes found missing (nothing
# when none are given), saying so as WHO: the one install step of build-image, build-tgt and
# build-libiscsi.
apt_install() {
    local who=$1
    shift
    (($#)) || return 0
    echo "$who: installing $*" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# debian_source_download PACKAGE SUITE DIR: fetches Debian's source package PACKAGE of SUITE (its
# .dsc, upstream tarball and packaging) from the machine's mirror into DIR, through a private apt
# state under DIR/apt, so the machine's apt configuration is left as it is. apt's output goes to
# DIR/apt.log; the status is apt's (update, then source).
debian_source_download() {
    local package=$1 suite=$2 dir=$3
    mkdir -p "$dir/apt/sources" "$dir/apt/lists/partial"
    cat >"$dir/apt/sources/$package-src.sources" <<SOURCES
Types: deb-src
URIs: $(debian_mirror)
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    local private=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$dir/apt/sources"
        -o "Dir::State::Lists=$dir/apt/lists" -o APT::Sandbox::User=root)
    apt-get "${private[@]}" update -qq >"$dir/apt.log" 2>&1 &&
        (cd "$dir" && apt-get "${private[@]}" source --download-only "$package") >>"$dir/apt.log" 2>&1
}

# tgtd's RBD backing store (`--bstype rbd`), Debian package tgt-rbd: the plugin tgtd loads at start.
# scripts/bench-target's RBD mode compares against it. PROBE_TGT_RBD set beforehand replaces the glob
# (tests/scripts/fresh-machine points it at files that are not there, then at its stub's).
PROBE_TGT_RBD=${PROBE_TGT_RBD:-/usr/lib/tgt/backing-store/bs_rbd.so}

# probe_tgt_rbd: some file matches PROBE_TGT_RBD.
probe_tgt_rbd() { compgen -G "$PROBE_TGT_RBD" >/dev/null; }
