use super::*;

#[test]
fn command_numbers_are_the_headers_ioctl_encodings() {
    // _IOWR('u', 0x04, struct ublksrv_ctrl_cmd), _IOR('u', 0x13, ...),
    // _IOWR('u', 0x21, struct ublksrv_io_cmd), as Linux 6.12 defines them.
    assert_eq!(Encoding::Ioctl.ctrl(CtrlOp::AddDev), 0xc020_7504);
    assert_eq!(Encoding::Ioctl.ctrl(CtrlOp::GetDevInfo), 0x8020_7502);
    assert_eq!(Encoding::Ioctl.ctrl(CtrlOp::GetFeatures), 0x8020_7513);
    assert_eq!(Encoding::Ioctl.io(IoOp::Fetch), 0xc010_7520);
    assert_eq!(Encoding::Ioctl.io(IoOp::CommitAndFetch), 0xc010_7521);
    assert_eq!(Encoding::Legacy.ctrl(CtrlOp::StopDev), 0x07);
    assert_eq!(Encoding::Legacy.io(IoOp::CommitAndFetch), 0x21);
}

#[test]
fn a_control_command_lays_out_as_the_driver_reads_it() {
    let cmd = CtrlCmd {
        dev_id: 3,
        queue_id: u16::MAX,
        len: 64,
        data: 4242,
    };
    let b = cmd.emit(0x1122_3344_5566_7788);
    assert_eq!(&b[0..4], &3u32.to_ne_bytes());
    assert_eq!(&b[4..6], &[0xff, 0xff]);
    assert_eq!(&b[6..8], &64u16.to_ne_bytes());
    assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_ne_bytes());
    assert_eq!(&b[16..24], &4242u64.to_ne_bytes());
    assert!(b[24..].iter().all(|&x| x == 0));
}

#[test]
fn dev_info_round_trips_and_refuses_short_buffers() {
    let info = DevInfo {
        nr_hw_queues: 2,
        queue_depth: 64,
        state: 1,
        max_io_buf_bytes: 1 << 20,
        dev_id: 7,
        ublksrv_pid: 1234,
        flags: F_USER_COPY | 1 << 6,
    };
    let b = info.emit();
    assert_eq!(DevInfo::parse(&b), Some(info));
    assert_eq!(DevInfo::parse(&b[..63]), None);
    // A pid the kernel reports as -1 (no server) stays negative.
    let mut b = b;
    b[16..20].copy_from_slice(&(-1i32).to_ne_bytes());
    assert_eq!(DevInfo::parse(&b).map(|i| i.ublksrv_pid), Some(-1));
}

#[test]
fn params_carry_their_length_and_fields_where_the_driver_reads_them() {
    let p = Params {
        types: PARAM_TYPE_BASIC | PARAM_TYPE_DISCARD,
        attrs: ATTR_VOLATILE_CACHE,
        logical_bs_shift: 9,
        physical_bs_shift: 12,
        io_opt_shift: 12,
        io_min_shift: 12,
        max_sectors: 2048,
        dev_sectors: 1 << 21,
        discard_alignment: 0,
        discard_granularity: 4096,
        max_discard_sectors: 8192,
        max_write_zeroes_sectors: 4096,
        max_discard_segments: 1,
    };
    let b = p.emit();
    assert_eq!(&b[0..4], &64u32.to_ne_bytes());
    assert_eq!(&b[4..8], &3u32.to_ne_bytes());
    assert_eq!(&b[8..12], &4u32.to_ne_bytes());
    assert_eq!(&b[12..16], &[9, 12, 12, 12]);
    assert_eq!(&b[16..20], &2048u32.to_ne_bytes());
    assert_eq!(&b[24..32], &(1u64 << 21).to_ne_bytes());
    assert_eq!(&b[44..48], &4096u32.to_ne_bytes());
    assert_eq!(&b[48..52], &8192u32.to_ne_bytes());
    assert_eq!(&b[52..56], &4096u32.to_ne_bytes());
    assert_eq!(&b[56..58], &1u16.to_ne_bytes());
}

#[test]
fn a_descriptor_decodes_from_captured_bytes() {
    // A WRITE with FUA of 8 sectors at sector 2048, as the driver fills it.
    let mut raw = [0u8; IO_DESC_LEN];
    raw[0..4].copy_from_slice(&(1u32 | 1 << 13).to_ne_bytes());
    raw[4..8].copy_from_slice(&8u32.to_ne_bytes());
    raw[8..16].copy_from_slice(&2048u64.to_ne_bytes());
    let d = IoDesc::parse(&raw);
    assert_eq!(d.op_flags & 0xff, 1);
    assert_eq!(d.nr_sectors, 8);
    assert_eq!(d.start_sector, 2048);
}

#[test]
fn offsets_of_descriptors_and_user_copy() {
    assert_eq!(descriptors_offset(0, 4096), 0);
    // 4096 descriptors of 24 bytes: 96 KiB a queue.
    assert_eq!(descriptors_offset(2, 4096), 2 * 98304);
    assert_eq!(descriptors_len(64, 4096), 4096);
    assert_eq!(descriptors_len(200, 4096), 8192);
    assert_eq!(user_copy_offset(0, 0), 0x8000_0000);
    assert_eq!(user_copy_offset(1, 3), 0x8000_0000 + (1 << 41) + (3 << 25));
}

/// Every number and layout above against the kernel header installed on
/// this machine (linux-libc-dev: gcc's libc6-dev pulls it in), through a C
/// program: what an older header lacks (user copy, ioctl encodings came
/// with 6.4 and 6.5) is left out by `#ifdef`, and what it has must match.
#[test]
fn layouts_match_the_installed_kernel_header() {
    let header = std::path::Path::new("/usr/include/linux/ublk_cmd.h");
    if !header.exists()
        || std::process::Command::new("cc")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!(
            "no {} or no cc here: nothing to check against",
            header.display()
        );
        return;
    }
    let dir = tempdir();
    let source = dir.join("layout.c");
    std::fs::write(&source, C_PROGRAM).unwrap();
    let binary = dir.join("layout");
    let built = std::process::Command::new("cc")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = std::process::Command::new(&binary).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let ours = our_values();
    let mut checked = 0;
    for line in text.lines() {
        let (name, value) = line.split_once(' ').unwrap();
        let value: u64 = value.parse().unwrap();
        let expected = ours
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("the C program printed {name}, which we do not define"));
        assert_eq!(
            expected.1, value,
            "{name}: ours {} header {value}",
            expected.1
        );
        checked += 1;
    }
    // Linux 6.1's header alone has 30 of them.
    assert!(checked >= 30, "only {checked} values checked:\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ublk-uapi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn our_values() -> Vec<(&'static str, u64)> {
    let ctrl = |op| u64::from(Encoding::Ioctl.ctrl(op));
    let legacy = |op| u64::from(Encoding::Legacy.ctrl(op));
    vec![
        ("sizeof_ctrl_cmd", CTRL_CMD_LEN as u64),
        ("sizeof_io_cmd", IO_CMD_LEN as u64),
        ("sizeof_io_desc", IO_DESC_LEN as u64),
        ("sizeof_dev_info", DEV_INFO_LEN as u64),
        ("ctrl_dev_id", 0),
        ("ctrl_queue_id", 4),
        ("ctrl_len", 6),
        ("ctrl_addr", 8),
        ("ctrl_data", 16),
        ("io_q_id", 0),
        ("io_tag", 2),
        ("io_result", 4),
        ("io_addr", 8),
        ("desc_op_flags", 0),
        ("desc_nr_sectors", 4),
        ("desc_start_sector", 8),
        ("info_nr_hw_queues", 0),
        ("info_queue_depth", 2),
        ("info_state", 4),
        ("info_max_io_buf_bytes", 8),
        ("info_dev_id", 12),
        ("info_ublksrv_pid", 16),
        ("info_flags", 24),
        ("params_len", 0),
        ("params_types", 4),
        ("params_basic", 8),
        ("params_discard", 40),
        ("basic_attrs", 0),
        ("basic_logical_bs_shift", 4),
        ("basic_physical_bs_shift", 5),
        ("basic_io_opt_shift", 6),
        ("basic_io_min_shift", 7),
        ("basic_max_sectors", 8),
        ("basic_dev_sectors", 16),
        ("discard_alignment", 0),
        ("discard_granularity", 4),
        ("discard_max_sectors", 8),
        ("discard_max_write_zeroes", 12),
        ("discard_max_segments", 16),
        // `basic` and `discard` end at byte 60: inside the PARAMS_LEN we send.
        ("sizeof_basic_and_discard", 60u64.min(PARAMS_LEN as u64)),
        ("legacy_get_dev_info", legacy(CtrlOp::GetDevInfo)),
        ("legacy_add_dev", legacy(CtrlOp::AddDev)),
        ("legacy_del_dev", legacy(CtrlOp::DelDev)),
        ("legacy_start_dev", legacy(CtrlOp::StartDev)),
        ("legacy_stop_dev", legacy(CtrlOp::StopDev)),
        ("legacy_set_params", legacy(CtrlOp::SetParams)),
        ("legacy_fetch", u64::from(Encoding::Legacy.io(IoOp::Fetch))),
        (
            "legacy_commit",
            u64::from(Encoding::Legacy.io(IoOp::CommitAndFetch)),
        ),
        ("u_get_dev_info", ctrl(CtrlOp::GetDevInfo)),
        ("u_add_dev", ctrl(CtrlOp::AddDev)),
        ("u_del_dev", ctrl(CtrlOp::DelDev)),
        ("u_start_dev", ctrl(CtrlOp::StartDev)),
        ("u_stop_dev", ctrl(CtrlOp::StopDev)),
        ("u_set_params", ctrl(CtrlOp::SetParams)),
        ("u_get_features", ctrl(CtrlOp::GetFeatures)),
        ("u_fetch", u64::from(Encoding::Ioctl.io(IoOp::Fetch))),
        (
            "u_commit",
            u64::from(Encoding::Ioctl.io(IoOp::CommitAndFetch)),
        ),
        ("res_abort", IO_RES_ABORT as i64 as u64),
        ("max_queue_depth", u64::from(MAX_QUEUE_DEPTH)),
        ("cmd_buf_offset", CMD_BUF_OFFSET),
        ("io_buf_offset", IO_BUF_OFFSET),
        ("tag_off", u64::from(TAG_OFF)),
        ("qid_off", u64::from(QID_OFF)),
        ("f_user_copy", F_USER_COPY),
        ("param_type_basic", u64::from(PARAM_TYPE_BASIC)),
        ("param_type_discard", u64::from(PARAM_TYPE_DISCARD)),
        ("attr_read_only", u64::from(ATTR_READ_ONLY)),
        ("attr_volatile_cache", u64::from(ATTR_VOLATILE_CACHE)),
        ("attr_fua", u64::from(ATTR_FUA)),
        ("features_len", FEATURES_LEN as u64),
    ]
}

const C_PROGRAM: &str = r#"
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <linux/ublk_cmd.h>
#define V(name, value) printf("%s %llu\n", name, (unsigned long long)(value))
int main(void) {
    V("sizeof_ctrl_cmd", sizeof(struct ublksrv_ctrl_cmd));
    V("sizeof_io_cmd", sizeof(struct ublksrv_io_cmd));
    V("sizeof_io_desc", sizeof(struct ublksrv_io_desc));
    V("sizeof_dev_info", sizeof(struct ublksrv_ctrl_dev_info));
    V("ctrl_dev_id", offsetof(struct ublksrv_ctrl_cmd, dev_id));
    V("ctrl_queue_id", offsetof(struct ublksrv_ctrl_cmd, queue_id));
    V("ctrl_len", offsetof(struct ublksrv_ctrl_cmd, len));
    V("ctrl_addr", offsetof(struct ublksrv_ctrl_cmd, addr));
    V("ctrl_data", offsetof(struct ublksrv_ctrl_cmd, data));
    V("io_q_id", offsetof(struct ublksrv_io_cmd, q_id));
    V("io_tag", offsetof(struct ublksrv_io_cmd, tag));
    V("io_result", offsetof(struct ublksrv_io_cmd, result));
    V("io_addr", offsetof(struct ublksrv_io_cmd, addr));
    V("desc_op_flags", offsetof(struct ublksrv_io_desc, op_flags));
    V("desc_nr_sectors", offsetof(struct ublksrv_io_desc, nr_sectors));
    V("desc_start_sector", offsetof(struct ublksrv_io_desc, start_sector));
    V("info_nr_hw_queues", offsetof(struct ublksrv_ctrl_dev_info, nr_hw_queues));
    V("info_queue_depth", offsetof(struct ublksrv_ctrl_dev_info, queue_depth));
    V("info_state", offsetof(struct ublksrv_ctrl_dev_info, state));
    V("info_max_io_buf_bytes", offsetof(struct ublksrv_ctrl_dev_info, max_io_buf_bytes));
    V("info_dev_id", offsetof(struct ublksrv_ctrl_dev_info, dev_id));
    V("info_ublksrv_pid", offsetof(struct ublksrv_ctrl_dev_info, ublksrv_pid));
    V("info_flags", offsetof(struct ublksrv_ctrl_dev_info, flags));
    V("params_len", offsetof(struct ublk_params, len));
    V("params_types", offsetof(struct ublk_params, types));
    V("params_basic", offsetof(struct ublk_params, basic));
    V("params_discard", offsetof(struct ublk_params, discard));
    V("basic_attrs", offsetof(struct ublk_param_basic, attrs));
    V("basic_logical_bs_shift", offsetof(struct ublk_param_basic, logical_bs_shift));
    V("basic_physical_bs_shift", offsetof(struct ublk_param_basic, physical_bs_shift));
    V("basic_io_opt_shift", offsetof(struct ublk_param_basic, io_opt_shift));
    V("basic_io_min_shift", offsetof(struct ublk_param_basic, io_min_shift));
    V("basic_max_sectors", offsetof(struct ublk_param_basic, max_sectors));
    V("basic_dev_sectors", offsetof(struct ublk_param_basic, dev_sectors));
    V("discard_alignment", offsetof(struct ublk_param_discard, discard_alignment));
    V("discard_granularity", offsetof(struct ublk_param_discard, discard_granularity));
    V("discard_max_sectors", offsetof(struct ublk_param_discard, max_discard_sectors));
    V("discard_max_write_zeroes", offsetof(struct ublk_param_discard, max_write_zeroes_sectors));
    V("discard_max_segments", offsetof(struct ublk_param_discard, max_discard_segments));
    V("sizeof_basic_and_discard", offsetof(struct ublk_params, discard) + sizeof(struct ublk_param_discard));
    V("legacy_get_dev_info", UBLK_CMD_GET_DEV_INFO);
    V("legacy_add_dev", UBLK_CMD_ADD_DEV);
    V("legacy_del_dev", UBLK_CMD_DEL_DEV);
    V("legacy_start_dev", UBLK_CMD_START_DEV);
    V("legacy_stop_dev", UBLK_CMD_STOP_DEV);
    V("legacy_set_params", UBLK_CMD_SET_PARAMS);
    V("legacy_fetch", UBLK_IO_FETCH_REQ);
    V("legacy_commit", UBLK_IO_COMMIT_AND_FETCH_REQ);
#ifdef UBLK_U_CMD_ADD_DEV
    V("u_get_dev_info", UBLK_U_CMD_GET_DEV_INFO);
    V("u_add_dev", UBLK_U_CMD_ADD_DEV);
    V("u_del_dev", UBLK_U_CMD_DEL_DEV);
    V("u_start_dev", UBLK_U_CMD_START_DEV);
    V("u_stop_dev", UBLK_U_CMD_STOP_DEV);
    V("u_set_params", UBLK_U_CMD_SET_PARAMS);
    V("u_fetch", UBLK_U_IO_FETCH_REQ);
    V("u_commit", UBLK_U_IO_COMMIT_AND_FETCH_REQ);
#endif
#ifdef UBLK_U_CMD_GET_FEATURES
    V("u_get_features", UBLK_U_CMD_GET_FEATURES);
    V("features_len", UBLK_FEATURES_LEN);
#endif
    V("res_abort", (long long)UBLK_IO_RES_ABORT);
    V("max_queue_depth", UBLK_MAX_QUEUE_DEPTH);
    V("cmd_buf_offset", UBLKSRV_CMD_BUF_OFFSET);
    V("io_buf_offset", UBLKSRV_IO_BUF_OFFSET);
#ifdef UBLK_QID_OFF
    V("tag_off", UBLK_TAG_OFF);
    V("qid_off", UBLK_QID_OFF);
#endif
#ifdef UBLK_F_USER_COPY
    V("f_user_copy", UBLK_F_USER_COPY);
#endif
    V("param_type_basic", UBLK_PARAM_TYPE_BASIC);
    V("param_type_discard", UBLK_PARAM_TYPE_DISCARD);
    V("attr_read_only", UBLK_ATTR_READ_ONLY);
    V("attr_volatile_cache", UBLK_ATTR_VOLATILE_CACHE);
    V("attr_fua", UBLK_ATTR_FUA);
    return 0;
}
"#;
