//! Where a sandbox's `execve` looks for a program named without a `/`:
//! the native jail and a microVM guest's init look the same way.

/// The `PATH` of `env`, or `default` when it has none.
pub fn search_path<'a>(env: &'a [(String, String)], default: &'a str) -> &'a str {
    env.iter()
        .find(|(k, _)| k == "PATH")
        .map_or(default, |(_, v)| v.as_str())
}

/// Where `name` is looked for in `path`, in order (absolute entries only).
pub fn path_candidates(path: &str, name: &str) -> Vec<String> {
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(|dir| format!("{}/{name}", dir.trim_end_matches('/')))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_entries_in_order_from_the_environment_or_the_default() {
        let env = vec![("PATH".to_string(), "/bin/:rel:/usr/bin".to_string())];
        assert_eq!(
            path_candidates(search_path(&env, "/x"), "sh"),
            ["/bin/sh", "/usr/bin/sh"]
        );
        assert_eq!(path_candidates(search_path(&[], "/x"), "sh"), ["/x/sh"]);
    }
}
