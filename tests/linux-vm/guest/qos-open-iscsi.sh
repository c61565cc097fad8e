# shellcheck shell=dash
# Guest side of jobs/qos-open-iscsi.sh: fio on LUN 1 alone, then fio on LUN 0 (limited to 200 IOPS,
# a queue of 8) beside fio on LUN 1 (free); then writes with verify on LUN 0 through its TASK SET
# FULLs. (An emulated guest does about 1,200 IOPS of 4 KiB reads in all: the limit stays well
# below, so that what holds LUN 0 is the limit, not the guest's CPU.)
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN
P=10.0.2.100:$PORT
start_iscsid
node_new "$IQN" "$P"
check "login" login "$IQN" "$P"
dev0=$(disk "$IQN" 0)
dev1=$(disk "$IQN" 1)
note "LUN 0 $dev0 (limited), LUN 1 $dev1"

common=(--ioengine=libaio --direct=1 --rw=randread --bs=4k --size=200M --time_based --runtime=10
    --output-format=json)
note "queue depths: sda $(cat /sys/block/${dev0#/dev/}/device/queue_depth), sdb $(cat /sys/block/${dev1#/dev/}/device/queue_depth)"
fio "${common[@]}" --runtime=5 --name=alone --filename="$dev1" --iodepth=16 --output=out/alone.json >/dev/null 2>&1 \
    || fail "fio on LUN 1 alone"
note "LUN 1 alone: $(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["jobs"][0]["read"]["iops"]))' out/alone.json) IOPS"
fio "${common[@]}" --name=limited --filename="$dev0" --iodepth=64 --output=out/limited.json >/dev/null 2>&1 &
limited=$!
fio "${common[@]}" --name=free --filename="$dev1" --iodepth=16 --output=out/free.json >/dev/null 2>&1 \
    || fail "fio on LUN 1"
wait "$limited" || fail "fio on LUN 0 (limited)"
iops() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(int(j["read"]["iops"]), j["error"])' "$1"; }
read -r limited_iops limited_errors < <(iops out/limited.json)
read -r free_iops free_errors < <(iops out/free.json)
note "LUN 0: $limited_iops IOPS (limit 200); LUN 1: $free_iops IOPS beside it"
[ "$limited_errors" = 0 ] && [ "$free_errors" = 0 ] || fail "fio saw errors: $limited_errors on LUN 0, $free_errors on LUN 1"
ok "fio saw no error on either LUN"
# The bucket lets at most 200 a second through, plus its burst (20) once in the 10 s run.
[ "$limited_iops" -le 203 ] || fail "LUN 0 ran at $limited_iops IOPS against a limit of 200"
[ "$limited_iops" -ge 160 ] || fail "LUN 0 ran at only $limited_iops IOPS against a limit of 200"
ok "LUN 0 held to its limit: $limited_iops IOPS"
[ "$free_iops" -gt "$limited_iops" ] || fail "LUN 1 (free) ran at $free_iops IOPS, no faster than the limited LUN"
ok "LUN 1, free, ran at $free_iops IOPS beside it"

fio_verify limited-writes "$dev0" 4M 4k
dmesg >out/dmesg.txt
check "logout" logout "$IQN" "$P"
echo "QOS OK"
