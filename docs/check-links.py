#!/usr/bin/env python3
"""Checks that every relative link and anchor in the given Markdown files resolves.

    python3 docs/check-links.py README.md docs/*.md deploy/README.md

A link is `[text](target)`; web links (http:, https:, mailto:) are not checked. A target must
exist relative to the file that links to it; a `#anchor` must be the GitHub id of a heading in
the target file (or in the same file for `#anchor` alone). Exits 1 listing every broken link.
"""
import os
import re
import sys

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose_lines(path):
    """(line number, text) of the lines outside fenced and indented code blocks."""
    in_fence = False
    prev_blank = True
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            # An indented block after a blank line is code (inside a list it is a continuation,
            # which never starts after a blank line in these files).
            if prev_blank and line.startswith("    ") and line.strip():
                continue
            prev_blank = not line.strip()
            yield n, line.rstrip("\n")


def slug(text):
    """GitHub's heading id: rendered text, lower-case, punctuation dropped, spaces → '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        ids = set()
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            ids.add(base if k == 0 else f"{base}-{k}")
        with open(path, encoding="utf-8") as f:
            ids.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", f.read()))
        _anchors[path] = ids
    return _anchors[path]


def check(path):
    broken = []
    for n, line in prose_lines(path):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                broken.append(f"{path}:{n}: {target}: {dest} does not exist")
            elif anchor:
                if not dest.endswith(".md"):
                    broken.append(f"{path}:{n}: {target}: anchor into a file that is not Markdown")
                elif anchor not in anchors(dest):
                    broken.append(f"{path}:{n}: {target}: no heading #{anchor} in {dest}")
    return broken


def main(paths):
    broken = [b for p in paths for b in check(p)]
    for b in broken:
        print(b)
    total = sum(1 for p in paths for _, l in prose_lines(p) for _ in LINK.finditer(CODE_SPAN.sub("", l)))
    print(f"{len(paths)} files, {total} links, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["README.md"]))
