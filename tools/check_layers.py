#!/usr/bin/env python3
"""Checks libdist's layering (docs/architecture.md section 1; issue #34).

Every part of src/ sits at a level; a file may include the headers of its own part and of
parts at lower levels, and of a part at its own level only where ALLOWED_SIDEWAYS says so.
Four checks, each printing `file:line: ...` per violation:

  include    `#include "..."` of a header of a part that is above, or beside and not allowed
  impl       `#include` of another part's `*_impl.h` (a part's private layout), at any level
  declares   a part's header declaring a function that another part defines (a lower header
             that names a higher part's functions hides an upward call, as core/scope.h did)
  calls      a call to a function that only a part above (or beside, not allowed) defines

The CLI (tools/distrain) is checked for includes only: its own headers and the public ones.
The public headers (include/dist/) are the API that every part and the CLI share, outside the
table; what the `calls` check sees is whether a part calls a function defined higher up,
whichever header declared it. A function's part is where a .c/.cu file defines it with
external linkage (static functions shadow it in their file); headers not found (system,
third-party) are ignored. The parsing is textual (comments, strings and preprocessor lines
blanked, braces counted), which the tree's clang-format style keeps reliable; a self-test on a
planted tree runs first, so a parser that stops seeing violations fails too.

Exit status: 0 clean, 1 violations, 2 usage. `--list` prints the parts and levels.
Stdlib only: run as `python3 tools/check_layers.py [repo root]` (ctest: unit.layering).
"""

import os
import re
import sys

# Lower level first. Parts at one level may not use each other unless ALLOWED_SIDEWAYS lists it.
LEVELS = [
    ["core"],
    ["backends", "data", "cluster"],
    ["autodiff"],
    ["nn"],
    ["collective", "ps", "xla", "pjrt"],
    ["strategy"],
    ["optim"],
    ["train"],
]

# Folder under src/ -> part.
FOLDERS = {
    "core": "core",
    "backend": "backends",
    "data": "data",
    "cluster": "cluster",
    "autodiff": "autodiff",
    "nn": "nn",
    "collective": "collective",
    "ps": "ps",
    "xla": "xla",
    "pjrt": "pjrt",
    "strategy": "strategy",
    "optim": "optim",
    "train": "train",
}

# Arrows between parts of one level that the table allows (docs/architecture.md section 1).
ALLOWED_SIDEWAYS = {
    # the parameter-server protocol's connections use the TCP handshake and sockets of
    # collective/net_internal.h
    ("ps", "collective"),
}

# Known violations in files that another change owns, each to be removed by the issue named.
# Entries: (check, file relative to the repo root, what it names). Keep this list short: an
# entry that no longer matches anything is itself reported, so it cannot outlive its fix.
ALLOWLIST = {
}

LEVEL_OF = {part: i for i, parts in enumerate(LEVELS) for part in parts}
LEVEL_OF["cli"] = len(LEVELS)
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
IDENT_CALL_RE = re.compile(r"(?<![\w.>])([A-Za-z_]\w*)\s*\(")
KEYWORDS = {
    "if", "for", "while", "switch", "return", "sizeof", "_Alignof", "alignof", "defined",
    "_Static_assert", "static_assert", "__attribute__", "__typeof__", "typeof", "do", "else",
    "case", "_Generic", "__builtin_expect", "__declspec", "offsetof",
}


# The CLI (tools/distrain) sits above every part and uses the public API only: it may include
# its own headers and include/dist/, no header of src/.
CLI_DIR = "tools/distrain"


def part_of(rel):
    """The part of a path relative to the repo root, or None outside src/<folder>/ and the CLI."""
    if rel.startswith(CLI_DIR + "/"):
        return "cli"
    bits = rel.split("/")
    if len(bits) < 3 or bits[0] != "src":
        return None
    return FOLDERS.get(bits[1])


def allowed(src_part, dst_part):
    if src_part == dst_part:
        return True
    if src_part == "cli":
        return False
    ls, ld = LEVEL_OF[src_part], LEVEL_OF[dst_part]
    if ld < ls:
        return True
    return ld == ls and (src_part, dst_part) in ALLOWED_SIDEWAYS


def strip_code(text):
    """Comments, string and character literals blanked (newlines kept, so lines still count);
    preprocessor lines blanked too."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = "".join(out).split("\n")
    cont = False
    for k, line in enumerate(lines):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            lines[k] = ""
    return "\n".join(lines)


def top_level_statements(code):
    """(head, start offset, body or None) for each statement at brace depth 0: a head ending in
    `;`, or a head followed by a {...} body."""
    depth, start, i, n = 0, 0, 0, len(code)
    while i < n:
        c = code[i]
        if c == "{":
            if depth == 0:
                head, head_start = code[start:i], start
                body_start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                yield head, head_start, code[body_start:i + 1], body_start
                start = i + 1
        elif c == ";" and depth == 0:
            yield code[start:i], start, None, None
            start = i + 1
        i += 1


FUNC_HEAD_RE = re.compile(r"([A-Za-z_]\w*)\s*\(([^()]|\([^()]*\))*\)\s*(__attribute__\s*\(\(.*\)\)\s*)?$",
                          re.S)


def function_name(head):
    """The function a declaration or definition head names, or None."""
    h = head.strip()
    if not h or re.match(r"(typedef|struct|union|enum)\b", h) and "(" not in h:
        return None
    if h.startswith("typedef") or "=" in h or "(*" in h.replace(" ", ""):
        return None
    m = FUNC_HEAD_RE.search(h)
    if not m:
        return None
    name = m.group(1)
    before = h[:m.start()].strip()
    if not before or name in KEYWORDS or name.isupper():
        return None  # a macro call at file level (DIST_API-less macros are upper case)
    return name, re.search(r"\bstatic\b", before) is not None


def line_of(code, offset):
    return code.count("\n", 0, offset) + 1


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = []
        for top in ("src", CLI_DIR):
            for d, dirs, names in os.walk(os.path.join(root, top)):
                dirs.sort()
                for name in sorted(names):
                    if name.endswith(SOURCE_EXT):
                        rel = os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")
                        if part_of(rel):
                            self.files.append(rel)
        self.text = {}
        self.code = {}
        for rel in self.files:
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                self.text[rel] = f.read()
            self.code[rel] = strip_code(self.text[rel])
        # name -> set of parts whose .c/.cu files define it with external linkage
        self.defined_in = {}
        # file -> names it defines with internal linkage (they shadow other parts' names)
        self.statics = {}
        for rel in self.files:
            if rel.endswith((".c", ".cu")):
                self.statics[rel] = set()
                for head, _, body, _ in top_level_statements(self.code[rel]):
                    if body is None:
                        continue
                    fn = function_name(head)
                    if not fn:
                        continue
                    name, is_static = fn
                    if is_static:
                        self.statics[rel].add(name)
                    elif part_of(rel) != "cli":
                        self.defined_in.setdefault(name, set()).add(part_of(rel))

    def resolve(self, rel, inc):
        for base in (os.path.dirname(rel), "src", "include"):
            cand = os.path.normpath(os.path.join(base, inc)).replace(os.sep, "/")
            if os.path.isfile(os.path.join(self.root, cand)):
                return cand
        return None


def check(tree):
    found = []  # (check, file, line, message, what)

    for rel in tree.files:
        part = part_of(rel)
        for no, line in enumerate(tree.text[rel].split("\n"), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            target = tree.resolve(rel, m.group(1))
            dst = part_of(target) if target else None
            if dst is None or dst == part:
                continue
            if os.path.basename(target).endswith("_impl.h"):
                found.append(("impl", rel, no, "part %s includes part %s's private header %s"
                              % (part, dst, target), target))
            elif not allowed(part, dst):
                found.append(("include", rel, no, "part %s includes part %s's header %s (%s)"
                              % (part, dst, target, direction(part, dst)), target))

    for rel in tree.files:
        if not rel.endswith((".h", ".cuh")):
            continue
        part = part_of(rel)
        code = tree.code[rel]
        for head, off, body, _ in top_level_statements(code):
            if body is not None:
                continue
            fn = function_name(head)
            if not fn or fn[1]:
                continue
            owners = tree.defined_in.get(fn[0], set())
            if owners and part not in owners:
                lead = len(head) - len(head.lstrip())
                found.append(("declares", rel, line_of(code, off + lead),
                              "part %s's header declares %s, which part %s defines"
                              % (part, fn[0], "/".join(sorted(owners))), fn[0]))

    for rel in tree.files:
        if not rel.endswith((".c", ".cu", ".h", ".cuh")):
            continue
        part = part_of(rel)
        if part == "cli":
            continue  # it links libdist.so, which exports the API only
        code = tree.code[rel]
        own = tree.statics.get(rel, set())
        seen = set()
        for head, _, body, body_off in top_level_statements(code):
            if body is None:
                continue
            for m in IDENT_CALL_RE.finditer(body):
                name = m.group(1)
                if name in own or name in KEYWORDS or name in seen:
                    continue
                owners = tree.defined_in.get(name)
                if not owners or part in owners or any(allowed(part, o) for o in owners):
                    continue
                seen.add(name)
                o = "/".join(sorted(owners))
                found.append(("calls", rel, line_of(code, body_off + m.start()),
                              "part %s calls %s, which part %s defines (%s)"
                              % (part, name, o, direction(part, sorted(owners)[0])), name))
    return found


def direction(src, dst):
    if src == "cli":
        return "the CLI uses the public API only"
    return "upward" if LEVEL_OF[dst] > LEVEL_OF[src] else "sideways"


# A tree with one violation of each kind, and one arrow of each allowed kind: the checker must
# report exactly the first ones, or a clean run of the real tree proves nothing.
SELF_TEST_TREE = {
    "src/core/scope.h": "int dist_strategy_thing(int x);\nint dist_core_ok(void);\n",
    "src/core/scope.c": "#include \"core/scope.h\"\nint dist_core_ok(void) { return 0; }\n"
                        "int dist_core_calls_up(void) { return dist_strategy_thing(1); }\n",
    "src/backend/b.c": "#include \"data/d.h\"\n#include \"core/scope.h\"\n",
    "src/data/d.h": "int dist_data_x(void);\n",
    "src/autodiff/tape_impl.h": "struct t { int a; };\n",
    "src/strategy/s.h": "int dist_strategy_thing(int x);\n",
    "src/strategy/s.c": "#include \"strategy/s.h\"\n#include \"optim/o.h\"\n"
                        "#include \"autodiff/tape_impl.h\"\n#include \"core/scope.h\"\n"
                        "static int helper(void) { return 1; }\n"
                        "int dist_strategy_thing(int x) { return x + helper() + dist_core_ok(); }\n",
    "src/optim/o.h": "int dist_optim_y(void);\n",
    "src/optim/o.c": "#include \"strategy/s.h\"\nint dist_optim_y(void) { return dist_strategy_thing(2); }\n",
    "src/ps/p.c": "#include \"collective/c.h\"\n",
    "src/collective/c.h": "int dist_net_z(void);\n",
    "src/collective/c.c": "#include \"ps/p.h\"\n",
    "src/ps/p.h": "int dist_ps_w(void);\n",
    "tools/distrain/main.c": "#include \"options.h\"\n#include \"dist/dist.h\"\n"
                             "#include \"core/scope.h\"\n",
    "tools/distrain/options.h": "int options_parse(void);\n",
}
SELF_TEST_EXPECT = [
    ("include", "src/backend/b.c", 1),      # backends and data: one level, not allowed
    ("include", "src/collective/c.c", 1),   # ps may use collective, not the other way
    ("include", "src/strategy/s.c", 2),     # strategy below optim
    ("impl", "src/strategy/s.c", 3),        # another part's *_impl.h
    ("declares", "src/core/scope.h", 1),    # core declaring the strategy's function
    ("calls", "src/core/scope.c", 3),       # core calling it
    ("include", "tools/distrain/main.c", 3),  # the CLI reaching past the public API
]


def self_test():
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        for rel, text in SELF_TEST_TREE.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        got = sorted((k, rel, no) for k, rel, no, _, _ in check(Tree(root)))
    want = sorted(SELF_TEST_EXPECT)
    if got != want:
        print("check_layers: self-test failed: reported %s, expected %s" % (got, want))
        return False
    return True


def main(argv):
    root = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else \
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--list" in argv:
        for i, parts in enumerate(LEVELS):
            print(i, " ".join(parts))
        return 0
    if not os.path.isdir(os.path.join(root, "src")):
        print("check_layers: no src/ under %s" % root, file=sys.stderr)
        return 2
    if not self_test():
        return 1
    tree = Tree(root)
    found = check(tree)
    used = set()
    bad = 0
    for kind, rel, no, msg, what in found:
        key = (kind, rel, what)
        if key in ALLOWLIST:
            used.add(key)
            continue
        bad += 1
        print("%s:%d: %s [%s]" % (rel, no, msg, kind))
    for key in sorted(set(ALLOWLIST) - used):
        bad += 1
        print("tools/check_layers.py: allow-list entry %s matches nothing: remove it" % (key,))
    n = len(tree.files)
    if bad:
        print("check_layers: %d violation(s) in %d files (docs/architecture.md section 1)"
              % (bad, n))
        return 1
    print("check_layers: %d files, %d known exception(s), layering holds" % (n, len(used)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
