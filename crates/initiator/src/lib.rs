//! The iSCSI initiator: an async client library over the sans-I/O protocol
//! core (`iscsi-proto`) and the TCP datamover (`iscsi-datamover`).
