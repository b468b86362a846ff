#!/usr/bin/env python3
"""The extender walkthrough of docs/install-extender.md, run as written.

Its section "Trying it without a cluster" drives a kgpu-extender in
--cluster-file mode with curl and shows each answer, either as `# ...`
comment lines under the command or as the ```json block after it. This test
starts the extender on the file the section names, sends every curl request
the section shows (its method, its body: `--data @args.json` is the heredoc
the section writes, `-d '...'` the inline one) and checks each answer equals
the one shown, as JSON, so the walkthrough cannot drift from what the
extender says. Then the `kgpu inspect` table the section shows, line by line
where it shows one (its `...` stands for lines left out).

  test_docs_walkthrough.py --extender PATH --kgpu PATH --source SRC_DIR
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SECTION = "## Trying it without a cluster"


def section_text(source):
    with open(os.path.join(source, "docs", "install-extender.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else len(text)]


def blocks(text):
    """(language, body) of each fenced code block, in order."""
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def requests_shown(text):
    """[(curl argv, expected JSON)] in the order shown; the heredoc files they read."""
    files, out = {}, []
    bl = blocks(text)
    for i, (lang, body) in enumerate(bl):
        if lang != "sh":
            continue
        for m in re.finditer(r"cat > (\S+) <<'EOF'\n(.*?)\nEOF", body, re.S):
            files[m.group(1)] = m.group(2)
        # Join continued lines, then take each curl command with what follows it.
        lines = body.replace("\\\n", " ").split("\n")
        joined, cur = [], ""
        for line in lines:  # a -d '...' body may run over several lines
            cur = cur + " " + line if cur else line
            if cur.count("'") % 2 == 0:
                joined.append(cur)
                cur = ""
        for j, line in enumerate(joined):
            if not line.startswith("curl "):
                continue
            expected = ""
            k = j + 1
            while k < len(joined) and joined[k].startswith("# "):
                expected += joined[k][2:]
                k += 1
            last = all(not rest.strip() for rest in joined[k:])
            if not expected and last and i + 1 < len(bl) and bl[i + 1][0] == "json":
                expected = bl[i + 1][1]
            if expected.strip().startswith(("{", "[")):
                out.append((shlex.split(line), json.loads(expected)))
    return out, files


def send(argv, files, port):
    method, data, url = "GET", None, None
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-s",):
            pass
        elif a == "-X":
            method = argv[i + 1]
            i += 1
        elif a == "-H":
            i += 1
        elif a in ("-d", "--data"):
            v = argv[i + 1]
            data = files[v[1:]] if v.startswith("@") else v
            method = "POST" if method == "GET" else method
            i += 1
        elif a.startswith("http"):
            url = a
        i += 1
    url = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:%d" % port, url)
    req = urllib.request.Request(url, data=data.encode() if data else None, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"HTTP": e.code, "body": e.read().decode(errors="replace")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--extender", required=True)
    ap.add_argument("--kgpu", required=True)
    ap.add_argument("--source", required=True)
    args = ap.parse_args()
    text = section_text(args.source)
    shown, files = requests_shown(text)
    cluster = re.search(r"--cluster-file (\S+)", text).group(1)
    work = tempfile.mkdtemp(prefix="kgpu-walkthrough-")
    port, probe = free_port(), free_port()
    log = open(os.path.join(work, "extender.log"), "w")
    proc = subprocess.Popen([args.extender, "--cluster-file", os.path.join(args.source, cluster),
                             "--listen", "127.0.0.1:%d" % port,
                             "--probe-listen", "127.0.0.1:%d" % probe],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    failed = 0
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/healthz" % probe, timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        if len(shown) < 4:
            print("FAIL the section shows %d requests with answers; expected filter, "
                  "prioritize, bind and a refused filter at least" % len(shown))
            failed += 1
        for argv, expected in shown:
            got = send(argv, files, port)
            what = " ".join(a for a in argv if a.startswith("http"))
            if got == expected:
                print("ok   %s answers as shown" % what)
            else:
                failed += 1
                print("FAIL %s\n  shown: %s\n  got:   %s" % (what, json.dumps(expected),
                                                           json.dumps(got)))
        # The inspect table, where the section shows one.
        table = next((b for lang, b in blocks(text) if b.startswith("NODE ")), None)
        if table is not None:
            r = subprocess.run([args.kgpu, "inspect", "--server", "http://127.0.0.1:%d" % port],
                               capture_output=True, text=True, timeout=30)
            got = [l.rstrip() for l in r.stdout.splitlines()]
            missing = [l for l in table.splitlines() if l.strip() not in ("", "...")
                       and l.rstrip() not in got]
            if r.returncode != 0 or missing:
                failed += 1
                print("FAIL kgpu inspect: lines shown but not printed: %r\n%s" %
                      (missing, r.stdout + r.stderr))
            else:
                print("ok   kgpu inspect prints the table shown")
        with open(os.path.join(work, "extender.log")) as f:
            logged = f.read()
        for line in re.findall(r"^(?:# )?\.\.\. (info  .*)$", text, re.M):
            want = re.sub(r"port \d+", "port N", line)
            have = re.sub(r"port \d+", "port N", logged)
            want = want.replace("examples/", os.path.join(args.source, "examples") + "/")
            if want in have:
                print("ok   logged: %s" % line[:70])
            else:
                failed += 1
                print("FAIL the log has no line like: %s\n%s" % (line, logged[-2000:]))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
