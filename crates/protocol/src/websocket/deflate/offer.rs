//! The permessage-deflate negotiation (RFC 7692 §5–7). A server's side: the client's
//! `Sec-WebSocket-Extensions` offers read by the extension grammar of RFC 6455 §9.1, the first
//! offer this server can honour accepted, the answer's header value. A client's side: the
//! one offer Switchboard's clients make ([`CLIENT_OFFER`]) and the server's answer to it judged
//! ([`accepted`]).
//!
//! An offer is declined — and the next one tried — when it has a parameter RFC 7692 does not
//! define for an offer, a parameter twice, a value where none belongs or a missing or invalid
//! one (§7: "A server MUST decline an extension negotiation offer ..."), or when its syntax is
//! broken. Other extensions are not supported and are ignored.
//!
//! Every answer carries `server_no_context_takeover` and `client_no_context_takeover`, which a
//! server may add to any offer (§7.1.1.1, §7.1.1.2): each message is compressed and inflated on
//! its own, so a connection keeps no LZ77 window. A `server_max_window_bits` the client asks
//! for is granted as asked (the server compresses with exactly that window, 8 included); the
//! client's own window needs no limit, since the server inflates with the largest one, so the
//! answer never names `client_max_window_bits`.

use super::{MAX_WINDOW_BITS, MIN_WINDOW_BITS};

/// The extension's name.
pub const PERMESSAGE_DEFLATE: &str = "permessage-deflate";

/// What a connection agreed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    /// The largest LZ77 window (bits) the server's compressor may use: the client's
    /// `server_max_window_bits`, or 15.
    pub server_window: u8,
    /// The client asked for `server_max_window_bits`: the answer names it.
    window_asked: bool,
}

impl Agreed {
    /// The `Sec-WebSocket-Extensions` value of the answer that accepts the offer.
    pub fn response(&self) -> String {
        let mut r = format!("{PERMESSAGE_DEFLATE}; server_no_context_takeover; client_no_context_takeover");
        if self.window_asked {
            r.push_str(&format!("; server_max_window_bits={}", self.server_window));
        }
        r
    }
}

/// The first permessage-deflate offer of a request's `Sec-WebSocket-Extensions` values (each
/// header line a comma-separated list; their order is the client's preference) that this server
/// can honour; `None` when there is none (the connection goes without compression).
pub fn negotiate<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Agreed> {
    values.into_iter().flat_map(|v| split_outside_quotes(v, b',')).find_map(|element| {
        let (name, params) = parse_extension(element)?;
        name.eq_ignore_ascii_case(PERMESSAGE_DEFLATE).then(|| accept(&params)).flatten()
    })
}

/// What Switchboard's clients offer: no context takeover either way, so that neither side keeps
/// an LZ77 window for the connection (the node answers every offer so). The client inflates
/// with the largest window, so it names no `server_max_window_bits`; it sends its own messages
/// uncompressed (RFC 7692 §6 allows any message so), so it names no `client_max_window_bits`.
pub const CLIENT_OFFER: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// A server's `Sec-WebSocket-Extensions` answer to [`CLIENT_OFFER`]: `Ok(true)` when it
/// accepted permessage-deflate, `Ok(false)` when it named no extension, `Err` (why) when the
/// answer is one RFC 7692 §5–7 forbids for that offer, and the client must fail the connection
/// (RFC 6455 §4.1): another extension, the extension twice, `server_no_context_takeover`
/// missing (the offer asked for it: a server that cannot honour it declines the offer), a
/// `client_max_window_bits` the offer did not name, or a parameter that is unknown, repeated or
/// badly valued.
pub fn accepted<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<bool, String> {
    let mut found = false;
    for element in values.into_iter().flat_map(|v| split_outside_quotes(v, b',')) {
        let (name, params) = parse_extension(element).ok_or_else(|| format!("malformed extension {element:?}"))?;
        if !name.eq_ignore_ascii_case(PERMESSAGE_DEFLATE) {
            return Err(format!("extension {name:?} was not offered"));
        }
        if found {
            return Err(format!("{PERMESSAGE_DEFLATE} accepted twice"));
        }
        found = true;
        if let Some(name) = repeated(&params) {
            return Err(format!("parameter {name} twice"));
        }
        for (name, value) in &params {
            match (name.to_ascii_lowercase().as_str(), value) {
                ("server_no_context_takeover" | "client_no_context_takeover", None) => {}
                ("server_max_window_bits", Some(v)) if window_bits(v).is_some() => {}
                _ => return Err(format!("parameter {name} is not one an answer to this offer may carry")),
            }
        }
        if !params.iter().any(|(name, _)| name.eq_ignore_ascii_case("server_no_context_takeover")) {
            return Err("server_no_context_takeover was asked for and is missing".into());
        }
    }
    Ok(found)
}

/// An extension parameter: its name and its value, unquoted, if it has one.
type Param<'a> = (&'a str, Option<String>);

/// Accepts one permessage-deflate offer, or declines it (`None`).
fn accept(params: &[Param]) -> Option<Agreed> {
    if repeated(params).is_some() {
        return None;
    }
    let mut server_window = None;
    for (name, value) in params {
        match (name.to_ascii_lowercase().as_str(), value) {
            ("server_no_context_takeover" | "client_no_context_takeover", None) => {}
            ("server_max_window_bits", Some(v)) => server_window = Some(window_bits(v)?),
            ("client_max_window_bits", None) => {}
            ("client_max_window_bits", Some(v)) => {
                window_bits(v)?;
            }
            _ => return None,
        }
    }
    Some(Agreed { server_window: server_window.unwrap_or(MAX_WINDOW_BITS), window_asked: server_window.is_some() })
}

/// The first parameter named twice (names are case-insensitive), which no offer or answer may
/// have (RFC 7692 §7).
fn repeated<'p>(params: &[Param<'p>]) -> Option<&'p str> {
    params.iter().enumerate().find_map(|(i, (name, _))| {
        params[..i].iter().any(|(earlier, _)| earlier.eq_ignore_ascii_case(name)).then_some(*name)
    })
}

/// A window size value: a decimal 8..=15 without leading zeros (RFC 7692 §7.1.2.1).
fn window_bits(v: &str) -> Option<u8> {
    if v.starts_with('0') || v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u8>().ok().filter(|b| (MIN_WINDOW_BITS..=MAX_WINDOW_BITS).contains(b))
}

/// One element of the list: `token *( ";" token [ "=" ( token / quoted-string ) ] )`, spaces
/// around each part; a quoted value, unescaped, must be a token (RFC 6455 §9.1). `None` for a
/// malformed one.
fn parse_extension(element: &str) -> Option<(&str, Vec<Param<'_>>)> {
    let mut parts = split_outside_quotes(element, b';');
    let name = parts.next()?.trim_matches(is_ows);
    if !is_token(name) {
        return None;
    }
    let params = parts
        .map(|p| {
            let (key, value) = match p.split_once('=') {
                Some((k, v)) => (k.trim_matches(is_ows), Some(param_value(v.trim_matches(is_ows))?)),
                None => (p.trim_matches(is_ows), None),
            };
            is_token(key).then_some((key, value))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((name, params))
}

/// A parameter's value: a token, or a quoted string whose content, unescaped, is a token.
fn param_value(v: &str) -> Option<String> {
    let value = match v.strip_prefix('"') {
        Some(rest) => {
            let inner = rest.strip_suffix('"')?;
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.push(chars.next()?),
                    '"' => return None,
                    c => out.push(c),
                }
            }
            out
        }
        None => v.to_string(),
    };
    is_token(&value).then_some(value)
}

/// RFC 9110 §5.6.2: `1*tchar`.
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn is_ows(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The pieces of `s` between the separators `sep` that stand outside quoted strings (a
/// backslash in a quoted string escapes the next character); empty list elements skipped, as
/// RFC 9110 §5.6.1 asks of a recipient.
fn split_outside_quotes(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut pieces = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, b) in s.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            _ if b == sep && !quoted => {
                pieces.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&s[start..]);
    // The element list skips empty elements; an extension's parameters do not.
    let lists = sep == b',';
    pieces.into_iter().filter(move |p| !lists || !p.trim_matches(is_ows).is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agreed(values: &[&str]) -> Option<(u8, String)> {
        negotiate(values.iter().copied()).map(|a| (a.server_window, a.response()))
    }

    const BOTH: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

    #[test]
    fn deflate_offer_is_answered_without_context_takeover() {
        for offer in [
            "permessage-deflate",
            "permessage-deflate; client_max_window_bits",
            "Permessage-Deflate; Client_Max_Window_Bits",
            "permessage-deflate;client_no_context_takeover;server_no_context_takeover",
            "permessage-deflate; client_max_window_bits=10",
            "permessage-deflate; client_max_window_bits=\"15\"",
            "  permessage-deflate ;\tclient_max_window_bits  ",
        ] {
            assert_eq!(agreed(&[offer]), Some((15, BOTH.to_string())), "{offer}");
        }
    }

    #[test]
    fn deflate_offer_grants_the_server_window_asked() {
        for bits in 8..=15u8 {
            let offer = format!("permessage-deflate; server_max_window_bits={bits}; client_max_window_bits");
            assert_eq!(agreed(&[&offer]), Some((bits, format!("{BOTH}; server_max_window_bits={bits}"))));
        }
        assert_eq!(agreed(&["permessage-deflate; server_max_window_bits=\"9\""]).map(|a| a.0), Some(9));
        assert_eq!(agreed(&["permessage-deflate; server_max_window_bits = 12"]).map(|a| a.0), Some(12));
    }

    #[test]
    fn deflate_offers_that_break_the_rfc_are_declined_and_the_next_is_tried() {
        for bad in [
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_max_window_bits=7",
            "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; server_max_window_bits=09",
            "permessage-deflate; server_max_window_bits=1a",
            "permessage-deflate; client_max_window_bits=20",
            "permessage-deflate; client_max_window_bits=",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; client_no_context_takeover=\"x\"",
            "permessage-deflate; client_max_window_bits; client_max_window_bits",
            "permessage-deflate; server_no_context_takeover; SERVER_NO_CONTEXT_TAKEOVER",
            "permessage-deflate; mem_level=8",
            "permessage-deflate; server_max_window_bits=\"1 0\"",
            "permessage-deflate; ; client_max_window_bits",
            "permessage-deflate; =10",
            "permessage deflate",
        ] {
            assert_eq!(agreed(&[bad]), None, "{bad}");
            let then = format!("{bad}, permessage-deflate; server_max_window_bits=10");
            assert_eq!(agreed(&[&then]).map(|a| a.0), Some(10), "{then}");
        }
    }

    #[test]
    fn deflate_answers_to_the_client_offer_are_judged_by_the_rfc() {
        for ok in [
            BOTH,
            "permessage-deflate; server_no_context_takeover",
            "Permessage-Deflate; Server_No_Context_Takeover; server_max_window_bits=10",
            "permessage-deflate;server_no_context_takeover;server_max_window_bits=\"15\"",
        ] {
            assert_eq!(accepted([ok]), Ok(true), "{ok}");
        }
        assert_eq!(accepted([]), Ok(false));
        assert_eq!(accepted(["", " , "]), Ok(false));
        for bad in [
            "permessage-deflate",
            "permessage-deflate; client_no_context_takeover",
            "permessage-deflate; server_no_context_takeover; client_max_window_bits=10",
            "permessage-deflate; server_no_context_takeover; server_max_window_bits=16",
            "permessage-deflate; server_no_context_takeover; server_max_window_bits",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; server_no_context_takeover; mem_level=8",
            "x-webkit-deflate-frame",
            "permessage deflate",
        ] {
            assert!(accepted([bad]).is_err(), "{bad}");
        }
        let twice = [BOTH, BOTH];
        assert!(accepted(twice).is_err());
        // The node's own answers are ones its clients accept.
        for offer in [CLIENT_OFFER, "permessage-deflate; server_max_window_bits=9"] {
            assert_eq!(accepted([agreed(&[offer]).unwrap().1.as_str()]), Ok(true), "{offer}");
        }
    }

    #[test]
    fn deflate_offers_come_in_the_clients_order_across_header_lines() {
        let lines = [
            "x-webkit-deflate-frame, permessage-deflate; server_max_window_bits=9",
            "permessage-deflate; server_max_window_bits=12",
        ];
        assert_eq!(agreed(&lines).map(|a| a.0), Some(9));
        assert_eq!(agreed(&["x-webkit-deflate-frame", "permessage-deflate"]).map(|a| a.0), Some(15));
        // A comma inside a quoted value does not split the list; the offer is declined (the
        // value is no token) and the next one taken.
        let quoted = "permessage-deflate; server_max_window_bits=\"9,\", permessage-deflate; server_max_window_bits=11";
        assert_eq!(agreed(&[quoted]).map(|a| a.0), Some(11));
        assert_eq!(agreed(&["", " , ,", "foo; bar=1"]), None);
        // A quote never closed: the rest of the list cannot be read.
        assert_eq!(agreed(&["permessage-deflate; server_max_window_bits=\"10, permessage-deflate"]), None);
        assert_eq!(agreed(&[]), None);
    }
}
