//! Memory: the geometry of address space (`layout`), the size classes,
//! reservations carved into segments, page descriptors, and the span pool
//! of each heap. No thread policy lives here: callers hold the locks these
//! types ask for.

pub(crate) mod block;
pub mod budget;
pub(crate) mod cache_handshake;
pub(crate) mod delayed;
pub(crate) mod hollow;
pub(crate) mod huge_pages;
pub mod layout;
pub(crate) mod mesh;
pub(crate) mod page;
pub(crate) mod registry;
pub(crate) mod remote_word;
pub(crate) mod reservation;
pub(crate) mod resident;
pub(crate) mod segment;
pub mod size_class;
pub(crate) mod spans;
pub(crate) mod transfer;
