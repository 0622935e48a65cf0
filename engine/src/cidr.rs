//! Address ranges as `network.allow` writes them (`10.0.0.0/8`), read the same way by validation and by
//! the `http` tool, so that neither imports the other.

use std::net::IpAddr;

/// `10.0.0.0/8` -> (10.0.0.0, 8); `None` unless the address parses and the prefix fits it.
pub fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (ip, prefix) = text.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    (prefix <= if ip.is_ipv4() { 32 } else { 128 }).then_some((ip, prefix))
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::parse_cidr;

    #[test]
    fn reads_address_and_prefix_within_the_address_length() {
        assert_eq!(
            parse_cidr("10.0.0.0/8"),
            Some((IpAddr::from([10, 0, 0, 0]), 8))
        );
        assert_eq!(
            parse_cidr("fd00::/8"),
            Some((IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 0]), 8))
        );
        assert_eq!(parse_cidr("10.0.0.0/33"), None);
        assert_eq!(parse_cidr("fd00::/129"), None);
        assert_eq!(parse_cidr("example.com/8"), None);
        assert_eq!(parse_cidr("10.0.0.0"), None);
    }
}
