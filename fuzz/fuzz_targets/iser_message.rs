//! An iSER message (the payload of an RDMA Send) on arbitrary bytes: the
//! iSER header, then the iSCSI header and data segment it carries. No
//! panic; what parses as a control-type PDU has its data inside the
//! message, and its iSER header re-emits to the same bytes (reserved bits
//! aside).
#![no_main]

use iscsi_datamover::iser::{IserHeader, Message, parse_message};
use iscsi_proto::pdu::decoder::DecoderConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let config = DecoderConfig {
        max_recv_data_segment_length: 8192,
        ..DecoderConfig::default()
    };
    let Ok(message) = parse_message(data, config) else {
        return;
    };
    if let Message::Control { header, data: range, .. } = message {
        assert!(range.end <= data.len());
        assert_eq!(range.len(), header.data_segment_length as usize);
        assert!(header.data_segment_length <= 8192);
    }
    if let Ok(iser) = IserHeader::parse(data) {
        assert_eq!(IserHeader::parse(&iser.emit()), Ok(iser));
    }
});
