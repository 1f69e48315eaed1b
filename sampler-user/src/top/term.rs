//! The terminal while `top` runs: raw mode, the alternate screen, a hidden cursor and no line
//! wrap, restored on every way out.
//!
//! Owns: [`Screen`], a guard whose drop restores the terminal, and a panic hook that restores
//! it before the panic message is printed. Restoring is idempotent (one flag), so the guard,
//! the hook and an error path can all call it. Drawing moves the cursor to each line and
//! clears the rest of it, so nothing scrolls and a stray write (a message on stderr) is gone
//! at the next refresh.

use std::io::{self, Write as _};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use crossterm::style::{Attribute, Print, SetAttribute};
use crossterm::terminal::{self, ClearType};
use crossterm::{cursor, execute, queue};

use super::view::{Line, Style};

/// Whether the terminal is in `top`'s state (and must be restored).
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// Restores the terminal if `top` changed it; safe to call more than once, from any thread.
pub fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let mut out = io::stdout();
        let _ = execute!(
            out,
            SetAttribute(Attribute::Reset),
            terminal::EnableLineWrap,
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

/// The terminal in `top`'s state; dropping it restores the terminal.
pub struct Screen {
    out: io::Stdout,
}

impl Screen {
    /// Enters raw mode and the alternate screen, hides the cursor, turns line wrap off and
    /// installs the panic hook (once).
    pub fn enter() -> io::Result<Screen> {
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        // Set first: whatever part of the set-up succeeds is undone.
        ACTIVE.store(true, Ordering::SeqCst);
        let screen = Screen { out: io::stdout() };
        terminal::enable_raw_mode()?;
        let mut out = io::stdout();
        execute!(
            out,
            terminal::EnterAlternateScreen,
            cursor::Hide,
            terminal::DisableLineWrap,
            terminal::Clear(ClearType::All)
        )?;
        Ok(screen)
    }

    /// The terminal's size in cells (80 × 24 when it cannot be read).
    pub fn size() -> (u16, u16) {
        terminal::size().unwrap_or((80, 24))
    }

    /// Draws `lines` from the top left of a screen `height` lines high, clearing what is
    /// below them.
    pub fn draw(&mut self, lines: &[Line], height: u16) -> io::Result<()> {
        if !ACTIVE.load(Ordering::SeqCst) {
            return Ok(());
        }
        for (row, line) in lines.iter().enumerate() {
            let row = u16::try_from(row).unwrap_or(u16::MAX);
            queue!(self.out, cursor::MoveTo(0, row))?;
            if line.style == Style::Reverse {
                queue!(self.out, SetAttribute(Attribute::Reverse))?;
            }
            queue!(
                self.out,
                Print(&line.text),
                terminal::Clear(ClearType::UntilNewLine),
                SetAttribute(Attribute::Reset)
            )?;
        }
        let below = u16::try_from(lines.len()).unwrap_or(u16::MAX);
        if below < height {
            queue!(
                self.out,
                cursor::MoveTo(0, below),
                terminal::Clear(ClearType::FromCursorDown)
            )?;
        }
        self.out.flush()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}
