#!/usr/bin/env python3
"""Mutation testing for muon: does the test suite notice a realistic one-line bug?

Each mutant in the list (tests/mutants.txt) replaces one exact piece of text, which must occur
exactly once in its file, by another. For each one, on a scratch copy of the tree, this script
applies the mutant, builds, and runs the mutation suite below in order until a step fails (the
mutant is killed, by that step) or every step passes (it survived). A mutant that does not
compile is an error in the list, not a kill. The unmutated tree must pass the whole suite first.

Usage: tools/mutate.py [--list FILE] [--only ID[,ID...]] [--check] [--dir DIR] [--jobs N] [--workers W]
  --check    only apply each mutant and compile the headers it touches (seconds): for writing lists
  --workers  mutants at once, each in its own scratch tree (the distributed steps mostly wait on
             the network, so 2 on 2 cores nearly halves the run); --jobs is shared among them
A mutant's killing step is kept in DIR/kills and tried first next time (a kill is a kill whichever
step finds it; a mutant no step kills still runs every step).
Output: one line per mutant, the survivors again with their notes, and the closing line
  mutation: K killed, S survived of T
"""
import argparse, os, shutil, subprocess, sys, threading, time

# The mutation suite: (name, make targets, command, headers it depends on). A step runs only if
# the mutated header is among its headers: a test that never includes a file cannot see its bugs.
# Fast, broad steps first, so most mutants die within a minute.
CORE = {"muon.h"}
GLOO = {"muon.h", "muon_gloo.h"}
CUDA = {"muon.h", "muon_cuda.h"}
NCCL = {"muon.h", "muon_cuda.h", "muon_nccl.h"}
MPI = {"muon.h", "muon_mpi.h"}
MPI_CFLAGS = "$(pkg-config --cflags ompi-c | sed 's/-I/-isystem /g')"
RUN = "build/muonrun --timeout 120"


def EXAMPLES_AT(build, names):
    """Each example once, at 4 ranks (8 for full_4d), 5 steps: exit 0 and the bitwise line."""
    return ("for e in %s; do n=4; [ $e = full_4d ] && n=8; %s -n $n %s/$e --steps 5 --quiet 2>&1 "
            "| grep -q 'bitwise equal to single device' || { echo \"$e -n $n failed\"; exit 1; }; done"
            % (names, RUN, build))

STEPS = [
    ("test_api", ["build/test_api"], "build/test_api", CORE),
    ("test_golden", ["build/test_golden", "build/golden/.done"], "build/test_golden build/golden", CORE),
    ("test_ns", ["build/test_ns", "build/golden/.done"], "build/test_ns build/golden", CORE),
    ("test_gemm", ["build/test_gemm"], "build/test_gemm", CORE),
    ("test_adamw", ["build/test_adamw"], "build/test_adamw", CORE),
    ("test_trainer", ["build/test_trainer"], "build/test_trainer", CORE),
    # nvcc's flags and gcc's -Ofast must not change the kernels' bits: cheap, so early
    ("test_cuda_slots_fast", ["build/cuda/test_cuda_slots_fast"], "build/cuda/test_cuda_slots_fast", CUDA),
    ("fast-math ptx", ["build/cuda/muon_cuda.o"],
     "tests/run_fast_math.sh " + os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/bin/nvcc build/cuda", CUDA),
    ("test_threads", ["build/test_threads"], "build/test_threads", CORE),
    ("test_parallel", ["build/test_parallel"], "build/test_parallel", CORE),
    ("test_faults", ["build/test_faults"], "build/test_faults build/faults", CORE),
    ("test_misuse", ["build/test_misuse"], "build/test_misuse build/misuse", CORE),
    ("test_muoncmp", ["build/test_muoncmp", "build/muoncmp"], "build/test_muoncmp build/muoncmp_test build/muoncmp",
     {"tools/muoncmp.c"}),
    ("test_parallel_tsan", ["build/test_parallel_tsan"], "build/test_parallel_tsan", CORE),
    ("test_parallel_cblas", ["build/test_parallel_cblas"], "OPENBLAS_NUM_THREADS=1 build/test_parallel_cblas", CORE),
    ("test_gloo -n 3", ["build/test_gloo", "build/muonrun"], RUN + " -n 3 build/test_gloo", GLOO),
    ("test_dist -n 3", ["build/test_dist", "build/muonrun"], RUN + " -n 3 build/test_dist", GLOO),
    # Gloo's blocking table: the communication thread of async (make test runs it too)
    ("test_dist blocking", ["build/test_dist", "build/muonrun"],
     "MUON_GLOO_BLOCKING=1 " + RUN + " -n 3 build/test_dist", GLOO),
    ("test_agree -n 2", ["build/test_agree", "build/muonrun"], RUN + " -n 2 build/test_agree", GLOO),
    ("test_llmc -n 2", ["build/test_llmc", "build/muonrun"], RUN + " -n 2 build/test_llmc", GLOO),
    ("test_clip -n 3", ["build/test_clip", "build/golden/qk_clip.bin", "build/muonrun"],
     RUN + " -n 3 build/test_clip build/golden/qk_clip.bin", GLOO),
    ("examples --sr", ["build/fsdp", "build/pp", "build/muonrun"],
     RUN + " -n 2 build/fsdp --sr --quiet && " + RUN + " -n 4 build/pp --sr --quiet", GLOO),
    ("test_cuda_slots", ["build/cuda/test_cuda_slots"], "build/cuda/test_cuda_slots", CUDA),
    ("test_cuda", ["build/cuda/test_cuda"], "build/cuda/test_cuda", CUDA),
    ("test_nccl -n 3", ["build/nccl/test_nccl", "build/muonrun"], RUN + " -n 3 build/nccl/test_nccl", NCCL),
    # MuonClip over a device communicator (its max logits staged through device memory)
    ("nccl test_llmc -n 2", ["build/nccl/test_llmc", "build/muonrun"], RUN + " -n 2 build/nccl/test_llmc", NCCL),
    ("test_gloo --stall", ["build/test_gloo", "build/muonrun"], RUN + " -n 3 build/test_gloo --stall", GLOO),
    ("test_gloo --die", ["build/test_gloo", "build/muonrun"],
     RUN + " -n 4 build/test_gloo --die && " + RUN + " -n 3 build/test_gloo --die-started", GLOO),
    ("test_dist -n 1,2,4", ["build/test_dist", "build/muonrun"],
     " && ".join(RUN + " -n %d build/test_dist" % n for n in (1, 2, 4)), GLOO),
    ("test_dist --fault", ["build/test_dist"],
     "build/test_dist --fault kill 3 && build/test_dist --fault stall 3", GLOO),
    ("test_agree -n 3", ["build/test_agree", "build/muonrun"], RUN + " -n 3 build/test_agree", GLOO),
    ("test_api_san", ["build/test_api_san"], "build/test_api_san", CORE),
    ("reshard", ["build/test_reshard", "build/muonrun"],
     "rm -rf build/reshard && mkdir -p build/reshard && "
     + RUN + " -n 4 build/test_reshard --layout tp_fsdp --normuon larger --save build/reshard/a && "
     + RUN + " -n 3 build/test_reshard --layout fsdp --normuon larger --load build/reshard/a --from 4 && "
     + RUN + " -n 1 build/test_reshard --layout single --save build/reshard/b && "
     + RUN + " -n 4 build/test_reshard --layout hsdp --load build/reshard/b --from 1", GLOO),
    ("test_verify -n 2", ["build/test_verify", "build/muoncmp", "build/muonrun"],
     RUN + " -n 2 build/test_verify build/muoncmp build/verify", GLOO),
    ("redis", ["build/test_gloo", "build/muonrun"], "tests/run_redis.sh build", GLOO),
    ("examples", ["examples"], EXAMPLES_AT("build", "ddp cp fsdp fsdp_flat tp hsdp tp_fsdp tp_hsdp "
     "ep ep_tp ep_fsdp pp full_4d layout_2d custom_vtable"), GLOO),
    ("overlap", ["build/fsdp", "build/tp_fsdp", "build/hsdp", "build/muonrun"],
     "tests/run_overlap.sh build fsdp tp_fsdp hsdp", GLOO),
    ("wire", ["build/ddp", "build/fsdp", "build/tp_fsdp", "build/hsdp", "build/muonrun"],
     "tests/run_wire.sh build 4 ddp fsdp tp_fsdp hsdp", GLOO),
    ("test_partial -n 3", ["build/test_partial", "build/muonrun"], RUN + " -n 3 build/test_partial build/partial", GLOO),
    ("test_partial -n 4", ["build/test_partial", "build/muonrun"], RUN + " -n 4 build/test_partial build/partial", GLOO),
    ("partial", ["build/ddp", "build/cp", "build/hsdp", "build/tp_hsdp", "build/muonrun"],
     "tests/run_partial.sh build ddp cp hsdp tp_hsdp", GLOO),
    ("examples --normuon", ["build/fsdp", "build/tp_fsdp", "build/muonrun"],
     RUN + " -n 4 build/fsdp --normuon larger --cautious --late --quiet && "
     + RUN + " -n 4 build/tp_fsdp --normuon rows --gram --quiet", GLOO),
    ("examples --momentum", ["build/fsdp_flat", "build/tp_fsdp", "build/muonrun"],
     RUN + " -n 3 build/fsdp_flat --momentum int8 --quiet && "
     + RUN + " -n 4 build/tp_fsdp --momentum bf16 --quiet", GLOO),
    ("cuda examples", ["build/cuda/fsdp", "build/cuda/tp_fsdp", "build/cuda/muonrun"],
     EXAMPLES_AT("build/cuda", "fsdp tp_fsdp"), CUDA | {"muon_gloo.h"}),
    ("nccl examples", ["build/nccl/fsdp", "build/nccl/tp_hsdp", "build/nccl/muonrun"],
     EXAMPLES_AT("build/nccl", "fsdp tp_hsdp"), NCCL),
    ("nccl overlap", ["build/nccl/fsdp", "build/nccl/muonrun"],
     "MUON_STANDIN_AHEAD=1 tests/run_overlap.sh --some build/nccl fsdp", NCCL),
    # last: muon.h's survivors only get here; for muon_mpi.h's mutants it is the only step
    ("mpi", ["build/mpi/test_mpi", "build/mpi/test_dist", "build/mpi/fsdp", "build/mpi/tp_fsdp"],
     "tests/run_mpi.sh build", MPI),
]

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
HAVE_CUDA = os.path.isfile(os.path.join(CUDA_HOME, "include", "cublas_v2.h"))

# --check: the header alone, implemented, as C99 and C++ with the build's warnings.
CHECK_TU = {
    "muon.h": '#define MUON_IMPLEMENTATION\n#include "muon.h"\n',
    "muon_gloo.h": None,  # compiled through examples/muon_gloo.cpp
    "muon_cuda.h": '#define MUON_IMPLEMENTATION\n#include "muon.h"\n#include "muon_cuda.h"\n',
    "muon_nccl.h": '#define MUON_IMPLEMENTATION\n#include "muon.h"\n#define MUON_NCCL_IMPLEMENTATION\n#include "muon_nccl.h"\n',
    "muon_mpi.h": '#define MUON_IMPLEMENTATION\n#include "muon.h"\n#define MUON_MPI_IMPLEMENTATION\n#include "muon_mpi.h"\n',
}


def parse(path):
    """The list: '@ id file' opens a mutant; then 'what:', '- original', '+ replacement' and an
    optional 'equivalent: why'. '#' lines are comments."""
    mutants, cur = [], None
    for no, line in enumerate(open(path), 1):
        line = line.rstrip("\n")
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("@ "):
            parts = line[2:].split()
            if len(parts) != 2:
                sys.exit("%s:%d: '@ id file' expected" % (path, no))
            cur = {"id": parts[0], "file": parts[1], "line": no, "what": "", "equivalent": ""}
            mutants.append(cur)
        elif cur is None:
            sys.exit("%s:%d: text before the first '@'" % (path, no))
        elif line.startswith("- "):
            cur["old"] = line[2:]
        elif line.startswith("+ "):
            cur["new"] = line[2:]
        elif line == "+":
            cur["new"] = ""
        elif line.startswith("what: "):
            cur["what"] = line[6:]
        elif line.startswith("equivalent: "):
            cur["equivalent"] = line[12:]
        else:
            sys.exit("%s:%d: cannot read '%s'" % (path, no, line))
    ids = set()
    for m in mutants:
        if "old" not in m or "new" not in m:
            sys.exit("%s:%d: mutant %s needs '- ' and '+ ' lines" % (path, m["line"], m["id"]))
        if m["id"] in ids:
            sys.exit("%s:%d: mutant id %s used twice" % (path, m["line"], m["id"]))
        ids.add(m["id"])
    return mutants


def sh(cmd, cwd, timeout=None, log=None):
    try:
        r = subprocess.run(cmd, shell=True, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
        out, rc = r.stdout.decode(errors="replace"), r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") + "\n(timed out)", 124
    if log:
        with open(log, "a") as f:
            f.write("$ %s\n%s\n" % (cmd, out))
    return rc, out


def copy_tree(src, dst):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=src,
                           stdout=subprocess.PIPE, check=True).stdout.decode().split("\n")
    for f in files:
        if not f or not os.path.isfile(os.path.join(src, f)):
            continue
        os.makedirs(os.path.join(dst, os.path.dirname(f)), exist_ok=True)
        # a fresh mtime: a kept scratch build may hold objects built from an earlier mutant
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))


def apply(tree, m):
    path = os.path.join(tree, m["file"])
    text = open(path).read()
    n = text.count(m["old"])
    if n != 1:
        return None, "'- %s' occurs %d times in %s (must be once)" % (m["old"], n, m["file"])
    open(path, "w").write(text.replace(m["old"], m["new"], 1))
    return text, None


def compile_check(tree, header, jobs):
    tu = CHECK_TU.get(header, CHECK_TU["muon.h"])
    flags = "-std=c99 -Wall -Wextra -Wpedantic -Werror"
    if header.endswith(".c"):  # a tool: the file itself
        return sh("gcc %s -fsyntax-only %s" % (flags, header), tree)
    cuda = "-isystem " + CUDA_HOME + "/include -DMUON_CUDA_STANDIN -D_GNU_SOURCE -Itests/standin"
    if tu is None:
        return sh("g++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I. examples/muon_gloo.cpp", tree)
    open(os.path.join(tree, "build", "mutant.c"), "w").write(tu)
    extra = cuda if header in ("muon_cuda.h", "muon_nccl.h") else ""
    if header == "muon_cuda.h":
        extra += " -DMUON_CUDA_IMPLEMENTATION"
    if header == "muon_mpi.h":
        extra = MPI_CFLAGS
    return sh("gcc %s %s -fsyntax-only -I. build/mutant.c && g++ -std=c++17 -Wall -Wextra -Werror "
              "%s -fsyntax-only -x c++ -I. build/mutant.c" % (flags, extra, extra), tree)


def run_suite(tree, header, jobs, log, first=None):
    """The first failing step's name, or None if every step passed; 'build: ...' if it did not build.
    header None: every step. first: a step's name to run before the others (last run's killer)."""
    steps = sorted(STEPS, key=lambda st: st[0] != first)
    for name, targets, cmd, deps in steps:
        t = time.time()
        if header is not None and header not in deps or (not HAVE_CUDA and deps & {"muon_cuda.h", "muon_nccl.h"}):
            continue
        rc, out = sh("make -s -j%d %s" % (jobs, " ".join(targets)), tree, timeout=900, log=log)
        if rc != 0:
            return "build: " + name
        rc, out = sh(cmd, tree, timeout=600, log=log)
        with open(log, "a") as f:
            f.write("(%s: %s, %.0f s)\n" % (name, "ok" if rc == 0 else "FAILED", time.time() - t))
        if rc != 0:
            return name
    return None


def fresh_tree(root, tree):
    if os.path.isdir(tree):
        # keep the scratch build (faster), refresh the sources
        for d in os.listdir(tree):
            if d != "build":
                p = os.path.join(tree, d)
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
    os.makedirs(os.path.join(tree, "build"), exist_ok=True)
    copy_tree(root, tree)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", default="tests/mutants.txt")
    ap.add_argument("--only", default="")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--dir", default="build/mutate")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    mutants = parse(a.list)
    if a.only:
        want = set(a.only.split(","))
        mutants = [m for m in mutants if m["id"] in want]
    root = os.getcwd()
    workers = max(1, min(a.workers, len(mutants)))
    trees = [os.path.abspath(os.path.join(a.dir, "tree" + ("%d" % w if w else ""))) for w in range(workers)]
    logs = [os.path.abspath(os.path.join(a.dir, "mutate%s.log" % ("%d" % w if w else ""))) for w in range(workers)]
    tree, log = trees[0], logs[0]
    for t, lg in zip(trees, logs):
        fresh_tree(root, t)
        open(lg, "w").close()
    kills_path = os.path.join(a.dir, "kills")
    kills = {}
    if os.path.isfile(kills_path):
        for line in open(kills_path):
            f = line.rstrip("\n").split("\t")
            if len(f) == 2:
                kills[f[0]] = f[1]
    print("mutation: %d mutants from %s; %d scratch tree(s) %s; log %s" % (len(mutants), a.list, workers,
          " ".join(trees), " ".join(logs)))
    if not HAVE_CUDA:
        print("mutation: no CUDA toolkit at %s (set CUDA_HOME): the CUDA and NCCL steps are skipped, "
              "and mutants of muon_cuda.h and muon_nccl.h with them" % CUDA_HOME)
        mutants = [m for m in mutants if m["file"] not in ("muon_cuda.h", "muon_nccl.h")]
    sys.stdout.flush()

    if a.check:
        bad = 0
        for m in mutants:
            orig, err = apply(tree, m)
            if err is None:
                rc, out = compile_check(tree, m["file"], a.jobs)
                open(os.path.join(tree, m["file"]), "w").write(orig)
                if rc != 0:
                    err = "does not compile:\n" + out[-1500:]
            print("%-5s %s%s" % ("ok" if err is None else "BAD", m["id"], "" if err is None else ": " + err))
            bad += err is not None
        print("mutation check: %d of %d mutants apply once and compile" % (len(mutants) - bad, len(mutants)))
        return 1 if bad else 0

    t0 = time.time()
    fail = run_suite(tree, None, a.jobs, log)
    if fail:
        print("mutation: the unmutated tree fails '%s'; see %s" % (fail, log))
        return 1
    print("mutation: the unmutated tree passes the suite (%.0f s)" % (time.time() - t0))
    sys.stdout.flush()

    killed, survivors, invalid = 0, [], []
    lock = threading.Lock()
    queue = list(mutants)

    def worker(w):
        nonlocal killed
        jobs = max(1, a.jobs // workers)
        while True:
            with lock:
                if not queue:
                    return
                m = queue.pop(0)
            t = time.time()
            orig, err = apply(trees[w], m)
            if err:
                with lock:
                    invalid.append((m, err)); print("INVALID  %s: %s" % (m["id"], err)); sys.stdout.flush()
                continue
            with open(logs[w], "a") as f:
                f.write("\n==== mutant %s (%s): %s\n" % (m["id"], m["file"], m["what"]))
            fail = run_suite(trees[w], m["file"], jobs, logs[w], kills.get(m["id"]))
            open(os.path.join(trees[w], m["file"]), "w").write(orig)
            with lock:
                if fail and fail.startswith("build: "):
                    invalid.append((m, "does not build (" + fail + ")"))
                    print("INVALID  %-28s does not build" % m["id"])
                elif fail:
                    killed += 1
                    kills[m["id"]] = fail
                    with open(kills_path, "w") as f:
                        f.writelines("%s\t%s\n" % kv for kv in sorted(kills.items()))
                    print("killed   %-28s by %-20s %4.0f s  %s" % (m["id"], fail, time.time() - t, m["what"]))
                else:
                    survivors.append(m)
                    print("SURVIVED %-28s %4.0f s  %s" % (m["id"], time.time() - t, m["what"]))
                sys.stdout.flush()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    order = {m["id"]: i for i, m in enumerate(mutants)}
    survivors.sort(key=lambda m: order[m["id"]])
    for m, err in invalid:
        print("invalid: %s: %s" % (m["id"], err))
    for m in survivors:
        why = ("equivalent: " + m["equivalent"]) if m["equivalent"] else "NOT EXPLAINED: needs a test that kills it"
        print("survivor %s (%s:%d): %s" % (m["id"], a.list, m["line"], why))
    total = killed + len(survivors)
    print("mutation: %d killed, %d survived of %d" % (killed, len(survivors), total))
    return 1 if invalid or any(not m["equivalent"] for m in survivors) else 0


if __name__ == "__main__":
    sys.exit(main())
