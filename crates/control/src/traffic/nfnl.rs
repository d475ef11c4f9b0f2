//! twill's netfilter netlink socket (NETLINK_NETFILTER): nf_tables transactions, reads and the
//! ruleset's generation, without the nft program.
//!
//! A transaction is one batch (`NFNL_MSG_BATCH_BEGIN`, the operations, `NFNL_MSG_BATCH_END`) in
//! one datagram: the kernel applies all of it or none of it, as `nft -f` does. Every operation
//! asks for an acknowledgement, so each one's errno comes back with its sequence number and an
//! error names the operation.
//!
//! The socket is blocking with a receive timeout and used from tokio's blocking pool
//! ([`Nftables::run`]): the kernel answers within the send for a transaction and within
//! microseconds for a read, and the timeout bounds a kernel that does not.

use super::failure::Failure;
use super::nftables::encode::Op;
use super::ruleset::Family;
use netlink_packet_core::{
    DoneBuffer, DoneMessage, ErrorBuffer, ErrorMessage, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NlasIterator, Parseable, NLMSG_DONE, NLMSG_ERROR, NLM_F_ACK,
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_netfilter::nftables::{GenMessage, NfTablesMessage};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use std::io;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// `NFNL_SUBSYS_NFTABLES`: the batch markers name the subsystem the batch is for.
const NFTABLES_SUBSYSTEM: u16 = 10;
/// Length of `struct nfgenmsg`, ahead of every nf_tables message's attributes.
pub const NFGENMSG_LEN: usize = 4;
/// Long enough for any answer the kernel gives in one datagram (dumps come in ≤ 32 KiB parts).
const RECEIVE_BUFFER: usize = 64 * 1024;
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A message the kernel sent in answer to a read: its nf_tables type (`NFT_MSG_NEW*`) and its
/// attributes, past the `nfgenmsg` header.
#[derive(Debug)]
pub struct Answer {
    pub kind: u8,
    pub attributes: Vec<u8>,
}

/// The socket, shared by the keeper and the shutdown path; one exchange at a time.
#[derive(Clone)]
pub struct Nftables(Arc<Mutex<Conn>>);

impl Nftables {
    /// Opens the socket in the network namespace of the calling thread.
    pub fn open() -> Result<Nftables, Failure> {
        Ok(Nftables(Arc::new(Mutex::new(Conn::open()?))))
    }

    /// Runs `f` on the socket in tokio's blocking pool.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Conn) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, Failure> {
        let conn = self.0.clone();
        let task = tokio::task::spawn_blocking(move || {
            // A panic elsewhere cannot leave the socket half-used: each exchange starts afresh.
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn)
        });
        task.await
            .map_err(|e| Failure::Io(io::Error::other(e.to_string())))?
    }
}

pub struct Conn {
    socket: Socket,
    /// The last sequence number used; answers to earlier exchanges are told apart by it.
    seq: u32,
    buf: Vec<u8>,
}

/// What one received message says about the exchange.
enum Reply<'a> {
    Ack,
    Error(io::Error),
    /// The end of a dump.
    Done,
    Data {
        flags: u16,
        kind: u16,
        payload: &'a [u8],
    },
}

impl Conn {
    fn open() -> Result<Conn, Failure> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(Failure::Socket)?;
        socket.bind_auto().map_err(Failure::Socket)?;
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as _, 0);
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| Failure::Socket(e.into()))?;
        Ok(Conn {
            socket,
            seq: 0,
            buf: Vec::with_capacity(RECEIVE_BUFFER),
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq += 1;
        self.seq
    }

    /// Starts numbering afresh if `count` more sequence numbers would not fit, so the numbers
    /// of one exchange always ascend (after some 4 billion, decades of resyncs).
    fn reserve(&mut self, count: usize) {
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        if self.seq.checked_add(count).is_none() {
            self.seq = 0;
        }
    }

    /// Applies `ops` as one transaction; the first refusal, naming its operation.
    pub fn transact(&mut self, ops: &[Op]) -> Result<(), Failure> {
        self.reserve(ops.len() + 2);
        let begin = self.next_seq();
        let mut datagram = control(ControlMessage::BatchBegin, begin);
        for op in ops {
            let seq = self.next_seq();
            datagram.extend(serialize(op.family, op.message.clone(), op.flags, seq));
        }
        let end = self.next_seq();
        datagram.extend(control(ControlMessage::BatchEnd, end));
        self.send(&datagram)?;

        let last_op = end - 1;
        let mut refusal = None;
        self.receive(begin..=end, |seq, reply| match reply {
            Reply::Error(error) => {
                // The batch markers' errors concern the whole transaction (e.g. its commit).
                let what = match seq.checked_sub(begin + 1).and_then(|i| ops.get(i as usize)) {
                    Some(op) => op.what.clone(),
                    None => "the transaction".into(),
                };
                refusal.get_or_insert(Failure::Refused { what, error });
                Ok(seq == last_op || seq == begin || seq == end)
            }
            Reply::Ack => Ok(seq == last_op),
            _ => Ok(false),
        })?;
        refusal.map_or(Ok(()), Err)
    }

    /// Sends one read request about `family`'s objects (`what` names it for errors) and
    /// collects the answers; a dump if `dump`. `None` when the kernel answers ENOENT: no such
    /// object.
    pub fn read(
        &mut self,
        family: Family,
        message: NfTablesMessage,
        dump: bool,
        what: &str,
    ) -> Result<Option<Vec<Answer>>, Failure> {
        // A dump interrupted by a concurrent change (of any table) is consistent only if read
        // again; after three tries the last is used, and at worst looks like a change.
        let mut tries = 1;
        loop {
            let (answers, interrupted) = self.read_once(family, message.clone(), dump, what)?;
            if !interrupted || tries == 3 {
                return Ok(answers);
            }
            tries += 1;
        }
    }

    /// The generation of this namespace's nf_tables ruleset (`NFT_MSG_GETGEN`): the kernel
    /// counts every committed transaction, of any table and any program (nft, iptables-nft,
    /// twill), so an unchanged number means nothing in nf_tables changed.
    pub fn generation(&mut self) -> Result<u32, Failure> {
        const NFTA_GEN_ID: u16 = 1;
        let request = NfTablesMessage::GetGen(GenMessage { attributes: vec![] });
        let answers = self.read(Family::Ipv4, request, false, "get the ruleset's generation")?;
        let id = answers.into_iter().flatten().find_map(|answer| {
            NlasIterator::new(&answer.attributes[..])
                .flatten()
                .find(|nla| nla.kind() == NFTA_GEN_ID)
                .and_then(|nla| Some(u32::from_be_bytes(nla.value().try_into().ok()?)))
        });
        id.ok_or_else(|| Failure::Garbled("a generation answer without NFTA_GEN_ID".into()))
    }

    fn read_once(
        &mut self,
        family: Family,
        message: NfTablesMessage,
        dump: bool,
        what: &str,
    ) -> Result<(Option<Vec<Answer>>, bool), Failure> {
        self.reserve(1);
        let seq = self.next_seq();
        let flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
        self.send(&serialize(family, message, flags, seq))?;
        let (mut answers, mut interrupted, mut missing) = (Vec::new(), false, false);
        let mut refusal = None;
        self.receive(seq..=seq, |_, reply| {
            match reply {
                Reply::Data {
                    flags,
                    kind,
                    payload,
                } => {
                    interrupted |= flags & NLM_F_DUMP_INTR != 0;
                    answers.push(answer(kind, payload)?);
                    return Ok(false);
                }
                Reply::Error(e) if e.raw_os_error() == Some(libc::ENOENT) => missing = true,
                Reply::Error(error) => {
                    refusal = Some(Failure::Refused {
                        what: what.into(),
                        error,
                    })
                }
                Reply::Ack | Reply::Done => {}
            }
            Ok(true)
        })?;
        if let Some(failure) = refusal {
            return Err(failure);
        }
        Ok(((!missing).then_some(answers), interrupted))
    }

    fn send(&mut self, datagram: &[u8]) -> Result<(), Failure> {
        let sent = self.socket.send(datagram, 0).map_err(Failure::Io)?;
        if sent != datagram.len() {
            return Err(Failure::Io(io::Error::other("a short send")));
        }
        Ok(())
    }

    /// Receives until `each` says the exchange is over, passing it every message whose
    /// sequence number is in `seqs`; answers to an earlier exchange (one that timed out) are
    /// dropped.
    fn receive(
        &mut self,
        seqs: RangeInclusive<u32>,
        mut each: impl FnMut(u32, Reply) -> Result<bool, Failure>,
    ) -> Result<(), Failure> {
        loop {
            self.buf.clear();
            let len = self.socket.recv(&mut self.buf, 0).map_err(Failure::Io)?;
            if len > self.buf.len() {
                return Err(Failure::Garbled(format!("a {len}-byte answer")));
            }
            let mut rest = &self.buf[..];
            while !rest.is_empty() {
                let message = NetlinkBuffer::new_checked(rest).map_err(garbled)?;
                let next = (message.length() as usize + 3) & !3;
                let seq = message.sequence_number();
                if seqs.contains(&seq) && each(seq, reply(&message)?)? {
                    return Ok(());
                }
                rest = rest.get(next..).unwrap_or_default();
            }
        }
    }
}

fn reply<'a>(message: &NetlinkBuffer<&'a [u8]>) -> Result<Reply<'a>, Failure> {
    let payload = message.payload();
    Ok(match message.message_type() {
        NLMSG_ERROR => {
            let error = ErrorMessage::parse(&ErrorBuffer::new_checked(&payload).map_err(garbled)?)
                .map_err(garbled)?;
            match error.code {
                None => Reply::Ack,
                Some(_) => Reply::Error(error.to_io()),
            }
        }
        NLMSG_DONE => {
            let done = DoneMessage::parse(&DoneBuffer::new_checked(&payload).map_err(garbled)?)
                .map_err(garbled)?;
            match done.code {
                code if code < 0 => Reply::Error(io::Error::from_raw_os_error(-code)),
                _ => Reply::Done,
            }
        }
        kind => Reply::Data {
            flags: message.flags(),
            kind,
            payload,
        },
    })
}

/// An nf_tables message's type is `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_*`.
fn answer(kind: u16, payload: &[u8]) -> Result<Answer, Failure> {
    if kind >> 8 != NFTABLES_SUBSYSTEM || payload.len() < NFGENMSG_LEN {
        return Err(Failure::Garbled(format!("a message of type {kind:#06x}")));
    }
    Ok(Answer {
        kind: kind as u8,
        attributes: payload[NFGENMSG_LEN..].to_vec(),
    })
}

fn garbled(e: impl std::fmt::Display) -> Failure {
    Failure::Garbled(e.to_string())
}

/// An nf_tables message about `family`'s tables (`ip` or `ip6`), ready to send.
fn serialize(family: Family, message: NfTablesMessage, flags: u16, seq: u32) -> Vec<u8> {
    let family = match family {
        Family::Ipv4 => NetfilterProtoFamily::IPv4,
        Family::Ipv6 => NetfilterProtoFamily::IPv6,
    };
    let header = NetfilterHeader::new(family, 0, 0);
    encode(NetfilterMessage::new(header, message), flags, seq)
}

/// A batch marker: family unspecified, the subsystem in `res_id`.
fn control(marker: ControlMessage, seq: u32) -> Vec<u8> {
    let header = NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFTABLES_SUBSYSTEM);
    let message = NetfilterMessage::new(header, NetfilterMessageInner::None(marker));
    encode(message, NLM_F_REQUEST, seq)
}

fn encode(message: NetfilterMessage, flags: u16, seq: u32) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_markers_name_the_nftables_subsystem() {
        // libnftnl's batch begin: type 0x10, NLM_F_REQUEST, nfgenmsg {AF_UNSPEC, 0, htons(10)}.
        let begin = control(ControlMessage::BatchBegin, 7);
        assert_eq!(
            begin,
            [20, 0, 0, 0, 0x10, 0, 1, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10]
        );
        assert_eq!(control(ControlMessage::BatchEnd, 8)[4], 0x11);
    }
}
