//! Sparkplug B payloads (placeholder until written).
