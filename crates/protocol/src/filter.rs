//! Publication tags and the subscribe filters that select publications by them
//! (docs/protocol.md, "Filters"): checked here, in one place for every transport, and evaluated
//! by the node's fan-out and recovery.
//!
//! A publication may carry `tags`, a small map of strings. A subscribe may carry `filter`, a
//! tree of leaves `{"key", "cmp", "val" | "vals"}` and nodes `{"op": "and" | "or" | "not",
//! "nodes": [...]}`. A subscriber with a filter is sent only the publications it matches; the
//! others are not its losses. Every size is bounded, and a filter or tags outside the bounds
//! is refused with 400 naming the field.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::OutOfBounds;

/// A publication's tags: tag name → value. Shared by the publication's history entry, its
/// deliveries and its last value.
pub type Tags = BTreeMap<String, String>;

/// Most tags one publication carries.
pub const MAX_TAGS: usize = 32;
/// Longest tag name (bytes).
pub const MAX_TAG_KEY_BYTES: usize = 64;
/// Longest tag value (bytes), and longest `val` of a filter leaf.
pub const MAX_TAG_VALUE_BYTES: usize = 256;
/// Most leaves and nodes in one filter: its cost per publication stays small.
pub const MAX_FILTER_NODES: usize = 64;
/// Deepest nesting of a filter's nodes.
pub const MAX_FILTER_DEPTH: usize = 8;
/// Most values of one `in` / `nin` leaf.
pub const MAX_FILTER_VALS: usize = 64;

/// Reads an optional `tags`: an object of strings or `null`; anything else is an error naming
/// the field (the bounds are [`check_tags`]'s).
pub fn tags<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Tags>, D::Error> {
    Option::<Tags>::deserialize(d)
        .map_err(|e| serde::de::Error::custom(format!("tags: an object of string values was expected ({e})")))
}

/// Checks a publication's tags against the bounds; `None` for no tags (an empty map is none).
pub fn check_tags(tags: Option<Tags>) -> Result<Option<Arc<Tags>>, OutOfBounds> {
    let Some(tags) = tags.filter(|t| !t.is_empty()) else { return Ok(None) };
    if tags.len() > MAX_TAGS {
        return Err(bad("tags", format!("{} tags, at most {MAX_TAGS}", tags.len())));
    }
    for (k, v) in &tags {
        if k.is_empty() || k.len() > MAX_TAG_KEY_BYTES {
            return Err(bad("tags", format!("a tag name must be 1..={MAX_TAG_KEY_BYTES} bytes: {k:?}")));
        }
        if v.len() > MAX_TAG_VALUE_BYTES {
            return Err(bad("tags", format!("the value of tag {k:?} is longer than {MAX_TAG_VALUE_BYTES} bytes")));
        }
    }
    Ok(Some(Arc::new(tags)))
}

/// A filter as a client sends it, before it is checked ([`Filter::compile`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterSpec {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub cmp: Option<String>,
    #[serde(default)]
    pub val: Option<String>,
    #[serde(default)]
    pub vals: Option<Vec<String>>,
    #[serde(default)]
    pub op: Option<String>,
    #[serde(default)]
    pub nodes: Option<Vec<FilterSpec>>,
}

/// A checked filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    Leaf { key: String, cmp: Cmp },
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Not(Box<Filter>),
}

/// A leaf's comparison with the tag named by its key. A publication without that tag matches
/// only `neq`, `nin` and `nex`; a numeric comparison matches only when the tag's value reads as
/// a number.
#[derive(Debug, Clone, PartialEq)]
pub enum Cmp {
    Eq(String),
    Neq(String),
    In(Vec<String>),
    Nin(Vec<String>),
    Gt(f64),
    Gte(f64),
    Lt(f64),
    Lte(f64),
    Ex,
    Nex,
}

fn bad(field: &str, message: String) -> OutOfBounds {
    OutOfBounds { field: field.to_string().into(), message }
}

impl Filter {
    /// Checks `spec` (what the client sent as `filter`): a known `op` or `cmp`, the values each
    /// needs, and every bound; the error names the field (`filter.nodes[1].cmp`).
    pub fn compile(spec: &FilterSpec) -> Result<Filter, OutOfBounds> {
        let mut count = 0;
        compile(spec, "filter", 1, &mut count)
    }

    /// Whether a publication with `tags` matches.
    pub fn matches(&self, tags: Option<&Tags>) -> bool {
        match self {
            Filter::And(nodes) => nodes.iter().all(|n| n.matches(tags)),
            Filter::Or(nodes) => nodes.iter().any(|n| n.matches(tags)),
            Filter::Not(node) => !node.matches(tags),
            Filter::Leaf { key, cmp } => {
                let tag = tags.and_then(|t| t.get(key)).map(String::as_str);
                let number = || tag.and_then(|v| v.trim().parse::<f64>().ok()).filter(|v| v.is_finite());
                match cmp {
                    Cmp::Eq(v) => tag == Some(v.as_str()),
                    Cmp::Neq(v) => tag != Some(v.as_str()),
                    Cmp::In(vs) => tag.is_some_and(|t| vs.iter().any(|v| v == t)),
                    Cmp::Nin(vs) => !tag.is_some_and(|t| vs.iter().any(|v| v == t)),
                    Cmp::Gt(x) => number().is_some_and(|n| n > *x),
                    Cmp::Gte(x) => number().is_some_and(|n| n >= *x),
                    Cmp::Lt(x) => number().is_some_and(|n| n < *x),
                    Cmp::Lte(x) => number().is_some_and(|n| n <= *x),
                    Cmp::Ex => tag.is_some(),
                    Cmp::Nex => tag.is_none(),
                }
            }
        }
    }
}

fn compile(spec: &FilterSpec, at: &str, depth: usize, count: &mut usize) -> Result<Filter, OutOfBounds> {
    *count += 1;
    if *count > MAX_FILTER_NODES {
        return Err(bad("filter", format!("more than {MAX_FILTER_NODES} leaves and nodes")));
    }
    if depth > MAX_FILTER_DEPTH {
        return Err(bad(at, format!("nested deeper than {MAX_FILTER_DEPTH} levels")));
    }
    match (&spec.op, &spec.cmp) {
        (Some(_), Some(_)) => Err(bad(at, "a node has `op` and `nodes`, a leaf `key`, `cmp` and a value".into())),
        (Some(op), None) => {
            if spec.key.is_some() || spec.val.is_some() || spec.vals.is_some() {
                return Err(bad(at, "a node has `op` and `nodes` only".into()));
            }
            let specs = spec.nodes.as_deref().unwrap_or_default();
            let mut nodes = Vec::with_capacity(specs.len());
            for (i, s) in specs.iter().enumerate() {
                nodes.push(compile(s, &format!("{at}.nodes[{i}]"), depth + 1, count)?);
            }
            match (op.as_str(), nodes.len()) {
                ("and", 1..) => Ok(Filter::And(nodes)),
                ("or", 1..) => Ok(Filter::Or(nodes)),
                ("not", 1) => Ok(Filter::Not(Box::new(nodes.remove(0)))),
                ("and" | "or", _) => Err(bad(&format!("{at}.nodes"), format!("`{op}` needs at least one node"))),
                ("not", _) => Err(bad(&format!("{at}.nodes"), "`not` needs exactly one node".into())),
                _ => Err(bad(&format!("{at}.op"), format!("{op:?} is not one of and, or, not"))),
            }
        }
        (None, Some(cmp)) => {
            if spec.nodes.is_some() {
                return Err(bad(at, "a leaf has `key`, `cmp` and a value, no `nodes`".into()));
            }
            let key = spec.key.clone().filter(|k| !k.is_empty() && k.len() <= MAX_TAG_KEY_BYTES).ok_or_else(|| {
                bad(&format!("{at}.key"), format!("a leaf needs a tag name of 1..={MAX_TAG_KEY_BYTES} bytes"))
            })?;
            let one = || -> Result<String, OutOfBounds> {
                if spec.vals.is_some() {
                    return Err(bad(&format!("{at}.vals"), format!("`{cmp}` takes one `val`")));
                }
                match &spec.val {
                    Some(v) if v.len() <= MAX_TAG_VALUE_BYTES => Ok(v.clone()),
                    Some(_) => Err(bad(&format!("{at}.val"), format!("longer than {MAX_TAG_VALUE_BYTES} bytes"))),
                    None => Err(bad(&format!("{at}.val"), format!("`{cmp}` needs a `val`"))),
                }
            };
            let many = || -> Result<Vec<String>, OutOfBounds> {
                if spec.val.is_some() {
                    return Err(bad(&format!("{at}.val"), format!("`{cmp}` takes `vals`, a list")));
                }
                match &spec.vals {
                    Some(vs) if vs.len() > MAX_FILTER_VALS => {
                        Err(bad(&format!("{at}.vals"), format!("{} values, at most {MAX_FILTER_VALS}", vs.len())))
                    }
                    Some(vs) if vs.iter().any(|v| v.len() > MAX_TAG_VALUE_BYTES) => {
                        Err(bad(&format!("{at}.vals"), format!("a value is longer than {MAX_TAG_VALUE_BYTES} bytes")))
                    }
                    Some(vs) => Ok(vs.clone()),
                    None => Err(bad(&format!("{at}.vals"), format!("`{cmp}` needs `vals`, a list"))),
                }
            };
            let number = || -> Result<f64, OutOfBounds> {
                let v = one()?;
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite())
                    .ok_or_else(|| bad(&format!("{at}.val"), format!("`{cmp}` compares numbers: {v:?} is not one")))
            };
            let none = || -> Result<(), OutOfBounds> {
                match spec.val.is_some() || spec.vals.is_some() {
                    true => Err(bad(at, format!("`{cmp}` takes no value"))),
                    false => Ok(()),
                }
            };
            let cmp = match cmp.as_str() {
                "eq" => Cmp::Eq(one()?),
                "neq" => Cmp::Neq(one()?),
                "in" => Cmp::In(many()?),
                "nin" => Cmp::Nin(many()?),
                "gt" => Cmp::Gt(number()?),
                "gte" => Cmp::Gte(number()?),
                "lt" => Cmp::Lt(number()?),
                "lte" => Cmp::Lte(number()?),
                "ex" => none().map(|()| Cmp::Ex)?,
                "nex" => none().map(|()| Cmp::Nex)?,
                other => {
                    return Err(bad(
                        &format!("{at}.cmp"),
                        format!("{other:?} is not one of eq, neq, in, nin, gt, gte, lt, lte, ex, nex"),
                    ))
                }
            };
            Ok(Filter::Leaf { key, cmp })
        }
        (None, None) => Err(bad(at, "neither a leaf (`key`, `cmp`) nor a node (`op`, `nodes`)".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(json: &str) -> Result<Filter, OutOfBounds> {
        Filter::compile(&serde_json::from_str::<FilterSpec>(json).unwrap())
    }

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn filter_leaves_compare_tags_and_a_missing_tag_matches_only_the_negations() {
        let t = tags(&[("site", "north"), ("level", "7.5")]);
        let cases = [
            (r#"{"key": "site", "cmp": "eq", "val": "north"}"#, true, false),
            (r#"{"key": "site", "cmp": "neq", "val": "north"}"#, false, true),
            (r#"{"key": "site", "cmp": "in", "vals": ["south", "north"]}"#, true, false),
            (r#"{"key": "site", "cmp": "nin", "vals": ["south"]}"#, true, true),
            (r#"{"key": "level", "cmp": "gt", "val": "7"}"#, true, false),
            (r#"{"key": "level", "cmp": "gte", "val": "7.5"}"#, true, false),
            (r#"{"key": "level", "cmp": "lt", "val": "10"}"#, true, false),
            (r#"{"key": "level", "cmp": "lte", "val": "7.4"}"#, false, false),
            (r#"{"key": "site", "cmp": "gt", "val": "1"}"#, false, false),
            (r#"{"key": "site", "cmp": "ex"}"#, true, false),
            (r#"{"key": "site", "cmp": "nex"}"#, false, true),
        ];
        for (json, with, without) in cases {
            let f = filter(json).unwrap();
            assert_eq!((f.matches(Some(&t)), f.matches(None)), (with, without), "{json}");
        }
    }

    #[test]
    fn filter_nodes_combine_their_leaves() {
        let f = filter(
            r#"{"op": "and", "nodes": [
                {"key": "site", "cmp": "eq", "val": "north"},
                {"op": "not", "nodes": [{"op": "or", "nodes": [
                    {"key": "kind", "cmp": "eq", "val": "debug"}, {"key": "level", "cmp": "lt", "val": "3"}]}]}]}"#,
        )
        .unwrap();
        assert!(f.matches(Some(&tags(&[("site", "north"), ("level", "5")]))));
        assert!(!f.matches(Some(&tags(&[("site", "north"), ("level", "1")]))));
        assert!(!f.matches(Some(&tags(&[("site", "north"), ("kind", "debug")]))));
        assert!(!f.matches(Some(&tags(&[("site", "south")]))));
    }

    #[test]
    fn filter_refusals_name_the_field() {
        let field = |json: &str| filter(json).unwrap_err().field.to_string();
        assert_eq!(field(r#"{"key": "a", "cmp": "like", "val": "x"}"#), "filter.cmp");
        assert_eq!(field(r#"{"op": "and", "nodes": [{"key": "a", "cmp": "eq"}]}"#), "filter.nodes[0].val");
        assert_eq!(field(r#"{"op": "xor", "nodes": [{"key": "a", "cmp": "ex"}]}"#), "filter.op");
        assert_eq!(field(r#"{"op": "not", "nodes": []}"#), "filter.nodes");
        assert_eq!(field(r#"{"key": "a", "cmp": "gt", "val": "high"}"#), "filter.val");
        assert_eq!(field(r#"{"key": "a", "cmp": "in", "val": "x"}"#), "filter.val");
        assert_eq!(field(r#"{"key": "", "cmp": "ex"}"#), "filter.key");
        assert_eq!(field(r#"{}"#), "filter");
        let deep = (0..MAX_FILTER_DEPTH).fold(r#"{"key": "a", "cmp": "ex"}"#.to_string(), |inner, _| {
            format!(r#"{{"op": "not", "nodes": [{inner}]}}"#)
        });
        assert!(filter(&deep).unwrap_err().message.contains("deeper"));
        let wide = format!(
            r#"{{"op": "or", "nodes": [{}]}}"#,
            vec![r#"{"key": "a", "cmp": "ex"}"#; MAX_FILTER_NODES].join(",")
        );
        assert!(filter(&wide).unwrap_err().message.contains("leaves and nodes"));
        assert!(serde_json::from_str::<FilterSpec>(r#"{"key": "a", "cmp": "ex", "x": 1}"#).is_err());
    }

    #[test]
    fn filter_tags_are_bounded() {
        assert_eq!(check_tags(Some(Tags::new())).unwrap(), None);
        assert!(check_tags(Some(tags(&[("a", "b")]))).unwrap().is_some());
        let many: Tags = (0..=MAX_TAGS).map(|i| (format!("k{i}"), String::new())).collect();
        assert_eq!(check_tags(Some(many)).unwrap_err().field, "tags");
        assert!(check_tags(Some(tags(&[("", "b")]))).is_err());
        assert!(check_tags(Some(tags(&[("a", &"x".repeat(MAX_TAG_VALUE_BYTES + 1))]))).is_err());
    }
}
