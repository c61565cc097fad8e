-- iser-iwarp.lua: iSER (RFC 7145) over iWARP (MPA/DDP/RDMAP over TCP) for Wireshark/tshark.
--
-- What it does
--   Stock Wireshark (4.0) decodes MPA, DDP and RDMAP, and has an iSER dissector, but that one
--   only hangs off InfiniBand: over iWARP the payload of every RDMA Send shows as "Data". This
--   script registers a heuristic on the `iwarp_ddp_rdmap` table for untagged Sends (RDMAP
--   opcodes Send, Send with Invalidate, Send with SE, Send with SE and Invalidate; DDP queue 0)
--   whose payload starts with an iSER header, and
--     - decodes the 28-byte iSER header: flags (opcode nibble 0x1 iSCSI control-type PDU,
--       0x2 Hello, 0x3 HelloReply; WSV 0x08, RSV 0x04; REJ 0x01 in a HelloReply), 3 reserved
--       bytes, Write STag + Write Base Offset, Read STag + Read Base Offset (big-endian);
--     - decodes Hello (MaxVer/MinVer, iSER-IRD) and HelloReply (REJ, MaxVer/CurVer, iSER-ORD);
--     - hands the bytes after the header to tshark's own `iscsi` dissector (BHS, text keys, CDB).
--   Fields: iser_iwarp (the protocol), iser.flags, iser.flags.opcode, iser.flags.wsv,
--   iser.flags.rsv, iser.flags.rej, iser.write_stag, iser.write_base_offset, iser.read_stag,
--   iser.read_base_offset, iser.hello.maxver, iser.hello.minver, iser.hello.curver, iser.ird,
--   iser.ord, iser.continuation. The names that stock packet-iser.c also has (iser.flags...,
--   iser.*_stag, iser.*_base_offset, iser.ird, iser.ord) are the same names with the same
--   types, so one display filter works for iSER over InfiniBand and over iWARP.
--
-- How to use it
--   tshark -X lua_script:tools/wireshark/iser-iwarp.lua -r capture.pcapng -Y iser_iwarp
--   tshark -X lua_script:tools/wireshark/iser-iwarp.lua -r capture.pcapng -V
--   tshark -X lua_script:tools/wireshark/iser-iwarp.lua -r capture.pcapng -Y iser.flags \
--       -T fields -e frame.number -e iwarp_rdma.opcode -e iser.flags -e iscsi.opcode -e scsi.sbc.opcode
--   Wireshark: copy or link it into the personal Lua plugins folder (Help > About > Folders),
--   or start `wireshark -X lua_script:tools/wireshark/iser-iwarp.lua`.
--   The capture must contain the connection's MPA Request/Reply: stock Wireshark finds MPA only
--   by those start-up frames (its `tcp` heuristic keys on "MPA ID Req Frame"), there is no
--   Decode As for it. Avoid ports that have a port dissector of their own (7000 is AFS, which
--   wins over the heuristic); an unassigned port or 3260 work, or add
--   `-o tcp.try_heuristic_first:TRUE`.
--
-- Multi-segment Sends (an iSCSI PDU split over several DDP segments, e.g. Linux siw limits an
-- FPDU to one MSS): stock iwarp_ddp_rdmap reassembles Send messages itself (preference
-- iwarp_ddp_rdmap.reassemble_iwarp_rdma_send, on by default) and calls this heuristic once, on
-- the last segment, with the whole message; this script then decodes the whole PDU. With that
-- preference off, each segment comes on its own: the first one (MO 0) is decoded as far as it
-- goes, and a continuation segment (MO != 0) is never taken for an iSER header: when its message
-- started as iSER it is shown as "iSER continuation" (field iser.continuation = its MO).
--
-- Limits
--   - Only what iWARP carries in Sends is decoded. RDMA Writes (Data-In), RDMA Read Requests and
--     Read Responses (Data-Out) stay as stock RDMAP shows them; nothing ties their STag/TO back
--     to the SCSI command that advertised it (compare iser.read_stag with iwarp_ddp.stag).
--   - The iscsi dissector is called per PDU without TCP desegmentation; iSCSI-level request/
--     response matching works as far as it keys on conversation and ITT.
--   - MPA markers are not handled by stock Wireshark's stream reassembly either; the peers
--     this was written for (our stack, Linux siw) never use them.
--   - The heuristic is narrow on purpose (Send opcodes, QN 0, flags byte with a known opcode
--     nibble, reserved bits/bytes zero, a plausible iSCSI opcode after the header), so SMB Direct
--     and RPC-over-RDMA Sends keep their own dissectors.
--
-- Written for the iscsi-rs project (tests/scripts/iser-capture checks it against a generated
-- capture and, once the stack speaks iSER, against a real one).

local iser = Proto("iser_iwarp", "iSCSI Extensions for RDMA (over iWARP)")

local opcodes = { [1] = "iSCSI control-type PDU", [2] = "Hello", [3] = "HelloReply" }

local f = {
    flags = ProtoField.uint8("iser.flags", "Flags", base.HEX),
    opcode = ProtoField.uint8("iser.flags.opcode", "Opcode", base.HEX, opcodes, 0xF0),
    wsv = ProtoField.bool("iser.flags.wsv", "Write STag Valid (WSV)", 8, nil, 0x08),
    rsv = ProtoField.bool("iser.flags.rsv", "Read STag Valid (RSV)", 8, nil, 0x04),
    rej = ProtoField.bool("iser.flags.rej", "Reject (REJ)", 8, nil, 0x01),
    reserved = ProtoField.bytes("iser.reserved", "Reserved"),
    write_stag = ProtoField.uint32("iser.write_stag", "Write STag", base.HEX),
    write_to = ProtoField.uint64("iser.write_base_offset", "Write Base Offset", base.HEX),
    read_stag = ProtoField.uint32("iser.read_stag", "Read STag", base.HEX),
    read_to = ProtoField.uint64("iser.read_base_offset", "Read Base Offset", base.HEX),
    maxver = ProtoField.uint8("iser.hello.maxver", "MaxVer", base.DEC, nil, 0xF0),
    minver = ProtoField.uint8("iser.hello.minver", "MinVer", base.DEC, nil, 0x0F),
    curver = ProtoField.uint8("iser.hello.curver", "CurVer", base.DEC, nil, 0x0F),
    ird = ProtoField.uint16("iser.ird", "iSER-IRD", base.DEC),
    ord = ProtoField.uint16("iser.ord", "iSER-ORD", base.DEC),
    continuation = ProtoField.uint32("iser.continuation", "iSER continuation segment, DDP MO", base.DEC),
}
iser.fields = f

local ef_short = ProtoExpert.new("iser.short", "Shorter than an iSER header + iSCSI BHS",
    expert.group.MALFORMED, expert.severity.ERROR)
local ef_reserved = ProtoExpert.new("iser.reserved_not_zero", "Reserved bits or bytes not zero",
    expert.group.PROTOCOL, expert.severity.WARN)
iser.experts = { ef_short, ef_reserved }

-- The DDP/RDMAP header of the segment being dissected: its fields are the last ones so far in the
-- frame (a TCP segment can hold several FPDUs; the heuristic runs right after each one's header).
local fx_opcode = Field.new("iwarp_rdma.opcode")
local fx_qn = Field.new("iwarp_ddp.qn")
local fx_mo = Field.new("iwarp_ddp.mo")
local fx_last = Field.new("iwarp_ddp.last_flag")
local fx_ulpdu_len = Field.new("iwarp_mpa.ulpdulength")

local function last(field)
    local all = { field() }
    local v = all[#all]
    return v and v.value
end

local SEND_OPCODES = { [3] = true, [4] = true, [5] = true, [6] = true }
local UNTAGGED_HEADER = 18 -- DDP/RDMAP untagged header, counted in the MPA ULPDU length
local ISER_HEADER = 28
local BHS = 48

-- iSCSI opcodes (RFC 7143 §11.1) an iSER Send can carry, initiator's and target's.
local ISCSI_OPCODES = {}
for _, op in ipairs({ 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10, 0x1c, 0x1d, 0x1e,
    0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31, 0x32, 0x3c, 0x3d, 0x3e, 0x3f }) do
    ISCSI_OPCODES[op] = true
end

local iscsi = Dissector.get("iscsi")

-- Messages whose first segment (MO 0, L 0) was iSER, so that their continuation segments can be
-- labelled when iwarp_ddp_rdmap does not reassemble: direction + MSN (QN 0) -> true.
local started = {}
function iser.init() started = {} end

local fx_msn = Field.new("iwarp_ddp.msn")
local function message_key(pinfo)
    return table.concat({ tostring(pinfo.src), pinfo.src_port, tostring(pinfo.dst), pinfo.dst_port,
        last(fx_msn) }, " ")
end

local function all_zero(tvb, offset, len)
    for i = offset, offset + len - 1 do
        if tvb(i, 1):uint() ~= 0 then return false end
    end
    return true
end

-- Is this payload (from MO 0) the start of an iSER message? Checked before anything is added.
local function looks_like_iser(tvb)
    local len = tvb:len()
    if len < 4 then return false end
    local flags = tvb(0, 1):uint()
    local op = bit.rshift(flags, 4)
    if op == 1 then
        return bit.band(flags, 0x03) == 0 and len >= ISER_HEADER + BHS and all_zero(tvb, 1, 3)
            and ISCSI_OPCODES[bit.band(tvb(ISER_HEADER, 1):uint(), 0x3f)] == true
    elseif op == 2 or op == 3 then
        -- Hello: only the opcode in byte 0; HelloReply may add REJ (0x01).
        local rest = bit.band(flags, 0x0F)
        return (rest == 0 or (op == 3 and rest == 0x01)) and len <= ISER_HEADER
            and all_zero(tvb, 4, len - 4)
    end
    return false
end

local function dissect_header(tvb, pinfo, tree)
    local flags = tvb(0, 1):uint()
    local op = bit.rshift(flags, 4)
    local hdr_len = math.min(ISER_HEADER, tvb:len())
    local item = tree:add(iser, tvb(0, hdr_len))
    local ft = item:add(f.flags, tvb(0, 1))
    ft:add(f.opcode, tvb(0, 1))
    if op == 1 then
        ft:add(f.wsv, tvb(0, 1))
        ft:add(f.rsv, tvb(0, 1))
        item:add(f.reserved, tvb(1, 3))
        item:add(f.write_stag, tvb(4, 4))
        item:add(f.write_to, tvb(8, 8))
        item:add(f.read_stag, tvb(16, 4))
        item:add(f.read_to, tvb(20, 8))
        local tags = {}
        if bit.band(flags, 0x08) ~= 0 then
            tags[#tags + 1] = string.format("WSV STag 0x%08x", tvb(4, 4):uint())
        end
        if bit.band(flags, 0x04) ~= 0 then
            tags[#tags + 1] = string.format("RSV STag 0x%08x", tvb(16, 4):uint())
        end
        item:append_text(tags[1] and (", " .. table.concat(tags, ", ")) or "")
    else
        local verbyte = tvb(1, 1)
        item:add(f.maxver, verbyte)
        if op == 2 then
            item:add(f.minver, verbyte)
            item:add(f.ird, tvb(2, 2))
            item:append_text(", Hello")
            pinfo.cols.info:append(" iSER Hello")
        else
            ft:add(f.rej, tvb(0, 1))
            item:add(f.curver, verbyte)
            item:add(f.ord, tvb(2, 2))
            item:append_text(", HelloReply")
            pinfo.cols.info:append(bit.band(flags, 1) ~= 0 and " iSER HelloReply (reject)" or " iSER HelloReply")
        end
        if hdr_len > 4 then item:add(f.reserved, tvb(4, hdr_len - 4)) end
    end
    return item, op
end

local function heuristic(tvb, pinfo, tree)
    local opcode = last(fx_opcode)
    if not SEND_OPCODES[opcode] or last(fx_qn) ~= 0 then return false end
    local mo = last(fx_mo) or 0
    local ulpdu_len = last(fx_ulpdu_len)
    local segment_len = ulpdu_len and (ulpdu_len - UNTAGGED_HEADER)
    -- The payload starts the message if this segment does (MO 0), or if iwarp_ddp_rdmap handed
    -- over its reassembly of the message (then the payload is MO + this segment's length long).
    local whole = mo == 0 or (segment_len ~= nil and tvb:len() == mo + segment_len)
    if not whole then return false end -- a continuation segment: see `continuation` below
    if not looks_like_iser(tvb) then return false end

    local item, op = dissect_header(tvb, pinfo, tree)
    if op == 1 then
        local rest = tvb(ISER_HEADER):tvb()
        local more = last(fx_last) == false and mo == 0
        if more then
            item:append_text(" (first DDP segment of a longer message)")
            started[message_key(pinfo)] = true
        end
        iscsi:call(rest, pinfo, tree)
    end
    pinfo.cols.protocol = "iSER"
    return true
end

iser:register_heuristic("iwarp_ddp_rdmap", heuristic)

-- Continuation segments when iwarp_ddp_rdmap does not reassemble: a second heuristic that labels
-- a Send segment with MO != 0, not a reassembled message, of a message that started as iSER.
local cont = Proto("iser_iwarp_cont", "iSER continuation segment (over iWARP)")
local function continuation(tvb, pinfo, tree)
    local opcode = last(fx_opcode)
    if not SEND_OPCODES[opcode] or last(fx_qn) ~= 0 then return false end
    local mo = last(fx_mo) or 0
    local ulpdu_len = last(fx_ulpdu_len)
    if mo == 0 or ulpdu_len == nil or tvb:len() ~= ulpdu_len - UNTAGGED_HEADER then return false end
    if not started[message_key(pinfo)] then return false end
    local item = tree:add(cont, tvb())
    item:add(f.continuation, mo):set_generated()
    item:append_text(string.format(", MO %d, %d bytes (not reassembled: the message starts in an earlier segment)", mo, tvb:len()))
    pinfo.cols.info:append(string.format(" [iSER continuation, MO %d]", mo))
    return true
end
cont:register_heuristic("iwarp_ddp_rdmap", continuation)
