//! Which variables a source subscribes to: the `nodes` it lists, or every Variable below a
//! browse path, found by walking the server's address space.

use std::collections::{HashSet, VecDeque};

use opcua::client::Session;
use opcua::types::{
    BrowseDescription, BrowseDirection, BrowseResult, BrowseResultMask, ByteString, NodeClass, NodeId, ObjectId,
    ReferenceDescription, ReferenceTypeId,
};

/// A variable found under the browse root, with its browse names below the root.
#[derive(Debug, Clone)]
pub struct Found {
    pub node: NodeId,
    pub path: Vec<String>,
}

/// Nodes browsed per Browse request, and references asked for per node (the rest comes
/// through continuation points).
const BROWSE_BATCH: usize = 100;
const REFS_PER_NODE: u32 = 1000;

/// The browse root: a node id (`ns=2;s=Plant`) as it is, or a path of browse names from the
/// Root folder (`Objects/Plant`; `2:Plant` also pins the namespace index).
pub async fn resolve_root(session: &Session, browse: &str) -> Result<NodeId, String> {
    if browse.contains('=') {
        return super::session::parse_node(browse);
    }
    let mut node: NodeId = ObjectId::RootFolder.into();
    for segment in browse.split('/').filter(|s| !s.is_empty()) {
        let (ns, name) = match segment.split_once(':') {
            Some((ns, name)) if ns.parse::<u16>().is_ok() => (ns.parse::<u16>().ok(), name),
            _ => (None, segment),
        };
        let children =
            children(session, std::slice::from_ref(&node), NodeClass::Object as u32 | NodeClass::Variable as u32)
                .await?
                .pop()
                .unwrap_or_default();
        node = children
            .into_iter()
            .find(|r| r.browse_name.name.as_ref() == name && ns.is_none_or(|ns| r.browse_name.namespace_index == ns))
            .map(|r| r.node_id.node_id)
            .ok_or_else(|| format!("browse path {browse:?}: no {segment:?} below {node}"))?;
    }
    Ok(node)
}

/// Every Variable below `root` over hierarchical references (properties excluded: they
/// describe a value, they are not one), breadth first, at most `max` of them. Returns the
/// variables and whether the walk stopped at `max`.
pub async fn variables(session: &Session, root: &NodeId, max: usize) -> Result<(Vec<Found>, bool), String> {
    let mut found = Vec::new();
    let mut seen: HashSet<NodeId> = HashSet::from([root.clone()]);
    let mut queue: VecDeque<(NodeId, Vec<String>)> = VecDeque::from([(root.clone(), Vec::new())]);
    while !queue.is_empty() {
        let batch: Vec<(NodeId, Vec<String>)> = queue.drain(..queue.len().min(BROWSE_BATCH)).collect();
        let ids: Vec<NodeId> = batch.iter().map(|(id, _)| id.clone()).collect();
        let mask = NodeClass::Object as u32 | NodeClass::Variable as u32;
        for ((_, path), refs) in batch.iter().zip(children(session, &ids, mask).await?) {
            for r in refs {
                if r.reference_type_id == ReferenceTypeId::HasProperty || r.node_id.server_index != 0 {
                    continue;
                }
                let id = r.node_id.node_id;
                if !seen.insert(id.clone()) {
                    continue;
                }
                let mut child_path = path.clone();
                child_path.push(r.browse_name.name.as_ref().to_string());
                if r.node_class == NodeClass::Variable {
                    if found.len() == max {
                        return Ok((found, true));
                    }
                    found.push(Found { node: id.clone(), path: child_path.clone() });
                }
                queue.push_back((id, child_path));
            }
        }
    }
    Ok((found, false))
}

/// The forward hierarchical references of each node (following continuation points).
async fn children(
    session: &Session,
    nodes: &[NodeId],
    class_mask: u32,
) -> Result<Vec<Vec<ReferenceDescription>>, String> {
    let descriptions: Vec<BrowseDescription> = nodes
        .iter()
        .map(|node| BrowseDescription {
            node_id: node.clone(),
            browse_direction: BrowseDirection::Forward,
            reference_type_id: ReferenceTypeId::HierarchicalReferences.into(),
            include_subtypes: true,
            node_class_mask: class_mask,
            result_mask: BrowseResultMask::All as u32,
        })
        .collect();
    let results =
        session.browse(&descriptions, REFS_PER_NODE, None).await.map_err(|e| format!("browse: {}", e.status()))?;
    let mut out = Vec::with_capacity(nodes.len());
    for (node, result) in nodes.iter().zip(results) {
        out.push(collect(session, node, result).await?);
    }
    Ok(out)
}

async fn collect(
    session: &Session,
    node: &NodeId,
    mut result: BrowseResult,
) -> Result<Vec<ReferenceDescription>, String> {
    let mut refs = Vec::new();
    loop {
        if result.status_code.is_bad() {
            return Err(format!("browse {node}: {}", result.status_code));
        }
        refs.extend(result.references.take().unwrap_or_default());
        let point: ByteString = result.continuation_point;
        if point.is_null_or_empty() {
            return Ok(refs);
        }
        result = session
            .browse_next(false, &[point])
            .await
            .map_err(|e| format!("browse next {node}: {}", e.status()))?
            .pop()
            .ok_or_else(|| format!("browse next {node}: no result"))?;
    }
}
