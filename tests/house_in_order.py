"""The house in order (issue 34): under include/shardwise, no folder includes a folder that includes it back
(directly or through others), no header is over 500 lines, and no function is over 80 lines (as lizard, from
PyPI, measures them). Prints each breach with the files that make it.

    python tests/house_in_order.py [INCLUDE_DIR]   # the check; INCLUDE_DIR defaults to this clone's include/
    python tests/house_in_order.py --self-test     # proves the check finds each kind of breach
"""
import collections
import graphlib
import pathlib
import re
import sys
import tempfile

import lizard

MAX_HEADER_LINES = 500
MAX_FUNCTION_LINES = 80
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]shardwise/([^">]+)[">]', re.M)


def folder_of(relative):
    parts = pathlib.PurePosixPath(relative).parts
    return parts[0] if len(parts) > 1 else "."


def folder_cycles(root):
    """Each folder cycle, as the include lines that make its edges."""
    edges = collections.defaultdict(lambda: collections.defaultdict(list))
    for header in sorted(root.rglob("*.hpp")):
        source = folder_of(header.relative_to(root).as_posix())
        if source == ".":
            continue  # the umbrella headers include everything and nothing includes them
        for target_path in INCLUDE.findall(header.read_text()):
            target = folder_of(target_path)
            if target not in (source, "."):
                edges[source][target].append(f"{header.relative_to(root)} includes {target_path}")
    breaches = []
    graph = {source: set(targets) for source, targets in edges.items()}
    while True:
        try:
            tuple(graphlib.TopologicalSorter(graph).static_order())
            return breaches
        except graphlib.CycleError as cycle:
            nodes = cycle.args[1]  # [a, b, ..., a]: b depends on a, ...
            lines = []
            for dependent, dependency in zip(nodes[1:], nodes[:-1]):
                lines += edges[dependent][dependency]
                graph[dependent].discard(dependency)  # report each cycle once, then look for the next
            breaches.append("folder cycle " + " <- ".join(nodes) + ":\n    " + "\n    ".join(lines))


def long_headers(root):
    for header in sorted(root.rglob("*.hpp")):
        lines = header.read_text().count("\n")
        if lines > MAX_HEADER_LINES:
            yield f"{header.relative_to(root)} has {lines} lines (limit {MAX_HEADER_LINES}): split it"


def long_functions(root):
    for header in sorted(root.rglob("*.hpp")):
        for function in lizard.analyze_file(str(header)).function_list:
            if function.length > MAX_FUNCTION_LINES:
                yield (f"{header.relative_to(root)}:{function.start_line}: {function.name} has {function.length} "
                       f"lines (limit {MAX_FUNCTION_LINES}): split it")


def breaches(root):
    return list(folder_cycles(root)) + list(long_headers(root)) + list(long_functions(root))


def check(root):
    headers = len(list(root.rglob("*.hpp")))
    if headers == 0:
        print(f"no headers under {root}")
        return 1
    found = breaches(root)
    for breach in found:
        print(breach)
    print(f"{headers} headers: {len(found)} breaches")
    return 1 if found else 0


def self_test():
    """A tree with one breach of each kind must give exactly those breaches; the same tree mended, none."""
    with tempfile.TemporaryDirectory() as scratch:
        root = pathlib.Path(scratch) / "shardwise"
        for folder in ("a", "b", "c"):
            (root / folder).mkdir(parents=True)
        (root / "a/one.hpp").write_text('#include "shardwise/b/two.hpp"\n')
        (root / "b/two.hpp").write_text('#include <shardwise/c/three.hpp>\n')
        (root / "c/three.hpp").write_text('#include "shardwise/a/one.hpp"\n' + "// line\n" * MAX_HEADER_LINES)
        body = "".join(f"  x += {i};\n" for i in range(MAX_FUNCTION_LINES))
        (root / "c/four.hpp").write_text(f"inline int long_one(int x) {{\n{body}  return x;\n}}\n")
        found = breaches(root)
        kinds = sorted(b.split(" ")[0] if b.startswith("folder") else b.split(" ")[0].split(":")[0] for b in found)
        expected = ["c/four.hpp", "c/three.hpp", "folder"]
        assert kinds == expected, f"the check found {found}, expected one breach of each kind"
        assert "a/one.hpp includes b/two.hpp" in found[0] and "long_one" in found[2], found
        (root / "c/three.hpp").write_text("// line\n")
        (root / "c/four.hpp").write_text("inline int short_one(int x) { return x; }\n")
        assert breaches(root) == [], breaches(root)
    print("self-test: a folder cycle, a long header and a long function each found; the mended tree passes")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    default = pathlib.Path(__file__).resolve().parent.parent / "include"
    sys.exit(check((pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else default) / "shardwise"))
