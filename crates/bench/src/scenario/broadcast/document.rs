//! `--doc-bytes`: what a plant dashboard's subscribers are sent, a point document of about
//! that size. The point's own fields (tag, description, unit, limits, quality), then the last
//! values of its neighbouring points, as many as the size takes. Between two publications
//! only the point's value and the stamp the run measures (`t`, `seq`) change, so that a delta
//! has little to carry and compression finds what real documents hold: repeated keys and
//! tag paths, and values whose digits do not repeat.

use serde_json::{json, Map, Value};

/// The document's fields that stay the same for the whole run, built once.
pub(super) struct Document {
    fixed: Map<String, Value>,
}

impl Document {
    /// A document of about `bytes` bytes of JSON (at least the point's own fields); `None`
    /// for 0, the bare stamp.
    pub(super) fn new(bytes: usize) -> Option<Document> {
        if bytes == 0 {
            return None;
        }
        let mut fixed = Map::new();
        fixed.insert("tag".into(), json!("plant1/area3/boiler7/outlet_temp"));
        fixed.insert("desc".into(), json!("Boiler 7 outlet temperature"));
        fixed.insert("unit".into(), json!("degC"));
        fixed.insert("lo".into(), json!(0.0));
        fixed.insert("hi".into(), json!(150.0));
        fixed.insert("alarm_hi".into(), json!(120.0));
        fixed.insert("q".into(), json!("good"));
        let mut near = Vec::new();
        // A fixed pseudo-random sequence: values whose digits vary as measurements do.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut size = serde_json::to_string(&fixed).map_or(0, |s| s.len()) + 45;
        let mut i = 0;
        while size < bytes {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let v = (x >> 40) as f64 / 1000.0;
            let entry = json!({"tag": format!("plant1/area{}/unit{}/pt{i}", i % 7, i % 13), "v": v, "q": "good"});
            size += serde_json::to_string(&entry).map_or(0, |s| s.len()) + 1;
            near.push(entry);
            i += 1;
        }
        fixed.insert("near".into(), Value::Array(near));
        Some(Document { fixed })
    }

    /// Publication `seq`, stamped `t`: the fixed fields and this publication's value.
    pub(super) fn at(&self, t: u64, seq: u64) -> Value {
        let mut doc = Map::with_capacity(self.fixed.len() + 3);
        doc.insert("t".into(), json!(t));
        doc.insert("seq".into(), json!(seq));
        doc.insert("v".into(), json!(60.0 + (seq % 400) as f64 * 0.125));
        doc.extend(self.fixed.iter().map(|(k, v)| (k.clone(), v.clone())));
        Value::Object(doc)
    }
}

/// What publication `seq` carries: the stamp alone, or the document.
pub(super) fn publication(doc: Option<&Document>, t: u64, seq: u64) -> Value {
    match doc {
        Some(d) => d.at(t, seq),
        None => json!({"t": t, "seq": seq}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_document_has_about_the_size_asked_and_changes_only_its_value_and_stamp() {
        for bytes in [512, 1024, 4096] {
            let d = Document::new(bytes).unwrap();
            let (a, b) = (d.at(1_764_000_000_000_000, 1), d.at(1_764_000_000_500_000, 2));
            let len = serde_json::to_string(&a).unwrap().len();
            assert!(len >= bytes && len < bytes + 120, "{bytes}: {len}");
            let mut differ: Vec<&String> =
                a.as_object().unwrap().keys().filter(|k| a[k.as_str()] != b[k.as_str()]).collect();
            differ.sort();
            assert_eq!(differ, ["seq", "t", "v"]);
        }
        assert!(Document::new(0).is_none());
        assert_eq!(publication(None, 5, 6), json!({"t": 5, "seq": 6}));
    }
}
