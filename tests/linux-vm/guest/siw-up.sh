#!/bin/sh
# Guest side of the iSER jobs: soft iWARP up on the VM's NIC. Run with sh from the working directory:
#   sh ./siw-up.sh [SIW_KO] [NETDEV]
# SIW_KO defaults to ./siw.ko (built on the host for this kernel by tests/linux-vm/build-siw and passed
# as a FILE), NETDEV to the first e* interface (ens4 under qemu's virtio-net). Loads the RDMA core and
# the iSER initiator's modules (rdma_cm, iw_cm, ib_uverbs and rdma_ucm for the user-space verbs of tgtd
# and libiscsi, ib_iser for open-iscsi), insmods siw.ko, adds the link siw0 and checks that `rdma
# link` shows it ACTIVE on NETDEV. Prints "siw-up: ok ..." or "siw-up: FAIL: ..." with the modules,
# the links and the kernel log's tail; exit status 0 or 1. Idempotent (siw0 already up: ok).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ko=${1:-./siw.ko}
dev=${2:-}
if [ -z "$dev" ]; then
    for i in /sys/class/net/e*; do [ -e "$i" ] && { dev=${i##*/}; break; }; done
fi
fail() {
    echo "siw-up: FAIL: $*"
    echo "--- RDMA modules:"; lsmod | awk 'NR == 1 || /siw|^ib_|rdma|iw_cm|crc32c/'
    echo "--- rdma link:"; rdma link 2>&1
    echo "--- /sys/class/infiniband:"; ls /sys/class/infiniband 2>&1
    echo "--- /sys/class/net:"; ls /sys/class/net
    echo "--- kernel log (tail):"; dmesg | tail -25
    exit 1
}
[ -n "$dev" ] && [ -e "/sys/class/net/$dev" ] || fail "no network interface ${dev:-e*}"
# siw needs ib_core and crc32c (its MPA CRC); insmod resolves no dependencies, so they come first.
for m in libcrc32c crc32c_generic ib_core ib_uverbs iw_cm rdma_cm rdma_ucm ib_iser; do
    modprobe "$m" 2>/tmp/modprobe.err || fail "modprobe $m: $(cat /tmp/modprobe.err)"
done
if [ ! -d /sys/module/siw ]; then
    [ -f "$ko" ] || fail "no $ko (tests/linux-vm/build-siw builds it on the host)"
    insmod "$ko" 2>/tmp/insmod.err || fail "insmod $ko: $(cat /tmp/insmod.err) (built for another kernel? this one is $(uname -r))"
fi
if [ ! -e /sys/class/infiniband/siw0 ]; then
    rdma link add siw0 type siw netdev "$dev" 2>/tmp/rdma.err || fail "rdma link add siw0 type siw netdev $dev: $(cat /tmp/rdma.err)"
fi
# `rdma link show siw0/1`: "link siw0/1 state ACTIVE physical_state LINK_UP netdev ens4"
i=0
while :; do
    link=$(rdma link show siw0/1 2>&1)
    case $link in *"state ACTIVE"*"netdev $dev"*) break ;; esac
    i=$((i + 1))
    [ "$i" -lt 50 ] || fail "siw0 is not ACTIVE on $dev: $link"
    sleep 0.2
done
# tgtd and libiscsi open the device through libibverbs: siw's user-space provider must be there.
provider=$(ls /usr/lib/*/libibverbs/libsiw-rdmav*.so 2>/dev/null | head -n 1)
[ -n "$provider" ] || fail "no libsiw-rdmav*.so (package ibverbs-providers) for user-space verbs"
echo "siw-up: ok: $link (provider ${provider##*/})"
