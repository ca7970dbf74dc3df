#!/usr/bin/env python3
"""The README and docs/ point only at what the repository has.

usage: check_docs.py SOURCE_DIR

Checks README.md and docs/*.md: every relative link names a file of the
source tree and, with #anchor, a heading of it (GitHub's anchors: lower
case, punctuation dropped, spaces as hyphens); every docs/ page is linked
from README.md; every path in backquotes under a source directory
(`tests/...`, `tools/...`, `runtime/...`, ...) exists.  Prints one line
per problem and exits 1 if there is any.
"""
import glob
import os
import re
import sys

DIRS = "tests|tools|bench|runtime|codegen|passes|ir|frontend|cli|models|docs"


def slug(heading):
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def strip_code(text):
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`]*`", "", text)


def anchors(path):
    out, fence = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            m = None if fence else re.match(r"#{1,6} (.*)", line)
            if m:
                out.add(slug(m.group(1)))
    return out


def main():
    root = sys.argv[1]
    readme = os.path.join(root, "README.md")
    files = [readme] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    problems = []
    linked = set()
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        rel = os.path.relpath(path, root)
        for url in re.findall(r"\]\(([^)\s]+)\)", strip_code(text)):
            if re.match(r"[a-z]+:", url):
                continue
            target, _, anchor = url.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
            if path == readme:
                linked.add(full)
            if not os.path.exists(full):
                problems.append("%s: link to a file that is not in the repository: %s" % (rel, url))
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                problems.append("%s: link to a heading that %s does not have: %s" % (rel, target or rel, url))
        for m in re.finditer(r"`((?:%s)/[\w./-]*)`" % DIRS, text):
            p = m.group(1).rstrip("/")
            if not glob.glob(os.path.join(root, p)):
                problems.append("%s: names %s, which is not in the repository" % (rel, p))
    for path in files[1:]:
        if os.path.normpath(path) not in linked:
            problems.append("%s: not linked from README.md" % os.path.relpath(path, root))
    for p in problems:
        print(p)
    print("check_docs: %d files, %d problems" % (len(files), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
