"""YAML loading that remembers where every key and value was written.

PyYAML's composer gives each node a start mark; we walk the node tree once, record the marks under the
same dotted paths ``SpecIssue`` uses (``distribution.smdistributed.dataparallel.enabled``, ``tags[0]``),
then let PyYAML's safe constructor build the values. Problems are then reported as ``job.yaml:7:3``.

A job file is input from anyone, so reading it is bounded before anything is built: the file's size,
the nesting depth (checked on the event stream, which PyYAML parses without recursion), and the number
of nodes once aliases are expanded (a "billion laughs" file is a few lines that expand to 10^9 nodes);
a recursive alias is refused too. Each limit is an error that says where and what to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from smddp_sdk.errors import SpecError, SpecIssue
from smddp_sdk.specs.limits import MAX_INT_DIGITS, MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES

# Issues about a key's name are reported at the key; all others at the value.
KEY_PROBLEMS = (
    "unknown field",
    "unknown option",
    "unknown channel option",
    "unknown distribution",
    "unknown smdistributed strategy",
    "unknown scheduler option",
    "unknown scheduler section",
    "keys must be strings",
    "duplicate key",
)


@dataclass(frozen=True, order=True)
class Mark:
    """A 1-based line and column in a YAML file."""

    line: int
    column: int

    @classmethod
    def of(cls, mark: yaml.Mark) -> Mark:
        return cls(mark.line + 1, mark.column + 1)


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML mapping plus the position of every key and value in it."""

    name: str  # the file as the user named it, used in messages
    text: str
    data: Any
    key_marks: dict[str, Mark] = field(default_factory=dict)
    value_marks: dict[str, Mark] = field(default_factory=dict)
    collections: frozenset[str] = frozenset()  # paths whose value is a mapping or a list
    issues: tuple[SpecIssue, ...] = ()  # problems found while reading (duplicate keys)

    def locate(self, path: str, message: str = "") -> Mark:
        """Where ``path`` was written; falls back to the nearest enclosing key, then to the file start."""
        at_key = message.startswith(KEY_PROBLEMS)
        for candidate in ancestors(path):
            if candidate in self.key_marks and (candidate in self.collections or (at_key and candidate == path)):
                return self.key_marks[candidate]  # a block's value starts on the next line: show its key
            if candidate in self.value_marks:
                return self.value_marks[candidate]
        return self.value_marks.get("", Mark(1, 1))


class YamlSyntaxError(SpecError):
    """The file is not valid YAML; carries the position and the offending line for a caret display."""

    def __init__(self, name: str, mark: Mark, problem: str, line_text: str) -> None:
        self.name, self.mark, self.problem, self.line_text = name, mark, problem, line_text
        super().__init__(SpecIssue("", f"YAML syntax error: {problem}"))

    def render(self) -> str:
        gutter = f"{self.mark.line:>5} | "
        text, column = _window(self.line_text, self.mark.column)
        caret = " " * (len(gutter) - 2) + "| " + " " * (column - 1) + "^"
        return f"{self.name}:{self.mark.line}:{self.mark.column}: YAML syntax error: {self.problem}\n{gutter}{text}\n{caret}"


def _window(line: str, column: int, width: int = 100) -> tuple[str, int]:
    """At most ``width`` characters of a long line around ``column``, and the column within them; control
    characters (NUL, escapes) are shown as '?' so they cannot garble the terminal."""
    line = "".join("?" if ord(ch) < 32 and ch != "\t" or ord(ch) == 127 else ch for ch in line)
    if len(line) <= width:
        return line, column
    start = max(0, min(column - width // 2, len(line) - width))
    text = line[start : start + width]
    return ("..." if start else "") + text + ("..." if start + width < len(line) else ""), column - start + (3 if start else 0)


def load_yaml_file(path: Path, name: str | None = None) -> YamlDocument:
    """Read and parse ``path``; a missing or unreadable file is a ``SpecError``."""
    name = name or str(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_YAML_BYTES + 1)  # /dev/zero or a huge file stops here, not in memory
        if len(raw) > MAX_YAML_BYTES:
            first = raw[:200].decode("utf-8", "replace").splitlines()[:1]
            raise YamlSyntaxError(name, Mark(1, 1), f"the file is larger than {MAX_YAML_BYTES} bytes, the limit for job files", first[0] if first else "")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise SpecError(SpecIssue(name, "file not found", "check the path, or run `smddp-launch init` to write one")) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise SpecError(SpecIssue(name, f"cannot read the file: {err}")) from None
    return parse_yaml(text, name)


def parse_yaml(text: str, name: str) -> YamlDocument:
    """Parse YAML text into a document with marks; raises ``YamlSyntaxError`` with line and column."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise YamlSyntaxError(name, Mark(1, 1), f"the file is larger than {MAX_YAML_BYTES} bytes, the limit for job files", _line(text, 1))
    try:
        _check_depth(text, name)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return YamlDocument(name, text, None)
            _check_expansion(node, name, text)
            walker = _MarkWalker()
            walker.walk(node, "")
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as err:
        where = _error_mark(err, text)
        problem = err.problem or err.context or "invalid YAML"
        if err.context and err.problem:
            problem = f"{err.problem} ({err.context})"
        raise YamlSyntaxError(name, where, problem, _line(text, where.line)) from None
    except yaml.reader.ReaderError as err:  # bad characters: a position, no mark
        mark = _mark_at(text, err.position)
        code = err.character if isinstance(err.character, int) else ord(err.character)
        problem = f"the character U+{code:04X} is not allowed in YAML; remove it or write it as an escape in a quoted string"
        raise YamlSyntaxError(name, mark, problem, _line(text, mark.line)) from None
    except yaml.YAMLError as err:
        raise YamlSyntaxError(name, Mark(1, 1), str(err).splitlines()[0], _line(text, 1)) from None
    except RecursionError:  # a safety net: the checks above keep PyYAML's recursive composer shallow
        raise YamlSyntaxError(name, Mark(1, 1), f"nesting is too deep (at most {MAX_YAML_DEPTH} levels)", _line(text, 1)) from None
    return YamlDocument(name, text, data, walker.key_marks, walker.value_marks, frozenset(walker.collections), tuple(walker.issues))


def _check_depth(text: str, name: str) -> None:
    """Refuse deep nesting before composing: PyYAML composes nodes recursively, its parser does not."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                mark = Mark.of(event.start_mark)
                raise YamlSyntaxError(name, mark, f"nesting is deeper than {MAX_YAML_DEPTH} levels; flatten the structure", _line(text, mark.line))
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_expansion(root: yaml.Node, name: str, text: str) -> None:
    """Count nodes with every alias expanded, and find recursive aliases, without expanding anything.

    One iterative pass over the node graph (each distinct node once): a node's expanded size is itself plus
    its children's, and a node met again while it is still being visited is a cycle.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            visiting.discard(key)
            size[key] = 1 + sum(size[id(child)] for child in children)
            depth[key] = 1 + max((depth[id(child)] for child in children), default=0)
            if size[key] > MAX_YAML_NODES or depth[key] > MAX_YAML_DEPTH:
                mark = Mark.of(node.start_mark)
                what = f"more than {MAX_YAML_NODES} values" if size[key] > MAX_YAML_NODES else f"nesting deeper than {MAX_YAML_DEPTH} levels"
                raise YamlSyntaxError(name, mark, f"aliases expand to {what}; write the values out or use fewer aliases", _line(text, mark.line))
            continue
        if key in size:
            continue
        _check_scalar(node, name, text)
        visiting.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in visiting:
                mark = Mark.of(child.start_mark)
                raise YamlSyntaxError(name, mark, "recursive alias: an anchor is used inside its own value", _line(text, mark.line))
            if id(child) not in size:
                stack.append((child, False))


def _check_scalar(node: yaml.Node, name: str, text: str) -> None:
    """An integer of thousands of digits: Python refuses to read one (and no setting needs one)."""
    if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int" and len(node.value) > MAX_INT_DIGITS:
        mark = Mark.of(node.start_mark)
        raise YamlSyntaxError(name, mark, f"a number of {len(node.value)} digits is too long (at most {MAX_INT_DIGITS})", _line(text, mark.line))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


class _MarkWalker:
    def __init__(self) -> None:
        self.key_marks: dict[str, Mark] = {}
        self.value_marks: dict[str, Mark] = {}
        self.collections: set[str] = set()
        self.issues: list[SpecIssue] = []

    def walk(self, node: yaml.Node, path: str) -> None:
        self.value_marks.setdefault(path, Mark.of(node.start_mark))
        if isinstance(node, yaml.MappingNode):
            self.collections.add(path)
            self.walk_mapping(node, path)
        elif isinstance(node, yaml.SequenceNode):
            self.collections.add(path)
            for index, item in enumerate(node.value):
                self.walk(item, f"{path}[{index}]")

    def walk_mapping(self, node: yaml.MappingNode, path: str) -> None:
        seen: dict[str, Mark] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue  # merged (<<) content keeps the anchor's marks; complex keys fail in construction
            key = str(key_node.value)
            child = f"{path}.{key}" if path else key
            mark = Mark.of(key_node.start_mark)
            if not path and key_node.tag != "tag:yaml.org,2002:str":
                self.issues.append(_odd_top_key(key, child, mark))
            if key in seen:
                # PyYAML keeps the last value, so that is the one located; the message names the first.
                self.issues.append(SpecIssue(child, "duplicate key", f"also written on line {seen[key].line}; keep one"))
                for stale in [p for p in (*self.key_marks, *self.value_marks) if p.startswith((f"{child}.", f"{child}["))]:
                    self.key_marks.pop(stale, None)
                    self.value_marks.pop(stale, None)
                self.value_marks.pop(child, None)
            seen[key] = mark
            self.key_marks[child] = mark
            self.walk(value_node, child)


def _odd_top_key(key: str, path: str, mark: Mark) -> SpecIssue:
    """`1: x`, `~: x` or `true: x` at the top: job fields are named by text. A key with '.' or '['
    would read as a path, so it is reported at the file's start and named in the message."""
    if "." in key or "[" in key:
        return SpecIssue("", f"line {mark.line}: the key {key} is not a field name (field names are text such as entry_point)")
    return SpecIssue(path, "keys must be strings", "field names are text such as entry_point")


def _error_mark(err: yaml.MarkedYAMLError, text: str) -> Mark:
    """Where to point: the problem, unless it is the end of the file (an unclosed quote or bracket),
    where the construct that was left open is the useful place."""
    problem, context = err.problem_mark, err.context_mark
    if problem is not None and context is not None and problem.index >= len(text.rstrip()):
        return Mark.of(context)
    mark = problem or context
    return Mark.of(mark) if mark is not None else Mark(1, 1)


def _mark_at(text: str, position: int) -> Mark:
    before = text[:position]
    return Mark(before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1)


def ancestors(path: str) -> list[str]:
    """``a.b[0].c`` -> [``a.b[0].c``, ``a.b[0]``, ``a.b``, ``a``]."""
    out = [path]
    while path:
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
        if path:
            out.append(path)
    return out


def _line(text: str, line: int) -> str:
    lines = text.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""
