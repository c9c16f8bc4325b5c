//! The image Dockerfiles (`docker/*.Dockerfile`), parsed. Every end-to-end test runs images built from
//! them with buildah (`network_enforcer_tests::buildah`), but with a local Debian base and a prebuilt
//! binary, as nothing can be pulled here; this checks what a user's default build depends on: multi-stage builds whose runtime stage is a minimal image, the controller
//! running as a non-root user, the agent's build stage installing the same eBPF toolchain as
//! `cargo xtask setup` (xtask/src/setup/ebpf.rs), locked release builds of the binary the chart runs, and
//! entrypoints at the path the chart's `command` finds on PATH.

use std::path::Path;

/// One instruction, continuation lines joined.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

/// One `FROM ... AS name` stage and its instructions.
#[derive(Debug)]
struct Stage {
    base: String,
    name: Option<String>,
    instructions: Vec<Instruction>,
}

struct Dockerfile {
    /// `ARG`s before the first FROM, with their defaults.
    global_args: Vec<(String, String)>,
    stages: Vec<Stage>,
}

fn parse(text: &str) -> Dockerfile {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(body) = trimmed.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            logical.push(std::mem::take(&mut current));
        }
    }
    assert!(current.is_empty(), "dangling line continuation");
    let mut file = Dockerfile {
        global_args: Vec::new(),
        stages: Vec::new(),
    };
    for line in logical.into_iter().filter(|l| !l.trim().is_empty()) {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let keyword = keyword.to_ascii_uppercase();
        let args = args.split_whitespace().collect::<Vec<_>>().join(" ");
        if keyword == "FROM" {
            let words: Vec<&str> = args.split(' ').collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                [_] => None,
                other => panic!("unexpected FROM {other:?}"),
            };
            file.stages.push(Stage {
                base: words[0].to_string(),
                name,
                instructions: Vec::new(),
            });
        } else if let Some(stage) = file.stages.last_mut() {
            stage.instructions.push(Instruction { keyword, args });
        } else {
            assert_eq!(keyword, "ARG", "only ARG may precede FROM");
            let (k, v) = args.split_once('=').expect("global ARGs have defaults");
            file.global_args.push((k.to_string(), v.to_string()));
        }
    }
    file
}

fn load(name: &str) -> Dockerfile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docker")
        .join(name);
    parse(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

impl Dockerfile {
    fn stage(&self, name: &str) -> &Stage {
        self.stages
            .iter()
            .find(|s| s.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no stage {name}"))
    }

    fn runtime(&self) -> &Stage {
        let last = self.stages.last().expect("at least one stage");
        assert_eq!(
            last.name.as_deref(),
            Some("runtime"),
            "the last stage is the runtime"
        );
        last
    }

    /// A base image reference with `${ARG}` replaced by the global default (defaults may name
    /// earlier ARGs).
    fn resolve(&self, base: &str) -> String {
        let mut out = base.to_string();
        for _ in 0..self.global_args.len() {
            for (k, v) in &self.global_args {
                out = out.replace(&format!("${{{k}}}"), v);
            }
        }
        assert!(!out.contains('$'), "unresolved {base}");
        out
    }
}

impl Stage {
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter(|i| i.keyword == keyword)
            .map(|i| i.args.as_str())
            .collect()
    }

    fn last(&self, keyword: &str) -> Option<&str> {
        self.all(keyword).last().copied()
    }

    fn runs(&self) -> String {
        self.all("RUN").join("\n")
    }
}

/// What both images share: a build stage with a locked release build of `binary`, copied into a
/// distroless runtime stage at /usr/local/bin (on PATH: the chart's `command` is the bare name), with
/// an exec-form entrypoint and `run` as the default command.
fn check_common(file: &Dockerfile, binary: &str, extra_copies: &[&str]) {
    assert!(file.stages.len() >= 2, "multi-stage");
    let build = file.stage("build");
    let runs = build.runs();
    assert!(
        runs.contains(&format!(
            "cargo build --locked --release --package {binary} --bin {binary}"
        )),
        "{runs}"
    );
    assert!(
        build.all("COPY").contains(&". ."),
        "the build copies the workspace"
    );

    assert_eq!(
        file.resolve(&file.stages[0].base),
        format!(
            "docker.io/library/rust:{}-bookworm",
            file.resolve("${RUST_VERSION}")
        ),
        "users' builds compile in the Rust image"
    );
    // The binary comes from `build` unless BINARY=prebuilt takes one from the build context.
    assert_eq!(file.resolve("${BINARY}"), "build");
    assert_eq!(file.resolve(&file.stage("binary").base), "build");
    assert_eq!(file.stage("binary").base, "${BINARY}");
    let prebuilt = file.stage("prebuilt");
    assert_eq!(prebuilt.base, "scratch");
    assert_eq!(
        prebuilt.all("COPY"),
        [format!("prebuilt/{binary} /out/{binary}").as_str()]
    );

    let runtime = file.runtime();
    let base = file.resolve(&runtime.base);
    assert!(
        base.starts_with("gcr.io/distroless/cc-debian12"),
        "minimal runtime: {base}"
    );
    assert!(
        runtime.all("RUN").is_empty(),
        "nothing runs in the runtime stage (no shell)"
    );
    let copies = runtime.all("COPY");
    let binary_copy = format!("--from=binary /out/{binary} /usr/local/bin/{binary}");
    let mut expected = vec![binary_copy.as_str()];
    expected.extend_from_slice(extra_copies);
    assert_eq!(copies, expected);
    assert_eq!(
        runtime.last("ENTRYPOINT"),
        Some(format!("[\"/usr/local/bin/{binary}\"]").as_str())
    );
    assert_eq!(runtime.last("CMD"), Some("[\"run\"]"));
    // The Rust image of the build matches the workspace's toolchain era (rust-version 1.87 or newer).
    let rust = file
        .global_args
        .iter()
        .find(|(k, _)| k == "RUST_VERSION")
        .map(|(_, v)| v.clone())
        .expect("RUST_VERSION");
    let minor: u32 = rust.strip_prefix("1.").unwrap().parse().unwrap();
    assert!(minor >= 87, "RUST_VERSION {rust}");
}

#[test]
fn controller_image_is_multi_stage_distroless_and_non_root() {
    let file = load("controller.Dockerfile");
    check_common(&file, "network-enforcer-controller", &[]);
    let runtime = file.runtime();
    let base = file.resolve(&runtime.base);
    assert!(base.ends_with(":nonroot"), "{base}");
    // The chart's runAsUser (values.yaml controller.securityContext).
    assert_eq!(runtime.last("USER"), Some("65532:65532"));
    let expose: Vec<&str> = runtime.all("EXPOSE");
    assert_eq!(expose, ["9443 8080"]);
    // No eBPF toolchain in the controller's build.
    assert!(!file.stage("build").runs().contains("bpf-linker"));
}

#[test]
fn agent_image_builds_with_the_setup_ebpf_toolchain() {
    let file = load("agent.Dockerfile");
    // nft and its libraries, for NetworkPolicy enforcement.
    check_common(&file, "network-enforcer-agent", &["--from=nft /out/ /"]);
    let names: Vec<&str> = file
        .stages
        .iter()
        .filter_map(|s| s.name.as_deref())
        .collect();
    assert_eq!(
        names,
        [
            "ebpf-toolchain",
            "build",
            "prebuilt",
            "binary",
            "nft",
            "runtime"
        ]
    );
    assert!(
        file.stage("nft")
            .runs()
            .contains("install -y --no-install-recommends nftables")
    );
    assert_eq!(file.stage("build").base, "ebpf-toolchain");

    let toolchain = file.stage("ebpf-toolchain");
    let runs = toolchain.runs();
    // The same packages, linker version and rustup link as xtask/src/setup/ebpf.rs.
    let setup = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/src/setup/ebpf.rs"),
    )
    .unwrap();
    for package in [
        "rustc-web",
        "cargo-web",
        "libstd-rust-web-dev-bpf",
        "llvm-22-dev",
    ] {
        assert!(
            setup.contains(&format!("\"{package}\"")),
            "setup installs {package}"
        );
        assert!(runs.contains(package), "the image installs {package}");
    }
    let linker = toolchain
        .all("ARG")
        .into_iter()
        .find_map(|a| a.strip_prefix("BPF_LINKER_VERSION="))
        .expect("BPF_LINKER_VERSION");
    assert!(
        setup.contains(&format!("BPF_LINKER_VERSION: &str = \"{linker}\"")),
        "bpf-linker {linker} as in setup"
    );
    assert!(runs.contains("--features llvm-22"), "{runs}");
    assert!(
        toolchain
            .all("ENV")
            .contains(&"LLVM_PREFIX=/usr/lib/llvm-22")
    );
    assert!(setup.contains("const LLVM_PREFIX: &str = \"/usr/lib/llvm-22\""));
    assert!(
        runs.contains("rustup toolchain link debian-bpf /usr"),
        "{runs}"
    );
    assert!(setup.contains("pub const TOOLCHAIN: &str = \"debian-bpf\""));
    let config = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cargo/config.toml"),
    )
    .unwrap();
    assert!(config.contains("AYA_BUILD_TOOLCHAIN = \"debian-bpf\""));

    // Root in the image; the chart grants only BPF, PERFMON, NET_ADMIN on top.
    assert_eq!(file.runtime().last("USER"), Some("0:0"));
    assert_eq!(file.runtime().all("EXPOSE"), ["9464"]);
}

#[test]
fn build_context_leaves_out_target_and_git() {
    let ignore =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.dockerignore"))
            .unwrap();
    let entries: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(entries.contains(&"target/"), "{entries:?}");
    assert!(entries.contains(&".git/"), "{entries:?}");
}

#[test]
fn parser_joins_continuations_and_rejects_garbage() {
    let file = parse(
        "ARG X=1\nFROM a:${X} AS one\nRUN echo \\\n  two\n# comment\nFROM one AS runtime\nCMD [\"run\"]\n",
    );
    assert_eq!(file.stages.len(), 2);
    assert_eq!(file.resolve(&file.stages[0].base), "a:1");
    assert_eq!(file.stages[0].runs(), "echo two");
    assert_eq!(file.runtime().last("CMD"), Some("[\"run\"]"));
    let bad = std::panic::catch_unwind(|| parse("RUN x\n"));
    assert!(bad.is_err(), "an instruction before FROM is refused");
}
