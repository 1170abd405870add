#!/usr/bin/env python3
"""Counts a module's lines of math and of protocol (docs/custom-modules.md, "Math and protocol").

A line is a line of code in the class body: blank lines and comments do not count. Each member is either math or
protocol:
- math: the children's declarations and the state the computation keeps; forward and backward (with and without a
  key-value cache) and the helpers they call, directly or through other helpers;
- protocol: what is there for the library: the SHARDWISE_* lists, constructors, shapes, static checks, the
  shardwise_* hooks and costs, type aliases and constants, accessors for other code.

Usage: protocol_lines.py FILE CLASS [--at-most-protocol N] [--protocol-below-math]; prints the counts and fails
(exit 1) when a limit given is broken.
"""
import re
import sys

MATH_FUNCTIONS = {"forward", "backward"}


def class_body(text, name):
    """The text between the braces of `struct/class name` (the first definition)."""
    match = re.search(r"\b(?:struct|class)\s+" + re.escape(name) + r"\b[^;{]*\{", text)
    if not match:
        sys.exit(f"protocol_lines.py: no definition of {name}")
    depth, start = 1, match.end()
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    sys.exit(f"protocol_lines.py: {name}'s body does not close")


def code_lines(text):
    """Lines with code, comments removed."""
    lines = []
    for line in text.split("\n"):
        line = re.sub(r"//.*", "", line).strip()
        if line:
            lines.append(line)
    return lines


def members(lines):
    """Top-level members of a class body: (its lines, its text), split at ';' or a closing '}' at depth 0."""
    out, current, depth = [], [], 0
    for line in lines:
        current.append(line)
        depth += line.count("{") - line.count("}")
        ends_member = depth == 0 and (line.endswith(";") or line.endswith("}") or line.endswith(":"))
        if line.startswith("SHARDWISE_") and depth == 0:
            ends_member = True
        if ends_member:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def function_name(head):
    """The name a member function is declared with, or None for data members and the rest."""
    head = re.sub(r"<[^<>]*>", "", re.sub(r"<[^<>]*>", "", head))  # template arguments, two levels
    match = re.search(r"([A-Za-z_~][A-Za-z_0-9]*)\s*\(", head)
    if not match or "=" in head.split("(")[0]:
        return None
    return match.group(1)


def calls_of(lines):
    return set(re.findall(r"\b([a-z_][a-z_0-9]*)\s*\(", " ".join(lines)))


def classify(body):
    math, protocol = 0, 0
    parsed = members(code_lines(body))
    bodies = {}  # name -> the calls in every member of that name
    for lines in parsed:
        name = function_name(" ".join(lines[:3]))
        if name:
            bodies.setdefault(name, set()).update(calls_of(lines))
    helpers_called, pending = set(), list(MATH_FUNCTIONS)  # what forward and backward reach, through helpers too
    while pending:
        for called in bodies.get(pending.pop(), ()):
            if called not in helpers_called:
                helpers_called.add(called)
                pending.append(called)
    for lines in parsed:
        first = lines[0]
        head = " ".join(lines[:3])
        name = function_name(head)
        if first in ("public:", "private:", "protected:"):
            continue
        if first.startswith("SHARDWISE_") or first.startswith(("using ", "static constexpr", "template <std::size_t")):
            protocol += len(lines)
        elif name is None:  # data: a child or the state the math keeps
            math += len(lines)
        elif name in MATH_FUNCTIONS or (name in helpers_called and not name.startswith("shardwise_")):
            math += len(lines)
        else:  # constructors, hooks, costs, accessors
            protocol += len(lines)
    return math, protocol


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    path, name = argv[1], argv[2]
    math, protocol = classify(class_body(open(path).read(), name))
    print(f"{name} in {path}: {math} lines of math, {protocol} of protocol")
    failed = False
    if "--at-most-protocol" in argv:
        limit = int(argv[argv.index("--at-most-protocol") + 1])
        if protocol > limit:
            print(f"  more protocol than the {limit} lines allowed")
            failed = True
    if "--protocol-below-math" in argv and protocol >= math:
        print("  no fewer lines of protocol than of math")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
