//! Which network destinations a workflow may reach: addresses that are not globally reachable (by the IANA
//! special-purpose address registries) are refused unless the spec's `network.allow` lists them.
//!
//! Validation reads `network.allow` ranges with [`parse_range`]; the `http` tool and MCP servers over
//! HTTP ask a [`NetworkPolicy`] about every address they would connect to ([`GuardedResolver`],
//! [`check_url`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// A DNS resolver for reqwest that drops the addresses the policy refuses, and refuses a name when none
/// is left; `who` names the refusing tool in the error (`` `http` ``, `MCP`).
#[derive(Debug)]
pub struct GuardedResolver {
    policy: Arc<NetworkPolicy>,
    who: &'static str,
}

impl GuardedResolver {
    pub fn new(policy: Arc<NetworkPolicy>, who: &'static str) -> Self {
        GuardedResolver { policy, who }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let who = self.who;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if policy.host_allowed(&host) {
                return Ok(Box::new(addrs.into_iter()) as Addrs);
            }
            let allowed: Vec<SocketAddr> = addrs
                .iter()
                .copied()
                .filter(|a| policy.ip_allowed(a.ip()))
                .collect();
            if allowed.is_empty() {
                return Err(format!("`{host}` resolves to an internal address, which {who} refuses unless `network.allow` lists it").into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Refuses a URL whose host is an IP literal the policy does not allow (names are checked when
/// resolved, by [`GuardedResolver`]); `who` names the refusing tool.
pub fn check_url(url: &reqwest::Url, policy: &NetworkPolicy, who: &str) -> Result<(), String> {
    let ip = match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
        Some(url::Host::Domain(_)) => return Ok(()),
        None => return Err(format!("`{url}` has no host")),
    };
    match policy.refusal(ip) {
        Some(_) if policy.host_allowed(&ip.to_string()) => Ok(()),
        Some(block) => Err(format!(
            "`{ip}` is an internal address ({block}), which {who} refuses unless `network.allow` lists it"
        )),
        None => Ok(()),
    }
}

/// Which destinations the workflow allows despite the default refusal.
#[derive(Clone, Debug, Default)]
pub struct NetworkPolicy {
    hosts: Vec<String>,
    ranges: Vec<IpNet>,
}

impl NetworkPolicy {
    /// The policy of a spec's `network.allow`: host names, addresses and CIDR ranges.
    pub fn new(allow: &[String]) -> Self {
        let mut policy = NetworkPolicy::default();
        for entry in allow {
            if let Some(range) = parse_range(entry) {
                policy.ranges.push(range);
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                policy.ranges.push(IpNet::from(ip));
            } else {
                policy.hosts.push(entry.to_ascii_lowercase());
            }
        }
        policy
    }

    /// Whether a host name is listed (compared without case and without a final dot).
    pub fn host_allowed(&self, host: &str) -> bool {
        self.hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(host.trim_end_matches('.')))
    }

    /// Whether `network.allow` lists an address itself or a range holding it.
    pub fn lists(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.ranges
            .iter()
            .any(|range| range.contains(&ip) || canonical_net(range).contains(&ip))
    }

    /// Whether an address may be reached: globally reachable addresses always, others only when allowed.
    pub fn ip_allowed(&self, ip: IpAddr) -> bool {
        self.refusal(ip).is_none()
    }

    /// Why an address may not be reached (the name of its special-purpose block), or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = canonical(ip);
        let block = special_block(ip)?;
        let allowed = self
            .ranges
            .iter()
            .any(|range| range.contains(&ip) || canonical_net(range).contains(&ip));
        (!allowed).then_some(block)
    }
}

/// A CIDR range as `network.allow` writes it (`10.0.0.0/8`, `fd00::/8`); `None` when it is not one.
pub fn parse_range(text: &str) -> Option<IpNet> {
    text.parse().ok()
}

/// IPv4-mapped IPv6 addresses are checked as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An allowed range written as IPv4-mapped IPv6 (`::ffff:10.0.0.0/104`) as the IPv4 range it means.
fn canonical_net(range: &IpNet) -> IpNet {
    match range {
        IpNet::V6(net) if net.prefix_len() >= 96 => net
            .network()
            .to_ipv4_mapped()
            .and_then(|v4| ipnet::Ipv4Net::new(v4, net.prefix_len() - 96).ok())
            .map_or(*range, IpNet::V4),
        other => *other,
    }
}

/// One entry of an IANA special-purpose address registry: the block, its name and whether an address in it
/// is globally reachable.
struct Special {
    block: &'static str,
    name: &'static str,
    global: bool,
}

const fn special(block: &'static str, name: &'static str, global: bool) -> Special {
    Special {
        block,
        name,
        global,
    }
}

/// The IANA IPv4 and IPv6 Special-Purpose Address Registries (iana-ipv4-special-registry and
/// iana-ipv6-special-registry, as updated in 2024), with their "Globally Reachable" column; a block the
/// registry marks N/A (6to4, Teredo) or deprecated counts as not reachable. Multicast (from the multicast
/// registries) and the site-local range IPv6 deprecated are added. To refresh: compare with the registries
/// and keep `every_registry_block_is_decided` passing.
const REGISTRY: &[Special] = &[
    special("0.0.0.0/8", "this network", false),
    special("10.0.0.0/8", "private-use", false),
    special("100.64.0.0/10", "shared address space", false),
    special("127.0.0.0/8", "loopback", false),
    special("169.254.0.0/16", "link local", false),
    special("172.16.0.0/12", "private-use", false),
    special("192.0.0.0/24", "IETF protocol assignments", false),
    special("192.0.0.9/32", "port control protocol anycast", true),
    special(
        "192.0.0.10/32",
        "traversal using relays around NAT anycast",
        true,
    ),
    special("192.0.2.0/24", "documentation (TEST-NET-1)", false),
    special("192.31.196.0/24", "AS112-v4", true),
    special("192.52.193.0/24", "AMT", true),
    special("192.88.99.0/24", "deprecated (6to4 relay anycast)", false),
    special("192.168.0.0/16", "private-use", false),
    special("192.175.48.0/24", "direct delegation AS112 service", true),
    special("198.18.0.0/15", "benchmarking", false),
    special("198.51.100.0/24", "documentation (TEST-NET-2)", false),
    special("203.0.113.0/24", "documentation (TEST-NET-3)", false),
    special("224.0.0.0/4", "multicast", false),
    special("240.0.0.0/4", "reserved", false),
    special("255.255.255.255/32", "limited broadcast", false),
    special("::/128", "unspecified address", false),
    special("::1/128", "loopback address", false),
    special("64:ff9b:1::/48", "local-use IPv4/IPv6 translation", false),
    special("100::/64", "discard-only address block", false),
    special("100:0:0:1::/64", "dummy IPv6 prefix", false),
    special("2001::/23", "IETF protocol assignments", false),
    special("2001::/32", "TEREDO", false),
    special("2001:1::1/128", "port control protocol anycast", true),
    special(
        "2001:1::2/128",
        "traversal using relays around NAT anycast",
        true,
    ),
    special(
        "2001:1::3/128",
        "DNS-SD service registration protocol anycast",
        true,
    ),
    special("2001:2::/48", "benchmarking", false),
    special("2001:3::/32", "AMT", true),
    special("2001:4:112::/48", "AS112-v6", true),
    special("2001:10::/28", "deprecated (previously ORCHID)", false),
    special("2001:20::/28", "ORCHIDv2", true),
    special("2001:30::/28", "drone remote ID protocol entity tags", true),
    special("2001:db8::/32", "documentation", false),
    special("2620:4f:8000::/48", "direct delegation AS112 service", true),
    special("3fff::/20", "documentation", false),
    special("5f00::/16", "segment routing SIDs", false),
    special("fc00::/7", "unique-local", false),
    special("fe80::/10", "link-local unicast", false),
    special("fec0::/10", "deprecated site-local", false),
    special("ff00::/8", "multicast", false),
];

/// The registry's blocks, parsed once, most specific first.
fn registry() -> &'static [(IpNet, &'static Special)] {
    static PARSED: OnceLock<Vec<(IpNet, &'static Special)>> = OnceLock::new();
    PARSED.get_or_init(|| {
        let mut parsed: Vec<(IpNet, &'static Special)> = REGISTRY
            .iter()
            .filter_map(|s| Some((s.block.parse().ok()?, s)))
            .collect();
        parsed.sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        parsed
    })
}

/// The name of the special-purpose block that makes an address not globally reachable: the most specific
/// registry block holding it, or, for an IPv6 address carrying an IPv4 address, that address's block.
fn special_block(ip: IpAddr) -> Option<&'static str> {
    if let IpAddr::V6(v6) = ip
        && let Some(v4) = embedded_ipv4(v6)
    {
        return special_block(IpAddr::V4(v4));
    }
    registry()
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .filter(|(_, special)| !special.global)
        .map(|(_, special)| special.name)
}

/// The IPv4 address inside an IPv6 address that carries one: IPv4-compatible (`::a.b.c.d`), IPv4-translated
/// (`::ffff:0:a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`). IPv4-mapped addresses are
/// handled by [`canonical`].
fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let from = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    // `::` and `::1` are themselves in the registry, not IPv4-compatible addresses.
    let compatible = s[..6] == [0; 6] && (s[6] != 0 || s[7] > 1);
    if compatible || s[..6] == [0, 0, 0, 0, 0xffff, 0] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some(from(s[6], s[7]))
    } else if s[0] == 0x2002 {
        Some(from(s[1], s[2]))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> bool {
        !NetworkPolicy::default().ip_allowed(text.parse().expect("an address"))
    }

    #[test]
    fn every_registry_block_is_decided() {
        assert_eq!(registry().len(), REGISTRY.len(), "every block parses");
        for (net, special) in registry() {
            for ip in [net.network(), net.broadcast()] {
                assert_eq!(
                    refused(&ip.to_string()),
                    !special.global,
                    "{ip} in {} ({})",
                    special.block,
                    special.name
                );
            }
        }
    }

    #[test]
    fn the_ranges_the_adversarial_pass_found_open_are_refused() {
        for ip in [
            "198.18.0.1",
            "198.19.255.254",
            "198.51.100.7",
            "203.0.113.9",
            "192.88.99.1",
            "::ffff:0:10.0.0.1",
            "::ffff:0:127.0.0.1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "64:ff9b::169.254.169.254",
            "2002:7f00:1::",
            "3fff::1",
        ] {
            assert!(refused(ip), "{ip}");
        }
        for ip in [
            "93.184.215.14",
            "2606:4700::1111",
            "192.0.0.9",
            "64:ff9b::8.8.8.8",
        ] {
            assert!(!refused(ip), "{ip} is globally reachable");
        }
    }

    #[test]
    fn allowed_ranges_and_hosts() {
        let policy = NetworkPolicy::new(&[
            "10.20.0.0/16".to_owned(),
            "127.0.0.1".to_owned(),
            "Intranet.Example".to_owned(),
        ]);
        assert!(policy.ip_allowed("10.20.3.4".parse().expect("ip")));
        assert!(policy.ip_allowed("::ffff:10.20.3.4".parse().expect("ip")));
        assert!(!policy.ip_allowed("10.21.0.1".parse().expect("ip")));
        assert!(policy.ip_allowed("127.0.0.1".parse().expect("ip")));
        assert!(!policy.ip_allowed("127.0.0.2".parse().expect("ip")));
        assert!(policy.host_allowed("intranet.example."));
        assert_eq!(parse_range("10.0.0.0/33"), None);
        assert_eq!(parse_range("fd00::/8").map(|r| r.prefix_len()), Some(8));
    }
}
