//! Round trips of every PDU type and flag combination (RFC 7143 section
//! 11): decode(encode(pdu)) == pdu, and encode(decode(bytes)) == bytes for
//! canonical bytes; plus the RFC 7143 Appendix B.4 Read command example.

use iscsi_proto::pdu::*;
use iscsi_proto::serial::Serial;
use proptest::prelude::*;

fn sn<K: 'static>() -> impl Strategy<Value = Serial<K>> {
    any::<u32>().prop_map(Serial::new)
}
fn lun() -> impl Strategy<Value = Lun> {
    any::<u64>().prop_map(Lun)
}
fn isid() -> impl Strategy<Value = Isid> {
    (0u8..4, 0u8..64, any::<u16>(), any::<u8>(), any::<u16>()).prop_map(|(t, a, b, c, d)| Isid {
        kind: IsidType::from_u8(t),
        a,
        b,
        c,
        d,
    })
}
fn stage() -> impl Strategy<Value = LoginStage> {
    (0u8..4).prop_map(LoginStage::from_u8)
}

prop_compose! {
    fn scsi_command()(flags in any::<[bool; 4]>(), attr in 0u8..8, lun in lun(), itt: u32,
                      edtl: u32, cmd_sn in sn(), exp_stat_sn in sn(), cdb: [u8; 16]) -> Pdu {
        Pdu::ScsiCommand(ScsiCommand {
            immediate: flags[0], final_flag: flags[1], read: flags[2], write: flags[3],
            attr: TaskAttribute::from_u8(attr), lun, initiator_task_tag: itt,
            expected_data_transfer_length: edtl, cmd_sn, exp_stat_sn, cdb,
        })
    }
}
prop_compose! {
    fn scsi_response()(flags in any::<[bool; 4]>(), response: u8, status: u8, itt: u32, snack_tag: u32,
                       stat_sn in sn(), exp_cmd_sn in sn(), max_cmd_sn in sn(), exp_data_sn in sn(),
                       bidi: u32, residual: u32) -> Pdu {
        Pdu::ScsiResponse(ScsiResponse {
            bidi_read_residual_overflow: flags[0], bidi_read_residual_underflow: flags[1],
            residual_overflow: flags[2], residual_underflow: flags[3],
            response: ServiceResponse::from_u8(response), status, initiator_task_tag: itt, snack_tag,
            stat_sn, exp_cmd_sn, max_cmd_sn, exp_data_sn, bidi_read_residual_count: bidi,
            residual_count: residual,
        })
    }
}
prop_compose! {
    fn data_out()(f: bool, lun in lun(), itt: u32, ttt: u32, exp_stat_sn in sn(), data_sn in sn(),
                  off: u32) -> Pdu {
        Pdu::DataOut(DataOut { final_flag: f, lun, initiator_task_tag: itt, target_transfer_tag: ttt,
            exp_stat_sn, data_sn, buffer_offset: off })
    }
}
prop_compose! {
    fn data_in()(flags in any::<[bool; 4]>(), status in proptest::option::of(any::<u8>()), lun in lun(),
                 itt: u32, ttt: u32, stat_sn in sn(), exp_cmd_sn in sn(), max_cmd_sn in sn(),
                 data_sn in sn(), off: u32, residual: u32) -> Pdu {
        Pdu::DataIn(DataIn { final_flag: flags[0], acknowledge: flags[1], residual_overflow: flags[2],
            residual_underflow: flags[3], status, lun, initiator_task_tag: itt, target_transfer_tag: ttt,
            stat_sn, exp_cmd_sn, max_cmd_sn, data_sn, buffer_offset: off, residual_count: residual })
    }
}
prop_compose! {
    fn r2t()(lun in lun(), itt: u32, ttt: u32, stat_sn in sn(), exp_cmd_sn in sn(), max_cmd_sn in sn(),
             r2t_sn in sn(), off: u32, len: u32) -> Pdu {
        Pdu::ReadyToTransfer(ReadyToTransfer { lun, initiator_task_tag: itt, target_transfer_tag: ttt,
            stat_sn, exp_cmd_sn, max_cmd_sn, r2t_sn, buffer_offset: off, desired_data_transfer_length: len })
    }
}
prop_compose! {
    fn tmf_request()(i: bool, function in 0u8..128, lun in lun(), itt: u32, rtt: u32, cmd_sn in sn(),
                     exp_stat_sn in sn(), ref_cmd_sn in sn(), exp_data_sn in sn()) -> Pdu {
        Pdu::TaskManagementRequest(TaskManagementRequest { immediate: i,
            function: TaskFunction::from_u8(function), lun, initiator_task_tag: itt,
            referenced_task_tag: rtt, cmd_sn, exp_stat_sn, ref_cmd_sn, exp_data_sn })
    }
}
prop_compose! {
    fn tmf_response()(r: u8, itt: u32, stat_sn in sn(), exp_cmd_sn in sn(), max_cmd_sn in sn()) -> Pdu {
        Pdu::TaskManagementResponse(TaskManagementResponse { response: TaskResponse::from_u8(r),
            initiator_task_tag: itt, stat_sn, exp_cmd_sn, max_cmd_sn })
    }
}
prop_compose! {
    fn login_request()(t: bool, c: bool, csg in stage(), nsg in stage(), vmax: u8, vmin: u8,
                       isid in isid(), tsih: u16, itt: u32, cid: u16, cmd_sn in sn(),
                       exp_stat_sn in sn()) -> Pdu {
        Pdu::LoginRequest(LoginRequest { transit: t, continue_flag: c, current_stage: csg,
            next_stage: nsg, version_max: vmax, version_min: vmin, isid, tsih,
            initiator_task_tag: itt, cid, cmd_sn, exp_stat_sn })
    }
}
prop_compose! {
    fn login_response()(t: bool, c: bool, csg in stage(), nsg in stage(), vmax: u8, vact: u8,
                        isid in isid(), tsih: u16, itt: u32, sns in (sn(), sn(), sn()),
                        class: u8, detail: u8) -> Pdu {
        Pdu::LoginResponse(LoginResponse { transit: t, continue_flag: c, current_stage: csg,
            next_stage: nsg, version_max: vmax, version_active: vact, isid, tsih,
            initiator_task_tag: itt, stat_sn: sns.0, exp_cmd_sn: sns.1, max_cmd_sn: sns.2,
            status: LoginStatus::new(class, detail) })
    }
}
prop_compose! {
    fn text_request()(i: bool, f: bool, c: bool, lun in lun(), itt: u32, ttt: u32, cmd_sn in sn(),
                      exp_stat_sn in sn()) -> Pdu {
        Pdu::TextRequest(TextRequest { immediate: i, final_flag: f, continue_flag: c, lun,
            initiator_task_tag: itt, target_transfer_tag: ttt, cmd_sn, exp_stat_sn })
    }
}
prop_compose! {
    fn text_response()(f: bool, c: bool, lun in lun(), itt: u32, ttt: u32, stat_sn in sn(),
                       exp_cmd_sn in sn(), max_cmd_sn in sn()) -> Pdu {
        Pdu::TextResponse(TextResponse { final_flag: f, continue_flag: c, lun,
            initiator_task_tag: itt, target_transfer_tag: ttt, stat_sn, exp_cmd_sn, max_cmd_sn })
    }
}
prop_compose! {
    fn logout_request()(i: bool, reason in 0u8..128, itt: u32, cid: u16, cmd_sn in sn(),
                        exp_stat_sn in sn()) -> Pdu {
        Pdu::LogoutRequest(LogoutRequest { immediate: i, reason: LogoutReason::from_u8(reason),
            initiator_task_tag: itt, cid, cmd_sn, exp_stat_sn })
    }
}
prop_compose! {
    fn logout_response()(r: u8, itt: u32, stat_sn in sn(), exp_cmd_sn in sn(), max_cmd_sn in sn(),
                         t2w: u16, t2r: u16) -> Pdu {
        Pdu::LogoutResponse(LogoutResponse { response: LogoutResponseCode::from_u8(r),
            initiator_task_tag: itt, stat_sn, exp_cmd_sn, max_cmd_sn, time2wait: t2w, time2retain: t2r })
    }
}
prop_compose! {
    fn nop_out()(i: bool, lun in lun(), itt: u32, ttt: u32, cmd_sn in sn(), exp_stat_sn in sn()) -> Pdu {
        Pdu::NopOut(NopOut { immediate: i, lun, initiator_task_tag: itt, target_transfer_tag: ttt,
            cmd_sn, exp_stat_sn })
    }
}
prop_compose! {
    fn nop_in()(lun in lun(), itt: u32, ttt: u32, stat_sn in sn(), exp_cmd_sn in sn(),
                max_cmd_sn in sn()) -> Pdu {
        Pdu::NopIn(NopIn { lun, initiator_task_tag: itt, target_transfer_tag: ttt, stat_sn,
            exp_cmd_sn, max_cmd_sn })
    }
}
prop_compose! {
    fn snack()(t in 0u8..16, lun in lun(), itt: u32, ttt: u32, exp_stat_sn in sn(), beg: u32,
               run: u32) -> Pdu {
        Pdu::SnackRequest(SnackRequest { snack_type: SnackType::from_u8(t), lun,
            initiator_task_tag: itt, target_transfer_tag: ttt, exp_stat_sn, beg_run: beg,
            run_length: run })
    }
}
prop_compose! {
    fn async_message()(lun in lun(), sns in (sn(), sn(), sn()), ev: u8, vcode: u8,
                       p in any::<[u16; 3]>()) -> Pdu {
        Pdu::AsyncMessage(AsyncMessage { lun, stat_sn: sns.0, exp_cmd_sn: sns.1, max_cmd_sn: sns.2,
            async_event: AsyncEvent::from_u8(ev), async_vcode: vcode, parameter1: p[0],
            parameter2: p[1], parameter3: p[2] })
    }
}
prop_compose! {
    fn reject()(r: u8, sns in (sn(), sn(), sn()), dsn: u32) -> Pdu {
        Pdu::Reject(Reject { reason: RejectReason::from_u8(r), stat_sn: sns.0, exp_cmd_sn: sns.1,
            max_cmd_sn: sns.2, data_sn_or_r2t_sn: dsn })
    }
}
prop_compose! {
    fn unknown()(op in prop::sample::select(vec![0x1cu8, 0x1d, 0x1e, 0x3c, 0x3d, 0x3e, 0x07, 0x11, 0x30]),
                 rest in prop::collection::vec(any::<u8>(), 47)) -> Pdu {
        let mut bhs = [0u8; 48];
        bhs[0] = op | (rest[0] & 0xc0);
        bhs[1..].copy_from_slice(&rest);
        bhs[4..8].fill(0);
        Pdu::Unknown(UnknownPdu { bhs: Box::new(bhs) })
    }
}

/// Every PDU type.
pub fn any_pdu() -> impl Strategy<Value = Pdu> {
    prop_oneof![
        scsi_command(),
        scsi_response(),
        data_out(),
        data_in(),
        r2t(),
        tmf_request(),
        tmf_response(),
        login_request(),
        login_response(),
        text_request(),
        text_response(),
        logout_request(),
        logout_response(),
        nop_out(),
        nop_in(),
        snack(),
        async_message(),
        reject(),
        unknown(),
    ]
}

fn ahs() -> impl Strategy<Value = Ahs> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Ahs::ExtendedCdb),
        any::<u32>().prop_map(Ahs::BidiExpectedReadDataLength),
        (3u8..=255, prop::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(ahs_type, specific)| Ahs::Other { ahs_type, specific }),
    ]
}

proptest! {
    #[test]
    fn bhs_round_trips(pdu in any_pdu(), ahs_words: u8, dsl in 0u32..=0xFF_FFFF) {
        let lengths = SegmentLengths { total_ahs_words: ahs_words, data_segment_length: dsl };
        let mut bhs = [0u8; 48];
        pdu.encode_bhs(lengths, &mut bhs);
        let (back, back_lengths) = Pdu::decode_bhs(&bhs);
        prop_assert_eq!(&back, &pdu);
        prop_assert_eq!(back_lengths, lengths);
        prop_assert!(Pdu::reserved_bits_clear(&bhs));
        prop_assert_eq!(back.opcode(), pdu.opcode());
    }

    #[test]
    fn any_bhs_decodes_and_canonical_bytes_round_trip(bytes in prop::collection::vec(any::<u8>(), 48)) {
        let bhs: [u8; 48] = bytes.try_into().unwrap();
        let (pdu, lengths) = Pdu::decode_bhs(&bhs);
        let mut again = [0u8; 48];
        pdu.encode_bhs(lengths, &mut again);
        // Re-encoding is canonical and stable.
        prop_assert_eq!(Pdu::decode_bhs(&again), (pdu, lengths));
        prop_assert_eq!(Pdu::reserved_bits_clear(&bhs), again == bhs);
    }

    #[test]
    fn whole_pdus_round_trip(pdu in any_pdu(), ahs in prop::collection::vec(ahs(), 0..4),
                             data in prop::collection::vec(any::<u8>(), 0..300),
                             hd: bool, dd: bool) {
        let header = Header { pdu, ahs, data_segment_length: data.len() as u32 };
        let digests = Digests { header: hd, data: dd };
        let wire = encode_pdu_to_vec(&header, &data, digests).unwrap();
        prop_assert_eq!(wire.len() % 4, 0);
        let config = DecoderConfig { digests, ..DecoderConfig::default() };
        let (decoded, used) = DecodedPdu::decode(config, &wire).unwrap().unwrap();
        prop_assert_eq!(used, wire.len());
        prop_assert_eq!(decoded.header, header);
        prop_assert_eq!(decoded.data, data);
    }
}

/// RFC 7143 Appendix B.4: "an iSCSI Read command PDU".
const READ_COMMAND_PDU: [u8; 48] = [
    0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
    0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

#[test]
fn rfc7143_b4_read_command_decodes() {
    let (pdu, lengths) = Pdu::decode_bhs(&READ_COMMAND_PDU);
    assert_eq!(lengths, SegmentLengths::default());
    let Pdu::ScsiCommand(cmd) = &pdu else {
        panic!("not a SCSI Command: {pdu:?}")
    };
    assert!(!cmd.immediate);
    assert!(cmd.final_flag && cmd.read && !cmd.write);
    assert_eq!(cmd.attr, TaskAttribute::Untagged);
    assert_eq!(cmd.lun, Lun(0));
    assert_eq!(cmd.initiator_task_tag, 0x1400_0000);
    assert_eq!(cmd.expected_data_transfer_length, 0x400);
    assert_eq!(cmd.cmd_sn.get(), 0x14);
    assert_eq!(cmd.exp_stat_sn.get(), 0x18);
    // READ(10): opcode 0x28, LBA 0, transfer length 2 blocks.
    assert_eq!(cmd.cdb[0], 0x28);
    assert_eq!(u32::from_be_bytes(cmd.cdb[2..6].try_into().unwrap()), 0);
    assert_eq!(u16::from_be_bytes([cmd.cdb[7], cmd.cdb[8]]), 2);
    assert!(Pdu::reserved_bits_clear(&READ_COMMAND_PDU));

    // With a header digest: CRC32C 0xd9963a56, sent as 56 3a 96 d9.
    let header = Header::new(pdu, 0);
    let wire = encode_pdu_to_vec(
        &header,
        &[],
        Digests {
            header: true,
            data: true,
        },
    )
    .unwrap();
    assert_eq!(&wire[..48], &READ_COMMAND_PDU);
    assert_eq!(&wire[48..], &[0x56, 0x3a, 0x96, 0xd9]);
    assert_eq!(header.full_cdb().unwrap().len(), 16);
}

#[test]
fn extended_cdb_and_bidi_ahs() {
    let cmd = ScsiCommand {
        cdb: [0x7f; 16],
        ..Default::default()
    };
    let header = Header {
        pdu: Pdu::ScsiCommand(cmd),
        ahs: vec![
            Ahs::ExtendedCdb(vec![1, 2, 3, 4, 5]),
            Ahs::BidiExpectedReadDataLength(4096),
        ],
        data_segment_length: 0,
    };
    let wire = encode_pdu_to_vec(&header, &[], Digests::default()).unwrap();
    // Extended CDB AHS: AHSLength = 21 - 15 = 6, type 1, padded to 12 bytes;
    // bidi AHS: AHSLength 5, type 2, 8 bytes.
    assert_eq!(wire[4], 5, "TotalAHSLength in words");
    assert_eq!(&wire[48..52], &[0, 6, 1, 0]);
    assert_eq!(&wire[60..64], &[0, 5, 2, 0]);
    assert_eq!(&wire[64..68], &4096u32.to_be_bytes());
    let (decoded, _) = DecodedPdu::decode(DecoderConfig::default(), &wire)
        .unwrap()
        .unwrap();
    assert_eq!(decoded.header.full_cdb().unwrap().len(), 21);
    assert_eq!(decoded.header.bidi_expected_read_data_length(), Some(4096));
}

#[test]
fn opcodes_round_trip() {
    for v in 0u8..64 {
        assert_eq!(Opcode::from_bits(v).to_bits(), v);
        assert_eq!(Opcode::from_bits(v | 0xc0), Opcode::from_bits(v));
    }
    assert_eq!(Opcode::from_bits(0x31), Opcode::ReadyToTransfer);
    assert!(Opcode::ScsiDataOut.is_initiator_opcode());
    assert!(!Opcode::ScsiDataIn.is_initiator_opcode());
}

#[test]
fn login_request_always_immediate_and_isid_layout() {
    let isid = Isid {
        kind: IsidType::Random,
        a: 0x3f,
        b: 0x1234,
        c: 0x56,
        d: 0x789a,
    };
    assert_eq!(isid.to_bytes(), [0xbf, 0x12, 0x34, 0x56, 0x78, 0x9a]);
    let pdu = Pdu::LoginRequest(LoginRequest {
        transit: true,
        current_stage: LoginStage::SecurityNegotiation,
        next_stage: LoginStage::LoginOperationalNegotiation,
        isid,
        ..Default::default()
    });
    let mut bhs = [0u8; 48];
    pdu.encode_bhs(SegmentLengths::default(), &mut bhs);
    assert_eq!(bhs[0], 0x43);
    assert_eq!(bhs[1], 0x81);
    assert_eq!(&bhs[8..14], &isid.to_bytes());
}
