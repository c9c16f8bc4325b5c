//! Embeds the web view's graph layout library: dagre's browser bundle, which `cargo xtask setup`
//! installs from the npm registry (`xtask/src/setup/ui.rs`), copied into `OUT_DIR` behind its licence
//! text, where `src/ui/server.rs` includes it. The binary serves it itself: no CDN, no network at
//! run time.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=NETWORK_ENFORCER_NODE_MODULES");
    println!("cargo:rerun-if-env-changed=HOME");
    let modules = match std::env::var_os("NETWORK_ENFORCER_NODE_MODULES") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/network-enforcer/ui/node_modules")
        }
    };
    // The version `cargo xtask setup` installs (xtask/src/setup/ui.rs); the web view's browser test
    // measures the layout with it.
    const DAGRE_VERSION: &str = "3.1.3";
    let manifest = modules.join("@dagrejs/dagre/package.json");
    let bundle = modules.join("@dagrejs/dagre/dist/dagre.min.js");
    // The bundle's licence notices (dagre's, as a comment), and graphlib's, which the bundle holds.
    let legal = modules.join("@dagrejs/dagre/dist/dagre.min.js.LEGAL.txt");
    let graphlib = modules.join("@dagrejs/graphlib/LICENSE");
    for path in [&manifest, &bundle, &legal, &graphlib] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).unwrap_or_else(|error| {
            eprintln!(
                "error: the web view's graph layout library is missing: {}: {error} (run `cargo \
                 xtask setup`, which installs it from the npm registry, or point \
                 NETWORK_ENFORCER_NODE_MODULES at a node_modules that holds @dagrejs/dagre)",
                path.display()
            );
            std::process::exit(1);
        })
    };
    let version = format!("\"version\": \"{DAGRE_VERSION}\"");
    if !read(&manifest).contains(&version) {
        eprintln!(
            "error: {} is not @dagrejs/dagre {DAGRE_VERSION} (run `cargo xtask setup`)",
            manifest.display()
        );
        std::process::exit(1);
    }
    // Served without its source map (the page would ask for a file nobody serves).
    let code: String = read(&bundle)
        .lines()
        .filter(|line| !line.starts_with("//# sourceMappingURL="))
        .collect::<Vec<_>>()
        .join("\n");
    // MIT: the notices travel with every copy, so with the served file.
    let embedded = format!(
        "{}\n/*! @dagrejs/graphlib (bundled)\n{}\n*/\n{}",
        read(&legal),
        read(&graphlib).replace("*/", "* /"),
        code
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("dagre.min.js"), embedded).expect("writing dagre.min.js into OUT_DIR");
}
