#!/usr/bin/env python3
"""The docs point at what exists: README.md and docs/*.md.

- Every relative link resolves: the file is in the tree, and a #fragment
  names a heading of that file (GitHub's anchors).
- Every path of the tree quoted in backticks (`src/...`, `scripts/...`,
  `tests/...`, `bench/...`, `deploy/...`, `docs/...`, `include/...`,
  `examples/...`, `proto/...`) exists, so a renamed or split file cannot
  leave the docs behind; `bench/bench_sim` names the program built from
  bench/bench_sim.c. A path with a placeholder (NAME, <x>, *, {a,b})
  is a pattern, not a path, and is left alone.
- Every --flag given to one of kgpu's commands in the docs (in backticks or
  in a code block: `kgpu`, `kgpu-extender`, `kgpu-device-plugin`,
  `kgpu-dra-plugin`, `kgpu-expander`, `kgpu-dispatcher`, `scripts/NAME.sh`, `bench/NAME.sh`, a `bench_NAME`
  program) is one that command's source still spells, so a renamed or
  removed flag cannot live on in the docs.

  test_docs.py --source SRC_DIR
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

ROOTS = ("src/", "scripts/", "tests/", "bench/", "deploy/", "docs/", "include/", "examples/",
         "proto/")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*```")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation gone, spaces to dashes."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    out, fenced = set(), False
    seen = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
            if fenced:
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
    return out


def is_pattern(p):
    return any(c in p for c in "<>*{}$") or re.search(r"\b[A-Z]{2,}\b", p) is not None


# kgpu's commands and where each one's flags are spelled.
PROGRAM_SOURCES = {
    "kgpu": ("src/cli", "src/sim", "src/common"),
    "kgpu-extender": ("src/extender", "src/common"),
    "kgpu-device-plugin": ("src/deviceplugin", "src/nodeagent", "src/common"),
    "kgpu-dra-plugin": ("src/dra", "src/nodeagent", "src/common"),
    "kgpu-expander": ("src/expander", "src/common"),
    "kgpu-dispatcher": ("src/dispatcher", "src/common"),
}
FLAG = re.compile(r"^--([a-z][a-z0-9-]*)(=.*)?$")
ENDS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}


def command_source(root, word):
    """The text a command's flags are spelled in, or None when word is no command of kgpu."""
    base = word.split("/")[-1]
    files = []
    if base in PROGRAM_SOURCES:
        for d in PROGRAM_SOURCES[base]:
            full = os.path.join(root, d)
            if os.path.isdir(full):
                files += [os.path.join(full, f) for f in sorted(os.listdir(full))
                          if f.endswith((".c", ".h"))]
    elif re.match(r"^(\./)?(scripts|bench)/[\w-]+\.sh$", word):
        files = [os.path.join(root, word.lstrip("./") if word.startswith("./") else word)]
    elif re.match(r"^bench_\w+$", base) and "/" in word:
        files = [os.path.join(root, "bench", base + ".c")]
    else:
        return None
    text = ""
    for f in files:
        if os.path.exists(f):
            with open(f, encoding="utf-8", errors="replace") as fh:
                text += fh.read()
    return text


def unknown_flags(root, command_line, cache):
    """(the --flags of command_line's kgpu commands that their source does not spell,
    how many flags were checked)."""
    words = command_line.split()
    out, n = [], 0
    i, at_start = 0, True  # a command is a line's first word, or the first after | ; &&
    while i < len(words):
        w = words[i].strip("`'\"(")
        if words[i] in ENDS:
            i, at_start = i + 1, True
            continue
        if at_start and (re.match(r"^[A-Z_][A-Z0-9_]*=", w) or w in ("sudo", "time", "exec")):
            i += 1
            continue
        if not at_start:
            i += 1
            continue
        at_start = False
        if w not in cache:
            cache[w] = command_source(root, w)
        text = cache[w]
        if text is None:
            i += 1
            continue
        j = i + 1
        while j < len(words) and words[j] not in ENDS:
            m = FLAG.match(words[j].strip("`'\",.;:)"))
            n += 1 if m else 0
            if m and ('"%s"' % m.group(1)) not in text and ("--" + m.group(1)) not in text:
                out.append("%s --%s" % (w, m.group(1)))
            j += 1
        i = j
    return out, n


def scan(root):
    """(problems, links and paths checked) of root's README.md and docs/*.md."""
    docs = [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs"))
        if f.endswith(".md"))
    problems, checked = [], 0
    cache = {}
    for doc in docs:
        rel_doc = os.path.relpath(doc, root)
        with open(doc, encoding="utf-8") as f:
            lines = f.read().split("\n")
        fenced = False
        flag_cache = {}
        for lineno, line in enumerate(lines, 1):
            where = f"{rel_doc}:{lineno}"
            if FENCE.match(line):
                fenced = not fenced
                continue
            commands = [line.split(" #")[0]] if fenced else CODE.findall(line)
            for cmd in commands:
                bad, n = unknown_flags(root, cmd, flag_cache)
                checked += n
                for b in bad:
                    problems.append(f"{where}: `{b}`: the command has no such flag")
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue  # http(s), mailto: not this tree's
                path, _, frag = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
                checked += 1
                if not os.path.exists(full):
                    problems.append(f"{where}: link to {target}: no {os.path.relpath(full, root)}")
                    continue
                if frag and full.endswith(".md"):
                    if full not in cache:
                        cache[full] = anchors(full)
                    if frag not in cache[full]:
                        problems.append(f"{where}: link to {target}: no heading #{frag} in "
                                        f"{os.path.relpath(full, root)}")
            for code in CODE.findall(line):
                if code.startswith("kubectl "):
                    continue  # deploy/NAME there is a Deployment, not a folder
                for word in code.split():
                    word = word.strip(".,;:()'\"")
                    if not word.startswith(ROOTS) or is_pattern(word):
                        continue
                    path = word.split("#")[0].split(":")[0]
                    checked += 1
                    full = os.path.join(root, path)
                    # A program is named by its source's path without the ending.
                    if not any(os.path.exists(full + end) for end in ("", ".c", ".sh", ".py")):
                        problems.append(f"{where}: `{word}`: no such path in the tree")
    return problems, checked


def self_check():
    """The scan names a broken link, a missing heading and a missing path, and passes good ones."""
    root = tempfile.mkdtemp(prefix="kgpu-docs-")
    try:
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "src", "x"))
        open(os.path.join(root, "src", "x", "a.c"), "w").close()
        os.makedirs(os.path.join(root, "scripts"))
        with open(os.path.join(root, "scripts", "t.sh"), "w", encoding="utf-8") as f:
            f.write("case $1 in --yes) ;; esac\n")
        with open(os.path.join(root, "docs", "b.md"), "w", encoding="utf-8") as f:
            f.write("# B\n\n## The node suite (`--suite node`)\n")
        with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as f:
            f.write("[ok](docs/b.md#the-node-suite---suite-node) `src/x/a.c` `src/x/NAME.c`\n"
                    "[gone](docs/c.md) [no heading](docs/b.md#the-node-suite) `src/x/b.c`\n"
                    "`X=1 scripts/t.sh --yes --nope` `helm install t --nope`\n")
        problems, checked = scan(root)
        want = ["README.md:2: link to docs/c.md", "README.md:2: link to docs/b.md#the-node-suite:",
                "README.md:2: `src/x/b.c`", "README.md:3: `scripts/t.sh --nope`"]
        ok = checked == 8 and len(problems) == 4 and all(
            any(p.startswith(w) for p in problems) for w in want)
        print(("ok   " if ok else "FAIL ") + "the scan finds what is broken: " + "; ".join(problems))
        return ok
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    root = os.path.abspath(ap.parse_args().source)
    ok = self_check()
    problems, checked = scan(root)
    for p in problems:
        print(p)
    print(f"docs: {checked} links and paths checked")
    print(f"{checked - len(problems) + ok} passed, {len(problems) + (not ok)} failed")
    return 1 if problems or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
