//! The dynamic symbol surface of `libhetccl.so` (`nm -D --defined-only`,
//! `readelf -d`): what a drop-in replacement for NVIDIA's libnccl.so.2 must
//! export for PyTorch, nccl-tests and NCCL's own plugin loader.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use hetccl_testkit::{cc, hetccl_so};

/// The `nccl*` symbols PyTorch's libtorch_cuda.so imports (a fact list,
/// copied from the shared reference).
const TORCH_IMPORTS: &str = include_str!("data/torch-nccl-imports.txt");

/// Beyond PyTorch's imports: nccl-tests' `ncclCommCuDevice` and the 2.32
/// per-collective config variants.
const EXTRA_FUNCTIONS: [&str; 9] = [
    "ncclCommCuDevice",
    "ncclAllReduceConfig",
    "ncclBroadcastConfig",
    "ncclReduceConfig",
    "ncclAllGatherConfig",
    "ncclReduceScatterConfig",
    "ncclAlltoAllConfig",
    "ncclGatherConfig",
    "ncclScatterConfig",
];

/// The net plugin tables NCCL's loader looks up by name.
const NET_PLUGIN_TABLES: [&str; 7] = [
    "ncclNetPlugin_v6",
    "ncclNetPlugin_v7",
    "ncclNetPlugin_v8",
    "ncclNetPlugin_v9",
    "ncclNetPlugin_v10",
    "ncclNetPlugin_v11",
    "ncclNetPlugin_v12",
];

/// The profiler plugin tables NCCL's loader looks up by name.
const PROFILER_TABLES: [&str; 2] = ["ncclProfiler_v5", "ncclProfiler_v6"];
/// The tuner plugin tables NCCL's tuner loader looks up (v6 first).
const TUNER_PLUGIN_TABLES: [&str; 4] = [
    "ncclTunerPlugin_v3",
    "ncclTunerPlugin_v4",
    "ncclTunerPlugin_v5",
    "ncclTunerPlugin_v6",
];

fn torch_imports() -> Vec<&'static str> {
    TORCH_IMPORTS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Defined dynamic symbols of `so`: name (without `@version`) -> nm type letter.
fn defined_dynamic_symbols(so: &Path) -> BTreeMap<String, char> {
    let out = cc::run_ok(
        Command::new(cc::tool("nm"))
            .args(["-D", "--defined-only"])
            .arg(so),
    );
    let text = String::from_utf8(out.stdout).expect("nm prints UTF-8");
    let mut syms = BTreeMap::new();
    for line in text.lines() {
        // "<address> <type> <name>"
        let mut it = line.split_whitespace();
        let (Some(_addr), Some(ty), Some(name)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        let ty = ty.chars().next().expect("nm type letter");
        syms.insert(name.to_string(), ty);
    }
    assert!(
        !syms.is_empty(),
        "nm listed no symbols in {}:\n{text}",
        so.display()
    );
    syms
}

/// Checks that each name is defined with one of `types`; returns the failures.
fn check(syms: &BTreeMap<String, char>, names: &[String], types: &[char]) -> Vec<String> {
    names
        .iter()
        .filter_map(|n| match syms.get(n) {
            None => Some(format!("  {n}: not exported")),
            Some(t) if !types.contains(t) => Some(format!(
                "  {n}: exported as type {t}, want one of {types:?}"
            )),
            Some(_) => None,
        })
        .collect()
}

#[test]
fn torch_import_list_is_intact() {
    let names = torch_imports();
    assert_eq!(names.len(), 51, "tests/data/torch-nccl-imports.txt changed");
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "duplicate names");
    assert!(names.iter().all(|n| n.starts_with("nccl")), "{names:?}");
}

#[test]
fn nccl_functions_and_pnccl_twins_are_exported() {
    let so = hetccl_so();
    let syms = defined_dynamic_symbols(&so);
    let mut want: Vec<String> = Vec::new();
    for n in torch_imports().into_iter().chain(EXTRA_FUNCTIONS) {
        want.push(n.to_string());
        want.push(format!("p{n}"));
    }
    let bad = check(&syms, &want, &['T']);
    assert!(
        bad.is_empty(),
        "{} of {} required functions are missing or not functions (type T) in {}:\n{}",
        bad.len(),
        want.len(),
        so.display(),
        bad.join("\n")
    );
}

#[test]
fn net_plugin_tables_are_exported_as_data() {
    let so = hetccl_so();
    let syms = defined_dynamic_symbols(&so);
    let want: Vec<String> = NET_PLUGIN_TABLES
        .iter()
        .chain(&PROFILER_TABLES)
        .map(|s| s.to_string())
        .collect();
    let bad = check(&syms, &want, &['D', 'R']);
    assert!(
        bad.is_empty(),
        "plugin tables missing or not data objects (type D/R) in {}:\n{}",
        so.display(),
        bad.join("\n")
    );
}

#[test]
fn tuner_plugin_tables_are_exported_as_data() {
    let so = hetccl_so();
    let syms = defined_dynamic_symbols(&so);
    let want: Vec<String> = TUNER_PLUGIN_TABLES.iter().map(|s| s.to_string()).collect();
    let bad = check(&syms, &want, &['D', 'R']);
    assert!(
        bad.is_empty(),
        "tuner plugin tables missing or not data objects (type D/R) in {}:\n{}",
        so.display(),
        bad.join("\n")
    );
}

#[test]
fn soname_is_libhetccl() {
    let so = hetccl_so();
    let out = cc::run_ok(Command::new(cc::tool("readelf")).arg("-d").arg(&so));
    let text = String::from_utf8(out.stdout).expect("readelf prints UTF-8");
    let sonames: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(SONAME)"))
        .filter_map(|l| {
            l.split_once('[')
                .and_then(|(_, r)| r.split_once(']'))
                .map(|(s, _)| s)
        })
        .collect();
    assert_eq!(
        sonames,
        ["libhetccl.so"],
        "readelf -d {}:\n{text}",
        so.display()
    );
}
