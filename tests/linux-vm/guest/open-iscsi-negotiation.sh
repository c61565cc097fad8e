# shellcheck shell=dash
# Guest side of jobs/open-iscsi-negotiation.sh: the negotiation matrix of the Linux kernel initiator
# against `iscsi target`. For every cell, the initiator's offers are set in the node record, the
# session's negotiated values (iscsiadm -m session -P 2) are compared with what RFC 7143's result
# functions give for the two sides' offers, and a small fio write+verify (QD32, mixed sizes crossing
# every burst and segment limit) checks that data moves correctly under them.
#   ImmediateData: AND (13.11); InitialR2T: OR (13.10); MaxBurstLength, FirstBurstLength: Minimum
#   (13.13, 13.14; FirstBurstLength is Irrelevant with InitialR2T=Yes and ImmediateData=No);
#   MaxRecvDataSegmentLength: declarative per direction (13.12): the initiator receives at most its own
#   value, and sends at most the target's (open-iscsi shows it as MaxXmitDataSegmentLength).
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# PORTS, TARGETS ("iqn port" per line), and per target T<i>_IMMEDIATE, T<i>_INITIAL_R2T, T<i>_MRDSL,
# T<i>_FBL, T<i>_MBL: what that target process offers (its [negotiation]); CELLS_<i>: which cells.
# shellcheck disable=SC1091 # written by the host job
. ./params.sh
start_iscsid

yn_and() { [ "$1" = Yes ] && [ "$2" = Yes ] && echo Yes || echo No; }
yn_or() { [ "$1" = Yes ] || [ "$2" = Yes ] && echo Yes || echo No; }
min() { [ "$1" -le "$2" ] && echo "$1" || echo "$2"; }

cells=0
i=0
while read -r iqn port; do
    i=$((i + 1))
    P=10.0.2.100:$port
    # This target's offers and cells (indirect: T1_..., T2_...).
    v=T${i}_IMMEDIATE; t_imm=${!v}
    v=T${i}_INITIAL_R2T; t_r2t=${!v}
    v=T${i}_MRDSL; t_mrdsl=${!v}
    v=T${i}_FBL; t_fbl=${!v}
    v=T${i}_MBL; t_mbl=${!v}
    v=CELLS_$i; cell_list=${!v}
    note "target $iqn on $P offers ImmediateData=$t_imm InitialR2T=$t_r2t MRDSL=$t_mrdsl FBL=$t_fbl MBL=$t_mbl"
    node_new "$iqn" "$P"
    # Each cell: ImmediateData InitialR2T MRDSL FBL MBL (the initiator's offers).
    for cell in $cell_list; do
        IFS=: read -r imm r2t mrdsl fbl mbl <<<"$cell"
        node_set "$iqn" "$P" node.session.iscsi.ImmediateData "$imm"
        node_set "$iqn" "$P" node.session.iscsi.InitialR2T "$r2t"
        node_set "$iqn" "$P" 'node.conn[0].iscsi.MaxRecvDataSegmentLength' "$mrdsl"
        node_set "$iqn" "$P" node.session.iscsi.FirstBurstLength "$fbl"
        node_set "$iqn" "$P" node.session.iscsi.MaxBurstLength "$mbl"
        what="ImmediateData=$imm InitialR2T=$r2t MRDSL=$mrdsl FBL=$fbl MBL=$mbl"
        login "$iqn" "$P" || fail "login with $what"
        # What RFC 7143 says the session must run with.
        e_imm=$(yn_and "$imm" "$t_imm")
        e_r2t=$(yn_or "$r2t" "$t_r2t")
        e_mbl=$(min "$mbl" "$t_mbl")
        e_fbl=$(min "$fbl" "$t_fbl")
        sid=$(session_dir "$iqn"); sid=${sid##*session}
        iscsiadm -m session -r "$sid" -P 2 >"out/session-$i-$cell.txt"
        get() { awk -v k="$1:" '$1==k {print $2; exit}' "out/session-$i-$cell.txt"; }
        got="ImmediateData=$(get ImmediateData) InitialR2T=$(get InitialR2T) MaxBurstLength=$(get MaxBurstLength) MaxRecvDataSegmentLength=$(get MaxRecvDataSegmentLength) MaxXmitDataSegmentLength=$(get MaxXmitDataSegmentLength)"
        want="ImmediateData=$e_imm InitialR2T=$e_r2t MaxBurstLength=$e_mbl MaxRecvDataSegmentLength=$mrdsl MaxXmitDataSegmentLength=$t_mrdsl"
        if [ "$e_r2t" = Yes ] && [ "$e_imm" = No ]; then
            note "FirstBurstLength is Irrelevant here (InitialR2T=Yes, ImmediateData=No): reported $(get FirstBurstLength)"
        else
            got="$got FirstBurstLength=$(get FirstBurstLength)"
            want="$want FirstBurstLength=$e_fbl"
        fi
        [ "$got" = "$want" ] || { cat "out/session-$i-$cell.txt"; fail "offers $what: negotiated $got, expected $want"; }
        ok "offers $what -> $got"
        dev=$(disk "$iqn" 0)
        fio_verify "cell-$i-$imm-$r2t-$mrdsl-$fbl-$mbl" "$dev" 4M 4k-1m
        logout "$iqn" "$P" || fail "logout after $what"
        cells=$((cells + 1))
    done
done <<<"$TARGETS"
echo "NEGOTIATION OK: $cells cells"
