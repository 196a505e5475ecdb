"""The shared-market scenario against hand-computed rounds of greedy buyers, and as a suite."""

import json

import gin
import pytest

import agentic_jax.registry  # noqa: F401  (registers every configurable for the gin config)
from agentic_jax import config as gin_config
from agentic_jax.agents.policies.base import AssistantMessage, Usage
from agentic_jax.data.chat import ToolCall
from agentic_jax.eval.suites.market import MarketConfig, MarketSuite, run_market
from agentic_jax.eval.suites.run import evaluate


class Greedy:
    """Asks for all it still needs every turn; answers once it has it."""

    def __init__(self, need):
        self.need = need

    def respond(self, messages, tools=(), **sampling):
        owned = 0
        for m in messages:
            if m.role == "tool":
                owned = json.loads(m.content).get("units_owned", owned)
        if owned >= self.need:
            return AssistantMessage("done", (), Usage(5, 1))
        call = ToolCall("buy", {"quantity": self.need - owned})
        return AssistantMessage("", (call,), Usage(5, 2), "tool_calls")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scarce_stock_makes_the_later_buyers_wait_and_pay_the_surge(seed):
    # 3 agents need 4 each; 4 units per round.  Round 0: the first buys 4 at 2, the others get
    # nothing (2 contention failures).  Demand was 12, so round 1 costs 2 + 0.5 * 8 = 6: the
    # second buys 4, the third gets nothing (1 failure).  Round 2 costs 2 + 0.5 * (8 - 4) = 4.
    config = MarketConfig(agents=3, need=4, budget=40, stock_per_round=4, seed=seed)
    rows, totals = run_market([Greedy(4) for _ in range(3)], config)
    assert totals["success"] == 1.0 and totals["contention_failures"] == 3
    assert sorted(r["spent"] for r in rows) == [8.0, 16.0, 24.0]
    assert sorted(r["contention_failures"] for r in rows) == [0, 1, 2]
    assert all(r["tokens"] > 0 and r["invalid_calls"] == 0 for r in rows)


def test_the_order_of_play_follows_the_seed():
    orders = set()
    for seed in range(6):
        rows, _ = run_market([Greedy(4) for _ in range(3)], MarketConfig(seed=seed))
        orders.add(tuple(r["contention_failures"] for r in rows))
    assert len(orders) > 1


def test_enough_stock_means_no_contention_and_a_budget_caps_purchases():
    rows, totals = run_market([Greedy(4) for _ in range(3)], MarketConfig(stock_per_round=12))
    assert totals["contention_failures"] == 0 and {r["spent"] for r in rows} == {8.0}
    rows, totals = run_market(
        [Greedy(4) for _ in range(2)], MarketConfig(agents=2, budget=10, max_rounds=2)
    )
    # The second buyer meets the surge price 2 + 0.5 * 4 = 4 with 10 credits: 2 units, not 4.
    assert sorted(r["units"] for r in rows) == [2, 4] and totals["success"] == 0.5
    with pytest.raises(ValueError, match="need 3 policies"):
        run_market([Greedy(4)], MarketConfig())


def test_the_market_suite_reports_what_run_market_plays(tmp_path):
    """Every agent is the evaluated policy: the suite's rows are run_market's with copies."""
    suite = MarketSuite(agents=3, need=4, seed=2)
    result = evaluate(tmp_path, policy=Greedy(4), suite=suite, progress=False)
    rows, totals = run_market([Greedy(4) for _ in range(3)], MarketConfig(agents=3, seed=2))
    assert result["agents"] == rows and result["totals"] == totals
    assert totals["tool_calls"] == sum(r["tool_calls"] for r in rows)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["agents"] == rows and saved["settings"]["seed"] == 2
    report = (tmp_path / "report.md").read_text()
    assert "| agent | success | units | spent | contention failures |" in report
    assert "| all | 1.000 | 4 | 16 | 3 |" in report  # spent 8, 16 and 24; 2 + 1 + 0 failures
    # configs/eval_market.gin is what `agentic-jax eval --suite market` runs.
    gin_config.parse(["eval_market"], ["eval.MarketSuite.agents = 2"])
    try:
        result = evaluate(tmp_path / "gin", policy=Greedy(4), progress=False)
    finally:
        gin.clear_config()
    assert result["suite"] == "market" and len(result["agents"]) == 2
    assert (tmp_path / "gin" / "report.md").exists()


def test_bad_market_settings_are_named():
    with pytest.raises(ValueError, match="agents must be >= 1, got 0"):
        MarketSuite(agents=0)
    with pytest.raises(ValueError, match="base_price must be > 0, got 0; surge must be >= 0"):
        MarketConfig(base_price=0, surge=-1)
    with pytest.raises(ValueError, match="temperature >= 0"):
        MarketSuite(temperature=-0.5)
