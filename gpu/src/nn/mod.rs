//! Layers on the device, each mirroring the CPU layer of the same name in
//! `tiderec_operators::nn` (same parameter layout inside the flat buffer,
//! same data layouts, same semantics; `backward` overwrites the gradient
//! ranges it owns unless its doc says it adds).

pub mod attention;
pub mod embedding_bag;
pub mod fm;
pub mod fm_partial;
pub mod gru;
pub mod interaction;
pub mod linear;
pub mod loss;
pub mod wide;
