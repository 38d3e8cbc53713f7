//! seccomp-bpf filter (being written).
