//! What a reasoning reader finds in the model's text: a file of its own, so
//! that the readers and the splitter that holds them need not import each
//! other.

/// One piece of the model's output, sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Reasoning text (`reasoning_content`).
    Reasoning(String),
    /// Answer text (`content`, where the tool-call reader looks).
    Content(String),
    /// A call in the model's own markup (harmony) begins: its function.
    CallStart(String),
    /// More of that call's arguments (JSON text).
    CallArguments(String),
}

/// The pieces one push found, and whether any of its bytes belonged to
/// reasoning (its text or its markup), for counting reasoning tokens.
#[derive(Debug, Default)]
pub struct Found {
    /// The pieces, in order.
    pub pieces: Vec<Piece>,
    /// Some byte was reasoning's.
    pub reasoning: bool,
}

impl Found {
    /// Adds `piece` unless its text is empty.
    pub(super) fn add(&mut self, piece: Piece) {
        let empty = match &piece {
            Piece::Reasoning(t) | Piece::Content(t) | Piece::CallArguments(t) => t.is_empty(),
            Piece::CallStart(_) => false,
        };
        if !empty {
            self.pieces.push(piece);
        }
    }
}
