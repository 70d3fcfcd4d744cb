//! The step table.

use super::Step;

#[test]
fn every_step_decodes_from_its_number_and_is_described() {
    for &s in Step::ALL {
        assert_eq!(Step::from_u32(s as u32), Some(s));
        assert!(!s.describe().is_empty());
    }
    assert_eq!(Step::Sync as u32, 1);
    assert_eq!(Step::from_u32(0), None);
    assert_eq!(Step::from_u32(Step::Started as u32 + 1), None);
}
