//! Tests of the name tables.

use super::*;

#[test]
fn table_is_sorted_and_unique() {
    assert!(ARCH_NAMES.iter().all(|&(n, _)| n < 424));
    assert!(COMMON_NAMES.iter().all(|&(n, _)| n >= 424));
    let all: Vec<_> = ARCH_NAMES.iter().chain(COMMON_NAMES).collect();
    for pair in all.windows(2) {
        assert!(pair[0].0 < pair[1].0, "{:?} / {:?}", pair[0], pair[1]);
    }
    let mut names: Vec<&str> = all.iter().map(|&&(_, n)| n).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len());
}

#[test]
fn lookups() {
    assert_eq!(name(libc::SYS_read), Some("read"));
    assert_eq!(name(libc::SYS_ptrace), Some("ptrace"));
    assert_eq!(name(libc::SYS_clone3), Some("clone3"));
    assert_eq!(name(nr::SYS_file_setattr), Some("file_setattr"));
    assert_eq!(name(100_000), None);
    assert_eq!(name(-1), None);
}
