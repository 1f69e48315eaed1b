//! Who pyebpf works for, and what it may do once sampling has started.
//!
//! Owns: the invoking user ([`invoking_user`]: `SUDO_UID`/`SUDO_GID` when root runs us through
//! `sudo`, else our own real ids), which owns the files we write and runs `record -- COMMAND`;
//! and dropping the capabilities a run no longer needs ([`drop_after_attach`]).
//! Input: the environment and our credentials. Output: a [`User`]; capability sets changed.

/// A user and its primary group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

/// Who runs `record -- COMMAND`: a user with its groups (under `sudo`, the invoking user).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// The user and its primary group.
    pub user: User,
    /// Supplementary groups.
    pub groups: Vec<libc::gid_t>,
}

impl RunAs {
    /// The `sudo` user with its groups; `None` when not run through `sudo`.
    pub fn sudo_user() -> Option<RunAs> {
        let user = sudo_user()?;
        Some(RunAs {
            user,
            groups: groups_of(user),
        })
    }
}

/// The user who asked for this run: under `sudo` (effective uid 0 and `SUDO_UID` set to
/// another user), the user who ran `sudo`; otherwise our real user.
pub fn invoking_user() -> User {
    sudo_user().unwrap_or_else(|| {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        User { uid, gid }
    })
}

/// The user behind `sudo`, when we run as root through it.
pub fn sudo_user() -> Option<User> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |name| std::env::var(name).ok()?.trim().parse::<u32>().ok();
    let uid = id("SUDO_UID")?;
    let gid = id("SUDO_GID")?;
    (uid != 0).then_some(User { uid, gid })
}

/// The owner to give the files we create: the `sudo` user (files in their home belong to
/// them, as if they had written them), or `None` to keep ours.
pub fn file_owner() -> Option<User> {
    sudo_user()
}

/// The `sudo` user's supplementary groups (`getgrouplist` of `SUDO_USER`), its primary group
/// alone when the name is unknown.
pub fn groups_of(user: User) -> Vec<libc::gid_t> {
    let Some(name) = std::env::var("SUDO_USER")
        .ok()
        .and_then(|n| std::ffi::CString::new(n).ok())
    else {
        return vec![user.gid];
    };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let want = n;
        // SAFETY: `groups` has room for `n` entries; getgrouplist writes at most that many and
        // sets `n` to the number it found.
        let r =
            unsafe { libc::getgrouplist(name.as_ptr(), user.gid, groups.as_mut_ptr(), &raw mut n) };
        if r >= 0 {
            groups.truncate(n as usize);
            return groups;
        }
        if n <= want || n > 65_536 {
            return vec![user.gid];
        }
    }
}
