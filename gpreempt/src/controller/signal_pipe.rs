//! A pipe that becomes readable when one of some signals arrives, so a `ppoll` can wait for
//! signals next to file descriptors. Signals are process-directed (SIGCHLD, SIGINT): whichever
//! thread runs the handler, the byte lands in the pipe the waiting thread polls. Handlers already
//! installed for those signals keep running (signal-hook-registry chains them).

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use nix::{
    errno::Errno,
    fcntl::OFlag,
    unistd::{pipe2, read},
};
use signal_hook_registry::SigId;

/// Signal pipes whose flag has a slot in [`FLAGS`]; later ones own a flag on the heap.
const SLOTS: usize = 64;

/// Which of [`SLOTS`] slots are taken, bit i for slot i.
#[derive(Debug)]
struct SlotMap(AtomicU64);

impl SlotMap {
    const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The lowest free slot, now taken; None when all are.
    fn take(&self) -> Option<usize> {
        let mut taken = self.0.load(Ordering::Relaxed);
        while taken != u64::MAX {
            let slot = taken.trailing_ones() as usize;
            match self.0.compare_exchange_weak(taken, taken | 1 << slot, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(slot),
                Err(now) => taken = now,
            }
        }
        None
    }

    fn give(&self, slot: usize) {
        self.0.fetch_and(!(1 << slot), Ordering::AcqRel);
    }
}

/// The flags signal handlers set, in one aligned block: the controller's back-to-back loop looks
/// at Ctrl-C's (`stop`, set by the binary's SIGINT/SIGTERM/SIGHUP handler) and at its session's
/// signal pipe every cycle, and under software emulation each distinct page it touches between
/// two ioctls is a measurable part of the cycle (BENCHMARKS.md row 5). 128-byte aligned and
/// smaller than that, the block never straddles a page.
#[repr(C, align(128))]
#[derive(Debug)]
pub struct Flags {
    /// The slots that belong to a live [`SignalPipe`].
    taken: SlotMap,
    pub stop: AtomicBool,
    slots: [AtomicBool; SLOTS],
}

pub static FLAGS: Flags =
    Flags { taken: SlotMap::new(), stop: AtomicBool::new(false), slots: [const { AtomicBool::new(false) }; SLOTS] };

/// A pipe's "a signal arrived" flag: a slot of [`FLAGS`], or its own once they are all taken.
#[derive(Debug)]
enum Flag {
    Slot(usize),
    Own(Arc<AtomicBool>),
}

impl Flag {
    fn take() -> Self {
        match FLAGS.taken.take() {
            Some(slot) => {
                FLAGS.slots[slot].store(false, Ordering::Relaxed);
                Self::Slot(slot)
            }
            None => Self::Own(Arc::new(AtomicBool::new(false))),
        }
    }

    #[inline(always)]
    fn get(&self) -> &AtomicBool {
        match self {
            Self::Slot(i) => &FLAGS.slots[*i],
            Self::Own(flag) => flag,
        }
    }
}

/// The read end of a signal-fed pipe; dropping it removes the handlers.
#[derive(Debug)]
pub struct SignalPipe {
    read: OwnedFd,
    /// Written from signal handlers; closed only after they are unregistered.
    write: OwnedFd,
    /// Set by the handlers too: a loop that must not make a system call per cycle can ask.
    arrived: Flag,
    ids: Vec<SigId>,
}

impl SignalPipe {
    pub fn new(signals: &[libc::c_int]) -> Result<Self, Errno> {
        let (read, write) = pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let raw = write.as_raw_fd();
        let arrived = Flag::take();
        let (slot, own) = match &arrived {
            Flag::Slot(i) => (Some(&FLAGS.slots[*i]), None),
            Flag::Own(flag) => (None, Some(Arc::clone(flag))),
        };
        let mut pipe = Self { read, write, arrived, ids: Vec::with_capacity(signals.len()) };
        for &signal in signals {
            let own = own.clone();
            // SAFETY: the action stores to an atomic and calls write(2) on a non-blocking pipe,
            // both async-signal-safe; a full pipe (EAGAIN) already says "something arrived".
            let id = unsafe {
                signal_hook_registry::register(signal, move || {
                    if let Some(flag) = slot.or(own.as_deref()) {
                        flag.store(true, Ordering::Relaxed);
                    }
                    let _ = libc::write(raw, b"s".as_ptr().cast(), 1);
                })
            }
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EINVAL)))?;
            pipe.ids.push(id);
        }
        Ok(pipe)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// A signal arrived since the last [`SignalPipe::drain`] (no system call).
    #[inline]
    pub fn arrived(&self) -> bool {
        self.arrived.get().load(Ordering::Relaxed)
    }

    /// The flag behind [`SignalPipe::arrived`], for a loop that keeps it at hand.
    #[inline(always)]
    pub fn flag(&self) -> &AtomicBool {
        self.arrived.get()
    }

    /// Empty the pipe; whether anything had arrived.
    pub fn drain(&self) -> bool {
        self.arrived.get().store(false, Ordering::Relaxed);
        drain(&self.read)
    }
}

impl Drop for SignalPipe {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook_registry::unregister(id);
        }
        if let Flag::Slot(i) = self.arrived {
            FLAGS.slots[i].store(false, Ordering::Relaxed);
            FLAGS.taken.give(i);
        }
        let _ = &self.write;
    }
}

/// Read a non-blocking fd until it is empty; whether anything was read.
pub fn drain(fd: &impl AsFd) -> bool {
    let mut buf = [0u8; 256];
    let mut any = false;
    while let Ok(n) = read(fd.as_fd(), &mut buf) {
        if n == 0 {
            break;
        }
        any = true;
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_lowest_first_until_none_is_left_and_a_given_one_is_taken_again() {
        let map = SlotMap::new();
        let taken: Vec<usize> = (0..SLOTS).map_while(|_| map.take()).collect();
        assert_eq!(taken, (0..SLOTS).collect::<Vec<_>>());
        assert_eq!(map.take(), None);
        map.give(5);
        map.give(17);
        assert_eq!((map.take(), map.take(), map.take()), (Some(5), Some(17), None));
    }

    #[test]
    fn a_pipe_owns_a_flag_when_every_slot_is_taken() {
        // At most SLOTS pipes hold slots (other tests' included): some of these own their flag.
        let pipes: Vec<SignalPipe> = (0..SLOTS + 2).map(|_| SignalPipe::new(&[]).unwrap()).collect();
        assert!(pipes.iter().filter(|p| matches!(p.arrived, Flag::Own(_))).count() >= 2);
    }

    #[test]
    fn the_flags_block_cannot_straddle_a_page() {
        assert!(size_of::<Flags>() <= align_of::<Flags>() && 4096 % align_of::<Flags>() == 0);
    }

    #[test]
    fn a_signal_makes_the_pipe_readable_and_drain_empties_it() {
        let pipe = SignalPipe::new(&[libc::SIGUSR2]).unwrap();
        assert!(!pipe.drain());
        // SAFETY: raise(3) to ourselves; the registry's handler only writes to the pipe.
        unsafe { libc::raise(libc::SIGUSR2) };
        assert!(pipe.arrived());
        assert!(pipe.drain());
        assert!(!pipe.arrived());
        assert!(!pipe.drain());
    }
}
