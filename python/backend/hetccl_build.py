"""Builds hetccl's platform wheel with the standard library only.

Used two ways:
  - as the PEP 517 backend named in pyproject.toml (`pip wheel .`,
    `pip install .`); the cargo profile comes from the config setting
    `profile` (`--config-settings profile=dev`) or $HETCCL_WHEEL_PROFILE,
    default release;
  - as a script, through scripts/wheel.sh:
    python3 python/backend/hetccl_build.py [--profile P] [--no-build] [--out DIR]

What goes in and why is in docs/packaging.md. In short: cargo builds
libhetccl.so and hetccl-perf; two small ELF shims named libnccl-net-hetccl.so
and libnccl.so.2, which only declare a dependency on libhetccl.so next to
them, stand in for the links a wheel cannot hold; the platform tag is derived
from the highest GLIBC_ symbol version the ELF files need (readelf -V).
"""

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Libraries a manylinux wheel may need from the system (PEP 600 / auditwheel's
# policy: glibc's own libraries and libgcc_s), plus libhetccl.so for the shims.
ALLOWED_NEEDED = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libutil.so.1",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "libhetccl.so",
}

# readelf -h "Machine:" -> wheel architecture.
MACHINES = {
    "Advanced Micro Devices X86-64": "x86_64",
    "AArch64": "aarch64",
}


class BuildError(RuntimeError):
    """The wheel cannot be built (or would not be what its tag says)."""


def _log(msg):
    sys.stderr.write("hetccl-wheel: %s\n" % msg)
    sys.stderr.flush()


def _toml(path):
    import tomllib  # Python >= 3.11: building needs it, installing does not.

    with open(path, "rb") as f:
        return tomllib.load(f)


def project():
    """pyproject.toml's [project], with the version from Cargo.toml
    ([workspace.package] version: one version for crates and wheel)."""
    meta = dict(_toml(os.path.join(ROOT, "pyproject.toml"))["project"])
    meta["version"] = _toml(os.path.join(ROOT, "Cargo.toml"))["workspace"]["package"]["version"]
    return meta


# ---------------------------------------------------------------- cargo


def profile_dir(profile):
    """cargo's output directory for `profile`."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    return os.path.join(target, "debug" if profile == "dev" else profile)


def cargo_build(profile):
    cmd = ["cargo", "build", "--locked", "--profile", profile, "-p", "hetccl", "-p", "hetccl-perf"]
    _log("$ " + " ".join(cmd))
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=sys.stderr)
    _log("cargo build took %.0f s" % (time.monotonic() - t0))


# ---------------------------------------------------------------- shims


def build_shim(cc, lib_dir, name, out, origin):
    """An ELF shared object `name` whose only content is DT_NEEDED
    libhetccl.so and DT_RPATH `origin`: the dynamic linker loads the real
    libhetccl.so (one copy, whatever name it was asked for) and dlsym on the
    shim's handle searches its dependencies, so every hetccl symbol resolves
    through it."""
    cmd = [
        cc, "-shared", "-nostdlib", "-x", "c", os.devnull, "-o", out,
        "-Wl,--no-as-needed", "-L" + lib_dir, "-l:libhetccl.so",
        "-Wl,--disable-new-dtags", "-Wl,-rpath," + origin,
        "-Wl,-soname," + name, "-Wl,-z,noexecstack",
    ]
    subprocess.run(cmd, check=True)


# ---------------------------------------------------------------- ELF checks


def _readelf(*args):
    r = subprocess.run(
        ["readelf", "-W"] + list(args), check=True, capture_output=True, text=True
    )
    return r.stdout


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def elf_needed(path):
    """DT_NEEDED entries."""
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf("-d", path))


# The newest libgcc_s symbol version every manylinux policy (2014 and
# later) allows.
GCC_MAX = (4, 8, 0)


def _needs(path, prefix):
    """The `prefix`x.y[.z] versions in the version-needs section, as tuples."""
    text = _readelf("-V", path)
    m = re.search(r"Version needs section.*?(?=\n\S|\Z)", text, re.S)
    if not m:
        return []
    names = re.findall(r"Name: (%s[0-9A-Z_.]+)" % prefix, m.group(0))
    bad = [n for n in names if not re.fullmatch(r"%s\d+(\.\d+)+" % prefix, n)]
    if bad:
        raise BuildError("%s needs %s: not a public version" % (path, ", ".join(bad)))
    return [tuple(int(x) for x in n[len(prefix):].split(".")) for n in names]


def elf_glibc_needs(path):
    """The GLIBC_x.y[.z] versions `path` needs, as tuples; fails on a
    libgcc_s version newer than every manylinux policy allows."""
    gcc = _needs(path, "GCC_")
    if gcc and max(gcc) > GCC_MAX:
        raise BuildError(
            "%s needs GCC_%s from libgcc_s, newer than manylinux allows (GCC_%s)"
            % (path, ".".join(map(str, max(gcc))), ".".join(map(str, GCC_MAX)))
        )
    return _needs(path, "GLIBC_")


def elf_arch(path):
    m = re.search(r"Machine:\s+(.+)", _readelf("-h", path))
    machine = m.group(1).strip() if m else "?"
    if machine not in MACHINES:
        raise BuildError("%s: unsupported machine %r" % (path, machine))
    return MACHINES[machine]


def platform_tag(elf_files):
    """manylinux_<major>_<minor>_<arch> from the highest GLIBC_ version any
    of `elf_files` needs (as auditwheel derives it), after checking that
    they need no library outside glibc and libgcc_s."""
    archs, versions = set(), [(2, 17)]  # manylinux2014's floor
    for path in elf_files:
        extra = [n for n in elf_needed(path) if n not in ALLOWED_NEEDED]
        if extra:
            raise BuildError(
                "%s needs %s, which a manylinux system need not have"
                % (path, ", ".join(extra))
            )
        archs.add(elf_arch(path))
        versions.extend(elf_glibc_needs(path))
    if len(archs) != 1:
        raise BuildError("mixed architectures: %s" % sorted(archs))
    major, minor = max(versions)[:2]
    return "manylinux_%d_%d_%s" % (major, minor, archs.pop())


# ---------------------------------------------------------------- wheel


def _metadata(meta):
    lines = [
        "Metadata-Version: 2.1",
        "Name: %s" % meta["name"],
        "Version: %s" % meta["version"],
        "Summary: %s" % meta["description"],
    ]
    if "requires-python" in meta:
        lines.append("Requires-Python: %s" % meta["requires-python"])
    lic = meta.get("license")
    if isinstance(lic, dict) and "text" in lic:
        lines.append("License: %s" % lic["text"])
    for c in meta.get("classifiers", []):
        lines.append("Classifier: %s" % c)
    for k, v in sorted(meta.get("urls", {}).items()):
        lines.append("Project-URL: %s, %s" % (k, v))
    body = meta.get("x-long-description", "")
    if body:
        lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + body


def _entry_points(meta):
    out = "[console_scripts]\n"
    for name, target in sorted(meta.get("scripts", {}).items()):
        out += "%s = %s\n" % (name, target)
    return out


def _record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _date_time():
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # 1980-01-01
    return time.gmtime(max(epoch, 315532800))[:6]


def write_wheel(out_dir, meta, tag, files):
    """Writes the wheel; `files` maps archive names to (source path, mode)."""
    dist = "%s-%s" % (meta["name"].replace("-", "_"), meta["version"])
    name = "%s-py3-none-%s.whl" % (dist, tag)
    info = dist + ".dist-info"
    extra = {
        info + "/METADATA": _metadata(meta).encode(),
        info + "/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: hetccl_build\nRoot-Is-Purelib: false\n"
            "Tag: py3-none-%s\n" % tag
        ).encode(),
        info + "/entry_points.txt": _entry_points(meta).encode(),
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    tmp = path + ".part"
    when = _date_time()
    record = io.StringIO()
    rec = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:

        def put(arcname, data, mode):
            zi = zipfile.ZipInfo(arcname, when)
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            rec.writerow([arcname, _record_hash(data), len(data)])

        for arcname in sorted(files):
            src, mode = files[arcname]
            with open(src, "rb") as f:
                put(arcname, f.read(), mode)
        for arcname in sorted(extra):
            put(arcname, extra[arcname], 0o644)
        rec.writerow([info + "/RECORD", "", ""])
        zi = zipfile.ZipInfo(info + "/RECORD", when)
        zi.external_attr = 0o100644 << 16
        z.writestr(zi, record.getvalue(), zipfile.ZIP_DEFLATED)
    os.replace(tmp, path)
    return path


def build(out_dir, profile="release", do_build=True):
    """Builds (unless `do_build` is False) and packs the wheel; returns its
    path."""
    meta = project()
    if isinstance(meta.get("readme"), str):
        with open(os.path.join(ROOT, meta["readme"]), encoding="utf-8") as f:
            meta["x-long-description"] = f.read()
    if do_build:
        cargo_build(profile)
    pdir = profile_dir(profile)
    lib = os.path.join(pdir, "libhetccl.so")
    perf = os.path.join(pdir, "hetccl-perf")
    for p in (lib, perf):
        if not os.path.isfile(p):
            raise BuildError("%s is missing; build with cargo --profile %s" % (p, profile))
    files = {}
    pkg = os.path.join(ROOT, "python", "hetccl")
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py"):
            files["hetccl/" + fn] = (os.path.join(pkg, fn), 0o644)
    files["hetccl/lib/libhetccl.so"] = (lib, 0o755)
    files["hetccl/bin/hetccl-perf"] = (perf, 0o755)
    files["hetccl/include/hetccl.h"] = (os.path.join(ROOT, "include", "hetccl.h"), 0o644)
    with tempfile.TemporaryDirectory(prefix="hetccl-wheel-") as tmp:
        cc = os.environ.get("CC", "cc")
        shutil.copy(lib, os.path.join(tmp, "libhetccl.so"))
        net = os.path.join(tmp, "libnccl-net-hetccl.so")
        os.mkdir(os.path.join(tmp, "nccl"))
        nccl = os.path.join(tmp, "nccl", "libnccl.so.2")
        build_shim(cc, tmp, "libnccl-net-hetccl.so", net, "$ORIGIN")
        build_shim(cc, tmp, "libnccl.so.2", nccl, "$ORIGIN/..")
        files["hetccl/lib/libnccl-net-hetccl.so"] = (net, 0o755)
        files["hetccl/lib/nccl/libnccl.so.2"] = (nccl, 0o755)
        elves = [src for src, _ in files.values() if is_elf(src)]
        tag = platform_tag(elves)
        _log("platform tag %s (highest GLIBC_ version needed by %d ELF files)" % (tag, len(elves)))
        path = write_wheel(out_dir, meta, tag, files)
    _log("wrote %s (%.1f MiB)" % (path, os.path.getsize(path) / 2**20))
    return path


# ---------------------------------------------------------------- PEP 517


def _profile(config_settings):
    p = (config_settings or {}).get("profile") or os.environ.get("HETCCL_WHEEL_PROFILE")
    return p or "release"


def get_requires_for_build_wheel(config_settings=None):
    """PEP 517: nothing beyond the standard library (and cargo, cc, readelf)."""
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 517: builds the wheel into `wheel_directory`; returns its name."""
    return os.path.basename(build(wheel_directory, profile=_profile(config_settings)))


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description="Build hetccl's wheel.")
    p.add_argument("--profile", default=os.environ.get("HETCCL_WHEEL_PROFILE", "release"),
                   help="cargo profile (default release; dev for a quick test wheel)")
    p.add_argument("--no-build", action="store_true", help="pack what cargo already built")
    p.add_argument("--out", default=os.path.join(ROOT, "dist"), help="output directory")
    a = p.parse_args(argv)
    try:
        print(build(a.out, profile=a.profile, do_build=not a.no_build))
    except (BuildError, subprocess.CalledProcessError) as e:
        _log("error: %s" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
