"""The installed wheel, exercised without a Rust toolchain.

Run by scripts/wheel-test.sh with the virtual environment's python, after
`pip install` of the wheel into that fresh environment, with PATH holding
only the environment's bin/, /usr/bin and /bin. Inputs, from the
environment:
  HETCCL_TEST_WHEEL      the wheel file that was installed
  HETCCL_TEST_INTERPOSE  tests/c/interpose.c, built against NVIDIA's nccl.h
                         and linked to NVIDIA's libnccl.so.2 (RUNPATH)
  HETCCL_TEST_NVIDIA_LIB the directory of NVIDIA's libnccl.so.2
  HETCCL_TEST_FAKE_CUDA  a directory holding the emulated CUDA driver
                         (tests/c/fake_cuda*.c) as libcuda.so.1

Expected values come from the files on disk (the site-packages directory,
readelf/objdump, the interfaces the kernel lists), not from the package
under test.
"""

import ctypes
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(sysconfig.get_paths()["platlib"], "hetccl")
LIB = os.path.join(PKG, "lib", "libhetccl.so")
LIB_DIR = os.path.join(PKG, "lib")
NVIDIA_VERSION = "23203"  # NCCL_VERSION_CODE of NVIDIA's 2.32.3 wheel
HETCCL_VERSION = "22800"  # NCCL_VERSION(2, 28, 0)
TIMEOUT_S = 300


def clean_env(**extra):
    """This process's environment without anything that steers NCCL or the
    dynamic linker, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")
        and not k.startswith(("NCCL_", "HETCCL_", "FAKE_CUDA_"))
    }
    env.update(extra)
    return env


def run(cmd, env=None, check=True, **kw):
    p = subprocess.run(
        cmd,
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        **kw,
    )
    if check and p.returncode != 0:
        raise AssertionError(
            "%r exited %d\nstdout:\n%s\nstderr:\n%s" % (cmd, p.returncode, p.stdout, p.stderr)
        )
    return p


def kv(text):
    out = {}
    for line in text.splitlines():
        if line.strip():
            k, _, v = line.partition(" ")
            out[k] = v
    return out


def same(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


class Toolchain(unittest.TestCase):
    def test_no_rust_toolchain_on_path(self):
        for tool in ("cargo", "rustc", "rustup"):
            self.assertIsNone(shutil.which(tool), "%s is reachable: PATH=%s" % (tool, os.environ["PATH"]))

    def test_installed_files(self):
        for rel in (
            "lib/libhetccl.so",
            "lib/libnccl-net-hetccl.so",
            "lib/nccl/libnccl.so.2",
            "bin/hetccl-perf",
            "include/hetccl.h",
        ):
            self.assertTrue(os.path.isfile(os.path.join(PKG, rel)), rel)
        self.assertTrue(os.access(os.path.join(PKG, "bin/hetccl-perf"), os.X_OK))
        for script in ("hetccl-run", "hetccl", "hetccl-perf"):
            self.assertTrue(same(shutil.which(script), os.path.join(sys.prefix, "bin", script)), script)

    def test_platform_tag_is_the_highest_glibc_version_needed(self):
        # objdump -T here, readelf -V in the builder: two readings of the
        # same symbol versions.
        versions = []
        for d, _, names in os.walk(PKG):
            for n in names:
                p = os.path.join(d, n)
                if is_elf(p):
                    out = run(["objdump", "-T", p]).stdout
                    versions += [
                        tuple(int(x) for x in v.split("."))
                        for v in re.findall(r"\(GLIBC_(\d+(?:\.\d+)+)\)", out)
                    ]
        self.assertTrue(versions)
        major, minor = max(versions)[:2]
        arch = {"x86_64": "x86_64", "aarch64": "aarch64"}[os.uname().machine]
        wheel = os.path.basename(os.environ["HETCCL_TEST_WHEEL"])
        self.assertTrue(
            wheel.endswith("-py3-none-manylinux_%d_%d_%s.whl" % (major, minor, arch)),
            "%s, but the binaries need GLIBC_%d.%d" % (wheel, major, minor),
        )

    def test_shims_only_point_at_libhetccl(self):
        for rel, rpath in (("lib/libnccl-net-hetccl.so", "$ORIGIN"), ("lib/nccl/libnccl.so.2", "$ORIGIN/..")):
            d = run(["readelf", "-d", os.path.join(PKG, rel)]).stdout
            self.assertEqual(re.findall(r"\(NEEDED\).*\[(.*)\]", d), ["libhetccl.so"], d)
            self.assertIn("Library rpath: [%s]" % rpath, d)
            self.assertEqual(re.findall(r"\(SONAME\).*\[(.*)\]", d), [os.path.basename(rel)], d)


class Interpose(unittest.TestCase):
    """tests/c/interpose.c: NVIDIA answers alone; hetccl under hetccl-run."""

    prog = os.environ.get("HETCCL_TEST_INTERPOSE", "")

    def test_without_hetccl_run_nvidia_answers(self):
        m = kv(run([self.prog]).stdout)
        self.assertEqual(m["getversion.version"], NVIDIA_VERSION)
        self.assertTrue(same(m["origin.ncclGetVersion"], os.path.join(os.environ["HETCCL_TEST_NVIDIA_LIB"], "libnccl.so.2")))

    def check_hetccl(self, m):
        for f in ("ncclGetVersion", "ncclGetErrorString", "ncclMemAlloc"):
            self.assertTrue(same(m["origin." + f], LIB), "%s bound to %s" % (f, m["origin." + f]))
        self.assertEqual(m["getversion.version"], HETCCL_VERSION)
        self.assertIn("hetccl", m["errstr.internal"])
        self.assertEqual(m["getversion_null.rc"], "4")
        self.assertIn("ncclGetVersion", m["getversion_null.lasterror"])
        self.assertEqual((m["memalloc4096.rc"], m["memalloc4096.rw"]), ("0", "1"))
        self.assertEqual(m["done"], "1")

    def test_hetccl_run_interposes(self):
        p = run(["hetccl-run", self.prog, "hetccl"])
        self.assertNotIn("cannot be preloaded", p.stderr)
        self.check_hetccl(kv(p.stdout))

    def test_libnccl_shim_on_ld_library_path(self):
        # A program finding libnccl.so.2 through LD_LIBRARY_PATH (before its
        # RUNPATH) gets hetccl through the shim.
        p = run([self.prog, "hetccl"], env=clean_env(LD_LIBRARY_PATH=os.path.join(LIB_DIR, "nccl")))
        self.check_hetccl(kv(p.stdout))


class TwoProcesses(unittest.TestCase):
    def check_perf(self, out):
        lib = re.search(r" lib=(\S+)", out)
        self.assertTrue(lib and same(lib.group(1), LIB), out)
        rows = [l.split() for l in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\w+", l)]
        self.assertGreaterEqual(len(rows), 4, out)
        for r in rows:
            # size count type redop root time algbw busbw #wrong (out, then in place)
            self.assertEqual((r[8], r[12]), ("0", "0"), out)
        self.assertIn("# Out of bounds values : 0 OK", out)

    def test_hetccl_run_perf_np2(self):
        p = run(["hetccl-run", "hetccl-perf", "all_reduce", "-np", "2", "-b", "8", "-e", "1M", "-f", "8", "-c", "1"])
        self.check_perf(p.stdout)
        self.assertIn("Rank  1", p.stdout)

    def test_hetccl_perf_subcommand(self):
        p = run(["hetccl", "perf", "reduce_scatter", "-np", "2", "-b", "8", "-e", "64K", "-f", "8", "-c", "1"])
        self.check_perf(p.stdout)

    def test_python_ranks_through_libnccl_name(self):
        script = os.path.join(HERE, "allreduce_ranks.py")
        nv = os.environ["HETCCL_TEST_NVIDIA_LIB"]
        env = clean_env(LD_LIBRARY_PATH=nv)
        # Control: without hetccl-run the name binds to NVIDIA's library.
        m = kv(run([sys.executable, script, "--origin-only"], env=env).stdout)
        self.assertTrue(same(m["origin"], os.path.join(nv, "libnccl.so.2")), m)
        m = kv(run(["hetccl-run", sys.executable, script, "--nranks", "2"], env=env).stdout)
        for r in (0, 1):
            self.assertTrue(same(m["origin.%d" % r], LIB), m)
            self.assertEqual((m["int32.%d" % r], m["float64.%d" % r]), ("ok", "ok"), m)


class Info(unittest.TestCase):
    def info(self, **env):
        return run(["hetccl", "info"], env=clean_env(**env)).stdout

    def rows(self, text, key):
        return [l[14:] for l in text.splitlines() if l.startswith("  %-11s " % key)]

    def test_library_and_api(self):
        out = self.info()
        self.assertEqual(self.rows(out, "library"), [LIB])
        self.assertEqual(self.rows(out, "nccl api"), ["22800 (2.28.0)"])
        # The wheel's version is the crates' (one workspace version).
        version = os.path.basename(os.environ["HETCCL_TEST_WHEEL"]).split("-")[1]
        self.assertEqual(out.splitlines()[0], "hetccl %s (NCCL API 2.28.0)" % version)
        self.assertEqual(self.rows(out, "package"), [version])
        self.assertIn("\ntransports\n", out)
        self.assertIn("\nconfiguration\n  NCCL_DEBUG=NONE (default)\n", out)

    def test_transports(self):
        out = self.info()
        shm_ok = os.access("/dev/shm", os.W_OK)
        self.assertEqual(
            self.rows(out, "shm"),
            ["available: /dev/shm is writable" if shm_ok else "unavailable: /dev/shm is not writable"],
        )
        names = {n for _, n in socket.if_nameindex()}
        tcp = self.rows(out, "tcp")
        self.assertTrue(tcp, out)
        for row in tcp:
            self.assertIn(row.split()[0], names, out)
        if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
            self.assertEqual(self.rows(out, "rdma"), ["none"])
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            self.assertEqual(self.rows(out, "cuda"), ["no driver (libcuda.so.1 cannot be loaded)"])

    def test_socket_ifname_selects_like_the_library(self):
        for var in ("NCCL_SOCKET_IFNAME", "HETCCL_SOCKET_IFNAME"):
            out = self.info(**{var: "=lo"})
            tcp = self.rows(out, "tcp")
            self.assertEqual(len(tcp), 1, out)
            self.assertTrue(tcp[0].startswith("lo 127.0.0.1 (loopback, "), out)
            self.assertIn("  %s==lo\n" % var, out)
            self.assertEqual(self.rows(out, "tcp filter"), ["=lo (HETCCL_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME)"])
        out = self.info(NCCL_SOCKET_IFNAME="=no-such-if0")
        self.assertEqual(self.rows(out, "tcp"), ["none: no interface passes the filter"])

    def test_shm_disable(self):
        out = self.info(NCCL_SHM_DISABLE="1")
        self.assertTrue(self.rows(out, "shm")[0].startswith("disabled by NCCL_SHM_DISABLE"), out)
        self.assertIn("\n  NCCL_SHM_DISABLE=1\n", out)

    def test_cuda_driver_probe(self):
        fake = os.environ["HETCCL_TEST_FAKE_CUDA"]
        out = self.info(LD_LIBRARY_PATH=fake, FAKE_CUDA_DEVICES="2")
        cuda = self.rows(out, "cuda")
        self.assertEqual(len(cuda), 1, out)
        self.assertRegex(cuda[0], r"^driver \d+\.\d+, 2 device\(s\): hetccl fake GPU, hetccl fake GPU$")
        out = self.info(LD_LIBRARY_PATH=fake, FAKE_CUDA_DEVICES="0")
        self.assertRegex(self.rows(out, "cuda")[0], r"^driver \d+\.\d+, cuInit or cuDeviceGetCount failed \(CUresult 100\)$")

    def test_version_options(self):
        version = os.path.basename(os.environ["HETCCL_TEST_WHEEL"]).split("-")[1]
        self.assertEqual(run(["hetccl", "--version"]).stdout, "hetccl %s (NCCL API 2.28.0)\n" % version)
        self.assertEqual(run(["hetccl-run", "--version"]).stdout, "hetccl-run %s\n" % version)

    def test_json_and_module(self):
        d = json.loads(run([sys.executable, "-m", "hetccl", "info", "--json"], env=clean_env(NCCL_SOCKET_IFNAME="=lo")).stdout)
        self.assertEqual(d["nccl_api"], 22800)
        self.assertEqual([i["name"] for i in d["hetccl"]["interfaces"]], ["lo"])
        self.assertEqual(d["library"], LIB)


class Selection(unittest.TestCase):
    def test_table_for_a_layout(self):
        out = run(["hetccl", "selection", "--nranks", "8", "--nodes", "2"]).stdout
        lines = out.splitlines()
        self.assertEqual(lines[0], '# hetccl algorithm selection: 8 ranks on 2 node(s) [4+4], NCCL_ALGO=""')
        colls = {l.split()[0] for l in lines[2:]}
        self.assertEqual(colls, {"allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "gather", "scatter"})
        flat = run(["hetccl", "selection", "--nranks", "8"]).stdout
        self.assertIn("8 ranks on 1 node(s) [8]", flat)
        self.assertNotEqual(flat.splitlines()[2:], lines[2:])

    def test_algo_restriction(self):
        out = run(["hetccl", "selection", "--nranks", "4", "--nodes", "2", "--algo", "ring"]).stdout
        rows = [l.split() for l in out.splitlines()[2:]]
        allreduce = [r for r in rows if r[0] == "allreduce"]
        self.assertTrue(allreduce)
        self.assertTrue(all(r[6] == "Ring" for r in allreduce), out)
        self.assertIn('NCCL_ALGO="ring"', out.splitlines()[0])

    def test_bad_arguments(self):
        for args in (["--nranks", "0"], ["--nranks", "2", "--nodes", "3"]):
            p = run(["hetccl", "selection"] + args, check=False)
            self.assertNotEqual(p.returncode, 0, args)


class DryRun(unittest.TestCase):
    cmd = ["torchrun", "--nproc-per-node", "2", "train.py", "a b"]
    cmd_line = "torchrun --nproc-per-node 2 train.py 'a b'"

    def dry(self, *opts, **env):
        return run(["hetccl-run", "--dry-run"] + list(opts) + self.cmd, env=clean_env(**env)).stdout

    def test_preload(self):
        self.assertEqual(self.dry(), "LD_PRELOAD=%s\n%s\n" % (LIB, self.cmd_line))

    def test_existing_preload_is_kept(self):
        self.assertEqual(
            self.dry(LD_PRELOAD="/opt/my lib.so"),
            "LD_PRELOAD='%s:/opt/my lib.so'\n%s\n" % (LIB, self.cmd_line),
        )

    def test_no_duplicate(self):
        self.assertEqual(self.dry(LD_PRELOAD="/opt/a.so %s" % LIB), self.cmd_line + "\n")

    def test_net_plugin(self):
        self.assertEqual(
            self.dry("--net-plugin", LD_LIBRARY_PATH="/usr/local/cuda/lib64"),
            "LD_LIBRARY_PATH=%s:/usr/local/cuda/lib64\nNCCL_NET_PLUGIN=hetccl\n%s\n" % (LIB_DIR, self.cmd_line),
        )

    def test_fallback(self):
        self.assertEqual(
            self.dry("--fallback", "/opt/nccl/libnccl.so.2"),
            "HETCCL_NCCL_FALLBACK=/opt/nccl/libnccl.so.2\nLD_PRELOAD=%s\n%s\n" % (LIB, self.cmd_line),
        )

    def test_runs_nothing(self):
        marker = os.path.join(os.environ.get("TMPDIR", "/tmp"), "hetccl-dry-run-%d" % os.getpid())
        run(["hetccl-run", "--dry-run", "sh", "-c", "touch " + marker])
        self.assertFalse(os.path.exists(marker))

    def test_usage_errors(self):
        self.assertEqual(run(["hetccl-run"], check=False).returncode, 2)
        self.assertEqual(run(["hetccl-run", "--no-such-option", "true"], check=False).returncode, 2)


class Exec(unittest.TestCase):
    def test_exit_code(self):
        self.assertEqual(run(["hetccl-run", "sh", "-c", "exit 7"], check=False).returncode, 7)

    # A child that dies of `sig` (default disposition restored first: a
    # signal ignored by whoever started the suite stays ignored in a shell).
    @staticmethod
    def suicide(sig):
        return [
            sys.executable, "-c",
            "import os, signal; signal.signal(%d, signal.SIG_DFL); os.kill(os.getpid(), %d)" % (sig, sig),
        ]

    def test_signal_death(self):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
            if sig == signal.SIGKILL:
                cmd = [sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]
            else:
                cmd = self.suicide(sig)
            p = run(["hetccl-run"] + cmd, check=False)
            self.assertEqual(p.returncode, -sig, sig)
        # Seen from a shell: 128 + the signal number.
        line = " ".join("'%s'" % a for a in self.suicide(signal.SIGINT))
        p = run(["sh", "-c", "hetccl-run %s; echo $?" % line])
        self.assertEqual(p.stdout.strip(), str(128 + signal.SIGINT))

    def test_command_not_found(self):
        p = run(["hetccl-run", "no-such-command-hetccl"], check=False)
        self.assertEqual(p.returncode, 127)
        self.assertIn("command not found", p.stderr)

    def test_same_pid_environment_and_preload(self):
        p = subprocess.Popen(
            ["hetccl-run", "sh", "-c", 'echo "$$ $FOO $LD_PRELOAD"'],
            env=clean_env(FOO="bar"),
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = p.communicate(timeout=TIMEOUT_S)
        self.assertEqual(out.split(), [str(p.pid), "bar", LIB])

    def test_sigterm_and_sigint_reach_the_command(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.signal_reaches_the_command(sig)

    def signal_reaches_the_command(self, sig):
        # The command reports the signal, then dies of it.
        code = (
            "import os, signal, time\n"
            "def on(sig, frame):\n"
            "    print('got', sig, flush=True)\n"
            "    signal.signal(sig, signal.SIG_DFL)\n"
            "    os.kill(os.getpid(), sig)\n"
            "signal.signal(%d, on)\n"
            "print('ready', os.getpid(), flush=True)\n"
            "time.sleep(600)\n" % sig
        )
        p = subprocess.Popen(
            ["hetccl-run", sys.executable, "-c", code], env=clean_env(), stdout=subprocess.PIPE
        )
        pid = None
        try:
            ready, _, _ = select.select([p.stdout], [], [], 120)
            self.assertTrue(ready, "the command did not start within 120 s")
            word, pid = p.stdout.readline().split()
            pid = int(pid)
            self.assertEqual((word, pid), (b"ready", p.pid), "the command does not run as hetccl-run's PID")
            p.send_signal(sig)
            self.assertEqual(p.wait(timeout=60), -sig)
            self.assertEqual(p.stdout.read().split(), [b"got", str(int(sig)).encode()])
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=60)
            if pid is not None and pid != p.pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.stdout.close()


class NetPlugin(unittest.TestCase):
    def test_nccl_finds_the_plugin_by_name(self):
        # What NVIDIA's NCCL does with NCCL_NET_PLUGIN=hetccl: dlopen
        # "libnccl-net-hetccl.so" and dlsym the plugin table on that handle.
        code = (
            "import ctypes, os\n"
            "h = ctypes.CDLL('libnccl-net-' + os.environ['NCCL_NET_PLUGIN'] + '.so')\n"
            "class I(ctypes.Structure):\n"
            "    _fields_ = [('f', ctypes.c_char_p), ('b', ctypes.c_void_p), ('s', ctypes.c_char_p), ('a', ctypes.c_void_p)]\n"
            "for v in ('ncclNetPlugin_v6', 'ncclNetPlugin_v12'):\n"
            "    i = I(); ctypes.CDLL(None).dladdr(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(h, v))), ctypes.byref(i))\n"
            "    print(v, i.f.decode())\n"
            "print('LD_PRELOAD', os.environ.get('LD_PRELOAD', '-'))\n"
        )
        m = kv(run(["hetccl-run", "--net-plugin", sys.executable, "-c", code]).stdout)
        self.assertTrue(same(m["ncclNetPlugin_v6"], LIB), m)
        self.assertTrue(same(m["ncclNetPlugin_v12"], LIB), m)
        self.assertEqual(m["LD_PRELOAD"], "-")


class PythonApi(unittest.TestCase):
    def test_library_path_and_preload_env(self):
        code = (
            "import hetccl, json\n"
            "print(json.dumps([hetccl.library_path(),\n"
            "  hetccl.preload_env({'LD_PRELOAD': '/a.so', 'X': '1'}),\n"
            "  hetccl.preload_env({'X': '1'}, fallback='libnccl.so.2'),\n"
            "  hetccl.net_plugin_env({})]))\n"
        )
        path, pre, fb, net = json.loads(run([sys.executable, "-c", code]).stdout)
        self.assertEqual(path, LIB)
        self.assertEqual(pre, {"LD_PRELOAD": LIB + ":/a.so", "X": "1"})
        self.assertEqual(fb, {"LD_PRELOAD": LIB, "X": "1", "HETCCL_NCCL_FALLBACK": "libnccl.so.2"})
        self.assertEqual(net, {"LD_LIBRARY_PATH": LIB_DIR, "NCCL_NET_PLUGIN": "hetccl"})


if __name__ == "__main__":
    unittest.main(verbosity=2)
