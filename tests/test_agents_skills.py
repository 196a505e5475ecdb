"""The skill registry: loading skill files, BM25 selection, composition, prompts and tools."""

import dataclasses
import string

import bm25s
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.agents import ReActAgent, ScriptedPolicy
from agentic_jax.agents.protocols.skills import (
    SKILLS_DIR,
    Skill,
    SkillError,
    SkillRegistry,
    compose,
    parse_skill,
    skill_tools,
    skills_prompt,
    with_skills,
)
from agentic_jax.agents.tools.builtin import calculator

SKILL_FILE = """---
name: weather
description: Report the weather forecast for a city.
tools: [calculator]
examples:
  - Will it rain in Oslo tomorrow?
---
Say the temperature in Celsius.
"""


def test_shipped_skills_load_with_their_fields():
    registry = SkillRegistry.load()
    assert [s.name for s in registry] == ["arithmetic", "python-analysis", "summarization"]
    arithmetic = registry.get("arithmetic")
    assert arithmetic.tools == ("calculator",) and arithmetic.examples
    assert "calculator" in arithmetic.instructions and not arithmetic.instructions.startswith("-")
    assert len(registry) == 3 and "summarization" in registry and "nope" not in registry
    assert [t.name for t in skill_tools(registry.skills())] == ["calculator", "python"]


def test_load_reads_flat_files_and_agent_skills_directories(tmp_path):
    (tmp_path / "weather.md").write_text(SKILL_FILE)
    nested = tmp_path / "poems"
    nested.mkdir()
    (nested / "SKILL.md").write_text(
        "---\nname: poems\ndescription: Write short poems.\n"
        "license: MIT\nallowed-tools: Read\n---\nRhyme.\n"
    )
    (tmp_path / "notes.txt").write_text("not a skill")
    registry = SkillRegistry.load(tmp_path)
    assert [s.name for s in registry] == ["poems", "weather"]
    assert registry.get("weather") == Skill(
        "weather",
        "Report the weather forecast for a city.",
        "Say the temperature in Celsius.",
        ("calculator",),
        ("Will it rain in Oslo tomorrow?",),
    )
    assert registry.get("poems").tools == ()  # allowed-tools names another host's tools


@pytest.mark.parametrize(
    "text, problem",
    [
        ("name: x\ndescription: y\n", "front-matter block"),
        ("---\nname: x\ndescription: y\n", "front-matter block"),
        ("---\nname: [x\n---\n", "not valid YAML"),
        ("---\n- a list\n---\n", "mapping"),
        ("---\nname: x\n---\nbody", "missing front-matter field(s) ['description']"),
        ("---\nname: x\ndescription: y\ntool: [calculator]\n---\n", "unknown front-matter field"),
        ("---\nname: x\ndescription: y\ntools: calculator\n---\n", "tools must be a list"),
        ("---\nname: two words\ndescription: y\n---\n", "skill name"),
        ("---\nname: x\ndescription: ''\n---\n", "needs a description"),
        ("---\nname: x\ndescription: y\n1: a\ntool: b\n---\n", "field(s) ['1', 'tool']"),
    ],
)
def test_malformed_skill_files_fail_naming_the_problem(text, problem):
    with pytest.raises(SkillError, match=r"bad\.md") as error:
        parse_skill(text, "bad.md")
    assert problem in str(error.value)


def test_a_byte_order_mark_before_the_front_matter_is_ignored(tmp_path):
    (tmp_path / "weather.md").write_text("\ufeff" + SKILL_FILE, encoding="utf-8")
    assert SkillRegistry.load(tmp_path).get("weather") == parse_skill(SKILL_FILE)


def test_select_among_skills_without_a_searchable_word_finds_nothing():
    registry = SkillRegistry([Skill("a", "It is.", ""), Skill("b", "x", "")])  # stop words
    assert registry.select("what is it") == [] and registry.select("xylophone") == []


def test_duplicate_names_and_mismatched_directories_are_errors(tmp_path):
    (tmp_path / "a.md").write_text(SKILL_FILE)
    (tmp_path / "b.md").write_text(SKILL_FILE)
    with pytest.raises(SkillError, match=r"b\.md.*already registered"):
        SkillRegistry.load(tmp_path)
    with pytest.raises(SkillError, match="already registered"):
        SkillRegistry([Skill("a", "x", ""), Skill("a", "y", "")])
    other = tmp_path / "nested" / "other"
    other.mkdir(parents=True)
    (other / "SKILL.md").write_text(SKILL_FILE)  # names itself "weather"
    with pytest.raises(SkillError, match="'weather' differs from its directory 'other'"):
        SkillRegistry.load(tmp_path / "nested")
    with pytest.raises(SkillError, match="does not exist"):
        SkillRegistry.load(tmp_path / "missing")
    with pytest.raises(SkillError, match="unknown skill 'zzz'"):
        SkillRegistry().get("zzz")


def test_select_ranks_by_relevance_and_leaves_out_unrelated_skills():
    registry = SkillRegistry.load(SKILLS_DIR)
    assert registry.select("What is 4821 * 37? Use the calculator.")[0].name == "arithmetic"
    assert registry.select("summarise these meeting notes", k=1)[0].name == "summarization"
    assert registry.select("simulate dice rolls with a python program")[0].name == "python-analysis"
    assert registry.select("xylophone quartz") == []
    assert registry.select("the and of") == []  # stop words only
    assert registry.select("calculator", k=0) == []
    with pytest.raises(ValueError, match="k=-1"):
        registry.select("x", k=-1)


def _kept(word: str) -> bool:
    """Not a stop word: the tokenizer keeps it."""
    return bm25s.tokenize(word, return_ids=False, show_progress=False)[0] == [word]


WORD = st.text(string.ascii_lowercase, min_size=4, max_size=8).filter(_kept)


@given(
    st.lists(st.lists(WORD, min_size=2, max_size=5, unique=True), min_size=2, max_size=5), st.data()
)
def test_a_task_with_a_skills_distinctive_words_selects_it_first(vocabularies, data):
    """Words only skill i has make it the top choice, whatever other shared words surround
    them: every other skill scores zero on them."""
    owner = {}
    for i, words in enumerate(vocabularies):
        for word in words:
            owner.setdefault(word, set()).add(i)
    skills = [Skill(f"s{i}", " ".join(words), "") for i, words in enumerate(vocabularies)]
    registry = SkillRegistry(skills)
    target = data.draw(st.integers(0, len(skills) - 1))
    distinctive = [w for w in vocabularies[target] if owner[w] == {target}]
    if not distinctive:
        return
    task = " ".join(data.draw(st.lists(st.sampled_from(distinctive), min_size=1, max_size=3)))
    selected = registry.select(task, k=len(skills))
    assert selected[0].name == f"s{target}"
    assert len(selected) == 1  # the others share no word with the task


def test_registering_invalidates_the_index():
    registry = SkillRegistry([Skill("a", "apples and pears", "")])
    assert registry.select("bananas") == []
    registry.register(Skill("b", "bananas", ""))
    assert [s.name for s in registry.select("bananas")] == ["b"]


def test_compose_merges_instructions_tools_and_examples_in_order():
    a = Skill("a", "First.", "Do A.", ("calculator", "python"), ("ex1",))
    b = Skill("b", "Second.", "Do B.", ("python",), ("ex1", "ex2"))
    c = Skill("c", "Third.", "", (), ())
    merged = compose(a, b, c, name="abc")
    assert merged == Skill(
        "abc",
        "First. Second. Third.",
        "## a\n\nDo A.\n\n## b\n\nDo B.",
        ("calculator", "python"),
        ("ex1", "ex2"),
    )
    assert compose(a, name="solo", description="Own words.").description == "Own words."
    with pytest.raises(SkillError, match="at least one"):
        compose(name="empty")
    with pytest.raises(SkillError, match="twice"):
        compose(a, a, name="aa")


def test_selected_skills_equip_an_agent_with_prompt_and_tools():
    registry = SkillRegistry.load()
    task = "What is 17 * 23 + 100?"
    selected = registry.select(task, k=1)
    prompt = with_skills("You are terse.", selected)
    assert prompt.startswith("You are terse.\n\n# Skills")
    assert "## Skill: arithmetic" in prompt and "Tools: calculator" in prompt
    assert with_skills("You are terse.", []) == "You are terse." and skills_prompt([]) == ""
    policy = ScriptedPolicy(
        [
            {"tool_calls": [{"name": "calculator", "arguments": {"expression": "17 * 23 + 100"}}]},
            "491",
        ]
    )
    result = ReActAgent(policy, skill_tools(selected), system_prompt=prompt).run(task)
    assert result.answer == "491" and result.tool_calls == ["calculator"]
    assert policy.calls[0][0][0].content == prompt and policy.calls[0][1] == ["calculator"]


def test_skill_tools_prefers_given_tools_and_names_missing_ones():
    own = dataclasses.replace(calculator, description="mine")
    skills = [Skill("a", "x", "", ("calculator",)), Skill("b", "y", "", ("teleport",))]
    assert skill_tools(skills[:1], [own])[0].description == "mine"
    assert skill_tools(skills[:1], {"calculator": own})[0] is own
    with pytest.raises(SkillError, match=r"\['b'\] need tool 'teleport'"):
        skill_tools(skills)
