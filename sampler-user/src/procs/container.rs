//! Container identity from cgroup paths.
//!
//! Owns: the rules that pick a container id out of `/proc/PID/cgroup`.
//! Input: the cgroup file's text (untrusted; bounded by the caller).
//! Output: the cgroup path to report and, where one is found, the 64-hex container id.
//! Constraints: pure; the innermost match wins (nested runtimes); podman's `conmon` monitor is
//! not the container, so `libpod-conmon-<id>` does not count.

/// Length of a docker/containerd/CRI-O/podman container id in hex digits.
const ID_LEN: usize = 64;

/// The container id in one cgroup path, if any.
///
/// Recognised shapes (all ending in a 64-hex id):
/// - docker, cgroupfs driver: `/docker/<id>`
/// - docker, systemd driver: `/system.slice/docker-<id>.scope`
/// - containerd/CRI (kubelet): `/kubepods/besteffort/pod<uid>/<id>`,
///   `/kubepods.slice/…/cri-containerd-<id>.scope`
/// - CRI-O: `…/crio-<id>.scope`
/// - podman: `/machine.slice/libpod-<id>.scope`, rootless
///   `/user.slice/…/user@1000.service/user.slice/libpod-<id>.scope/container`,
///   cgroupfs `/libpod_parent/libpod-<id>`
pub fn container_id_from_path(path: &str) -> Option<String> {
    path.rsplit('/').find_map(id_in_component)
}

fn id_in_component(component: &str) -> Option<String> {
    if component.contains("conmon") {
        return None;
    }
    let c = component.strip_suffix(".scope").unwrap_or(component);
    // The id is the whole component or its last `-`-separated part.
    let candidate = c.rsplit('-').next().unwrap_or(c);
    is_container_id(candidate).then(|| candidate.to_owned())
}

fn is_container_id(s: &str) -> bool {
    s.len() == ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// From the whole cgroup file: `(cgroup path to report, container id)`.
///
/// The reported path is the cgroup v2 one (`0::/…`) if present, else the first v1 line's.
/// The id is taken from the first line that has one.
pub fn from_cgroup_file(text: &str) -> (Option<String>, Option<String>) {
    let mut v2 = None;
    let mut first = None;
    let mut id = None;
    for line in text.lines().take(64) {
        // hierarchy-ID:controller-list:cgroup-path; the path may contain ':'.
        let mut parts = line.splitn(3, ':');
        let (Some(hier), Some(_controllers), Some(path)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if hier == "0" && v2.is_none() {
            v2 = Some(path.to_owned());
        }
        if first.is_none() {
            first = Some(path.to_owned());
        }
        if id.is_none() {
            id = container_id_from_path(path);
        }
    }
    (v2.or(first), id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1e6c4c9a0b4d1e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f";

    #[test]
    fn docker_cgroupfs_and_systemd() {
        assert_eq!(
            container_id_from_path(&format!("/docker/{ID}")).as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id_from_path(&format!("/system.slice/docker-{ID}.scope")).as_deref(),
            Some(ID)
        );
    }

    #[test]
    fn containerd_cri_and_crio() {
        let cgroupfs = format!("/kubepods/besteffort/pod0e3c1f2a-1111-2222-3333-444455556666/{ID}");
        assert_eq!(container_id_from_path(&cgroupfs).as_deref(), Some(ID));
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0e3c1f2a_1111.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(container_id_from_path(&systemd).as_deref(), Some(ID));
        let crio = format!("/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope");
        assert_eq!(container_id_from_path(&crio).as_deref(), Some(ID));
    }

    #[test]
    fn podman_root_rootless_and_conmon() {
        assert_eq!(
            container_id_from_path(&format!("/machine.slice/libpod-{ID}.scope")).as_deref(),
            Some(ID)
        );
        let rootless = format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
        );
        assert_eq!(container_id_from_path(&rootless).as_deref(), Some(ID));
        assert_eq!(
            container_id_from_path(&format!("/libpod_parent/libpod-{ID}")).as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id_from_path(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            None
        );
    }

    #[test]
    fn plain_systemd_scopes_have_no_id() {
        for p in [
            "/user.slice/user-0.slice/session-3.scope",
            "/system.slice/ssh.service",
            "/",
            "",
            "/init.scope",
            // 63 and 65 digits, upper case: not ids.
            "/docker/3f1e6c4c9a0b4d1e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5",
            "/docker/3f1e6c4c9a0b4d1e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5ff",
            "/docker/3F1E6C4C9A0B4D1E8A7B6C5D4E3F2A1B0C9D8E7F6A5B4C3D2E1F0A9B8C7D6E5F",
        ] {
            assert_eq!(container_id_from_path(p), None, "{p}");
        }
    }

    #[test]
    fn whole_files_v1_and_v2() {
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(
            from_cgroup_file(&v2),
            (
                Some(format!("/system.slice/docker-{ID}.scope")),
                Some(ID.to_owned())
            )
        );
        let v1 = format!(
            "12:pids:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n"
        );
        assert_eq!(
            from_cgroup_file(&v1),
            (Some(format!("/docker/{ID}")), Some(ID.to_owned()))
        );
        assert_eq!(
            from_cgroup_file("0::/user.slice/user-0.slice/session-1.scope\n"),
            (
                Some("/user.slice/user-0.slice/session-1.scope".to_owned()),
                None
            )
        );
        assert_eq!(from_cgroup_file("nonsense\n"), (None, None));
    }
}
