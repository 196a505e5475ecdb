"""MemGPT-style memory tools driven by a scripted policy through the ReAct loop, their limits
and permissions, and an agent given its memory from gin (`agentic-jax agent`)."""

import gin
import pytest

from agentic_jax.agents import ContextManager, ReActAgent, ScriptedPolicy, ToolExecutor
from agentic_jax.agents.tools.memory import MEMORY_TOOLS, MemoryTools
from agentic_jax.cli import main
from agentic_jax.data.chat import ToolCall
from agentic_jax.memory import (
    HashingEmbedder,
    MemoryReader,
    MemoryRecord,
    MemoryStore,
    MemoryWriter,
    SharedSpace,
)

FACT = "Ann's locker code is 4512."


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _tools(store, *, core_limit=2000):
    embed = HashingEmbedder(64)
    context = ContextManager()
    tools = MemoryTools(
        store,
        MemoryWriter(store, embed),
        MemoryReader(store, embed),
        context,
        user="ann",
        core_limit=core_limit,
    )
    return tools, context


def _call(name, **arguments):
    return {"text": "", "tool_calls": [{"name": name, "arguments": arguments}]}


def _system(policy, turn):
    return policy.calls[turn][0][0].content


def test_a_scripted_agent_pages_a_fact_out_and_back_in_and_answers_from_it(tmp_path):
    with MemoryStore(tmp_path, "notes") as store:
        tools, context = _tools(store)
        first = ScriptedPolicy(
            [
                _call("core_memory_append", text=FACT),
                _call("page_out", text="locker code"),
                "Noted.",
            ]
        )
        result = ReActAgent(first, tools.tools(), context=context).run("Remember my code: 4512")
        assert result.answer == "Noted." and context.pinned == []
        assert FACT in _system(first, 1) and FACT not in _system(first, 2)  # in core, then out
        [stored] = store.records(user="ann")
        assert (stored.text, stored.source) == (FACT, "page_out")

    # A later session: a fresh agent and context over the same file.
    with MemoryStore(tmp_path, "notes") as store:
        tools, context = _tools(store)
        second = ScriptedPolicy(
            [
                _call("memory_search", query="locker code"),
                _call("page_in", id="m1"),
                FACT,
            ]
        )
        result = ReActAgent(second, tools.tools(), context=context).run("What is my code?")
        tool_results = [m.content for m in result.messages if m.role == "tool"]
        assert tool_results[0] == f"[m1] (semantic) {FACT}"
        assert tool_results[1].startswith(f"paged in m1: {FACT}; core memory holds 26 of")
        assert FACT not in _system(second, 1)
        assert f"# Facts to keep\n- {FACT}" in _system(second, 2)  # answered with it in core
        assert result.answer == FACT and context.pinned == [FACT]
        assert store.get(stored.id).accessed_at > stored.accessed_at


def test_core_memory_is_limited_with_a_clear_tool_error(tmp_path):
    with MemoryStore(tmp_path) as store:
        tools, context = _tools(store, core_limit=40)
        executor = ToolExecutor(tools.tools())

        def run(name, **arguments):
            return executor.execute(ToolCall(name, arguments))

        assert run("core_memory_append", text="a" * 30).ok
        full = run("core_memory_append", text="b" * 20)
        assert full.status == "failed" and full.content == (
            "error: core memory is full: it holds 30 of 40 characters and this needs 20 more; "
            "page_out an entry or shorten one with core_memory_replace first"
        )
        assert "core memory is full" in run("core_memory_replace", old="aaa", new="c" * 20).content
        assert context.pinned == ["a" * 30]
        assert run("core_memory_replace", old="a" * 25, new="z").content == (
            "replaced; core memory holds 6 of 40 characters"
        )
        assert run("core_memory_append", text="b" * 20).ok
        assert run("page_out", text="").status == "invalid_arguments"
        assert run("core_memory_append", text="zz").ok
        assert "2 entries contain 'z'" in run("page_out", text="z").content
        assert "no entry contains 'q'" in run("page_out", text="q").content
        stored = run("memory_insert", text="x" * 30).content
        assert stored == "stored as m1"
        assert "core memory is full" in run("page_in", id="m1").content
        assert "no stored memory 'm9'" in run("page_in", id="m9").content
        assert "At most 40 characters" in executor.tools["core_memory_append"].description
        assert not executor.is_down("core_memory_append")  # refusals are answers, not outages


def test_memory_update_invalidates_the_old_memory_and_keeps_it_in_history(tmp_path):
    with MemoryStore(tmp_path) as store:
        tools, _ = _tools(store)
        assert tools.memory_insert("Ann lives in Oslo") == "stored as m1"
        assert tools.memory_insert("Ann lives in Oslo") == "already stored as m1 (skipped)"
        assert tools.memory_update("m1", "Ann lives in Bergen") == (
            "updated: m1 no longer holds; the memory is now m2"
        )
        [now] = store.records(user="ann")
        old = store.get(tools._ids["m1"])
        assert now.text == "Ann lives in Bergen" and now.links == (old.id,)
        assert old.valid_to is not None and old.expired_at is not None
        assert len(store.records(user="ann", history=True)) == 2
        assert tools.memory_search("Where does Ann live?") == "[m2] (semantic) Ann lives in Bergen"
        episode = tools.memory_insert("Ann moved house", type="episodic")
        assert store.get(tools._ids[episode.split()[-1]]).event_time is not None
        with pytest.raises(KeyError, match="unknown memory tools"):
            tools.tools(["memory_forget"])


def test_a_read_only_agent_is_refused_writes_through_its_tools_and_audited(tmp_path):
    with MemoryStore(tmp_path, "team") as store:
        space = SharedSpace(store, {"lead": "admin", "helper": "read"})
        MemoryWriter(space.agent("lead"), HashingEmbedder(64)).write(
            MemoryRecord(text=FACT, user="ann")
        )
        tools, _ = _tools(space.agent("helper"))
        executor = ToolExecutor(tools.tools())
        found = executor.execute(ToolCall("memory_search", {"query": "locker code"}))
        assert found.content == f"[m1] (semantic) {FACT}"
        refused = executor.execute(ToolCall("memory_insert", {"text": "Ann's code is 0000."}))
        assert refused.content.startswith("error: agent 'helper' may not add in memory space")
        assert [r.text for r in store.records()] == [FACT]
        [denied] = space.audit_log(allowed=False)
        assert (denied.agent, denied.action) == ("helper", "add")


def test_the_agent_command_runs_with_memory_from_gin(tmp_path, capsys):
    root = f"agents.MemoryConfig.root = '{tmp_path}'"
    assert main(["agent", "--gin_file", "agent_memory_scripted", "--gin_param", root]) == 0
    out = capsys.readouterr().out
    assert "page_in ok" in out and f"answer: {FACT}" in out
    with MemoryStore(tmp_path, "demo") as store:
        [record] = store.records(user="ann")
        assert (record.text, record.source) == (FACT, "page_out")

    # A shared space where the agent may only read: paging out is refused and audited.
    gin.clear_config()
    shared = [
        root,
        "agents.MemoryConfig.space = 'team'",
        "agents.MemoryConfig.agent = 'helper'",
        "agents.MemoryConfig.acl = {'lead': 'admin', 'helper': 'read'}",
        f"agents.MemoryConfig.tools = {list(MEMORY_TOOLS)}",
    ]
    args = ["agent", "--gin_file", "agent_memory_scripted"]
    assert main([*args, *(x for p in shared for x in ("--gin_param", p))]) == 0
    assert "may not add in memory space 'team'" in capsys.readouterr().out
    with MemoryStore(tmp_path, "team") as store:
        assert store.records() == []
        denied = SharedSpace(store).audit_log(allowed=False)
        assert [(e.agent, e.action) for e in denied] == [("helper", "add")]
