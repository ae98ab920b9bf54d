//! The resource the locks guard: a counter that checks the holder's fencing token on every read
//! and every write, as a real fenced resource must (fencing writes alone lets a stale holder's
//! write slip in between the new holder's read and write). It keeps the highest token it has
//! seen and refuses any operation with a lower one. A holder increments it by reading it and
//! writing one more, so an increment lost to two holders interleaving shows as a final value
//! below the increments acknowledged.

use parking_lot::Mutex;

/// How the resource checks tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// Reads and writes with a token below the highest seen are refused.
    Checked,
    /// The negative control: every token is taken (a resource that trusts its clients).
    Trusting,
}

#[derive(Debug, Default)]
struct State {
    value: u64,
    highest: u64,
    /// Operations refused for a stale token.
    refused: u64,
    /// Writes taken with a token below the highest seen (only a trusting resource takes
    /// one).
    stale_accepted: u64,
    /// Increments acknowledged to their holders.
    increments: u64,
}

/// One fenced counter.
#[derive(Debug)]
pub struct Fenced {
    fencing: Fencing,
    state: Mutex<State>,
}

/// Why the resource turned an operation away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stale {
    pub token: u64,
    pub highest: u64,
}

/// What a run did to one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    pub value: u64,
    pub increments: u64,
    pub refused: u64,
    pub stale_accepted: u64,
}

impl Tally {
    /// Increments acknowledged but missing from the value.
    pub fn lost_updates(&self) -> u64 {
        self.increments.saturating_sub(self.value)
    }
}

impl Fenced {
    pub fn new(fencing: Fencing) -> Fenced {
        Fenced {
            fencing,
            state: Mutex::new(State::default()),
        }
    }

    fn admit(&self, state: &mut State, token: u64) -> Result<(), Stale> {
        if token < state.highest {
            if self.fencing == Fencing::Checked {
                state.refused += 1;
                return Err(Stale {
                    token,
                    highest: state.highest,
                });
            }
            return Ok(());
        }
        state.highest = token;
        Ok(())
    }

    /// Reads the counter as the holder of `token`.
    pub fn read(&self, token: u64) -> Result<u64, Stale> {
        let mut state = self.state.lock();
        self.admit(&mut state, token)?;
        Ok(state.value)
    }

    /// Writes `value` as the holder of `token`; taken as one acknowledged increment.
    pub fn write(&self, token: u64, value: u64) -> Result<(), Stale> {
        let mut state = self.state.lock();
        let stale = token < state.highest;
        self.admit(&mut state, token)?;
        if stale {
            state.stale_accepted += 1;
        }
        state.value = value;
        state.increments += 1;
        Ok(())
    }

    pub fn tally(&self) -> Tally {
        let state = self.state.lock();
        Tally {
            value: state.value,
            increments: state.increments,
            refused: state.refused,
            stale_accepted: state.stale_accepted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_holder_is_refused_on_read_and_write() {
        let r = Fenced::new(Fencing::Checked);
        let v = r.read(5).unwrap();
        r.write(5, v + 1).unwrap();
        // A new holder reads: from now on the old token is refused, before its write lands.
        let v = r.read(7).unwrap();
        assert_eq!(
            r.write(5, 100),
            Err(Stale {
                token: 5,
                highest: 7
            })
        );
        r.write(7, v + 1).unwrap();
        let t = r.tally();
        assert_eq!(
            (t.value, t.increments, t.lost_updates(), t.refused),
            (2, 2, 0, 1)
        );
    }

    #[test]
    fn a_trusting_resource_loses_updates() {
        let r = Fenced::new(Fencing::Trusting);
        let old = r.read(5).unwrap();
        let new = r.read(7).unwrap();
        r.write(7, new + 1).unwrap();
        r.write(5, old + 1).unwrap();
        let t = r.tally();
        assert_eq!((t.lost_updates(), t.stale_accepted), (1, 1));
    }
}
