//! Weft: an eBPF-accelerated VXLAN overlay network agent, wire- and
//! etcd-compatible with flannel's VXLAN backend.

pub mod dataplane;
