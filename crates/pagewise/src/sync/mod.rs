//! Synchronisation the allocator can use inside itself: a spin lock that
//! never allocates (and that the fork hooks can take and reset), and the
//! schedule perturbation points of the `pagewise_perturb` test build.

pub(crate) mod asymmetric;
pub(crate) mod lock;
pub(crate) mod perturb;
pub(crate) mod word;
