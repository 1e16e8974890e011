//! The C-call path of `set_external_logger`: a real C variadic logger (built
//! with the system C compiler and loaded with dlopen) receives hetccl's
//! messages through "%s". Skipped when no C compiler is available.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::process::Command;

use hetccl_core::obs::{self, NcclLogger};

const LOGGER_C: &str = r#"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
static char text[65536];
static char last_file[512];
static int count, last_level, last_line;
static unsigned long last_flags;
void test_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char tmp[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  count++; last_level = level; last_flags = flags; last_line = line;
  snprintf(last_file, sizeof last_file, "%s", file);
  strncat(text, tmp, sizeof text - strlen(text) - 2);
  strcat(text, "\n");
}
const char* test_text(void) { return text; }
const char* test_file(void) { return last_file; }
int test_count(void) { return count; }
int test_level(void) { return last_level; }
int test_line(void) { return last_line; }
unsigned long test_flags(void) { return last_flags; }
"#;

struct CLib(*mut c_void);

impl CLib {
    fn sym(&self, name: &str) -> *mut c_void {
        let name = CString::new(name).expect("symbol name");
        // SAFETY: a live handle from dlopen and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        assert!(!p.is_null(), "missing symbol {name:?}");
        p
    }
    fn int(&self, name: &str) -> c_int {
        // SAFETY: the symbol is a C function `int f(void)`.
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> c_int>(self.sym(name))() }
    }
    fn flags(&self) -> c_ulong {
        // SAFETY: `unsigned long test_flags(void)`.
        unsafe {
            std::mem::transmute::<*mut c_void, extern "C" fn() -> c_ulong>(self.sym("test_flags"))()
        }
    }
    fn string(&self, name: &str) -> String {
        // SAFETY: `const char* f(void)` returning a static NUL-terminated buffer.
        unsafe {
            let f = std::mem::transmute::<*mut c_void, extern "C" fn() -> *const c_char>(
                self.sym(name),
            );
            CStr::from_ptr(f()).to_string_lossy().into_owned()
        }
    }
}

fn build_logger() -> Option<CLib> {
    let dir = std::env::temp_dir().join(format!("hetccl-clogger-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("logger.c");
    let lib = dir.join("liblogger.so");
    std::fs::write(&src, LOGGER_C).ok()?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .ok()?;
    if !status.success() {
        return None;
    }
    let path = CString::new(lib.to_string_lossy().into_owned()).ok()?;
    // SAFETY: a NUL-terminated path to a library we just built.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    (!handle.is_null()).then_some(CLib(handle))
}

#[test]
fn c_logger_receives_messages_through_percent_s() {
    let Some(lib) = build_logger() else {
        eprintln!("skipped: no C compiler to build the test logger");
        return;
    };
    std::env::set_var("NCCL_DEBUG", "INFO");
    std::env::set_var("NCCL_DEBUG_SUBSYS", "INIT");
    std::env::remove_var("NCCL_DEBUG_FILE");
    obs::ensure_init();
    assert!(obs::owns_global_subscriber());

    // SAFETY: test_logger has exactly the ncclDebugLogger_t signature.
    let logger = unsafe { std::mem::transmute::<*mut c_void, NcclLogger>(lib.sym("test_logger")) };
    obs::set_external_logger(Some(logger));
    assert!(obs::has_external_logger());

    // NET is not in NCCL_DEBUG_SUBSYS, but NCCL filters forwarded lines itself.
    tracing::info!(target: "hetccl::NET", "100%s sure %n %d");
    assert_eq!(lib.int("test_count"), 1);
    assert_eq!(lib.int("test_level"), 3);
    assert_eq!(lib.flags(), 0x10);
    assert!(lib.int("test_line") > 0);
    assert!(lib.string("test_file").ends_with("external_logger.rs"));

    tracing::warn!(target: "hetccl::INIT", "careful");
    assert_eq!(lib.int("test_level"), 2);
    assert_eq!(lib.flags(), c_ulong::MAX);
    tracing::debug!(target: "hetccl::INIT", "below the level");
    assert_eq!(lib.int("test_count"), 2);
    assert_eq!(
        lib.string("test_text"),
        "hetccl: 100%s sure %n %d\nhetccl: careful\n"
    );

    obs::set_external_logger(None);
    assert!(!obs::has_external_logger());
    tracing::info!(target: "hetccl::NET", "filtered by us again");
    assert_eq!(lib.int("test_count"), 2);
}
