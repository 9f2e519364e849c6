//! Why an observer is woken, as a value: the kinds of wake and the set of
//! them taken at once (the runtime's inbox posts and takes these).

/// Why an observer is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Wake {
    /// The op's `.pid` or `.code` file appeared or changed.
    File = 1,
    /// The container monitor's probe did not find the op's wrapper alive.
    Alarm = 2,
    /// A kill request was recorded for the op.
    Kill = 4,
    /// A drill asked the current observer attempt to fail.
    Fault = 8,
    /// A drill asked the op's supervisor to give up (as one whose final
    /// write failed would): the op is left without an observer.
    Abandon = 16,
    /// A drill asked the current observer attempt to panic for real (a
    /// bug's unwinding, not an error it returns).
    Panic = 32,
}

/// The set of wakes taken at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wakes(u8);

impl Wakes {
    /// No wake at all (a wait that ran out of time).
    pub const NONE: Wakes = Wakes(0);

    /// The set of the given wakes.
    pub fn of(wakes: &[Wake]) -> Wakes {
        Wakes(wakes.iter().fold(0, |bits, w| bits | *w as u8))
    }

    /// The set whose bits are `bits` (each bit a [`Wake`]'s value).
    pub fn from_bits(bits: u8) -> Wakes {
        Wakes(bits)
    }

    /// Whether `wake` is in the set.
    pub fn has(self, wake: Wake) -> bool {
        self.0 & wake as u8 != 0
    }
}
