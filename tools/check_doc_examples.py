#!/usr/bin/env python3
"""Checks that every C/C++ example in the documentation is code the build compiles.

Usage: check_doc_examples.py SOURCE_ROOT [--fix]

The C and C++ code blocks of docs/NAME.md (```c, ```cpp) are, in order, the regions between
`// [doc]` (or `/* [doc] */`) and `// [end doc]` (or `/* [end doc] */`) of examples/docs/NAME.c or
NAME.cpp, which examples/meson.build compiles with -Wall -Wextra -Werror. A block's `#include`
lines stand for the file's: each must be among the file's includes; the rest of the block must
equal the region, indentation removed. --fix rewrites the blocks from the regions (includes
kept). Exit status 1, with the differences, when a block and its region differ, a document has
more blocks than regions or fewer, or a region has no document.
"""
import difflib
import pathlib
import re
import sys

FENCE = re.compile(r"^```(c|cpp|c\+\+)\s*$")
START = re.compile(r"^\s*(//\s*\[doc\]|/\*\s*\[doc\]\s*\*/)\s*$")
END = re.compile(r"^\s*(//\s*\[end doc\]|/\*\s*\[end doc\]\s*\*/)\s*$")


def dedent(lines):
    lines = [line.rstrip() for line in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    indent = min((len(line) - len(line.lstrip()) for line in lines if line), default=0)
    return [line[indent:] for line in lines]


def doc_blocks(path):
    """(first line number, include lines, body lines, (start, end) line indexes) per block."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            text = lines[i + 1 : j]
            includes = [line.strip() for line in text if line.startswith("#include")]
            body = dedent([line for line in text if not line.startswith("#include")])
            blocks.append((i + 2, includes, body, (i + 1, j)))
            i = j
        i += 1
    return lines, blocks


def example_regions(path):
    lines = path.read_text().splitlines()
    regions, start = [], None
    for n, line in enumerate(lines):
        if START.match(line):
            start = n + 1
        elif END.match(line) and start is not None:
            regions.append((start + 1, dedent(lines[start:n])))
            start = None
    includes = {line.strip() for line in lines if line.startswith("#include")}
    return regions, includes


def main():
    root = pathlib.Path(sys.argv[1])
    fix = "--fix" in sys.argv[2:]
    examples = {p.stem: p for p in sorted((root / "examples/docs").glob("*")) if p.suffix in (".c", ".cpp")}
    problems, checked = [], 0
    for doc in sorted((root / "docs").glob("*.md")) + [root / "README.md"]:
        lines, blocks = doc_blocks(doc)
        example = examples.pop(doc.stem, None)
        if not blocks:
            if example:
                problems.append(f"{example}: no C or C++ block in {doc.name} for its regions")
            continue
        name = doc.relative_to(root)
        if example is None:
            problems.append(f"{name}: {len(blocks)} code block(s) but no examples/docs/{doc.stem}.c or .cpp")
            continue
        regions, file_includes = example_regions(example)
        if len(regions) != len(blocks):
            problems.append(f"{name}: {len(blocks)} code block(s), {example.relative_to(root)}: {len(regions)} region(s)")
            continue
        for (line, includes, body, span), (region_line, region) in reversed(list(zip(blocks, regions))):
            checked += 1
            where = f"{name}:{line} / {example.relative_to(root)}:{region_line}"
            for include in includes:
                if include not in file_includes:
                    problems.append(f"{where}: the example file lacks `{include}`")
            if body != region:
                if fix:
                    lines[span[0] : span[1]] = includes + ([""] if includes else []) + region
                else:
                    diff = "\n".join(difflib.unified_diff(body, region, "document", "example", lineterm=""))
                    problems.append(f"{where}: the block differs from the compiled code\n{diff}")
        if fix:
            doc.write_text("\n".join(lines) + "\n")
    for stem, example in examples.items():
        problems.append(f"{example.relative_to(root)}: no docs/{stem}.md")
    for problem in problems:
        print(problem)
    print(f"check_doc_examples: {checked} block(s) checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
