//! Where a repacked matrix holds each row group's data.
//!
//! Rows come in groups of 8 and groups in panels of 2 (the last panel holds
//! one group when their count is odd). Every per-row array (quant plane
//! registers, sub-block scales, f16 scales) is laid out
//! `[panel][unit][field][group in panel][row in group]`, so a 512-bit load
//! takes a field for a whole panel (16 rows), a 256-bit load for one group
//! (8 rows), and a panel's data is one contiguous run of each array.

use crate::quant_type::GROUP;

/// The row groups of a matrix, and where each group's elements sit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    groups: usize,
}

impl Layout {
    /// The layout of `rows` rows.
    pub fn new(rows: usize) -> Self {
        Self {
            groups: rows.div_ceil(GROUP),
        }
    }

    /// Row groups, the last padded.
    pub fn groups(self) -> usize {
        self.groups
    }

    /// Groups in group `g`'s panel: 2, or 1 for a lone last group.
    pub fn width(self, g: usize) -> usize {
        if g / 2 * 2 + 1 < self.groups { 2 } else { 1 }
    }

    /// Elements from one (unit, field) of group `g` to the next: the panel's rows.
    pub fn step(self, g: usize) -> usize {
        self.width(g) * GROUP
    }

    /// Index of row 0 of group `g`'s element (`unit`, `field`) in an array
    /// of `units` units a row and `fields` fields a unit.
    pub fn index(self, g: usize, unit: usize, units: usize, field: usize, fields: usize) -> usize {
        let (p, h) = (g / 2, g % 2);
        p * 2 * GROUP * units * fields + ((unit * fields + field) * self.width(g) + h) * GROUP
    }

    /// Elements of a panel (`units * fields` a row): where panel `p` starts
    /// is `p` times this.
    pub fn panel_len(units: usize, fields: usize) -> usize {
        2 * GROUP * units * fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_has_one_slot_and_panels_are_contiguous() {
        for rows in [1, 8, 9, 16, 17, 24, 40, 41] {
            let l = Layout::new(rows);
            let (units, fields) = (3, 2);
            let total = l.groups() * GROUP * units * fields;
            let mut seen = vec![false; total];
            for g in 0..l.groups() {
                for u in 0..units {
                    for f in 0..fields {
                        let at = l.index(g, u, units, f, fields);
                        for r in 0..GROUP {
                            assert!(!seen[at + r], "rows {rows} g {g} u {u} f {f}");
                            seen[at + r] = true;
                        }
                        // The panel's other group sits right beside it.
                        if l.width(g) == 2 && g % 2 == 0 {
                            assert_eq!(l.index(g + 1, u, units, f, fields), at + GROUP);
                        }
                    }
                }
                let start = g / 2 * Layout::panel_len(units, fields);
                assert!(l.index(g, 0, units, 0, fields) >= start);
            }
            assert!(seen.iter().all(|&s| s), "rows {rows}");
        }
    }
}
