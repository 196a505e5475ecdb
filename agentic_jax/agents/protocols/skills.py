"""Skills: named, reusable instructions with the tools they need, selected per task.

A :class:`Skill` is what an agent should know for one kind of task (say, careful arithmetic):
a description (what it is for), instructions (how to do it, for the system prompt), the names of
the agentic-jax tools it uses and example tasks.  A :class:`SkillRegistry` holds skills by name,
loads them from a directory, and selects the ones relevant to a task, so that an agent's prompt
carries only those (progressive disclosure, as in Anthropic's *Agent Skills*).

**File format.**  One Markdown file per skill, ``<dir>/<name>.md`` or ``<dir>/<name>/SKILL.md``
(the Agent Skills layout), with a YAML front-matter block; the body is the instructions::

    ---
    name: arithmetic
    description: Exact integer arithmetic with the calculator tool.
    tools: [calculator]
    examples:
      - What is 17 * 23 + 100?
    ---
    Never compute products of large numbers in your head: ...

``name`` and ``description`` are required; ``tools`` and ``examples`` are lists of strings.  The
Agent Skills fields ``license``, ``compatibility``, ``metadata`` and ``allowed-tools`` (the tool
names of other hosts) are accepted and not used; any other key is an error, so a misspelt
``tool:`` fails at load time instead of silently dropping the skill's tools.

**Selection** scores each skill's text (name, description, examples, instructions) against the
task with Okapi BM25 (Robertson & Zaragoza 2009, *The Probabilistic Relevance Framework: BM25
and Beyond*) by a :class:`~agentic_jax.agents.tools.retrieval.Retriever`, whose index,
:class:`~agentic_jax.retrieval.BM25`, has the formula and tokenisation in its module
docstring: whole lowercased words without stemming, English stop words removed. Skills that
share no word with the task are never selected.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import yaml

from agentic_jax.agents.tools.base import Tool
from agentic_jax.agents.tools.builtin import builtin_tool
from agentic_jax.agents.tools.retrieval import Retriever

SKILLS_DIR = Path(__file__).resolve().parents[2] / "skills"  # the skills shipped with the package
SKILL_FILE = "SKILL.md"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FIELDS = {"name", "description", "tools", "examples"}
_FOREIGN_FIELDS = {"license", "compatibility", "metadata", "allowed-tools"}
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*\r?$\n?", re.DOTALL | re.MULTILINE)


class SkillError(ValueError):
    """A malformed skill or skill file, a duplicate name or an unknown skill."""


@dataclasses.dataclass(frozen=True)
class Skill:
    """``tools`` are agentic-jax tool names; ``examples`` are tasks the skill is meant for."""

    name: str
    description: str
    instructions: str
    tools: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SkillError(
                f"skill name {self.name!r} must be 1-64 letters, digits, '_', '-' "
                f"or '.', starting with a letter or digit"
            )
        for field in ("description", "instructions"):
            if not isinstance(getattr(self, field), str):
                raise SkillError(f"skill {self.name!r}: {field} must be a string")
        if not self.description.strip():
            raise SkillError(f"skill {self.name!r} needs a description")
        for field in ("tools", "examples"):
            value = getattr(self, field)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise SkillError(
                    f"skill {self.name!r}: {field} must be a list of strings, got {value!r}"
                )
            object.__setattr__(self, field, tuple(value))

    def prompt(self) -> str:
        """The skill as a system-prompt section."""
        parts = [f"## Skill: {self.name}", self.description.strip()]
        if self.instructions.strip():
            parts.append(self.instructions.strip())
        if self.tools:
            parts.append("Tools: " + ", ".join(self.tools))
        if self.examples:
            parts.append("Example tasks:\n" + "\n".join(f"- {e}" for e in self.examples))
        return "\n\n".join(parts)

    def search_text(self) -> str:
        """The text selection matches a task against."""
        return "\n".join(
            [
                self.name.replace("-", " ").replace("_", " "),
                self.description,
                *self.examples,
                self.instructions,
            ]
        )


def parse_skill(text: str, source: str = "<string>") -> Skill:
    """A skill from a Markdown file's text (front matter, then instructions).  A leading byte
    order mark (as some Windows editors write) is ignored."""
    text = text.removeprefix("\ufeff")
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise SkillError(
            f"{source}: a skill file starts with a '---' front-matter block closed by a '---' line"
        )
    try:
        fields = yaml.safe_load(match.group(1))
    except yaml.YAMLError as e:
        raise SkillError(f"{source}: front matter is not valid YAML: {e}") from None
    if not isinstance(fields, dict):
        raise SkillError(f"{source}: front matter must be a mapping of fields, got {fields!r}")
    unknown = set(fields) - _FIELDS - _FOREIGN_FIELDS
    if unknown:  # YAML keys need not be strings (``1:``, ``yes:``), nor sort together
        raise SkillError(
            f"{source}: unknown front-matter field(s) "
            f"{sorted(map(str, unknown))}; expected {sorted(_FIELDS)}"
        )
    missing = {"name", "description"} - set(fields)
    if missing:
        raise SkillError(f"{source}: missing front-matter field(s) {sorted(missing)}")
    try:
        return Skill(
            fields["name"],
            fields["description"],
            text[match.end() :].strip(),
            _string_list(fields.get("tools")),
            _string_list(fields.get("examples")),
        )
    except SkillError as e:
        raise SkillError(f"{source}: {e}") from None


def _string_list(value) -> tuple:
    """YAML's ``None`` (an empty field) as no items; lists as tuples; anything else as is, for
    :class:`Skill` to reject."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else value


def skill_files(directory: str | Path) -> list[Path]:
    """``<dir>/*.md`` and ``<dir>/*/SKILL.md``, sorted by path."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SkillError(f"skill directory {str(directory)!r} does not exist")
    flat = [p for p in directory.glob("*.md") if p.is_file()]
    nested = [p for p in directory.glob(f"*/{SKILL_FILE}") if p.is_file()]
    return sorted(flat + nested)


class SkillRegistry:
    """Skills by unique name, in registration order."""

    def __init__(self, skills: Iterable[Skill] = ()):
        self._skills: dict[str, Skill] = {}
        self._index: Retriever | None = None
        for skill in skills:
            self.register(skill)

    def register(self, skill: Skill) -> Skill:
        if not isinstance(skill, Skill):
            raise SkillError(f"expected a Skill, got {type(skill).__name__}")
        if skill.name in self._skills:
            raise SkillError(f"a skill named {skill.name!r} is already registered")
        self._skills[skill.name] = skill
        self._index = None
        return skill

    def get(self, name: str) -> Skill:
        if name not in self._skills:
            raise SkillError(f"unknown skill {name!r}; registered: {sorted(self._skills)}")
        return self._skills[name]

    def skills(self) -> list[Skill]:
        return list(self._skills.values())

    def __iter__(self) -> Iterator[Skill]:
        return iter(self.skills())

    def __len__(self) -> int:
        return len(self._skills)

    def __contains__(self, name: object) -> bool:
        return name in self._skills

    @classmethod
    def load(cls, path: str | Path = SKILLS_DIR) -> SkillRegistry:
        """Every skill file in ``path`` (default: the shipped skills); a malformed file or a
        repeated name is a :class:`SkillError` naming the file."""
        registry = cls()
        for file in skill_files(path):
            skill = parse_skill(file.read_text(encoding="utf-8"), str(file))
            if file.name == SKILL_FILE and skill.name != file.parent.name:
                raise SkillError(
                    f"{file}: name {skill.name!r} differs from its directory {file.parent.name!r}"
                )
            try:
                registry.register(skill)
            except SkillError as e:
                raise SkillError(f"{file}: {e}") from None
        return registry

    def select(self, task: str, k: int = 3) -> list[Skill]:
        """Up to ``k`` skills most relevant to ``task`` by BM25, best first (ties in registration
        order); skills sharing no word with the task are left out."""
        if k < 0:
            raise ValueError(f"k={k} must be >= 0")
        if not self._skills or k == 0:
            return []
        if self._index is None:
            self._index = Retriever([s.search_text() for s in self], list(self._skills))
        return [self._skills[hit.id] for hit in self._index.search(task, k)]


def compose(*skills: Skill, name: str, description: str | None = None) -> Skill:
    """One skill doing the work of several: instructions in order under each skill's heading,
    tools and examples united (first occurrence kept).  ``description`` defaults to the parts'
    descriptions joined."""
    if not skills:
        raise SkillError("compose needs at least one skill")
    names = [s.name for s in skills]
    if len(set(names)) != len(names):
        raise SkillError(f"compose got a skill twice: {names}")
    instructions = "\n\n".join(
        f"## {s.name}\n\n{s.instructions.strip()}" for s in skills if s.instructions.strip()
    )
    return Skill(
        name,
        description or " ".join(s.description.strip() for s in skills),
        instructions,
        _union(s.tools for s in skills),
        _union(s.examples for s in skills),
    )


def _union(groups: Iterable[Sequence[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for group in groups for item in group))


def skills_prompt(skills: Sequence[Skill]) -> str:
    """A system-prompt fragment presenting ``skills`` (empty when there are none)."""
    if not skills:
        return ""
    return "# Skills\n\nFollow the instructions of the skills that fit the task.\n\n" + "\n\n".join(
        s.prompt() for s in skills
    )


def skill_tools(
    skills: Sequence[Skill], tools: Mapping[str, Tool] | Sequence[Tool] = ()
) -> list[Tool]:
    """The tools ``skills`` name, each once, looked up in ``tools`` (a name -> tool mapping or a
    list of tools) and then among the built-in tools; an unknown name is a :class:`SkillError`
    naming the skills that need it."""
    if not isinstance(tools, Mapping):
        tools = {t.name: t for t in tools}
    out = []
    for name in _union(s.tools for s in skills):
        if name in tools:
            out.append(tools[name])
            continue
        try:
            out.append(builtin_tool(name))
        except KeyError:
            users = [s.name for s in skills if name in s.tools]
            raise SkillError(
                f"skill(s) {users} need tool {name!r}, which is neither among the "
                f"given tools {sorted(tools)} nor built in"
            ) from None
    return out


def with_skills(system_prompt: str, skills: Sequence[Skill]) -> str:
    """``system_prompt`` followed by the skills' fragment."""
    fragment = skills_prompt(skills)
    return f"{system_prompt}\n\n{fragment}" if fragment else system_prompt
