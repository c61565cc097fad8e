//! An iSER message (the payload of an RDMA Send) on arbitrary bytes: the
//! iSER header, then the iSCSI header and data segment it carries. No
//! panic; what parses as a control-type PDU has its data inside the
//! message, and its iSER header re-emits to the same bytes (reserved bits
//! aside). Immediate data counted but not carried is accepted only on a
//! write with a Write STag (libiscsi 1.19's shape), as no immediate data.
#![no_main]

use iscsi_datamover::iser::{IserHeader, Message, parse_message};
use iscsi_proto::pdu::Pdu;
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
    if let Message::Control {
        header,
        write,
        data: range,
        unsent_immediate,
        ..
    } = message
    {
        assert!(range.end <= data.len());
        assert_eq!(range.len(), header.data_segment_length as usize);
        assert!(header.data_segment_length <= 8192);
        if unsent_immediate > 0 {
            // Only a write whose Write STag holds all of it, taken as one
            // without immediate data, and whose message ends with the header.
            let Pdu::ScsiCommand(command) = &header.pdu else {
                panic!("unsent immediate data on {:?}", header.pdu);
            };
            assert!(command.write && write.is_some());
            assert!(unsent_immediate <= command.expected_data_transfer_length);
            assert_eq!(header.data_segment_length, 0);
            assert_eq!(range.end, data.len());
        }
    }
    if let Ok(iser) = IserHeader::parse(data) {
        assert_eq!(IserHeader::parse(&iser.emit()), Ok(iser));
    }
});
