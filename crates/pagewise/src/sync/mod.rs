//! Synchronisation the allocator can use inside itself: a spin lock that
//! never allocates (and that the fork hooks can take and reset).

pub(crate) mod lock;
