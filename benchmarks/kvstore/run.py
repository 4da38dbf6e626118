"""Run the workload of benchmarks/cases.py on psnode and its peers (MXNet, raw pyzmq, torch gloo, a bare
PS) and the memory bound of a round, interleaved in one run; print tables, the targets and a JSON file.

    python benchmarks/kvstore/run.py                 # full: 3 interleaved runs, every case, W,S = 1,1 2,1 2,2
    python benchmarks/kvstore/run.py --quick         # smoke run: 1 run, W2S2 only, few rounds
    python benchmarks/kvstore/run.py --cases 1x4KiB,1x1MiB --configs 2,2 --runs 3 --json out.json
    python benchmarks/kvstore/run.py --no-shm        # psnode's data over TCP only (no same-host link)
    python benchmarks/kvstore/run.py --cpu-policy normal   # psnode's processes left under SCHED_OTHER
    python benchmarks/kvstore/run.py --psnode-via mxdist --launch-flags "--no-shm"     # psnode through the launcher
    python benchmarks/kvstore/run.py --ssh 2 --security-modes --runs 2                 # modes over the SSH testbed
    python benchmarks/kvstore/run.py --cases 1x16MiB,embedding --configs 2,2 --runs 5 --peers membw,gloo \
        --no-launch                                  # the speed goals: 16 MiB round / bound, embedding vs DDP

See benchmarks/README.md for what is measured and how.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from benchmarks.cases import ALL, select  # noqa: E402
from benchmarks.common import harness  # noqa: E402
from benchmarks.kvstore.embedding_case import EMBEDDING, QUICK_EMBEDDING, EmbeddingCase  # noqa: E402
from benchmarks.kvstore.mxnet_job import DEFAULT_VENV, mxnet_python, run_mxnet, run_mxnet_launch  # noqa: E402
from benchmarks.kvstore.peers_run import run_bare, run_gloo, run_membw, run_zmq, torch_available  # noqa: E402
from benchmarks.kvstore.psnode_job import (  # noqa: E402
    Launcher,
    cli_ready,
    run_mxdist_launch,
    run_psnode,
    run_psnode_launch,
    run_psnode_mxdist,
)

DEFAULT_PEERS = "zmq,gloo,bare,mxnet,membw"
SECURITY_MODES = ("insecure=--insecure", "default=", "encrypt=--encrypt")
SSH_CASES = "1x4KiB,1x1MiB,1x16MiB,200x16KiB"


def parse_configs(values: list[str]) -> list[tuple[int, int]]:
    out = []
    for v in values:
        for item in v.split():
            m = re.fullmatch(r"[Ww]?(\d+)[,xX:Ss](\d+)", item.strip())
            if not m:
                raise SystemExit(f"bad config {item!r}: use W,S (e.g. 2,2)")
            out.append((int(m.group(1)), int(m.group(2))))
    return out


def parse_modes(values: list[str]) -> list[tuple[str, list[str]]]:
    """NAME=FLAGS items (FLAGS may be empty: the launcher's default) -> [(name, flags)]."""
    out = []
    for v in values:
        name, sep, flags = v.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise SystemExit(f"bad --mode {v!r}: use NAME=FLAGS, e.g. insecure=--insecure or default=")
        out.append((name, shlex.split(flags)))
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 run, W2S2 only, few rounds")
    ap.add_argument("--cases", help=f"comma list of cases (default all): {','.join(ALL)}; and {EMBEDDING!r} "
                                    "(the embedding workload, psnode W2 S2 against DDP + gloo, W2; not in the "
                                    "default list)".replace("%", "%%"))
    ap.add_argument("--configs", nargs="+", help="W,S configurations (default: 1,1 2,1 2,2; --quick, --ssh: 2,2)")
    ap.add_argument("--runs", type=int, help="interleaved runs (default 3; --quick: 1)")
    ap.add_argument("--peers", help=f"peers to run (default {DEFAULT_PEERS}; with --ssh or --mode none): "
                                    "zmq, gloo (if torch imports), bare (pyzmq+numpy PS), mxnet (its own venv), "
                                    "membw (the memory bound: np.copyto on every core at once)")
    ap.add_argument("--mxnet-venv", type=Path, default=DEFAULT_VENV, help="MXNet's venv (made on first use)")
    ap.add_argument("--no-mxnet-install", action="store_true", help="do not make the MXNet venv when missing")
    ap.add_argument("--psnode-via", choices=("harness", "mxdist"), default="harness",
                    help="start psnode's jobs with the test harness (env contract; default) or mxdist launch")
    ap.add_argument("--launch-flags", default="", help="extra mxdist launch flags for psnode (implies mxdist)")
    ap.add_argument("--ssh", type=int, metavar="HOSTS", default=0,
                    help="run psnode over the SSH testbed (sshd on 127.0.0.2...; implies mxdist)")
    ap.add_argument("--mode", action="append", default=[], metavar="NAME=FLAGS",
                    help="run psnode once per mode, with these launch flags (repeatable; implies mxdist)")
    ap.add_argument("--security-modes", action="store_true",
                    help="the three security modes: " + " ".join(SECURITY_MODES))
    ap.add_argument("--no-shm", action="store_true",
                    help="psnode's data over TCP only, as between hosts (PSNODE_SHM=0; through mxdist: "
                         "launch --no-shm); default: the same-host link (Unix socket + shared memory)")
    ap.add_argument("--cpu-policy", choices=("batch", "normal"), default="batch",
                    help="psnode's processes under SCHED_BATCH (default, as mxdist launch runs them) or left "
                         "as they are (PSNODE_CPU_POLICY; through mxdist: launch --cpu-policy)")
    ap.add_argument("--no-launch", action="store_true", help="skip the launch-to-first-pull measurement")
    ap.add_argument("--launch-via", choices=("auto", "harness", "mxdist"),
                    help="launch to first pull: auto (default: mxdist when the CLI works), harness, mxdist")
    ap.add_argument("--embedding-rows", type=float,
                    help=f"the embedding case: table rows (default {EmbeddingCase.rows:.0f}; --quick: "
                         f"{QUICK_EMBEDDING.rows}; e.g. 2e6 for a shorter run)")
    ap.add_argument("--embedding-steps", type=int,
                    help=f"the embedding case: timed steps per job (default {EmbeddingCase.steps}; --quick: "
                         f"{QUICK_EMBEDDING.steps}).  A job's time is mostly its start (the 20 M-row table "
                         "made on the servers, or on DDP's rank 0 and broadcast): 12-25 s for psnode and "
                         "20-30 s for DDP on this 2-core VM, so a run of 1x16MiB and embedding takes 40-65 s "
                         "and --runs 5 4-6 minutes")
    ap.add_argument("--embedding-warmup", type=int,
                    help=f"the embedding case: untimed steps first (default {EmbeddingCase.warmup}; --quick: "
                         f"{QUICK_EMBEDDING.warmup})")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per job before it is killed")
    ap.add_argument("--json", help="write the raw records and the summary here")
    return ap


def embedding_case(a: argparse.Namespace) -> EmbeddingCase:
    """The embedding case's size and length from the flags (--quick: a small, short one)."""
    base = QUICK_EMBEDDING if a.quick else EmbeddingCase()
    rows = base.rows if a.embedding_rows is None else a.embedding_rows
    steps = base.steps if a.embedding_steps is None else a.embedding_steps
    warmup = base.warmup if a.embedding_warmup is None else a.embedding_warmup
    for flag, value, least in (("--embedding-rows", rows, 1), ("--embedding-steps", steps, 1),
                               ("--embedding-warmup", warmup, 0)):
        if not value >= least or value != int(value):
            raise SystemExit(f"bad {flag} {value:g}: give a whole number of at least {least}")
    return EmbeddingCase(rows=int(rows), steps=int(steps), warmup=int(warmup), timeout=a.timeout)


Step = tuple[str, Callable[[], list[dict]]]


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    modes = parse_modes(a.mode + (list(SECURITY_MODES) if a.security_modes else []))
    via_mxdist = a.psnode_via == "mxdist" or bool(a.launch_flags) or a.ssh > 0 or bool(modes)
    names = [n.strip() for n in (a.cases or (SSH_CASES if a.ssh else "")).split(",") if n.strip()]
    embedding = EMBEDDING in names
    names = [n for n in names if n != EMBEDDING]
    cases = select(names) if names else ([] if embedding else select(None))
    if embedding and (a.ssh or a.mode or a.security_modes or a.psnode_via == "mxdist" or a.launch_flags):
        raise SystemExit(f"case {EMBEDDING!r} runs psnode through the harness on this host only: "
                         "leave out --ssh, --mode, --security-modes, --psnode-via mxdist and --launch-flags")
    emb = embedding_case(a)
    if embedding and not torch_available():
        raise SystemExit(f"case {EMBEDDING!r} needs torch (pip install torch, CPU build)")
    configs = parse_configs(a.configs) if a.configs else (
        [(2, 2)] if a.quick or a.ssh else [(1, 1), (2, 1), (2, 2)])
    runs = a.runs or (1 if a.quick else 3)
    peer_text = a.peers if a.peers is not None else ("" if (a.ssh or modes) else DEFAULT_PEERS)
    peers = {p.strip() for p in peer_text.split(",") if p.strip()}
    unknown = peers - set(DEFAULT_PEERS.split(","))
    if unknown:
        raise SystemExit(f"unknown peer(s) {sorted(unknown)}; known: {DEFAULT_PEERS}")
    gloo = "gloo" in peers and torch_available()
    if "gloo" in peers and not gloo:
        print("torch is not importable: gloo skipped (pip install torch, CPU build)")
    mx_py = None
    if "mxnet" in peers:
        mx_py, why = mxnet_python(a.mxnet_venv, install=not a.no_mxnet_install)
        print(f"MXNet: {why}" if mx_py else f"MXNet skipped: {why}", flush=True)
    h = harness()

    with ExitStack() as stack:
        home = Path(tempfile.mkdtemp(prefix="mxdist-bench-home-"))
        stack.callback(shutil.rmtree, home, True)
        base_env = {"MXDIST_HOME": str(home)}
        hosts = None
        exe = None
        if via_mxdist or (not a.no_launch and a.launch_via != "harness" and not a.quick):
            ok, why = cli_ready()
            if ok:
                exe = why
            elif via_mxdist or a.launch_via == "mxdist":
                raise SystemExit(f"psnode through mxdist: the CLI is not usable: {why}")
            else:
                print(f"launch to first pull via the harness only: mxdist not usable: {why}")
        if a.ssh:
            from benchmarks.kvstore.sshbed import SshBed, SshBedError
            try:
                bed = stack.enter_context(SshBed(a.ssh))
            except SshBedError as exc:
                raise SystemExit(f"SSH testbed: {exc}") from None
            base_env = bed.env(home)
            hosts = bed.hostlist
            print(f"SSH testbed: {a.ssh} sshd on {', '.join(bed.addresses)} port {bed.port} ({hosts}) in {bed.root}")
        variants: list[tuple[str, Launcher | None]] = []   # (system name, launcher or None: harness)
        if modes:
            for name, flags in modes:
                assert exe is not None
                if a.no_shm and "--no-shm" not in flags:
                    flags = [*flags, "--no-shm"]
                lr = Launcher(exe, flags, hosts, base_env)
                refused = lr.flags_refused()
                if refused:
                    print(f"mode {name} skipped: mxdist launch {' '.join(flags)} refused: {refused}")
                    continue
                variants.append((f"psnode:{name}", lr))
            if not variants:
                raise SystemExit("no mode left to run")
        elif via_mxdist:
            assert exe is not None
            flags = shlex.split(a.launch_flags)
            if a.no_shm and "--no-shm" not in flags:
                flags.append("--no-shm")
            if not any(f == "--cpu-policy" or f.startswith("--cpu-policy=") for f in flags):
                flags += ["--cpu-policy", a.cpu_policy]
            lr = Launcher(exe, flags, hosts, base_env)
            refused = lr.flags_refused()
            if refused:
                raise SystemExit(f"mxdist launch {a.launch_flags} refused: {refused}")
            variants.append(("psnode", lr))
        else:
            variants.append(("psnode", None))
        do_launch = not a.no_launch and not modes and not a.ssh and bool(cases)
        launch_exe = exe if (do_launch and a.launch_via != "harness" and not a.quick) else None
        lw, ls = (2, 2) if (2, 2) in configs or not configs else configs[-1]

        print(f"psnode benchmark: {platform.python_version()} on {os.cpu_count()} cpu(s); runs={runs} "
              f"quick={a.quick} configs={configs} cases={[c.name for c in cases]} peers={sorted(peers)} "
              f"psnode={[(n, 'harness' if lr is None else _describe(lr)) for n, lr in variants]} "
              f"{emb.describe() + ' ' if embedding else ''}"
              f"data path={'TCP only (--no-shm)' if a.no_shm else 'same-host link'} cpu policy={a.cpu_policy}")
        records: list[dict] = []
        t_all = time.monotonic()
        for run in range(runs):
            steps: list[Step] = []
            for W, S in configs if cases else ():   # the peers right after psnode on the same config
                for name, lr in variants:
                    def ps(W: int = W, S: int = S, name: str = name, lr: Launcher | None = lr) -> list[dict]:
                        got = (run_psnode(h, W, S, cases, a.quick, a.timeout, shm=not a.no_shm,
                                          cpu_policy=a.cpu_policy) if lr is None
                               else run_psnode_mxdist(lr, W, S, cases, a.quick, a.timeout, name))
                        return [dict(r, system=name, path="tcp" if a.no_shm else "same-host") for r in got]
                    steps.append((f"{name} W{W}S{S}", ps))
                if "membw" in peers:
                    steps.append((f"memory bound W{W}S{S}", lambda W=W, S=S: run_membw(W, S, cases, a.quick,
                                                                                        a.timeout)))
                if "bare" in peers:
                    steps.append((f"bare W{W}S{S}", lambda W=W, S=S: run_bare(W, S, cases, a.quick, a.timeout)))
                if mx_py:
                    steps.append((f"mxnet W{W}S{S}", lambda W=W, S=S: run_mxnet(mx_py, W, S, cases, a.quick,
                                                                                   a.timeout)))
            if embedding:
                steps.append(("embedding psnode W2S2", lambda: emb.run_psnode(h)))
                steps.append(("embedding DDP", emb.run_ddp))
            if "zmq" in peers and cases:
                steps.append(("raw zmq", lambda: [dict(r, config="1,1") for r in run_zmq(cases, a.quick, a.timeout)]))
            if gloo and cases:
                steps.append(("gloo", lambda: [dict(r, config="2") for r in run_gloo(cases, a.quick, a.timeout)]))
            if do_launch:
                def launch() -> list[dict]:
                    out = run_psnode_launch(h, lw, ls, 120)
                    if launch_exe:
                        out += run_mxdist_launch(Launcher(launch_exe, env=base_env), lw, ls, 120)
                    if mx_py:
                        out += [dict(r, system="mxnet") for r in run_mxnet_launch(mx_py, lw, ls, 120)]
                    return [dict(r, config=f"{lw},{ls}") for r in out]
                steps.append(("launch", launch))
            k = run % len(steps)           # rotate the order each run (interleaving)
            for name, fn in steps[k:] + steps[:k]:
                t0 = time.monotonic()
                got = fn()
                for r in got:
                    r["run"] = run
                    r.setdefault("config", _config_of(name))
                records.extend(got)
                print(f"  run {run + 1}/{runs} {name}: {len(got)} results in {time.monotonic() - t0:.1f} s",
                      flush=True)

    stats = report.collect(records)
    summary: dict = {}
    if modes:
        summary["modes"] = report.modes_table(stats, [n.split(":", 1)[1] for n, _ in variants], cases, configs)
        checks: list[dict] = []
        ceilings: list[dict] = []
    else:
        summary["dense"] = report.dense_table(stats, cases, configs)
        summary["sparse"] = report.sparse_table(stats, configs)
        summary["launch"] = report.launch_table(stats)
        summary["bound"] = report.bound_table(stats, cases, configs)
        summary["embedding"] = report.embedding_table(stats)
        checks = report.targets(stats)
        ceilings = report.bare_ceilings(stats)
        summary["goals"] = report.speed_goals(stats)
    print(f"\ntotal {time.monotonic() - t_all:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "argv": sys.argv, "python": platform.python_version(), "cpus": os.cpu_count(),
            "path": "tcp" if a.no_shm else "same-host", "cpu_policy": a.cpu_policy,
            "psnode": [n for n, _ in variants], "mxnet": mx_py is not None,
            "embedding": emb.config() if embedding else None, "records": records,
            "summary": summary, "targets": checks, "bare_ceilings": ceilings}, indent=1))
        print(f"wrote {a.json}")
    return 0


def _describe(lr: Launcher) -> str:
    where = f"-H {lr.hosts} " if lr.hosts else ""
    return f"mxdist launch {where}{shlex.join(lr.flags)}".strip()


def _config_of(step: str) -> str:
    """'psnode W2S1' -> '2,1' (the config a step's records belong to)."""
    m = re.search(r"W(\d+)S(\d+)$", step)
    return f"{m.group(1)},{m.group(2)}" if m else ""


if __name__ == "__main__":
    sys.exit(main())
