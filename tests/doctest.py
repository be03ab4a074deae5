#!/usr/bin/env python3
"""Runs every command the documentation quotes, so that it stays true.

    tests/doctest.py [--bin D3STREAM] [--list] [FILE.md ...]

Reads README.md and docs/*.md (or the files named). In each:

* a fenced block whose info string is ``sh`` is run by ``bash -euo pipefail``
  from the repository root and must exit 0 (within 300 s x
  $D3_TEST_TIMEOUT_MULT); ``sh background`` is started in the background and
  its process group killed after the file's last block;
* a block preceded, on the line right before its fence, by
  ``<!-- doctest: skip: REASON -->`` is not run; the reason is printed and
  must not be empty;
* blocks of other kinds (``text``, ``json``, ...) are data, not run;
* every relative link into the repository names a file that exists, and
  its #anchor a heading of that file (links out of it, to the design
  documents beside a checkout, are not checked: a clone elsewhere has none);
* a command in an indented code block, or a full command line in inline code (``d3stream``, ``curl``, ``kcat``,
  ``cmake`` or ``systemctl`` with two more words, or a script of ``ops/`` or
  ``tests/`` with an argument) is an error: it would escape this test.

The blocks see ``d3stream`` on PATH (--bin, else $D3STREAM, else
build/d3stream) and these variables, for which a reader substitutes their own:
$PKG a tiny synthetic package (safetensors, with a vision tower), $Q4 the
same in q4nx, $NANO_Q4 and $NANO_BF16 (here the tiny packages again: the
command is checked, not the figure it measured on nano), $BROKERS a running
Kafka broker ($D3_KAFKA_BOOTSTRAP), $KAFKA_DIR its ops/kafka.sh directory
($D3_KAFKA_DIR), $WORK a scratch directory of the file.
"""
import argparse
import functools
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULT = float(os.environ.get("D3_TEST_TIMEOUT_MULT", "1"))
SKIP = re.compile(r"^\s*<!--\s*doctest:\s*skip:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)\s*(.*?)\s*$")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
CMD_WORDS = ("curl", "kcat", "cmake", "systemctl")


def blocks(path):
    """(line, info, extra, body, skip_reason) of each fenced block, and the
    prose lines outside them (line, text)."""
    out, prose = [], []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, info, extra = m.group(2), m.group(3), m.group(4)
        skip = SKIP.match(lines[i - 1]) if i > 0 else None
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            sys.exit(f"{path}:{start}: a fence that never closes")
        i += 1
        out.append((start, info, extra, "\n".join(body) + "\n", skip.group(1) if skip else None))
    return out, prose


INDENTED = re.compile(r"^(?: {4,}|\t)(?:d3stream|curl|kcat|cmake|nice|ops/|tests/|build/tests/)\S* ")


def inline_commands(path, prose):
    bad = []
    prev = ""
    for line, text in prose:
        if INDENTED.match(text) and (not prev.strip() or INDENTED.match(prev)):
            bad.append(f"{path}:{line}: a command in an indented code block, not run: {text.strip()!r}"
                       " (fence it as sh, or as text for a synopsis)")
        prev = text
        for m in INLINE.finditer(text):
            w = m.group(1).split()
            if not w:
                continue
            # "d3stream serve" and "cmake --install" name a command; with
            # one more word they are a command line to run
            full = ((w[0] == "d3stream" or w[0] in CMD_WORDS) and len(w) >= 3) or (
                w[0].startswith(("ops/", "tests/")) and len(w) >= 2)
            if full:
                bad.append(f"{path}:{line}: a command in inline code, not run: `{m.group(1)}`"
                           " (put it in an sh block)")
    return bad


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation but - and _
    dropped, spaces to -."""
    h = re.sub(r"`", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path):
    _, prose = blocks(path)
    return {slug(t.lstrip("#")) for _, t in prose if re.match(r"^#{1,6} ", t)}


def links(path, prose):
    """Every relative link of the prose names a file that exists, and its
    #anchor a heading of that file."""
    bad = []
    for line, text in prose:
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            where = f"{os.path.relpath(path, ROOT)}:{line}"
            if os.path.relpath(dest, ROOT).startswith(".."):
                continue  # the design documents beside the checkout: not ours to check
            if not os.path.exists(dest):
                bad.append(f"{where}: link to {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{where}: link to {target}: no heading with that anchor")
    return bad


def make_env(args, work, pk):
    env = dict(os.environ)
    bindir = os.path.join(pk, "bin")
    os.makedirs(bindir, exist_ok=True)
    link = os.path.join(bindir, "d3stream")
    if not os.path.exists(link):
        os.symlink(os.path.abspath(args.bin), link)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["D3STREAM"] = os.path.abspath(args.bin)
    env.update(PKG=os.path.join(pk, "tiny"), Q4=os.path.join(pk, "tiny-q4"), WORK=work)
    env["NANO_Q4"], env["NANO_BF16"] = env["Q4"], env["PKG"]
    if os.environ.get("D3_KAFKA_BOOTSTRAP"):
        env["BROKERS"] = os.environ["D3_KAFKA_BOOTSTRAP"]
    if os.environ.get("D3_KAFKA_DIR"):
        env["KAFKA_DIR"] = os.environ["D3_KAFKA_DIR"]
    return env


def packages(args, pk):
    for name, extra in (("tiny", []), ("tiny-q4", ["--format", "q4nx"])):
        out = os.path.join(pk, name)
        if not os.path.isdir(out):
            subprocess.run([args.bin, "make-package", "--size", "tiny", "--seed", "1", "--out", out]
                           + extra, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_group(p):
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            pass


def run_file(path, args, pk, stats):
    bl, prose = blocks(path)
    errors = inline_commands(os.path.relpath(path, ROOT), prose) + links(path, prose)
    rel = os.path.relpath(path, ROOT)
    work = tempfile.mkdtemp(prefix="d3doc-")
    env = make_env(args, work, pk)
    background = []
    try:
        for line, info, extra, body, skip in bl:
            if info != "sh":
                continue
            where = f"{rel}:{line}"
            if skip is not None:
                if not skip:
                    errors.append(f"{where}: a skip without a reason")
                stats["skipped"].append(f"{where}: {skip}")
                continue
            if args.list:
                print(f"{where}: {'background ' if extra == 'background' else ''}{body.strip()[:100]!r}")
                continue
            if extra == "background":
                log = open(os.path.join(work, f"background-{line}.log"), "w")
                p = subprocess.Popen(["bash", "-euo", "pipefail", "-c", body], cwd=ROOT, env=env,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                background.append((p, where, log.name))
                stats["run"] += 1
                continue
            t0 = time.monotonic()
            try:
                r = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=300 * MULT, start_new_session=True)
                rc, out = r.returncode, r.stdout.decode("utf-8", "replace")
            except subprocess.TimeoutExpired as e:
                rc, out = "timeout", (e.stdout or b"").decode("utf-8", "replace")
            dt = time.monotonic() - t0
            stats["run"] += 1
            status = "ok" if rc == 0 else f"FAIL (exit {rc})"
            print(f"doctest: {where}: {status} in {dt:.1f} s", flush=True)
            if rc != 0:
                tail = "\n".join(out.rstrip().split("\n")[-25:])
                errors.append(f"{where}: exit {rc}\n--- block\n{body}--- output (tail)\n{tail}")
                for p, w, log in background:
                    if p.poll() is not None:
                        errors.append(f"{w}: the background block had exited ({p.returncode}):\n"
                                      + open(log).read()[-2000:])
    finally:
        for p, w, log in background:
            kill_group(p)
        shutil.rmtree(work, ignore_errors=True)
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("D3STREAM", os.path.join(ROOT, "build", "d3stream")))
    ap.add_argument("--list", action="store_true", help="list the blocks, run nothing")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    files = args.files or [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"doctest: no d3stream binary at {args.bin} (--bin or $D3STREAM)")
    pk = tempfile.mkdtemp(prefix="d3doc-pkg-")
    stats = {"run": 0, "skipped": []}
    errors = []
    try:
        if not args.list:
            packages(args, pk)
        for f in files:
            errors += run_file(os.path.abspath(f), args, pk, stats)
    finally:
        shutil.rmtree(pk, ignore_errors=True)
    for s in stats["skipped"]:
        print(f"doctest: skipped {s}")
    for e in errors:
        print(f"doctest: FAIL {e}", file=sys.stderr)
    print(f"doctest: {len(files)} files, {stats['run']} blocks run, {len(stats['skipped'])} skipped, "
          f"{len(errors)} failures")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
