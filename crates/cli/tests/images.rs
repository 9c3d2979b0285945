//! P2 images from the CLI, as a user runs them: images built here with
//! umoci (`tests/images/build.sh`), loaded into a store of the test's own,
//! run with `cordon exec --image`, as a manifest's image tool, probed, and
//! an MCP server image (node with the reference server-everything) served
//! through `cordon serve` and called by the rmcp client.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cordon_testkit::skip;

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn npm_dir() -> PathBuf {
    std::env::var_os("CORDON_E2E_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/npm"))
}

/// A scratch directory of its own (world-traversable: the sandbox's uid
/// reaches the store's rootfs through it), removed when dropped.
use cordon_testkit::Scratch;

fn dir(tag: &str) -> Scratch {
    cordon_testkit::scratch::named(&format!("cordon-img-{tag}-"))
}

fn cordon(store: &Path, args: &[&str], input: &[u8]) -> Output {
    let mut c = Command::new(CORDON);
    c.args(args)
        .env("CORDON_STORE", store)
        .env("CORDON_AUDIT", store.with_extension("audit.jsonl"))
        .env_remove("CORDON_MANIFEST")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn cordon");
    {
        use std::io::Write;
        let mut si = child.stdin.take().unwrap();
        let _ = si.write_all(input);
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Build the layout of `kind` and load it as `name`; its pinned reference.
fn build_and_load(work: &Path, store: &Path, kind: &str, name: &str) -> Option<String> {
    let layout = build(work, kind)?;
    Some(load(store, &layout, name))
}

/// Build the layout of `kind` (`tests/images/build.sh`); `None` when a
/// tool it needs is missing (and skipping is allowed).
fn build(work: &Path, kind: &str) -> Option<PathBuf> {
    if !Path::new("/usr/bin/umoci").exists() {
        skip::skip_or_fail(
            &skip::this_test(),
            "umoci is not installed (scripts/setup.sh)",
        );
        return None;
    }
    let layout = work.join(format!("{kind}-layout"));
    let mut b = Command::new(repo().join("tests/images/build.sh"));
    b.arg(kind).arg(&layout);
    if kind == "node-mcp" {
        if !npm_dir()
            .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
            .is_file()
        {
            skip::skip_or_fail(
                &skip::this_test(),
                "server-everything is not installed (scripts/setup.sh)",
            );
            return None;
        }
        b.arg(npm_dir());
    }
    let o = b.output().unwrap();
    assert!(o.status.success(), "build.sh {kind}: {:?}", text(&o));
    Some(layout)
}

/// `cordon image load LAYOUT --name NAME`; its pinned reference.
fn load(store: &Path, layout: &Path, name: &str) -> String {
    let o = cordon(
        store,
        &["image", "load", layout.to_str().unwrap(), "--name", name],
        b"",
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let r = out.trim().to_string();
    assert!(
        r.starts_with(&format!("{name}@sha256:")) && r.len() == name.len() + 72,
        "{r}"
    );
    r
}

#[test]
fn an_image_runs_read_only_as_the_sandbox_root() {
    let work = dir("exec");
    let store = work.join("store");
    let Some(layout) = build(&work, "busybox") else {
        return;
    };

    // The unpack caps are a setting: over one, the image is refused when
    // it is loaded, with the cap named, and nothing of it is kept.
    let o = Command::new(CORDON)
        .args([
            "image",
            "load",
            layout.to_str().unwrap(),
            "--name",
            "busybox",
        ])
        .env("CORDON_STORE", &store)
        .env("CORDON_UNPACK_MAX_ENTRIES", "3")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(text(&o).1.contains("max_entries"), "{:?}", text(&o));
    for sub in ["images", "rootfs", "blobs/sha256"] {
        let left: Vec<_> = std::fs::read_dir(store.join(sub))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "a capped load left {left:?}");
    }

    let r = load(&store, &layout, "busybox");
    let o = cordon(&store, &["image", "ls"], b"");
    assert!(text(&o).0.contains(&r), "{:?}", text(&o));

    // The image's root, its own /etc/passwd, its uid 0 (an unprivileged
    // uid on the host), read-only but for /tmp.
    let o = cordon(
        &store,
        &[
            "exec",
            "--image",
            &r,
            "--",
            "/bin/sh",
            "-c",
            "ls /; cat /etc/passwd; id -u; echo x > /tmp/ok && echo tmp-ok; touch /bin/x",
        ],
        b"",
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(10), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        &lines[..5],
        &["bin", "dev", "etc", "proc", "tmp"],
        "only the image's entries and the mount points: {out}"
    );
    assert!(
        out.contains("root:x:0:0:root:/root:/bin/sh\n0\ntmp-ok"),
        "{out}"
    );
    assert!(
        !out.contains("nobody"),
        "the host's passwd is not there: {out}"
    );
    assert!(err.contains("/bin/x: Read-only file system"), "{err}");

    // Without a command: the image's entrypoint (/bin/sh) reads stdin.
    let o = cordon(&store, &["exec", "--image", &r], b"echo from-entrypoint\n");
    assert_eq!(text(&o).0.trim(), "from-entrypoint", "{:?}", text(&o));

    // Refusals: a pin not in the store, a tag, a program not in the image.
    let missing = format!("busybox@sha256:{}", "1".repeat(64));
    let o = cordon(&store, &["exec", "--image", &missing], b"");
    assert_eq!(o.status.code(), Some(21), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("not in the image store") && text(&o).1.contains("cordon image pull"),
        "{:?}",
        text(&o)
    );
    let o = cordon(&store, &["exec", "--image", "busybox:latest"], b"");
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(text(&o).1.contains("sha256"), "{:?}", text(&o));
    let o = cordon(
        &store,
        &["exec", "--image", &r, "--", "/usr/bin/python3"],
        b"",
    );
    assert_eq!(o.status.code(), Some(21), "{:?}", text(&o));
    assert!(
        text(&o)
            .1
            .contains("program /usr/bin/python3 does not exist inside the sandbox"),
        "{:?}",
        text(&o)
    );

    // A manifest's image tool: checked, run, probed in its own sandbox.
    let m = work.join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  count:\n    profile: P1\n    image: {r}\n    command: [/bin/sh, -c, \"wc -c\"]\n    limits: {{wall_seconds: 3}}\n"
        ),
    )
    .unwrap();
    let ms = m.to_str().unwrap();
    let o = cordon(&store, &["check", "-m", ms], b"");
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let o = cordon(&store, &["run", "count", "-m", ms], b"abcd");
    assert_eq!(text(&o).0.trim(), "4", "{:?}", text(&o));
    let o = cordon(&store, &["probe", "-m", ms, "--tool", "count"], b"");
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains(" 0 escaped, 0 error"), "{out}");

    // rm, then gc frees its blobs.
    let o = cordon(&store, &["image", "rm", &r], b"");
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let o = cordon(&store, &["image", "gc"], b"");
    assert!(text(&o).0.starts_with("removed "), "{:?}", text(&o));
    assert!(!text(&o).0.starts_with("removed 0 blobs"), "{:?}", text(&o));
    let o = cordon(&store, &["exec", "--image", &r], b"");
    assert_eq!(o.status.code(), Some(21), "{:?}", text(&o));
}

/// One tar entry with a raw name and link name, as a hostile layer writes
/// it.
fn entry(out: &mut Vec<u8>, ty: tar::EntryType, name: &str, link: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(ty);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.extend(std::iter::repeat_n(0u8, (512 - data.len() % 512) % 512));
}

/// A copy of the layout at `from` in `to`, its image given one more
/// (uncompressed) layer, `tar`, on top; `diff_id` replaces the layer's true
/// one in the config when given. Returns the new layer's index and
/// digest, and the new manifest's digest.
fn with_layer(
    from: &Path,
    to: &Path,
    tar: &[u8],
    diff_id: Option<&str>,
) -> (usize, String, String) {
    use cordon_image::Digest;
    let o = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    let blob = |d: &str| {
        to.join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let put = |bytes: &[u8]| {
        let d = Digest::of(bytes).to_string();
        std::fs::write(blob(&d), bytes).unwrap();
        d
    };
    let read = |d: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(blob(d)).unwrap()).unwrap()
    };
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(to.join("index.json")).unwrap()).unwrap();
    let entry = &mut index["manifests"][0];
    let mut manifest = read(entry["digest"].as_str().unwrap());
    let mut config = read(manifest["config"]["digest"].as_str().unwrap());

    let layer = put(tar);
    let true_id = Digest::of(tar).to_string();
    config["rootfs"]["diff_ids"]
        .as_array_mut()
        .unwrap()
        .push(diff_id.unwrap_or(&true_id).into());
    let config = serde_json::to_vec(&config).unwrap();
    manifest["config"]["digest"] = put(&config).into();
    manifest["config"]["size"] = config.len().into();
    let layers = manifest["layers"].as_array_mut().unwrap();
    layers.push(serde_json::json!({
        "mediaType": "application/vnd.oci.image.layer.v1.tar",
        "digest": layer, "size": tar.len(),
    }));
    let index_of = layers.len() - 1;
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let digest = put(&manifest);
    entry["digest"] = digest.clone().into();
    entry["size"] = manifest.len().into();
    std::fs::write(to.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    (index_of, layer, digest)
}

/// An image whose layer could never run is refused by `cordon image load`
/// itself, naming the layer (index and digest) and the entry; nothing of
/// it is kept, and `cordon check` refuses a manifest that names it. The
/// positive control: the image it was made from loads and runs.
#[test]
fn a_layer_that_could_never_run_is_refused_at_load() {
    use tar::EntryType::{Link, Regular, Symlink};
    let work = dir("refuse");
    let Some(layout) = build(&work, "busybox") else {
        return;
    };
    let store = work.join("store");
    let r = load(&store, &layout, "busybox");
    let o = cordon(
        &store,
        &["exec", "--image", &r, "--", "/bin/sh", "-c", "echo ran"],
        b"",
    );
    assert_eq!(text(&o).0.trim(), "ran", "{:?}", text(&o));

    let end = |mut t: Vec<u8>| {
        t.extend(std::iter::repeat_n(0u8, 1024));
        t
    };
    let mut shadow = Vec::new();
    entry(&mut shadow, Link, "shadow", "/etc/shadow", b"");
    let mut through = Vec::new();
    entry(
        &mut through,
        Symlink,
        "hostetc",
        "/nonexistent-host-dir",
        b"",
    );
    entry(&mut through, Link, "stolen", "hostetc/shadow", b"");
    let mut file_through = Vec::new();
    entry(&mut file_through, Symlink, "keys", "/root/.ssh", b"");
    entry(
        &mut file_through,
        Regular,
        "keys/authorized_keys",
        "",
        b"attacker\n",
    );
    let good = end(Vec::new());
    let wrong = cordon_image::Digest::of(b"not this layer").to_string();
    let cases: [(&str, Vec<u8>, Option<&str>, &str); 4] = [
        (
            "diff-id",
            good.clone(),
            Some(&wrong),
            "its uncompressed content has digest",
        ),
        (
            "hardlink-host",
            end(shadow),
            None,
            "entry \"shadow\" refused: the hard link's target is not in the rootfs",
        ),
        (
            "hardlink-symlink",
            end(through),
            None,
            "entry \"stolen\" refused: the hard link's target is not in the rootfs",
        ),
        (
            "file-symlink",
            end(file_through),
            None,
            "entry \"keys/authorized_keys\" refused: the parent \"keys\" is a symlink to nothing",
        ),
    ];
    for (case, tar, diff_id, why) in cases {
        let bad = work.join(format!("bad-{case}"));
        let (index, layer, manifest) = with_layer(&layout, &bad, &tar, diff_id);
        let store = work.join(format!("store-{case}"));
        let o = cordon(
            &store,
            &["image", "load", bad.to_str().unwrap(), "--name", "bad"],
            b"",
        );
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{case}: {out}{err}");
        assert!(out.is_empty(), "{case}: {out}");
        let head = format!("layer {index} ({layer}): ");
        assert!(err.contains(&format!("{head}{why}")), "{case}: {err}");
        if diff_id.is_some() {
            assert!(
                err.contains(&format!(
                    "but the image config's rootfs.diff_ids says {wrong}"
                )),
                "{err}"
            );
        }
        for sub in ["images", "rootfs", "blobs/sha256"] {
            let left: Vec<_> = std::fs::read_dir(store.join(sub))
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            assert!(left.is_empty(), "{case}: a refused load left {left:?}");
        }
        // A manifest naming it is refused by `cordon check`.
        let m = work.join(format!("{case}.yaml"));
        std::fs::write(
            &m,
            format!(
                "tools:\n  t:\n    profile: P1\n    image: bad@{manifest}\n    command: [/bin/true]\n"
            ),
        )
        .unwrap();
        let o = cordon(&store, &["check", "-m", m.to_str().unwrap()], b"");
        assert_eq!(o.status.code(), Some(1), "{case}: {:?}", text(&o));
        assert!(
            text(&o).0.contains("not in the image store")
                || text(&o).1.contains("not in the image store"),
            "{case}: {:?}",
            text(&o)
        );
    }
}

/// The seed's P2 shape: a third-party MCP server from an image pinned by
/// digest (node and server-everything, no host /usr), probed at start,
/// served, and called by a real MCP client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_image_is_served() {
    use cordon_mcp::rmcp::model::CallToolRequestParams;
    let work = dir("mcp");
    let store = work.join("store");
    let Some(r) = build_and_load(&work, &store, "node-mcp", "everything") else {
        return;
    };
    let m = work.join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  everything:\n    profile: P2\n    network: none\n    limits: {{wall_seconds: 20, memory: 1G, tasks: 64}}\n    mcp:\n      image: {r}\n      tools: {{allow: [echo]}}\n"
        ),
    )
    .unwrap();
    let c = serve(&store, &m, &work.join("audit.jsonl")).await;
    let tools = c.peer().list_all_tools().await.unwrap();
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(
        names,
        vec!["everything__echo".to_string()],
        "probed and served"
    );
    let mut p = CallToolRequestParams::new("everything__echo".to_owned());
    p.arguments = serde_json::json!({"message": "from an image"})
        .as_object()
        .cloned();
    let res = c.peer().call_tool(p).await.unwrap();
    let t: String = res
        .content
        .iter()
        .filter_map(|x| x.as_text().map(|t| t.text.clone()))
        .collect();
    assert!(t.contains("Echo: from an image"), "{t}");
    let _ = c.cancel().await;
}

/// The seed's `jira_search` shape: an MCP server from an image pinned by
/// digest whose only egress is its one API (here an upstream on loopback
/// the test runs, named `api.test`): it reaches that host through cordon's
/// doors, and any other host gets the doors' 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_image_reaches_only_its_one_api() {
    use cordon_mcp::rmcp::model::CallToolRequestParams;
    use std::io::{Read, Write};
    let work = dir("egress");
    let store = work.join("store");
    let Some(r) = build_and_load(&work, &store, "node-mcp", "fetcher") else {
        return;
    };
    // The upstream: answers every request with a marker.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut s = s;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\nupstream-marker",
            );
        }
    });
    let m = work.join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  jira:\n    profile: P2\n    egress: [\"api.test:{port}\"]\n    resolve: {{api.test: 127.0.0.1}}\n    allow_cidrs: [127.0.0.0/8]\n    limits: {{wall_seconds: 20, memory: 1G, tasks: 64}}\n    mcp:\n      image: {r}\n      command: [/usr/bin/node, /app/fetch-server.js]\n"
        ),
    )
    .unwrap();
    let c = serve(&store, &m, &work.join("audit.jsonl")).await;
    let call = |url: String| {
        let mut p = CallToolRequestParams::new("jira__get".to_owned());
        p.arguments = serde_json::json!({ "url": url }).as_object().cloned();
        p
    };
    let body = |r: &cordon_mcp::rmcp::model::CallToolResult| -> String {
        r.content
            .iter()
            .filter_map(|x| x.as_text().map(|t| t.text.clone()))
            .collect()
    };
    let ok = c
        .peer()
        .call_tool(call(format!("http://api.test:{port}/issues")))
        .await
        .unwrap();
    assert!(
        body(&ok).contains("HTTP 200: upstream-marker"),
        "{}",
        body(&ok)
    );
    let denied = c
        .peer()
        .call_tool(call(format!("http://other.test:{port}/")))
        .await
        .unwrap();
    assert!(
        body(&denied).contains("HTTP 403")
            && body(&denied).contains("refused: not in the allowlist of jira"),
        "{}",
        body(&denied)
    );
    assert!(!body(&denied).contains("upstream-marker"));
    let _ = c.cancel().await;
}

/// `cordon serve -m manifest` on the store, with an rmcp client connected.
async fn serve(
    store: &Path,
    manifest: &Path,
    audit: &Path,
) -> cordon_mcp::rmcp::service::RunningService<cordon_mcp::rmcp::RoleClient, ()> {
    cordon_testkit::serve::Serve::manifest(CORDON, manifest, audit)
        .env("CORDON_STORE", store)
        .stdio((), Stdio::inherit())
        .await
}
