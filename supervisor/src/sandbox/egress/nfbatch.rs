//! A turn's nftables ruleset as data, loaded as one nf_tables netlink
//! batch (issue 29: the cost of a `restricted` turn's setup).
//!
//! The ruleset was text for libnftables, which parsed and evaluated it,
//! fetched its cache from the kernel and built this same batch: ~0.5 ms of
//! its own work per load and ~1.3 ms more for the first load in a process
//! (every cold turn's), on the egress thread, beside the sandbox being
//! built on the other core (`unshare -n`, this 2-core host). Here each rule
//! is the expressions nft compiles it to, with its nft text kept beside
//! them: the text names a rule the kernel refused, and the tests load it
//! through `nft` to prove the kernel holds the same bytecode either way.
//! The batch is one `send` and one answer per message; the kernel
//! applies all of it or nothing.
//!
//! Only what the turn's ruleset uses is here: prefix matches on the
//! destination, `meta`, ports, `ct status`, verdicts,
//! `redirect`, `reject`, `dynset` add to a set with a counter per element,
//! and a named counter.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWOBJ: u16 = 18;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

// Attributes and values of <linux/netfilter/nf_tables.h>.
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_ACCEPT: i32 = 1;
const NFT_RETURN: i32 = -5;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_EXPR: u16 = 17;
const NFTA_SET_DESC_SIZE: u16 = 1;
const NFT_SET_EVAL: u32 = 0x20;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFT_OBJECT_COUNTER: u32 = 1;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
/// Registers: the verdict, the first 16-byte one, the second, and the
/// second 4-byte word (a concatenation's second field after an IPv4
/// address in the first).
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG_2: u32 = 2;
const REG32_01: u32 = 9;
/// Data types of a set key (nft's `ipv4_addr`, `ipv6_addr`,
/// `inet_service`), a concatenation's packed six bits apiece.
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
const TYPE_INET_SERVICE: u32 = 13;
/// `meta` keys.
pub const META_MARK: u32 = 3;
pub const META_NFPROTO: u32 = 15;
pub const META_L4PROTO: u32 = 16;
const PAYLOAD_NETWORK: u32 = 1;
const PAYLOAD_TRANSPORT: u32 = 2;
const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
const CMP_LTE: u32 = 3;
const CMP_GTE: u32 = 5;
const CT_STATUS: u32 = 2;
/// `IPS_DST_NAT` of the conntrack status.
const IPS_DST_NAT: u32 = 1 << 5;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`.
const NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
const REJECT_ICMP_UNREACH: u32 = 0;
const REJECT_TCP_RST: u32 = 1;
const REJECT_ICMPX_UNREACH: u32 = 2;
const ICMP_PORT_UNREACH: u8 = 3;
const ICMPV6_PORT_UNREACH: u8 = 4;
const ICMPX_PORT_UNREACH: u8 = 1;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

/// One expression, as nft compiles it. Each reads and writes register 1
/// but a key's second field (`Payload::dreg`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Meta(u32),
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    /// `reg1 = reg1 & mask`.
    Mask(Vec<u8>),
    Cmp(u32, Vec<u8>),
    CtStatus,
    Verdict(i32),
    /// `reg1 = port` (network order).
    Port(u16),
    /// A redirect to the port in register 1.
    Redirect,
    AddToSet(String),
    Reject(u32, u8),
    CounterRef(String),
}

/// A rule: its nft text (to name it, and for the tests) and its
/// expressions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub text: String,
    exprs: Vec<Expr>,
    /// The network protocol a match so far fixed (for `reject`'s type).
    family: Option<u8>,
}

impl Rule {
    pub fn new() -> Self {
        Self::default()
    }

    fn say(mut self, text: &str) -> Self {
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        self.text.push_str(text);
        self
    }

    /// The match on the network protocol a later match depends on (nft
    /// adds it the same way), once.
    fn family(mut self, v6: bool) -> Self {
        let f = if v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 };
        if self.family != Some(f) {
            self.exprs.push(Expr::Meta(META_NFPROTO));
            self.exprs.push(Expr::Cmp(CMP_EQ, vec![f]));
            self.family = Some(f);
        }
        self
    }

    /// The match on the transport protocol a later match depends on.
    fn transport(mut self, p: u8) -> Self {
        self.exprs.push(Expr::Meta(META_L4PROTO));
        self.exprs.push(Expr::Cmp(CMP_EQ, vec![p]));
        self
    }

    /// `meta nfproto ipv4|ipv6`.
    pub fn nfproto(self, v6: bool) -> Self {
        self.family(v6).say(if v6 {
            "meta nfproto ipv6"
        } else {
            "meta nfproto ipv4"
        })
    }

    /// `ip daddr NET/LEN` (`ip6 daddr`): a whole-byte prefix loads its
    /// bytes; any other, the whole address, masked.
    pub fn daddr(self, net: IpAddr, len: u8) -> Self {
        let (bytes, v6, offset, fam) = match net {
            IpAddr::V4(a) => (a.octets().to_vec(), false, 16, "ip"),
            IpAddr::V6(a) => (a.octets().to_vec(), true, 24, "ip6"),
        };
        let bits = bytes.len() * 8;
        let len = usize::from(len).min(bits);
        let text = if len == bits {
            format!("{fam} daddr {net}")
        } else {
            format!("{fam} daddr {net}/{len}")
        };
        let mut r = self.family(v6);
        if len > 0 {
            let load = if len % 8 == 0 { len / 8 } else { bytes.len() };
            let mut value = bytes[..load].to_vec();
            r.exprs.push(Expr::Payload {
                base: PAYLOAD_NETWORK,
                offset,
                len: load as u32,
                dreg: REG_1,
            });
            if len % 8 != 0 {
                let mask: Vec<u8> = (0..load)
                    .map(|i| match (i * 8).cmp(&(len - len % 8)) {
                        std::cmp::Ordering::Less => 0xff,
                        std::cmp::Ordering::Equal => 0xffu8 << (8 - len % 8),
                        std::cmp::Ordering::Greater => 0,
                    })
                    .collect();
                for (v, m) in value.iter_mut().zip(&mask) {
                    *v &= m;
                }
                r.exprs.push(Expr::Mask(mask));
            }
            r.exprs.push(Expr::Cmp(CMP_EQ, value));
        }
        r.say(&text)
    }

    /// `meta l4proto P`.
    pub fn l4proto(self, p: u8) -> Self {
        let name = match p {
            IPPROTO_ICMP => "icmp".to_owned(),
            IPPROTO_TCP => "tcp".to_owned(),
            IPPROTO_UDP => "udp".to_owned(),
            IPPROTO_ICMPV6 => "ipv6-icmp".to_owned(),
            other => other.to_string(),
        };
        self.transport(p).say(&format!("meta l4proto {name}"))
    }

    /// `tcp dport A[-B]` (`udp`).
    pub fn dport(self, proto: u8, ports: (u16, u16)) -> Self {
        let name = if proto == IPPROTO_UDP { "udp" } else { "tcp" };
        let mut r = self.transport(proto);
        r.exprs.push(Expr::Payload {
            base: PAYLOAD_TRANSPORT,
            offset: 2,
            len: 2,
            dreg: REG_1,
        });
        let (a, b) = ports;
        if a == b {
            r.exprs.push(Expr::Cmp(CMP_EQ, a.to_be_bytes().to_vec()));
            r.say(&format!("{name} dport {a}"))
        } else {
            // As nft does: two comparisons (network order compares as
            // bytes, most significant first).
            r.exprs.push(Expr::Cmp(CMP_GTE, a.to_be_bytes().to_vec()));
            r.exprs.push(Expr::Cmp(CMP_LTE, b.to_be_bytes().to_vec()));
            r.say(&format!("{name} dport {a}-{b}"))
        }
    }

    /// `meta mark M`.
    pub fn mark(mut self, m: u32) -> Self {
        self.exprs.push(Expr::Meta(META_MARK));
        self.exprs.push(Expr::Cmp(CMP_EQ, m.to_ne_bytes().to_vec()));
        self.say(&format!("meta mark {m:#x}"))
    }

    /// `ct status dnat`.
    pub fn ct_dnat(mut self) -> Self {
        self.exprs.push(Expr::CtStatus);
        self.exprs
            .push(Expr::Mask(IPS_DST_NAT.to_ne_bytes().to_vec()));
        self.exprs.push(Expr::Cmp(CMP_NEQ, vec![0; 4]));
        self.say("ct status dnat")
    }

    /// `tcp flags & (syn | ack) != syn`.
    pub fn not_a_first_syn(self) -> Self {
        let mut r = self.transport(IPPROTO_TCP);
        r.exprs.push(Expr::Payload {
            base: PAYLOAD_TRANSPORT,
            offset: 13,
            len: 1,
            dreg: REG_1,
        });
        r.exprs.push(Expr::Mask(vec![0x12]));
        r.exprs.push(Expr::Cmp(CMP_NEQ, vec![0x02]));
        r.say("tcp flags & (syn | ack) != syn")
    }

    pub fn accept(mut self) -> Self {
        self.exprs.push(Expr::Verdict(NF_ACCEPT));
        self.say("accept")
    }

    pub fn ret(mut self) -> Self {
        self.exprs.push(Expr::Verdict(NFT_RETURN));
        self.say("return")
    }

    pub fn redirect(mut self, port: u16) -> Self {
        self.exprs.push(Expr::Port(port));
        self.exprs.push(Expr::Redirect);
        self.say(&format!("redirect to :{port}"))
    }

    /// `add @SET { ip daddr . tcp dport }` (`ip6`, `udp`).
    pub fn add_flow(mut self, set: &str, v6: bool, proto: u8) -> Self {
        let (fam, offset, len, second) = if v6 {
            ("ip6", 24, 16, REG_2)
        } else {
            ("ip", 16, 4, REG32_01)
        };
        self.exprs.push(Expr::Payload {
            base: PAYLOAD_NETWORK,
            offset,
            len,
            dreg: REG_1,
        });
        self.exprs.push(Expr::Payload {
            base: PAYLOAD_TRANSPORT,
            offset: 2,
            len: 2,
            dreg: second,
        });
        self.exprs.push(Expr::AddToSet(set.to_owned()));
        let l4 = if proto == IPPROTO_UDP { "udp" } else { "tcp" };
        self.say(&format!("add @{set} {{ {fam} daddr . {l4} dport }}"))
    }

    /// `reject`: port unreachable in the ICMP of the rule's network
    /// protocol, ICMPX where no match fixed one (as nft chooses).
    pub fn reject(mut self) -> Self {
        let (ty, code) = match self.family {
            Some(NFPROTO_IPV4) => (REJECT_ICMP_UNREACH, ICMP_PORT_UNREACH),
            Some(NFPROTO_IPV6) => (REJECT_ICMP_UNREACH, ICMPV6_PORT_UNREACH),
            _ => (REJECT_ICMPX_UNREACH, ICMPX_PORT_UNREACH),
        };
        self.exprs.push(Expr::Reject(ty, code));
        self.say("reject")
    }

    /// `reject with tcp reset`.
    pub fn reset(mut self) -> Self {
        self.exprs.push(Expr::Reject(REJECT_TCP_RST, 0));
        self.say("reject with tcp reset")
    }

    /// `counter name C`.
    pub fn count(mut self, counter: &str) -> Self {
        self.exprs.push(Expr::CounterRef(counter.to_owned()));
        self.say(&format!("counter name {counter}"))
    }
}

/// A base chain on the output hook, policy accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    /// `nat` or `filter`.
    pub kind: &'static str,
    pub priority: i32,
    pub rules: Vec<Rule>,
}

/// A table of family `inet`: its sets of flows (a key of an address and a
/// port, added by the rules, a counter per element), named counters and
/// output chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub name: String,
    /// (name, IPv6 key, size).
    pub sets: Vec<(String, bool, u32)>,
    pub counters: Vec<String>,
    pub chains: Vec<Chain>,
}

impl Table {
    /// The table as nft text (what `nft -f` compiles to the same
    /// bytecode).
    pub fn text(&self) -> String {
        let mut s = format!("table inet {} {{\n", self.name);
        for (name, v6, size) in &self.sets {
            let ty = if *v6 { "ipv6_addr" } else { "ipv4_addr" };
            s += &format!(
                "  set {name} {{ type {ty} . inet_service; size {size}; flags dynamic; counter; }}\n"
            );
        }
        for c in &self.counters {
            s += &format!("  counter {c} {{ }}\n");
        }
        for c in &self.chains {
            s += &format!(
                "  chain {} {{\n    type {} hook output priority {}; policy accept;\n",
                c.name, c.kind, c.priority
            );
            for r in &c.rules {
                s += &format!("    {}\n", r.text);
            }
            s += "  }\n";
        }
        s + "}\n"
    }

    /// The batch creating the table, and per sequence number what the
    /// message makes (to name one the kernel refuses).
    fn batch(&self) -> (Vec<u8>, Vec<(u32, String)>) {
        let mut b = Vec::with_capacity(8192);
        let mut what: Vec<(u32, String)> = Vec::new();
        let mut next = |w: String| {
            let seq = what.len() as u32 + 1;
            what.push((seq, w));
            seq
        };
        let begin_end = |b: &mut Vec<u8>, ty: u16, seq: u32| {
            message_into(b, ty, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, |_| {});
        };
        begin_end(&mut b, NFNL_MSG_BATCH_BEGIN, 0);
        let create = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK;
        let new = |b: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, body: &dyn Fn(&mut Vec<u8>)| {
            message_into(b, nft(ty), flags, seq, NFPROTO_INET, 0, body);
        };
        let s = next(format!("table inet {}", self.name));
        new(&mut b, NFT_MSG_NEWTABLE, create, s, &|m| {
            put_str(m, NFTA_TABLE_NAME, &self.name);
            put_u32(m, NFTA_TABLE_FLAGS, 0);
        });
        for (i, (name, v6, size)) in self.sets.iter().enumerate() {
            let (addr, addr_len) = if *v6 {
                (TYPE_IP6ADDR, 16)
            } else {
                (TYPE_IPADDR, 4)
            };
            let s = next(format!("set {name}"));
            new(&mut b, NFT_MSG_NEWSET, create, s, &|m| {
                put_str(m, NFTA_SET_TABLE, &self.name);
                put_str(m, NFTA_SET_NAME, name);
                put_u32(m, NFTA_SET_FLAGS, NFT_SET_EVAL);
                put_u32(m, NFTA_SET_KEY_TYPE, (addr << 6) | TYPE_INET_SERVICE);
                // Each field of a concatenation takes whole 4-byte words.
                put_u32(m, NFTA_SET_KEY_LEN, addr_len + 4);
                put_u32(m, NFTA_SET_ID, i as u32 + 1);
                nest(m, NFTA_SET_DESC, |m| put_u32(m, NFTA_SET_DESC_SIZE, *size));
                nest(m, NFTA_SET_EXPR, |m| {
                    put_str(m, NFTA_EXPR_NAME, "counter");
                    nest(m, NFTA_EXPR_DATA, |_| {});
                });
            });
        }
        for c in &self.counters {
            let s = next(format!("counter {c}"));
            new(&mut b, NFT_MSG_NEWOBJ, create, s, &|m| {
                put_str(m, NFTA_OBJ_TABLE, &self.name);
                put_str(m, NFTA_OBJ_NAME, c);
                put_u32(m, NFTA_OBJ_TYPE, NFT_OBJECT_COUNTER);
                nest(m, NFTA_OBJ_DATA, |m| {
                    put(m, NFTA_COUNTER_BYTES, &0u64.to_be_bytes());
                    put(m, NFTA_COUNTER_PACKETS, &0u64.to_be_bytes());
                });
            });
        }
        for c in &self.chains {
            let s = next(format!("chain {}", c.name));
            new(&mut b, NFT_MSG_NEWCHAIN, create, s, &|m| {
                put_str(m, NFTA_CHAIN_TABLE, &self.name);
                put_str(m, NFTA_CHAIN_NAME, &c.name);
                nest(m, NFTA_CHAIN_HOOK, |m| {
                    put_u32(m, NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_OUT);
                    put_u32(m, NFTA_HOOK_PRIORITY, c.priority as u32);
                });
                put_u32(m, NFTA_CHAIN_POLICY, NF_ACCEPT as u32);
                put_str(m, NFTA_CHAIN_TYPE, c.kind);
            });
        }
        for c in &self.chains {
            for r in &c.rules {
                let s = next(format!("in chain {}: `{}`", c.name, r.text));
                new(&mut b, NFT_MSG_NEWRULE, create | NLM_F_APPEND, s, &|m| {
                    put_str(m, NFTA_RULE_TABLE, &self.name);
                    put_str(m, NFTA_RULE_CHAIN, &c.name);
                    nest(m, NFTA_RULE_EXPRESSIONS, |m| {
                        for e in &r.exprs {
                            nest(m, NFTA_LIST_ELEM, |m| self.expr(m, e));
                        }
                    });
                });
            }
        }
        begin_end(&mut b, NFNL_MSG_BATCH_END, what.len() as u32 + 1);
        (b, what)
    }

    /// One expression: its name and its data (attribute numbers of
    /// `enum nft_<name>_attributes`).
    fn expr(&self, m: &mut Vec<u8>, e: &Expr) {
        let data = |m: &mut Vec<u8>, ty: u16, v: &[u8]| {
            nest(m, ty, |m| put(m, NFTA_DATA_VALUE, v));
        };
        let named = |m: &mut Vec<u8>, name: &str, body: &dyn Fn(&mut Vec<u8>)| {
            put_str(m, NFTA_EXPR_NAME, name);
            nest(m, NFTA_EXPR_DATA, body);
        };
        match e {
            Expr::Meta(key) => named(m, "meta", &|m| {
                put_u32(m, 2, *key); // KEY
                put_u32(m, 1, REG_1); // DREG
            }),
            Expr::Payload {
                base,
                offset,
                len,
                dreg,
            } => named(m, "payload", &|m| {
                put_u32(m, 1, *dreg); // DREG
                put_u32(m, 2, *base); // BASE
                put_u32(m, 3, *offset); // OFFSET
                put_u32(m, 4, *len); // LEN
            }),
            Expr::Mask(mask) => named(m, "bitwise", &|m| {
                put_u32(m, 1, REG_1); // SREG
                put_u32(m, 2, REG_1); // DREG
                put_u32(m, 3, mask.len() as u32); // LEN
                data(m, 4, mask); // MASK
                data(m, 5, &vec![0; mask.len()]); // XOR
            }),
            Expr::Cmp(op, v) => named(m, "cmp", &|m| {
                put_u32(m, 1, REG_1); // SREG
                put_u32(m, 2, *op); // OP
                data(m, 3, v); // DATA
            }),
            Expr::CtStatus => named(m, "ct", &|m| {
                put_u32(m, 2, CT_STATUS); // KEY
                put_u32(m, 1, REG_1); // DREG
            }),
            Expr::Verdict(code) => named(m, "immediate", &|m| {
                put_u32(m, 1, REG_VERDICT); // DREG
                nest(m, 2, |m| {
                    // DATA
                    nest(m, NFTA_DATA_VERDICT, |m| {
                        put_u32(m, NFTA_VERDICT_CODE, *code as u32);
                    });
                });
            }),
            Expr::Port(port) => named(m, "immediate", &|m| {
                put_u32(m, 1, REG_1); // DREG
                data(m, 2, &port.to_be_bytes()); // DATA
            }),
            Expr::Redirect => named(m, "redir", &|m| {
                put_u32(m, 1, REG_1); // REG_PROTO_MIN
                put_u32(m, 3, NAT_RANGE_PROTO_SPECIFIED); // FLAGS
            }),
            Expr::AddToSet(set) => {
                let id = self
                    .sets
                    .iter()
                    .position(|(n, ..)| n == set)
                    .map_or(0, |i| i as u32 + 1);
                named(m, "dynset", &|m| {
                    put_str(m, 1, set); // SET_NAME
                    put_u32(m, 2, id); // SET_ID
                    put_u32(m, 3, 0); // OP: NFT_DYNSET_OP_ADD
                    put_u32(m, 4, REG_1); // SREG_KEY
                });
            }
            Expr::Reject(ty, code) => named(m, "reject", &|m| {
                put_u32(m, 1, *ty); // TYPE
                put(m, 2, &[*code]); // ICMP_CODE
            }),
            Expr::CounterRef(name) => named(m, "objref", &|m| {
                put_u32(m, 1, NFT_OBJECT_COUNTER); // IMM_TYPE
                put_str(m, 2, name); // IMM_NAME
            }),
        }
    }

    /// Loads the table through `sock` (a `NETLINK_NETFILTER` socket of the
    /// namespace it is for): all of it, or nothing and why.
    pub fn load(&self, sock: &OwnedFd) -> Result<(), String> {
        use nix::sys::socket::{MsgFlags, recv, send};
        let (batch, what) = self.batch();
        let fd = sock.as_raw_fd();
        let timeout = nix::sys::time::TimeVal::new(5, 0);
        nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| format!("nft: {e}"))?;
        // The kernel is the socket's default peer.
        let n = send(fd, &batch, MsgFlags::empty()).map_err(|e| format!("nft: {e}"))?;
        if n != batch.len() {
            return Err(format!("nft: sent {n} of {} bytes", batch.len()));
        }
        // One answer per message (each asks for one); the first refusal is
        // the one reported (the kernel applied nothing).
        let mut answered = std::collections::BTreeSet::new();
        let mut refused: Option<String> = None;
        let mut buf = vec![0u8; 64 * 1024];
        while answered.len() < what.len() {
            let n = match recv(fd, &mut buf, MsgFlags::empty()) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    return Err(format!(
                        "nft: waiting for the kernel's answers ({} of {}): {e}",
                        answered.len(),
                        what.len()
                    ));
                }
            };
            let mut rest = buf.get(..n).unwrap_or_default();
            while !rest.is_empty() {
                let (ty, seq, payload, next) = message(rest).map_err(|e| format!("nft: {e}"))?;
                rest = next;
                if ty != NLMSG_ERROR {
                    continue;
                }
                let errno = payload
                    .get(..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or("nft: a short answer")?;
                let Some((_, name)) = what.iter().find(|(s, _)| *s == seq) else {
                    // The batch itself (its begin or end).
                    if errno != 0 {
                        return Err(format!(
                            "nft: the kernel refused the batch: {}",
                            std::io::Error::from_raw_os_error(-errno)
                        ));
                    }
                    continue;
                };
                answered.insert(seq);
                if errno != 0 && refused.is_none() {
                    refused = Some(format!(
                        "nft: the kernel refused {name}: {}",
                        std::io::Error::from_raw_os_error(-errno)
                    ));
                }
            }
        }
        refused.map_or(Ok(()), Err)
    }
}

/// Opens a `NETLINK_NETFILTER` socket in the calling thread's network
/// namespace.
pub fn socket() -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType};
    nix::sys::socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(std::io::Error::from)
}

pub(super) fn nft(ty: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | ty
}

/// Appends one message: nlmsghdr, nfgenmsg, what `body` puts.
pub(super) fn message_into(
    b: &mut Vec<u8>,
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    body: impl FnOnce(&mut Vec<u8>),
) {
    let start = b.len();
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&ty.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.push(family);
    b.push(0); // NFNETLINK_V0
    b.extend_from_slice(&res_id.to_be_bytes());
    body(b);
    let len = (b.len() - start) as u32;
    b[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

fn put(m: &mut Vec<u8>, ty: u16, v: &[u8]) {
    m.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(v);
    m.resize(m.len().next_multiple_of(4), 0);
}

pub(super) fn put_u32(m: &mut Vec<u8>, ty: u16, v: u32) {
    put(m, ty, &v.to_be_bytes());
}

pub(super) fn put_str(m: &mut Vec<u8>, ty: u16, s: &str) {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    put(m, ty, &v);
}

/// A nested attribute holding what `body` puts.
fn nest(m: &mut Vec<u8>, ty: u16, body: impl FnOnce(&mut Vec<u8>)) {
    let start = m.len();
    m.extend_from_slice(&[0, 0]);
    m.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    body(m);
    let len = (m.len() - start) as u16;
    m[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// One netlink message: (type, sequence, payload, the bytes after it).
pub(super) type Message<'a> = (u16, u32, &'a [u8], &'a [u8]);

/// The first netlink message of `b`.
pub(super) fn message(b: &[u8]) -> Result<Message<'_>, String> {
    let h = b.get(..16).ok_or("a short netlink header")?;
    let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let ty = u16::from_ne_bytes([h[4], h[5]]);
    let seq = u32::from_ne_bytes([h[8], h[9], h[10], h[11]]);
    if len < 16 {
        return Err(format!("a netlink message of {len} bytes"));
    }
    let payload = b.get(16..len).ok_or("a truncated netlink message")?;
    let rest = b.get(len.next_multiple_of(4)..).unwrap_or_default();
    Ok((ty, seq, payload, rest))
}
