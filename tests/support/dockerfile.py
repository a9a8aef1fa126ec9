"""Just enough of the Dockerfile and .dockerignore formats to check the image without Docker:
instructions by stage (continuations joined, comments dropped, ARG defaults substituted in
FROM), exec-form arguments, and .dockerignore matching (last matching pattern wins)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY ...
    args: str  # the rest of the line, continuations joined

    def exec_form(self) -> list[str]:
        """["a", "b"] for JSON (exec) form, else the shell words."""
        text = self.args
        for flag in ("--interval", "--timeout", "--start-period", "--retries"):
            text = re.sub(rf"{flag}=\S+\s*", "", text)
        if self.keyword == "HEALTHCHECK":
            text = text.removeprefix("CMD").strip()
        if text.startswith("["):
            value = json.loads(text)
            assert isinstance(value, list)
            return [str(v) for v in value]
        return shlex.split(text)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse_dockerfile(text: str) -> list[Stage]:
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            base, _, alias = rest.partition(" AS ")
            for name, value in args.items():
                base = base.replace(f"${{{name}}}", value)
            stages.append(Stage(base.strip(), alias.strip() or None))
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, rest))
    return stages


@dataclass
class DockerIgnore:
    patterns: list[tuple[bool, str]]  # (exclude?, pattern)

    @classmethod
    def load(cls, path: Path) -> DockerIgnore:
        patterns = []
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exclude = not line.startswith("!")
            patterns.append((exclude, line.lstrip("!").strip("/")))
        return cls(patterns)

    def excluded(self, relative: str) -> bool:
        """Whether the context leaves `relative` (a/b/c, from the context root) out: the last
        pattern matching it or one of its parent directories decides."""
        parts = relative.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        result = False
        for exclude, pattern in self.patterns:
            if any(_match(pattern, p) for p in prefixes):
                result = exclude
        return result


def _match(pattern: str, path: str) -> bool:
    if pattern.startswith("**/"):
        tail = pattern[3:]
        return fnmatch.fnmatchcase(path, tail) or any(
            fnmatch.fnmatchcase("/".join(path.split("/")[i:]), tail)
            for i in range(1, len(path.split("/")))
        )
    return fnmatch.fnmatchcase(path, pattern) and path.count("/") == pattern.count("/")
